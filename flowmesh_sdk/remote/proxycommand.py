"""An ssh config ``ProxyCommand``, run the way OpenSSH runs it.

OpenSSH (``sshconnect.c``) prefixes the command with ``exec``, expands the tokens ``%h``
(the host, after ``HostName``), ``%p`` (the port), ``%r`` (the login user), ``%n`` (the host
as given), ``%k`` (``HostKeyAlias``, else the host as given) and ``%%`` (a ``%``), refuses any
other ``%`` sequence, and runs the result with the user's shell: ``$SHELL -c COMMAND``
(``/bin/sh`` when ``SHELL`` is unset or empty).  The connection then travels over the
command's stdin and stdout.  So redirections, pipes, variables and quoting work as in
``ssh`` (``nc %h %p 2>/dev/null``).  paramiko's own ``ProxyCommand`` splits the line with
``shlex`` and runs it without a shell; :class:`ShellProxy` replaces it.

Apart from OpenSSH: the command runs in a session of its own (no controlling terminal, so
a prompt fails instead of hanging), its stderr is kept (the last of it goes into the error
when the connection fails) instead of going to the terminal, and closing the connection
ends the command's whole process group (SIGTERM, then SIGKILL for what is left once
the command has exited or 2 s have passed).  Host and user
names given to the SDK are checked before they can reach the shell
(:mod:`.hostnames`); names from the ssh config itself are the user's own, as in OpenSSH.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import tempfile
import threading

from ..errors import SpecError

_KILL_WAIT_S = 2.0
_STDERR_TAIL = 400


def expand(command: str, *, host: str, port: int, user: str, alias: str, key_alias: str | None = None,
           field_name: str = "ssh.ssh_config") -> str:
    """``exec COMMAND`` with OpenSSH's ProxyCommand tokens expanded; a ``%`` sequence
    OpenSSH does not know is a :class:`SpecError` on ``field_name``."""
    values = {"h": host, "p": str(port), "r": user, "n": alias, "k": key_alias or alias, "%": "%"}
    out: list[str] = []
    i = 0
    while i < len(command):
        ch = command[i]
        if ch != "%":
            out.append(ch)
            i += 1
            continue
        key = command[i + 1:i + 2]
        if key not in values or not key:
            raise SpecError(field_name, f"ProxyCommand for {alias}: {'%' + key!r} is not a token "
                                        "(ProxyCommand knows %h %p %r %n %k and %% for a '%')")
        out.append(values[key])
        i += 2
    return "exec " + "".join(out)


def user_shell() -> str:
    """The shell OpenSSH runs a ProxyCommand with: ``$SHELL``, else ``/bin/sh``."""
    return os.environ.get("SHELL") or "/bin/sh"


class ShellProxy:
    """A running ProxyCommand as the socket-like object paramiko's Transport talks over
    (``send``, ``recv``, ``settimeout``, ``close``, ``closed``): the command's stdin and
    stdout are pipes, as in OpenSSH.  ``command`` is what :func:`expand` returned.

    The transport's thread reads while other threads write, so each direction has its
    own lock; :meth:`close` ends the command first (its pipes then answer at once) and
    closes a pipe only under that pipe's lock, so no read or write ever meets a closed
    (or reused) file descriptor."""

    def __init__(self, command: str) -> None:
        self._err = tempfile.TemporaryFile()  # noqa: SIM115 - closed in close()
        self._state = threading.Lock()
        self._rlock = threading.Lock()
        self._wlock = threading.Lock()
        self._timeout: float | None = None
        self._closed = False    # the name paramiko's Transport.stop_thread looks at
        self._eof = False       # the command closed its stdout
        self._tail = ""
        try:
            self.process = subprocess.Popen([user_shell(), "-c", command], stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, stderr=self._err, bufsize=0,
                                            close_fds=True, start_new_session=True)
        except BaseException:
            self._err.close()
            raise
        assert self.process.stdin is not None and self.process.stdout is not None
        self._in = self.process.stdin
        self._out = self.process.stdout

    def __repr__(self) -> str:
        return f"ShellProxy(pid={self.process.pid})"

    def settimeout(self, timeout: float | None) -> None:
        self._timeout = timeout

    def send(self, data: bytes) -> int:
        with self._wlock:
            if self._in.closed:
                raise BrokenPipeError("the ProxyCommand is closed")
            return os.write(self._in.fileno(), data)   # EPIPE once it has exited: paramiko reads EOF

    def recv(self, size: int) -> bytes:
        """Up to ``size`` bytes; ``b""`` once the command closed its stdout (EOF);
        ``socket.timeout`` when nothing came within the timeout."""
        with self._rlock:
            if self._out.closed:
                return b""
            ready, _, _ = select.select([self._out], [], [], self._timeout)
            if not ready:
                raise socket.timeout("the ProxyCommand sent nothing")
            data = os.read(self._out.fileno(), size)
            if not data:
                self._eof = True
            return data

    @property
    def closed(self) -> bool:
        return self._closed

    def stderr_tail(self) -> str:
        """The last of what the command wrote to stderr, and how it exited if it did."""
        code = self.process.poll()
        err = self._tail if self._closed else self._read_tail()
        how = ("was still running" if code is None else f"was ended by signal {-code}" if code < 0
               else f"exited with {code}")
        return f"the ProxyCommand {how}" + (f", stderr: {err}" if err else ", no stderr")

    def _read_tail(self) -> str:
        try:
            size = os.fstat(self._err.fileno()).st_size
            self._err.seek(max(0, size - _STDERR_TAIL))
            return self._err.read().decode("utf-8", "replace").strip()
        except (OSError, ValueError):
            return ""

    def close(self) -> None:
        """End the command's process group (SIGTERM; SIGKILL for what is left once the command
        has exited, or after 2 s), then close the pipes."""
        with self._state:
            if self._closed:
                return
            self._closed = True
        proc = self.process
        if self._eof and proc.poll() is None:
            try:   # it closed its stdout: it is exiting, let it say how
                proc.wait(_KILL_WAIT_S)
            except subprocess.TimeoutExpired:
                pass
        if proc.poll() is None:   # not reaped: its pid is still its group's id
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(_KILL_WAIT_S)
                except subprocess.TimeoutExpired:
                    pass
                os.killpg(proc.pid, signal.SIGKILL)   # and what of its group ignored SIGTERM
            except ProcessLookupError:
                pass
            proc.wait()
        with self._wlock:
            self._in.close()
        with self._rlock:
            self._out.close()
        self._tail = self._read_tail()
        self._err.close()
