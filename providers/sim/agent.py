"""The sandbox agent and session shells of a simulated container, on virtual time.

A held-open ``podman exec -i CTR /bin/sh`` channel of a :class:`~.machine.SimMachine`
answers the framing of :mod:`flowmesh_sdk.sandbox` the way the real agent does:

* ``__fm_run`` (``exec`` and the file calls): one ``__FM__`` answer;
* ``__fm_proc`` (``start``, ``exec(on_stdout=)``): ``__FMP__ ID pid``, the output, ``end``,
  then ``idle`` after the host's ``__fm_end``; stdin frames are read and dropped;
* a session shell (``Sandbox.session``): ``__FM_BOOT__`` and ``__FM_SREADY__``, then
  ``__FMS__`` and ``__FM__`` per ``__fm_srun``.

A command ``sim-work SECONDS [EXIT]`` takes that long and prints ``ok``; any other script
ends at once with exit code 0.  Signals arrive as the host sends them, as a command on
another channel (``kill -SIG -PID`` for a process, the session signal script for a
session's command), and end the signalled command with 128 + SIG.

The container these channels run in (:class:`SimContainer`: its channels and running
jobs) is recorded here too; the machine is known through :class:`SimHost` only.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol

from flowmesh_sdk import clock
from flowmesh_sdk.errors import ProviderUnavailableError
from flowmesh_sdk.remote.runner import StreamChannel

WORK = re.compile(rb"sim-work\s+([0-9]+(?:\.[0-9]+)?)(?:\s+(-?[0-9]+))?")
# KIND ID TIMEOUT CAP SCRIPT_LEN STDIN_LEN [LINES]; a session's: __fm_srun ID CAP SCRIPT_LEN LINES
_HEAD = re.compile(rb"^(__fm_run|__fm_proc) (\d+) ([0-9.]+) (\d+) (\d+) (\d+)(?: \d+)?\n")
_SRUN = re.compile(rb"^__fm_srun (\d+) (\d+) (\d+) \d+\n")
_STDIN = re.compile(rb"^__fm_in (\d+)\n")
_KILL = re.compile(rb"^kill -(\d+) -(\d+) ")                       # Process.kill
_SIGNAL = re.compile(rb"^set -- (\d+) \d+ (\d+) ")                 # the session signal script


class SimHost(Protocol):
    """What a channel needs of its machine (a :class:`~.machine.SimMachine` is one): named
    here, so that this module does not import the machine's."""

    label: str
    alive: bool
    work_done_s: float

    def _check(self) -> None: ...


class SimChannel(StreamChannel):
    def __init__(self, machine: SimHost) -> None:
        self.machine = machine
        self._out = asyncio.StreamReader()
        err = asyncio.StreamReader()
        err.feed_eof()
        super().__init__(self._out, err)
        self._open = True

    @property
    def alive(self) -> bool:
        return self._open and self.machine.alive

    def hang_up(self) -> None:
        if self._open:
            self._open = False
            self._out.feed_eof()

    def say(self, data: bytes) -> None:
        """Put ``data`` on the channel's stdout (what the machine writes before the shell)."""
        self._out.feed_data(data)

    async def close(self) -> None:
        self.hang_up()


class FailedChannel(SimChannel):
    """A channel whose process ended at once, saying ``stderr`` (``podman run -i`` that
    could not start its container)."""

    def __init__(self, machine: SimHost, stderr: bytes) -> None:
        super().__init__(machine)
        self._err.append(stderr.decode("utf-8", "replace").rstrip())
        self.hang_up()

    async def write(self, data: bytes) -> None:
        raise ProviderUnavailableError(f"{self.machine.label}: channel closed", provider="sim")


class EchoShell(SimChannel):
    """``sh`` on the machine, for bootstrap's agent step: answers ``echo WORD``."""

    async def write(self, data: bytes) -> None:
        self.machine._check()
        for line in data.splitlines():
            if line.startswith(b"echo "):
                self._out.feed_data(line[5:] + b"\n")


class SimJob:
    """A running command: ``seconds`` of virtual work unless a signal ends it first."""

    def __init__(self, script: bytes, timeout: float) -> None:
        w = WORK.search(script)
        self.seconds, self.rc, self.out = 0.0, 0, b""
        if w is not None:
            self.seconds, self.rc, self.out = float(w.group(1)), int(w.group(2) or 0), b"ok\n"
        self.timed_out = bool(timeout) and self.seconds > timeout
        if self.timed_out:
            self.seconds, self.rc, self.out = timeout, 137, b""
        self._signal: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def kill(self, sig: int) -> None:
        if not self._signal.done():
            self._signal.set_result(sig)

    async def run(self, machine: SimHost) -> None:
        t0 = clock.monotonic()
        if self.seconds:
            end = asyncio.get_running_loop().call_later(self.seconds, self.kill, 0)   # 0: the work's end
            try:
                sig = await self._signal
            finally:
                end.cancel()
            if sig:
                self.rc, self.out, self.timed_out = 128 + sig, b"", False
        machine.work_done_s += clock.monotonic() - t0


@dataclass
class SimContainer:
    id: str
    name: str
    image: str
    labels: dict[str, str]
    channels: list[AgentShell] = field(default_factory=list)
    jobs: dict[int, SimJob] = field(default_factory=dict)      # running processes and session commands by pid
    last_pid: int = 1

    def new_pid(self) -> int:
        self.last_pid += 1
        return self.last_pid


class AgentShell(SimChannel):
    """The agent (or a session shell) inside a container."""

    def __init__(self, machine: SimHost, container: SimContainer) -> None:
        super().__init__(machine)
        self.container = container
        self._tasks: set[asyncio.Task[None]] = set()
        self._buf = b""
        self._session_pid = 0
        self._proc = 0                   # the id of the streamed process this channel serves

    async def write(self, data: bytes) -> None:
        self.machine._check()
        if not self._open:
            raise ProviderUnavailableError(f"{self.machine.label}: channel closed", provider="sim")
        if b"echo __FM_READY__" in data:
            self._out.feed_data(b"__FM_READY__ %d\n" % self.container.new_pid())
            return
        if b"__FM_BOOT__" in data:
            self._out.feed_data(b"__FM_BOOT__ /bin/sh\n")
            return
        if b"echo __FM_SREADY__" in data:
            self._session_pid = self.container.new_pid()
            self._out.feed_data(b"__FM_SREADY__ %d\n" % self._session_pid)
            return
        self._buf += data
        while self._frame():
            pass

    def _frame(self) -> bool:
        """Take one frame off the buffer (False: it is not all here yet)."""
        buf = self._buf
        if b"\n" not in buf:
            return False
        if buf.startswith((b"__fm_run ", b"__fm_proc ")):
            m = _HEAD.match(buf)
            if m is None:
                return self._drop_line()
            end = m.end() + int(m.group(5)) + int(m.group(6))
            if len(buf) < end:
                return False
            script = buf[m.end():m.end() + int(m.group(5))]
            self._buf = buf[end:]
            ident, timeout, cap = int(m.group(2)), float(m.group(3)), int(m.group(4))
            if m.group(1) == b"__fm_run":
                self._spawn(self._answer(ident, timeout, cap, script))
            else:
                self._proc = ident
                self._spawn(self._stream(ident, timeout, cap, script))
            return True
        if buf.startswith(b"__fm_srun "):
            m = _SRUN.match(buf)
            if m is None:
                return self._drop_line()
            end = m.end() + int(m.group(3))
            if len(buf) < end:
                return False
            script, self._buf = buf[m.end():end], buf[end:]
            self._spawn(self._session_run(int(m.group(1)), int(m.group(2)), script))
            return True
        m = _STDIN.match(buf)
        if m is not None:
            end = m.end() + int(m.group(1))
            if len(buf) < end:
                return False
            self._buf = buf[end:]          # a simulated command reads no input
            return True
        if buf.startswith(b"__fm_end\n") and self._proc:
            self._out.feed_data(b"__FMP__ %d idle\n" % self._proc)
            self._proc = 0
        return self._drop_line()           # __fm_eof, __fm_sloop, anything else

    def _drop_line(self) -> bool:
        self._buf = self._buf.split(b"\n", 1)[1]
        return True

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        t = asyncio.ensure_future(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    def _signal(self, script: bytes) -> bytes:
        """Deliver a signal the host sent as a command; what the command prints."""
        m = _KILL.match(script)
        if m is not None:
            job = self.container.jobs.get(int(m.group(2)))
            if job is not None:
                job.kill(int(m.group(1)))
            return b""
        m = _SIGNAL.match(script)
        if m is not None:
            job = self.container.jobs.get(int(m.group(1)))
            if job is not None:
                job.kill(int(m.group(2)))
            return b"signalled: %s\n" % m.group(1)
        return b""

    async def _answer(self, ident: int, timeout: float, cap: int, script: bytes) -> None:
        out = self._signal(script)
        job = SimJob(script, timeout)
        await job.run(self.machine)
        if self.alive:
            body = (out or job.out)[:cap]
            self._out.feed_data(b"__FM__ %d %d %d %d 0\n" % (ident, job.rc, job.timed_out, len(body)) + body)

    async def _stream(self, ident: int, timeout: float, cap: int, script: bytes) -> None:
        job = SimJob(script, timeout)
        pid = self.container.new_pid()
        self.container.jobs[pid] = job
        self._out.feed_data(b"__FMP__ %d pid %d\n" % (ident, pid))
        try:
            await job.run(self.machine)
        finally:
            self.container.jobs.pop(pid, None)
        if self.alive:
            body = job.out[:cap]
            if body:
                self._out.feed_data(b"__FMP__ %d 1 %d\n" % (ident, len(body)) + body)
            self._out.feed_data(b"__FMP__ %d end %d %d %d 0\n" % (ident, job.rc, job.timed_out, len(job.out)))

    async def _session_run(self, ident: int, cap: int, script: bytes) -> None:
        job = SimJob(script, 0.0)
        self.container.jobs[self._session_pid] = job
        self._out.feed_data(b"__FMS__ %d 0\n" % ident)
        try:
            await job.run(self.machine)
        finally:
            self.container.jobs.pop(self._session_pid, None)
        if self.alive:
            body = job.out[:cap]
            self._out.feed_data(b"__FM__ %d %d 0 %d 0\n" % (ident, job.rc, len(body)) + body)

    def hang_up(self) -> None:
        for t in self._tasks:
            t.cancel()
        super().hang_up()
        # its container no longer lists it: the two would otherwise hold each other until
        # the collector's next full pass (issue 29: the coordinator's heap is what it walks)
        with contextlib.suppress(ValueError):
            self.container.channels.remove(self)
