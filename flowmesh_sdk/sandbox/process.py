"""A command started with :meth:`Sandbox.start`: streamed output, standard input, signals.

It runs on an agent channel of its own (``__fm_proc``): the agent answers
``__FMP__ ID pid PID`` once the command runs, then ``__FMP__ ID 1|2 LEN`` and LEN bytes
of stdout or stderr as they are written (up to the output cap), then
``__FMP__ ID end RC TIMEDOUT OUTBYTES ERRBYTES``.  The host's frames to it are
``__fm_in LEN`` and LEN bytes for the command's stdin, ``__fm_eof`` and, after the end,
``__fm_end``; the agent then answers ``__FMP__ ID idle`` and the channel serves the next
command.  Signals go over another channel (``kill`` of the command's process group), so
a command that does not read its input can never hold a signal back.
"""

from __future__ import annotations

import asyncio
import inspect
import re
import signal as _signal
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, Protocol

from .. import clock, timers
from ..errors import SandboxClosedError, SandboxTimeout, SpecError
from ..remote.runner import Channel
from ..specs import ExecResult
from ._common import _Agent, _frame_head, _read_exactly, _read_line, _result, truncation_marker

_FRAME = re.compile(rb"^__FMP__ (\d+) (1|2|pid|end|idle)((?: -?\d+)*)\n$")
_STDIN_CHUNK = 1 << 20
_END_GRACE_S = 10.0


class ProcessStream:
    """One output stream of a :class:`Process`: ``async for chunk in stream`` yields the
    bytes as they arrive, in order, then (if the output cap cut it) the truncation marker
    that ``exec`` would append, and ends when the process does.  One consumer."""

    def __init__(self) -> None:
        self._q: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._parts: list[bytes] = []
        self._ended = False

    def _feed(self, data: bytes) -> None:
        self._parts.append(data)
        self._q.put_nowait(data)

    def _end(self, tail: bytes = b"") -> None:
        if not self._ended:
            self._ended = True
            if tail:
                self._q.put_nowait(tail)
            self._q.put_nowait(None)

    def data(self) -> bytes:
        return b"".join(self._parts)

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._iter()

    async def _iter(self) -> AsyncIterator[bytes]:
        while True:
            chunk = await self._q.get()
            if chunk is None:
                self._q.put_nowait(None)        # a second loop ends at once
                return
            yield chunk

    async def read(self) -> bytes:
        """Everything (until the process ends)."""
        return b"".join([c async for c in self])


class ProcessHost(Protocol):
    """What a :class:`Process` needs of the sandbox it runs in (a
    :class:`~flowmesh_sdk.sandbox.Sandbox` is one): named here, so that this module does
    not import the sandbox's."""

    name: str
    _procs: dict[Process, None]

    @property
    def closed(self) -> bool: ...

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]: ...

    async def _release(self, agent: _Agent | None, *, proc: bool = False, ok: bool = True) -> None: ...

    async def _call(self, script: bytes, stdin: bytes, timeout: float, cap: int, *,
                    urgent: bool = False) -> tuple[int, bool, bytes, bytes, int, int, float]: ...


class Process:
    """A running command.  ``pid`` is its pid in the sandbox; ``returncode`` is None
    until it ends."""

    def __init__(self, sandbox: ProcessHost, agent: _Agent, ident: int, cmd: str, cap: int,
                 binary: bool) -> None:
        self.sandbox = sandbox
        self.command = cmd
        self.pid = 0
        self.stdout = ProcessStream()
        self.stderr = ProcessStream()
        self.returncode: int | None = None
        self._agent: _Agent | None = agent
        self._id = ident
        self._cap = cap
        self._binary = binary
        self._t0 = clock.monotonic()
        self._done = asyncio.get_running_loop().create_future()
        self._stdin_closed = False
        self._wlock = asyncio.Lock()
        self._reader: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        state = "running" if self.returncode is None else f"exited {self.returncode}"
        return f"Process({self.command[:40]!r}, pid={self.pid}, {state})"

    async def _launch(self, script: bytes, timeout: float) -> None:
        assert self._agent is not None
        chan = self._agent.chan
        head = _frame_head("__fm_proc", self._id, f"{timeout:.3f}" if timeout else "0",
                           self._cap, script, 0)
        await chan.write(head + script)
        deadline = clock.monotonic() + 30.0
        raw = await _read_line_until(chan, deadline)
        m = _FRAME.match(raw)
        while m is None or int(m.group(1)) != self._id:
            if not raw:
                raise SandboxClosedError(f"{self.sandbox.name}: channel closed: {chan.stderr_tail()}")
            raw = await _read_line_until(chan, deadline)
            m = _FRAME.match(raw)
        if m.group(2) == b"pid":
            self.pid = int(m.group(3))
            self._reader = self.sandbox._spawn(self._read(timeout))
        else:       # the agent could not run it: the frames are already on their way
            self._reader = self.sandbox._spawn(self._read(timeout, first=raw))

    async def _read(self, timeout: float, first: bytes | None = None) -> None:
        assert self._agent is not None
        agent = self._agent
        chan = agent.chan
        ok = False
        try:
            raw = first
            while True:
                if raw is None:
                    raw = await chan.readline()
                if not raw:
                    raise SandboxClosedError(f"{self.sandbox.name}: channel closed while "
                                             f"{self.command[:40]!r} ran: {chan.stderr_tail()}")
                m = _FRAME.match(raw)
                raw = None
                if m is None or int(m.group(1)) != self._id:
                    continue
                kind, nums = m.group(2), [int(x) for x in m.group(3).split()]
                if kind in (b"1", b"2"):
                    data = await chan.readexactly(nums[0])
                    (self.stdout if kind == b"1" else self.stderr)._feed(data)
                elif kind == b"end":
                    rc, to, osz, esz = nums[0], nums[1] == 1, nums[2], nums[3]
                    out, err = self.stdout.data(), self.stderr.data()
                    self.stdout._end(truncation_marker(osz, len(out)).encode() if osz > len(out) else b"")
                    self.stderr._end(truncation_marker(esz, len(err)).encode() if esz > len(err) else b"")
                    self.returncode = rc
                    if not self._done.done():
                        self._done.set_result(_result(rc, to, out, err, osz, esz,
                                                      clock.monotonic() - self._t0, self._binary))
                    async with self._wlock:
                        await chan.write(b"__fm_end\n")
                    deadline = clock.monotonic() + _END_GRACE_S
                    while True:
                        raw = await _read_line_until(chan, deadline)
                        if not raw:
                            break
                        m = _FRAME.match(raw)
                        if m and int(m.group(1)) == self._id and m.group(2) == b"idle":
                            ok = True
                            break
                    return
        except asyncio.CancelledError:
            await self._lost(SandboxClosedError(f"{self.sandbox.name}: {self.command[:40]!r} "
                                                "was abandoned"))
            raise
        except (Exception, asyncio.TimeoutError) as exc:   # noqa: BLE001 - reported through wait()
            await self._lost(exc if isinstance(exc, SandboxClosedError) else SandboxClosedError(
                f"{self.sandbox.name}: lost {self.command[:40]!r}: {exc}"), cause=exc)
        finally:
            self._agent = None
            self.sandbox._procs.pop(self, None)
            await asyncio.shield(self.sandbox._release(agent, proc=True, ok=ok))

    async def _lost(self, exc: BaseException, cause: BaseException | None = None) -> None:
        if cause is not None and exc is not cause:
            exc.__cause__ = cause
        self.stdout._end()
        self.stderr._end()
        if not self._done.done():
            self._done.set_exception(exc)
            self._done.exception()           # retrieved: no "never retrieved" warning

    # ---- the public side -----------------------------------------------------------
    @property
    def done(self) -> bool:
        return self._done.done()

    async def wait(self, timeout_s: float | None = None) -> ExecResult:
        """The command's :class:`ExecResult` once it ends (the output as ``exec`` would
        give it, capped the same way).  ``timeout_s`` bounds the wait only (the process
        keeps running): :class:`SandboxTimeout` past it."""
        try:
            async with timers.timeout(timeout_s):
                return await asyncio.shield(self._done)
        except TimeoutError as exc:
            raise SandboxTimeout(f"{self.sandbox.name}: {self.command[:40]!r} still running "
                                 f"after {timeout_s} s") from exc

    def kill(self, sig: int = _signal.SIGKILL) -> asyncio.Task[None]:
        """Send ``sig`` (default SIGKILL) to the command's process group.  Returns a task:
        ``await proc.kill()`` waits until the signal was sent."""
        if not isinstance(sig, int) or not 0 < int(sig) < 65:
            raise SpecError("signal", f"must be a signal number, got {sig!r}")
        return self.sandbox._spawn(self._kill(int(sig)))

    async def _kill(self, sig: int) -> None:
        if self.done or self.pid <= 0 or self.sandbox.closed:
            return
        await self.sandbox._call(f"kill -{sig} -{self.pid} 2>/dev/null || kill -{sig} {self.pid}\n".encode(),
                                 b"", 30.0, 4096, urgent=True)

    async def write_stdin(self, data: bytes | str) -> None:
        """Append ``data`` to the command's standard input (any bytes)."""
        raw = data.encode() if isinstance(data, str) else bytes(data)
        if self._stdin_closed:
            raise SpecError("stdin", "was closed")
        if self.done or self._agent is None:
            raise SandboxClosedError(f"{self.sandbox.name}: {self.command[:40]!r} has ended")
        chan = self._agent.chan
        async with self._wlock:
            if self.returncode is not None:
                raise SandboxClosedError(f"{self.sandbox.name}: {self.command[:40]!r} has ended")
            for i in range(0, len(raw), _STDIN_CHUNK):
                part = raw[i:i + _STDIN_CHUNK]
                await chan.write(b"__fm_in %d\n" % len(part) + part)

    async def close_stdin(self) -> None:
        """End the command's standard input (it reads end-of-file)."""
        if self._stdin_closed:
            return
        self._stdin_closed = True
        if self.done or self._agent is None:
            return
        async with self._wlock:
            if self.returncode is None:
                await self._agent.chan.write(b"__fm_eof\n")


async def _read_line_until(chan: Channel, deadline: float) -> bytes:
    return await _read_line(chan, deadline)


async def _pump(stream: ProcessStream, callback: Callable[[bytes], object]) -> None:
    async for chunk in stream:
        res = callback(chunk)
        if inspect.isawaitable(res):
            await res


__all__ = ["Process", "ProcessHost", "ProcessStream", "_read_exactly"]
