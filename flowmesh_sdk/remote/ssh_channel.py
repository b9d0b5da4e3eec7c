"""The remote side of one SSH session channel, and the held-open channel built on it.

:class:`SshChannel` is what :meth:`SshRunner.open_channel
<flowmesh_sdk.remote.ssh.SshRunner.open_channel>` returns: a process on a session channel
of the runner's connection, spoken to over its stdin and stdout.  Underneath, ``_Proc``
holds the paramiko channel, its exit status and the remote process group's id (the
first stdout line, from the wrapper :func:`_wrap`); ``_Pump`` threads feed its stdout
and stderr into asyncio ``StreamReader`` objects; ``_Conn`` is one connection of a runner
and its count of session slots taken.  Every blocking paramiko call runs in the bounded
pool :data:`_POOL` (:func:`_blocking`).  These are re-exported from :mod:`.ssh`, where they
were defined first.

The runner is reached through :class:`_ProcRunner`, the few members of
:class:`~flowmesh_sdk.remote.ssh.SshRunner` a process uses, so this module does not
import :mod:`.ssh`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import shlex
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

from ..errors import AuthError, ProviderUnavailableError, SandboxClosedError
from .runner import StreamChannel
from .sudo import Sudo, SudoGate

try:  # paramiko is the optional extra ``ssh``
    import paramiko
except ImportError:  # pragma: no cover - exercised only without the extra
    paramiko = None

log = logging.getLogger("flowmesh.remote.ssh")
T = TypeVar("T")

#: every blocking SSH call of every runner in this process runs here (connects, channel
#: opens, writes, waits): a bound of its own, apart from asyncio's default executor
_POOL = ThreadPoolExecutor(max_workers=64, thread_name_prefix="fm-ssh")


async def _blocking(fn: Callable[..., T], *args: Any) -> T:
    return await asyncio.get_running_loop().run_in_executor(_POOL, functools.partial(fn, *args))

_READ_CHUNK = 65536
_CLOSE_GRACE_S = 2.0      # a closed channel's process gets this long to exit on EOF


def _wrap(argv: Sequence[str], sudo: Sudo | None = None) -> str:
    """The remote command line: ``argv`` as the leader of a new process group whose id is
    printed first on stdout (as root through ``sudo`` when given)."""
    inner = "sh -c 'echo $$; exec \"$@\"' fm-run " + shlex.join(argv)
    if sudo is not None:
        # sudo's child is no session leader: setsid makes the command lead its own group
        return f"exec {sudo.prefix()} setsid -w {inner}"
    # OpenSSH starts every session command in a new session (setsid), so the shell
    # already leads its group; ``setsid -w`` only when it does not (it forks and, when
    # the child is killed, writes a line to stderr, which the first form avoids).
    return ('if [ "$(cut -d" " -f5 /proc/$$/stat 2>/dev/null)" = "$$" ]; '
            f"then exec {inner}; else exec setsid -w {inner}; fi")


class _ProcRunner(Protocol):
    """What a remote process needs of its runner (:class:`~flowmesh_sdk.remote.ssh.SshRunner`)."""

    label: str
    sudo: Sudo | None

    @property
    def resolved_user(self) -> str: ...

    async def _exec_simple(self, argv: Sequence[str], timeout_s: float, conn: _Conn) -> int | None: ...

    def _give_slot(self, conn: _Conn) -> None: ...


class _Pump:
    """Reads one side of a paramiko channel in a thread and feeds an asyncio StreamReader."""

    def __init__(self, loop: asyncio.AbstractEventLoop, chan: Any, stderr: bool,
                 reader: asyncio.StreamReader, gate: SudoGate | None = None) -> None:
        self._loop = loop
        self._chan = chan
        self._stderr = stderr
        self._reader = reader
        self._gate = gate
        self.done = threading.Event()
        threading.Thread(target=self._run, daemon=True,
                         name=f"fm-ssh-{'err' if stderr else 'out'}").start()

    def _call(self, fn: Any, *args: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass

    def _run(self) -> None:
        recv = self._chan.recv_stderr if self._stderr else self._chan.recv
        try:
            while True:
                data = recv(_READ_CHUNK)
                if not data:
                    break
                if self._gate is not None:
                    data = self._gate.feed(data)
                    if self._gate.refused:
                        self._chan.close()   # a wrong sudo password: the command never starts
                    if not data:
                        continue
                self._call(self._reader.feed_data, data)
        except Exception:  # noqa: BLE001 - a dead transport ends the stream like EOF
            pass
        finally:
            self.done.set()
            self._call(self._reader.feed_eof)


class _Proc:
    """A remote process on a session channel: its streams, its exit status, its pgid."""

    def __init__(self, runner: _ProcRunner, conn: _Conn, chan: Any, argv: Sequence[str]) -> None:
        self.runner = runner
        self.conn = conn
        self.chan = chan
        self.argv = tuple(argv)
        loop = asyncio.get_running_loop()
        self.stdout = asyncio.StreamReader(limit=1 << 20)
        self.stderr = asyncio.StreamReader(limit=1 << 20)
        sudo = runner.sudo
        self.gate = SudoGate(sudo.password, chan.sendall) if sudo is not None and sudo.password else None
        self._out = _Pump(loop, chan, False, self.stdout)
        self._err = _Pump(loop, chan, True, self.stderr, self.gate)
        self.pgid: int | None = None

    async def read_pgid(self, timeout_s: float) -> None:
        line = await asyncio.wait_for(self.stdout.readline(), timeout_s)
        if self.gate is not None:
            if self.gate.refused:
                raise AuthError(f"{self.runner.label}: sudo refused the password given for "
                                f"{self.runner.resolved_user}", provider="ssh")
            held = self.gate.release()
            if held:
                self.stderr.feed_data(held)
        try:
            self.pgid = int(line.strip())
        except ValueError as exc:
            err = await _read_rest(self.stderr, 2.0)
            raise ProviderUnavailableError(
                f"{self.runner.label}: the remote command did not start "
                f"({line[:200]!r} {err.decode('utf-8', 'replace')[:400]})", provider="ssh") from exc

    async def write(self, data: bytes) -> None:
        await _blocking(self.chan.sendall, data)

    async def send_eof(self) -> None:
        await _blocking(self.chan.shutdown_write)

    def exited(self) -> bool:
        return self.chan.exit_status_ready()

    def lost(self) -> bool:
        """The channel ended without an exit status because its connection died (not
        because sshd ended it: then EOF came first, as for a command killed by a signal,
        whose ``exit-signal`` paramiko does not keep)."""
        t = self.chan.get_transport()
        return self.chan.exit_status == -1 and (not self.chan.eof_received or t is None or not t.is_active())

    async def wait_exit(self, timeout_s: float) -> int | None:
        """The exit status, or None if there is none within ``timeout_s`` (or it was
        killed by a signal / the connection died)."""
        ok = await _blocking(self.chan.status_event.wait, timeout_s)
        if not ok:
            return None
        status = self.chan.exit_status
        return None if status == -1 else status

    async def kill(self) -> None:
        if self.pgid is not None and self.pgid > 1:
            try:
                # and waited for (at most 5 s): a timed-out run returns once its group is
                # gone, not while its processes are still dying (seen under load: a
                # SIGKILLed sleep still listed by the next command)
                await self.runner._exec_simple(
                    ["sh", "-c", f"kill -KILL -{self.pgid} 2>/dev/null; i=0; while "
                                 f"kill -0 -{self.pgid} 2>/dev/null && [ $i -lt 100 ]; do "
                                 "sleep 0.05; i=$((i + 1)); done; true"], 15.0, self.conn)
            except Exception as exc:  # noqa: BLE001 - best effort; logged
                log.warning("%s: could not kill remote process group %s: %s",
                            self.runner.label, self.pgid, exc)

    def close(self) -> None:
        try:
            self.chan.close()
        except Exception:  # noqa: BLE001
            pass


async def _read_rest(reader: asyncio.StreamReader, timeout_s: float, cap: int = 4096) -> bytes:
    """What ``reader`` gives until its end (at most ``cap`` bytes, at most ``timeout_s``):
    one read took only what had come, and sudo's refusal arrives in more than one piece
    (under load the error said only "sudo")."""
    out = bytearray()
    deadline = time.monotonic() + timeout_s
    while len(out) < cap:
        try:
            chunk = await asyncio.wait_for(reader.read(cap - len(out)), max(0.0, deadline - time.monotonic()))
        except asyncio.TimeoutError:
            break
        if not chunk:
            break
        out += chunk
    return bytes(out)


class SshChannel(StreamChannel):
    def __init__(self, proc: _Proc) -> None:
        super().__init__(proc.stdout, proc.stderr)
        self._proc = proc
        self._closed = False

    async def write(self, data: bytes) -> None:
        if not self.alive:
            raise SandboxClosedError(f"channel process exited: {self.stderr_tail()}")
        try:
            await self._proc.write(data)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise SandboxClosedError(f"channel closed: {self.stderr_tail()}") from exc

    @property
    def alive(self) -> bool:
        chan = self._proc.chan
        return (not self._closed and not chan.closed and not chan.exit_status_ready()
                and chan.get_transport() is not None and chan.get_transport().is_active())

    async def close(self) -> None:
        await self._end(_CLOSE_GRACE_S)

    async def kill(self) -> None:
        await self._end(0.0)

    async def _end(self, grace_s: float) -> None:
        """Send EOF; kill the remote process unless it exits within ``grace_s``."""
        if self._closed:
            return
        self._closed = True
        proc = self._proc
        try:
            if not proc.exited():
                try:
                    await proc.send_eof()
                except Exception:  # noqa: BLE001
                    pass
                if (grace_s <= 0 or await proc.wait_exit(grace_s) is None) and not proc.exited():
                    await proc.kill()
        finally:
            proc.close()
            self.runner_release()
            self._drain.cancel()

    def runner_release(self) -> None:
        self._proc.runner._give_slot(self._proc.conn)


class _Conn:
    """One SSH connection of a runner (a fabric Connection), and how many session slots
    are taken on it."""

    __slots__ = ("cxn", "busy", "lock")

    def __init__(self) -> None:
        self.cxn: Any = None
        self.busy = 0
        self.lock = asyncio.Lock()

    @property
    def transport(self) -> Any:
        return self.cxn.transport if self.cxn is not None else None
