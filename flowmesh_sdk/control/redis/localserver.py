"""A real ``redis-server`` (Debian's package) on 127.0.0.1 for the tests, the benchmark and
a one-machine shared fleet: a free port, its own directory, not daemonized, AOF on
(``fsync``: ``always``, the default, loses nothing a client was answered for even when the
machine dies; ``everysec`` survives a redis-server crash except when a slow disk made Redis
postpone its AOF write -- see docs/operations.md), with a password when given
(``requirepass``; :attr:`LocalRedis.url` then carries it), stopped and restarted on the
same port and data at will."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
import urllib.parse
from pathlib import Path

from ...errors import FlowMeshError
from ...redaction import redact_url


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalRedis:
    def __init__(self, directory: str | Path, *, port: int | None = None, appendonly: bool = True,
                 fsync: str = "always", password: str | None = None) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise FlowMeshError("redis-server is not installed: apt-get install -y redis-server "
                                "(bash setup.sh --dev installs it)")
        self.binary: str = binary
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.appendonly = appendonly
        self.fsync = fsync
        if password is not None and (not password or any(c in password for c in '"\\\r\n')):
            raise FlowMeshError("LocalRedis(password=...): a non-empty password without quotes, backslashes "
                                "or newlines")
        self.password = password
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{urllib.parse.quote(self.password, safe='')}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def __repr__(self) -> str:
        return f"LocalRedis({redact_url(self.url)!r})"

    def start(self, timeout_s: float = 10.0) -> LocalRedis:
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
                "--daemonize", "no", "--save", "", "--protected-mode", "yes", "--loglevel", "warning",
                "--logfile", str(self.dir / "redis.log")]
        if self.appendonly:
            args += ["--appendonly", "yes", "--appendfsync", self.fsync]
        if self.password:   # on stdin, not in argv where ps shows it
            args.insert(1, "-")
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE if self.password else subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if self.password:
            assert self.proc.stdin is not None
            self.proc.stdin.write(f'requirepass "{self.password}"\n'.encode())
            self.proc.stdin.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                log = (self.dir / "redis.log").read_text(errors="replace")[-2000:]
                raise FlowMeshError(f"redis-server exited with {self.proc.returncode}: {log}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(64).startswith((b"+PONG", b"-NOAUTH")):   # up (and asking for the password)
                        return self
            except OSError:
                pass
            time.sleep(0.02)
        self.stop()
        raise FlowMeshError(f"redis-server on 127.0.0.1:{self.port} did not answer within {timeout_s:g} s")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def kill(self) -> None:
        """SIGKILL: what survives is what the AOF holds."""
        self.stop(signal.SIGKILL)

    def restart(self, *, down_s: float = 0.0, sig: int = signal.SIGKILL) -> None:
        self.stop(sig)
        if down_s:
            time.sleep(down_s)
        self.start()

    def __enter__(self) -> LocalRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
