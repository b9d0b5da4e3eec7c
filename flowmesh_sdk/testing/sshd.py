"""A TEST FIXTURE: a real OpenSSH ``sshd`` on a loopback address, for the SSH runner's tests.

``LoopbackSshd`` generates a fresh ed25519 host key and a fresh ed25519 client key in a
temporary directory, writes an ``sshd_config`` that accepts exactly that client key
(public-key auth only, root allowed by key, no PAM, no passwords) and runs
``/usr/sbin/sshd -D -e -f CONFIG`` listening on ``127.0.0.N:PORT`` (a free port)::

    with LoopbackSshd() as sshd:
        target = SshTarget(sshd.host, sshd.port, sshd.user, sshd.client_key_path,
                           sshd.host_public_key)

Each daemon is a distinct machine as far as containers go: its sessions get
``CONTAINERS_STORAGE_CONF`` and ``CONTAINERS_CONF`` (``SetEnv``) pointing at a storage root,
run root and libpod state of its own, so every host has its own image cache, and a ``HOME``
of its own (``.home``), so no startup file of this machine's user runs in its sessions.  ``path=``
replaces the sessions' ``PATH`` (a host "without podman" gets a directory of symlinks to
everything but the container runtimes: :func:`bin_dir_without`).  ``host_key_path=`` and
``authorized_keys=`` make it use keys handed to it (as cloud-init would on a VM) instead of
generating its own.  ``extra_config=`` lines go at the end of its ``sshd_config`` (a
``HostCertificate``, ``Match`` blocks for other users, ...).

``restart()`` stops and starts the daemon on the same address, port and keys (to test
reconnects); ``accepted_logins()`` counts the ``Accepted publickey`` lines in its log.
``stop(cleanup=True)`` (the context manager's exit) is a machine that is gone for good:
what its sessions still run is killed, its containers are removed and confirmed gone (no
container in its store, no conmon of it alive), and only then are its storage and keys
deleted.  Its sessions carry ``FLOWMESH_TEST_SSHD=<its directory>`` (and the test session's
tag, :data:`~flowmesh_sdk.testing.hygiene.SESSION_VAR`), which is how their processes are
found once the daemon no longer holds them.
It is not meant for anything but tests: it runs as the current user (root in CI) and
trusts a key it generated itself.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import BinaryIO

from . import hygiene

SSHD = "/usr/sbin/sshd"
HOST_VAR = "FLOWMESH_TEST_SSHD"   # in every session's environment: this host's directory
INSTALL_HINT = "install OpenSSH's server: apt-get install -y openssh-server"


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _keygen(path: Path, comment: str) -> None:
    if shutil.which("ssh-keygen") is None:
        raise RuntimeError(f"ssh-keygen not found; {INSTALL_HINT}")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                   check=True, capture_output=True)


def bin_dir_without(dest: str | Path, missing: tuple[str, ...] = ("podman", "docker")) -> str:
    """A directory of symlinks to every program in /usr/sbin and /usr/bin except ``missing``
    (for a test host that lacks them); returns its path, to give as ``path=``."""
    d = Path(dest)
    d.mkdir(parents=True, exist_ok=True)
    for src in ("/usr/sbin", "/usr/bin"):
        for entry in os.scandir(src):
            link = d / entry.name
            if entry.name not in missing and not link.exists():
                os.symlink(entry.path, link)
    return str(d)


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 1 and fields[1] == str(pid):
            out.append(int(entry))
    return out


class LoopbackSshd:
    """A test fixture: OpenSSH's sshd on ``host`` (a 127.x address) and a free port."""

    def __init__(self, host: str = "127.0.0.2", *, port: int | None = None,
                 startup_timeout_s: float = 10.0, path: str | None = None,
                 own_storage: bool = True, host_key_path: str | None = None,
                 authorized_keys: list[str] | None = None, extra_config: tuple[str, ...] = ()) -> None:
        if not os.path.exists(SSHD):
            raise RuntimeError(f"{SSHD} not found; {INSTALL_HINT}")
        self.host = host
        self.port = port or _free_port(host)
        self.user = "root"
        self.startup_timeout_s = startup_timeout_s
        self._tmp = Path(tempfile.mkdtemp(prefix="fm-sshd-"))
        os.chmod(self._tmp, 0o700)
        self.host_key_path = host_key_path or str(self._tmp / "host_ed25519")
        self.client_key_path = str(self._tmp / "client_ed25519")
        self.config_path = str(self._tmp / "sshd_config")
        self.log_path = str(self._tmp / "sshd.log")
        if host_key_path is None:
            _keygen(Path(self.host_key_path), "flowmesh-test-host")
        if authorized_keys is None:
            _keygen(Path(self.client_key_path), "flowmesh-test-client")
            shutil.copyfile(self.client_key_path + ".pub", self._tmp / "authorized_keys")
        else:
            self.client_key_path = ""   # whoever handed the keys holds the private half
            (self._tmp / "authorized_keys").write_text("".join(k.strip() + "\n" for k in authorized_keys))
        parts = Path(self.host_key_path + ".pub").read_text().split()
        #: the host's public key line, ``ssh-ed25519 AAAA...`` (what a client pins)
        self.host_public_key = f"{parts[0]} {parts[1]}"
        #: its sessions' ``HOME``, empty as on a fresh machine: their shell reads none of this
        #: machine's user's startup files (a ``pyenv init`` in root's ~/.bashrc leaves its rehash
        #: lock behind when a session is killed mid-rehash, and every later shell waits 60 s on it)
        self.home = str(self._tmp / "home")
        os.mkdir(self.home, 0o700)
        env = [f"HOME={self.home}"]
        if path:
            env.append(f"PATH={path}")
        env.append(f"{HOST_VAR}={self._tmp}")
        if os.environ.get(hygiene.SESSION_VAR):
            env.append(f"{hygiene.SESSION_VAR}={os.environ[hygiene.SESSION_VAR]}")
        #: this host's own container storage (None when it shares the machine's)
        self.storage_root = str(self._tmp / "containers") if own_storage else None
        if self.storage_root:
            env += self._write_container_confs(Path(self.storage_root))
            hygiene.STORES.add(Path(self.storage_root))
        Path(self.config_path).write_text("\n".join([
            f"ListenAddress {self.host}:{self.port}",
            f"HostKey {self.host_key_path}",
            f"AuthorizedKeysFile {self._tmp / 'authorized_keys'}",
            f"PidFile {self._tmp / 'sshd.pid'}",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PubkeyAuthentication yes",
            "PermitRootLogin prohibit-password",
            "StrictModes no",
            "UsePAM no",
            "MaxSessions 64",
            "MaxStartups 64",
            "LogLevel VERBOSE",
            "Subsystem sftp internal-sftp",
            f"SetEnv {' '.join(env)}",
            *extra_config,   # last: it may hold Match blocks
            "",
        ]))
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: BinaryIO | None = None

    def __repr__(self) -> str:
        return f"LoopbackSshd({self.user}@{self.host}:{self.port})"

    @staticmethod
    def _write_container_confs(root: Path) -> list[str]:
        """storage.conf and containers.conf for a machine of its own: image store, run
        root, and libpod's state and temp dirs all under ``root``."""
        for d in ("graph", "run", "tmp", "volumes"):
            (root / d).mkdir(parents=True, exist_ok=True)
        storage = root / "storage.conf"
        storage.write_text(f'[storage]\ndriver = "overlay"\ngraphroot = "{root / "graph"}"\n'
                           f'runroot = "{root / "run"}"\n')
        conf = root / "containers.conf"
        conf.write_text(f'[engine]\ntmp_dir = "{root / "tmp"}"\n'
                        f'static_dir = "{root / "graph" / "libpod"}"\n'
                        f'volume_path = "{root / "volumes"}"\n')
        return [f"CONTAINERS_STORAGE_CONF={storage}", f"CONTAINERS_CONF={conf}"]

    # ---- lifecycle ---------------------------------------------------------------
    def start(self) -> LoopbackSshd:
        if self._proc is not None and self._proc.poll() is None:
            return self
        os.makedirs("/run/sshd", exist_ok=True)  # privilege-separation directory
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self._proc = subprocess.Popen([SSHD, "-D", "-e", "-f", self.config_path],
                                      stdin=subprocess.DEVNULL, stdout=self._log,
                                      stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError(f"sshd exited with {self._proc.returncode}: {self.log_tail()}")
            try:
                with socket.create_connection((self.host, self.port), timeout=0.5) as s:
                    s.settimeout(1.0)
                    if s.recv(4).startswith(b"SSH-"):
                        return self
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"sshd did not listen on {self.host}:{self.port} within "
                                   f"{self.startup_timeout_s:g} s: {self.log_tail()}")
            time.sleep(0.05)

    def stop(self, *, cleanup: bool = False) -> None:
        """Stop the daemon (and the sessions it runs); ``cleanup`` also ends what the
        sessions left running and this host's containers (:meth:`_end_host`), then deletes
        its directory: keys and container storage."""
        if self._proc is not None and self._proc.poll() is None:
            # Per-connection sshd processes are children of the listener in their own
            # sessions; killing the listener does not end them, so end them by pid.  The
            # listener is stopped first: it then accepts no connection while they die (as
            # with a machine that vanished), and no session it forks after they were listed
            # lives on to run a command.
            pid = self._proc.pid
            os.kill(pid, signal.SIGSTOP)
            _, status = os.waitpid(pid, os.WUNTRACED)   # stopped: every child it forked exists
            if os.WIFSTOPPED(status):
                hygiene.kill(_children(pid))
                os.killpg(pid, signal.SIGKILL)
                self._proc.wait(5)
            else:   # it had exited: the status is reaped here, not by Popen
                self._proc.returncode = os.waitstatus_to_exitcode(status)
        if self._log is not None:
            self._log.close()
            self._log = None
        if cleanup:
            self._end_host()
            if self._tmp.exists():
                hygiene.unmount_under(self._tmp)
                shutil.rmtree(self._tmp)
            if self.storage_root:
                hygiene.STORES.discard(Path(self.storage_root))

    def _end_host(self, timeout_s: float = 30.0) -> None:
        """Kill what this host's sessions still run, remove its containers, and wait until
        none of its processes is left; raises (and keeps the storage) if one is.

        The daemon is stopped already, but a command a session started lives on: an
        in-flight ``podman run`` would create its container after a ``podman rm -a`` (so
        those go first), and every container's conmon, and the ``podman container cleanup``
        conmon runs when its container exits, must be gone before the store is deleted."""
        mark = f"={self._tmp}"   # HOST_VAR, or the CONTAINERS_* paths that sudo keeps
        procs = hygiene.processes()
        mine = hygiene.tagged(procs, mark)
        conmons = {p for p in mine if procs[p].comm == "conmon"}
        commands = hygiene.with_descendants(procs, mine - conmons) - hygiene.with_descendants(procs, conmons)
        hygiene.kill(commands)
        hygiene.wait_gone(commands, timeout_s)
        root = Path(self.storage_root) if self.storage_root else None
        if root is not None and (root / "graph").is_dir() and shutil.which("podman"):
            res = hygiene.podman(root, "rm", "-af", "-t", "0")
            stored = hygiene.containers(root)
            if res.returncode != 0 or stored:
                raise RuntimeError(f"{self}: podman rm -af in {root} failed ({res.stderr.strip()}); "
                                   f"containers left: {', '.join(map(str, stored))}")
        elif conmons:
            # the machine's own storage: only the containers this host's sessions started
            ids = [procs[p].cmdline.partition(" -c ")[2].split(" ", 1)[0] for p in conmons]
            hygiene.podman(None, "rm", "-f", "-t", "0", "--ignore", *filter(None, ids))
        deadline = time.monotonic() + timeout_s
        while True:
            procs = hygiene.processes()
            left = hygiene.with_descendants(procs, hygiene.tagged(procs, mark))
            if root is not None:
                left |= hygiene.with_descendants(procs, hygiene.conmons_of(procs, root))
            if not left or time.monotonic() >= deadline:
                break
            hygiene.wait_gone(left, deadline - time.monotonic())
        if left:
            raise RuntimeError(f"{self}: still running after its containers were removed: "
                               + "; ".join(str(procs[p]) for p in sorted(left) if p in procs))
        if root is not None and (root / "graph").is_dir():
            hygiene.podman(root, "rmi", "-af")

    def restart(self) -> None:
        """Stop and start again on the same address, port and keys (drops connections)."""
        self.stop()
        self.start()

    def __enter__(self) -> LoopbackSshd:
        try:
            return self.start()
        except BaseException:   # no __exit__ follows a failed __enter__
            self.stop(cleanup=True)
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop(cleanup=True)

    # ---- diagnostics -------------------------------------------------------------
    def log_text(self) -> str:
        try:
            return Path(self.log_path).read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, n: int = 10) -> str:
        return " | ".join(self.log_text().strip().splitlines()[-n:])

    def accepted_logins(self) -> int:
        """How many connections authenticated (``Accepted publickey`` log lines)."""
        return self.log_text().count("Accepted publickey")
