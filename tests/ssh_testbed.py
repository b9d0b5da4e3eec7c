"""Real pieces for the SSH tests (tests/test_ssh_*.py): login users made with useradd,
sudoers.d files, an nftables rule that lets only one user's processes reach a port (so a
host is reachable only through a jump host logged in as that user), ssh config and
known_hosts files written as a user would, OpenSSH keys and host certificates made with
ssh-keygen, and a real ssh-agent.  Everything is removed again on exit."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path


def keygen(path: Path, comment: str = "fm-test") -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                   check=True, capture_output=True)
    return path


def pub(path: str | Path) -> str:
    """``type base64`` of a key's .pub file."""
    parts = Path(f"{path}.pub").read_text().split()
    return f"{parts[0]} {parts[1]}"


def sign_host_key(ca: Path, host_key: Path, principals: str, validity: str = "-5m:+1h") -> Path:
    """``ssh-keygen -s CA -h``: a host certificate next to ``host_key`` (``-cert.pub``)."""
    subprocess.run(["ssh-keygen", "-q", "-s", str(ca), "-I", f"fm-test-{principals}", "-h",
                    "-n", principals, "-V", validity, f"{host_key}.pub"], check=True, capture_output=True)
    return Path(f"{host_key}-cert.pub")


def hash_known_hosts(path: Path) -> None:
    """``ssh-keygen -H``: OpenSSH's own hashing of the host names in a known_hosts file."""
    subprocess.run(["ssh-keygen", "-q", "-H", "-f", str(path)], check=True, capture_output=True)
    Path(f"{path}.old").unlink(missing_ok=True)


@contextlib.contextmanager
def login_user(authorized: Sequence[str], *, sudoers: str | None = None,
               password: str | None = None) -> Iterator[pwd.struct_passwd]:
    """A real local user (``useradd -m``) whose ``~/.ssh/authorized_keys`` holds
    ``authorized``; ``sudoers``: a sudoers.d file for it (``{user}`` is replaced);
    ``password`` set with chpasswd.  Removed again (``userdel -r``) on exit."""
    name = f"fm{uuid.uuid4().hex[:8]}"
    subprocess.run(["useradd", "-m", "-s", "/bin/sh", name], check=True, capture_output=True)
    drop_in = Path(f"/etc/sudoers.d/{name}")
    try:
        entry = pwd.getpwnam(name)
        ssh_dir = Path(entry.pw_dir) / ".ssh"
        ssh_dir.mkdir(mode=0o700)
        (ssh_dir / "authorized_keys").write_text("".join(k + "\n" for k in authorized))
        for p in (ssh_dir, ssh_dir / "authorized_keys"):
            os.chown(p, entry.pw_uid, entry.pw_gid)
        os.chmod(ssh_dir / "authorized_keys", 0o600)
        if password is not None:
            subprocess.run(["chpasswd"], input=f"{name}:{password}\n", text=True, check=True,
                           capture_output=True)
        else:   # useradd leaves the account locked ("!"), and sshd without PAM refuses those
            subprocess.run(["usermod", "-p", "*", name], check=True, capture_output=True)
        if sudoers is not None:
            drop_in.write_text(sudoers.replace("{user}", name))
            os.chmod(drop_in, 0o440)
            subprocess.run(["visudo", "-c", "-f", str(drop_in)], check=True, capture_output=True)
        yield entry
    finally:
        drop_in.unlink(missing_ok=True)
        subprocess.run(["pkill", "-KILL", "-u", name], capture_output=True)
        subprocess.run(["userdel", "-r", "-f", name], capture_output=True)


def user_keys_config(user: str) -> tuple[str, ...]:
    """sshd_config lines (for LoopbackSshd(extra_config=...)) that let ``user`` log in
    with the keys in its own ``~/.ssh/authorized_keys``."""
    return (f"Match User {user}", "    AuthorizedKeysFile .ssh/authorized_keys")


@contextlib.contextmanager
def only_user_reaches(uid: int, ports: Sequence[tuple[str, int]]) -> Iterator[None]:
    """An nftables table that rejects TCP connections to ``ports`` from every process that
    is not running as ``uid``: a host that this test (root) cannot reach directly, but a
    jump host's sshd, forwarding as that user, can."""
    table = f"fm_ssh_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    rules = "\n".join(f"  ip daddr {a} tcp dport {p} meta skuid != {uid} reject with tcp reset"
                      for a, p in ports)
    spec = (f"table inet {table} {{\n chain out {{\n  type filter hook output priority 0;\n{rules}\n }}\n}}\n")
    subprocess.run(["nft", "-f", "-"], input=spec, text=True, check=True, capture_output=True)
    try:
        yield
    finally:
        subprocess.run(["nft", "delete", "table", "inet", table], capture_output=True)


@contextlib.contextmanager
def ssh_agent(tmp: Path, *keys: Path) -> Iterator[str]:
    """A real ``ssh-agent`` on its own socket, holding ``keys`` (``ssh-add``); yields the
    socket path (for SSH_AUTH_SOCK).  Killed on exit."""
    sock = tmp / "agent.sock"
    out = subprocess.run(["ssh-agent", "-s", "-a", str(sock)], check=True, capture_output=True, text=True).stdout
    pid = int(out.split("SSH_AGENT_PID=")[1].split(";")[0])
    try:
        env = {**os.environ, "SSH_AUTH_SOCK": str(sock)}
        for k in keys:
            subprocess.run(["ssh-add", "-q", str(k)], env=env, check=True, capture_output=True)
        yield str(sock)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)


def need(*programs: str) -> None:
    """Fail (never skip) when a program the test runs is missing."""
    missing = [p for p in programs if shutil.which(p) is None]
    if missing:
        raise RuntimeError(f"the SSH tests need {', '.join(missing)}: run setup.sh (apt-get install sudo "
                           "openssh-server nftables)")
