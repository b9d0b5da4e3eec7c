"""The agent channels of a :class:`~flowmesh_sdk.sandbox.Sandbox`: opening one (the agent
started and warmed), the pool of idle ones (``EXEC_CHANNELS`` for ``exec`` and the file
calls), one framed command and its answer over a held channel, and killing what a lost
channel ran.  A sandbox owns one :class:`AgentChannels` and calls it; the component is
given what it uses (the runtime, the container, the name for messages, the agent's text,
the sandbox's frame counter, the channel limit) and keeps the channel state itself: the
idle pool, the busy counts, every channel opened, and whether the sandbox is closed or
aborted."""

from __future__ import annotations

import asyncio
import itertools
import re
import weakref

from .. import clock, timers
from ..errors import SandboxClosedError, SandboxTimeout
from ..remote.runner import Channel
from ..remote.runtime import ContainerRuntime
from ..specs import SandboxSpec
from ._agent import AGENT
from ._common import _Agent, _frame_head, _read_line
from ._host_scripts import KILL_AGENT, SIGNAL_TREE

EXEC_CHANNELS = 4                     # channels exec and the file calls may use at once
_HOST_GRACE_S = 15.0                  # agent must answer within timeout + grace
_AGENT_BYTES = AGENT.encode()

_HEADER = re.compile(rb"^__FM__ (\d+) (-?\d+) ([01]) (\d+) (\d+)\n$")

__all__ = ["EXEC_CHANNELS", "AgentChannels", "agent_text"]


def agent_text(spec: SandboxSpec) -> bytes:
    """What a shell channel is sent to become an agent, for a sandbox of ``spec``."""
    # under gVisor the agent cannot read the process limit (no cgroup files inside): it is told
    if spec.kernel == "gvisor":
        return f"__fm_gv={int(spec.pids)}\n".encode() + _AGENT_BYTES
    return _AGENT_BYTES


class AgentChannels:
    """The channel side of one sandbox (owned by a :class:`~flowmesh_sdk.sandbox.Sandbox`).

    ``agent`` is asked for the agent's text each time one is opened (the sandbox's spec
    may be replaced while it is warm); ``ids`` numbers the frames, shared with the
    sandbox's other uses of it; at most ``limit`` channels serve ``exec`` and the file
    calls at once (processes and urgent calls are not counted)."""

    def __init__(self, runtime: ContainerRuntime, container_id: str, name: str, *,
                 spec: SandboxSpec, ids: itertools.count[int],
                 limit: int = EXEC_CHANNELS, shell: Channel | None = None) -> None:
        self.runtime = runtime
        self.container_id = container_id
        self.name = name
        self.limit = limit
        self.spec = spec   # its agent's start script is written from it (agent_text)
        self._ids = ids
        self.idle: list[_Agent] = []
        self.exec_busy = 0
        self._opening = 0
        self._freed: list[asyncio.Future[None]] = []   # acquire()s waiting for a channel
        self.closed = False
        self.aborted: Exception | None = None
        # every channel opened, for abort: weak references, pruned as they pile up (a WeakSet
        # is five objects for the collector to walk, per sandbox)
        self._chans: list[weakref.ref[Channel]] = []
        self._prune_at = 8
        # a shell that came with the container (ContainerRuntime.start): the first agent's
        self._shell = shell
        if shell is not None:
            self._chans.append(weakref.ref(shell))

    # ---- the sandbox's lifecycle, channel side ---------------------------------
    async def prime(self) -> None:
        """Open the first agent channel unless one is idle and alive or one is busy."""
        if not any(a.chan.alive for a in self.idle) and self.exec_busy == 0:
            self.idle.append(await self.open_agent())

    async def close(self) -> None:
        """Count as closed and close the idle channels (busy ones close when released)."""
        self.closed = True
        if self._shell is not None:
            shell, self._shell = self._shell, None
            await shell.close()
        idle, self.idle = self.idle, []
        for agent in idle:
            await agent.chan.close()

    def wake(self) -> None:
        """Wake every call waiting for a channel (it sees the sandbox closed, or one free)."""
        waiting, self._freed = self._freed, []
        for fut in waiting:
            if not fut.done():
                fut.set_result(None)

    def abort(self, exc: Exception) -> list[Channel]:
        """Count as closed and aborted by ``exc``, and abort every channel opened; the
        channels are returned for :meth:`close_aborted` (in the background)."""
        self.closed = True
        self.aborted = exc
        self.idle = []
        chans = [c for r in self._chans if (c := r()) is not None]
        for chan in chans:
            chan.abort(exc)
        return chans

    async def close_aborted(self, chans: list[Channel]) -> None:
        self.wake()   # exec calls waiting for a channel see the sandbox closed
        await asyncio.gather(*(chan.close() for chan in chans), return_exceptions=True)

    # ---- channels ---------------------------------------------------------------
    def track(self, chan: Channel) -> None:
        """Know ``chan`` for :meth:`abort` (aborted at once where the sandbox already is)."""
        if len(self._chans) >= self._prune_at:
            self._chans = [r for r in self._chans if r() is not None]
            self._prune_at = 2 * len(self._chans) + 8
        self._chans.append(weakref.ref(chan))
        if self.aborted is not None:
            chan.abort(self.aborted)

    async def open_shell(self) -> Channel:
        """A shell channel into the container (for an agent or a session), known to
        :meth:`abort`."""
        chan = await self.runtime.open_shell(self.container_id)
        self.track(chan)
        return chan

    async def open_agent(self) -> _Agent:
        """A new agent: on the shell that came with the container if it is still unused,
        else on a channel opened for it."""
        chan, self._shell = self._shell, None
        if chan is None:
            chan = await self.open_shell()
        try:
            await chan.write(agent_text(self.spec))
            deadline = clock.monotonic() + 30.0
            while True:
                try:
                    line = await _read_line(chan, deadline)
                except asyncio.TimeoutError as exc:
                    raise SandboxClosedError(f"{self.name}: the sandbox agent did not start: "
                                             f"{chan.stderr_tail()}") from exc
                if line.startswith(b"__FM_READY__"):
                    break
                if not line:
                    raise SandboxClosedError(f"{self.name}: sandbox shell did not start: "
                                             f"{chan.stderr_tail()}")
            parts = line.split()
            agent = _Agent(chan, int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0)
            # One no-op command warms the agent (its first fork/exec of each tool), so
            # the caller's first exec costs what every later one does.
            try:
                await self.exchange(chan, b":\n", b"", 30.0, 0)
            except asyncio.TimeoutError as exc:
                raise SandboxClosedError(f"{self.name}: the sandbox agent did not answer: "
                                         f"{chan.stderr_tail()}") from exc
            return agent
        except BaseException:
            await chan.close()
            raise

    async def acquire(self, *, proc: bool = False) -> _Agent:
        """An idle agent channel, or a new one (``exec`` waits past ``limit``)."""
        while True:
            if self.closed:
                raise SandboxClosedError(f"{self.name} is closed")
            while self.idle:
                agent = self.idle.pop()
                if agent.chan.alive:
                    if not proc:
                        self.exec_busy += 1
                    return agent
                await agent.chan.close()
            if proc or self.exec_busy + self._opening < self.limit:
                self._opening += 1
                try:
                    agent = await self.open_agent()
                finally:
                    self._opening -= 1
                if self.closed:
                    await agent.chan.close()
                    raise SandboxClosedError(f"{self.name} is closed")
                if not proc:
                    self.exec_busy += 1
                return agent
            fut = asyncio.get_running_loop().create_future()
            self._freed.append(fut)
            await fut

    def give_back(self, agent: _Agent, *, proc: bool = False) -> bool:
        """An agent that answered goes back among the idle ones at once, without awaiting
        (the common end of every command): True.  False when it cannot be kept (its channel
        ended, the sandbox closed, enough idle already): then :meth:`release` closes it."""
        if not agent.chan.alive or self.closed or len(self.idle) >= self.limit:
            return False
        if not proc:
            self.exec_busy -= 1
        self.idle.append(agent)
        self.wake()
        return True

    async def release(self, agent: _Agent | None, *, proc: bool = False, ok: bool = True) -> None:
        if agent is not None and ok and self.give_back(agent, proc=proc):
            return
        if not proc:
            self.exec_busy -= 1
        if agent is not None and self.aborted is None:   # an aborted sandbox's channels are closed by abort()
            await agent.chan.close()
            if not ok and not self.closed:
                await self.kill_agent(agent.pid)
        self.wake()

    async def ensure_open(self) -> None:
        if self.closed:
            raise SandboxClosedError(f"{self.name} is closed")

    # ---- commands ---------------------------------------------------------------
    async def call(self, script: bytes, stdin: bytes, timeout: float, cap: int, *,
                   urgent: bool = False) -> tuple[int, bool, bytes, bytes, int, int, float]:
        """One buffered command on a free channel.  ``urgent`` (signals) never waits for
        the ``limit``: it takes an idle channel or opens one."""
        await self.ensure_open()
        agent = await self.acquire(proc=urgent)
        ok = False
        try:
            res = await self.exchange(agent.chan, script, stdin, timeout, cap)
            ok = True
            return res
        except asyncio.TimeoutError as exc:
            raise SandboxTimeout(f"{self.name}: no answer from the sandbox within "
                                 f"{timeout + _HOST_GRACE_S:.0f} s") from exc
        finally:
            # A channel in an unknown state is dropped and what it ran is killed (shielded:
            # that happens even if the caller is cancelled); one that answered is kept.
            if not (ok and self.give_back(agent, proc=urgent)):
                await asyncio.shield(self.release(agent, proc=urgent, ok=ok))

    async def exchange(self, chan: Channel, script: bytes, stdin: bytes, timeout: float, cap: int
                       ) -> tuple[int, bool, bytes, bytes, int, int, float]:
        """One frame out, one answer back (the caller holds the channel)."""
        ident = next(self._ids)
        t0 = clock.monotonic()
        # A short script (text, newline-terminated) goes as lines the agent reads with
        # the `read` builtin (no fork); a long one as bytes it copies with dd.
        head = _frame_head("__fm_run", ident, f"{timeout:.3f}", cap, script, len(stdin))
        if len(stdin) < (1 << 16):
            await chan.write(head + script + stdin)
        else:   # no copy of a large payload
            await chan.write(head + script)
            await chan.write(stdin)
        # one deadline for the whole answer, not one per read
        async with timers.timeout(timeout + _HOST_GRACE_S - (clock.monotonic() - t0)):
            while True:
                raw = await chan.readline()
                if not raw:
                    raise SandboxClosedError(f"{self.name}: channel closed: {chan.stderr_tail()}")
                m = _HEADER.match(raw)
                if m and int(m.group(1)) == ident:
                    break
            rc, to, osz, esz = (int(m.group(2)), m.group(3) == b"1",
                                int(m.group(4)), int(m.group(5)))
            n_out, n_err = min(osz, cap), min(esz, cap)
            out = await chan.readexactly(n_out) if n_out else b""
            err = await chan.readexactly(n_err) if n_err else b""
        return rc, to, out, err, osz, esz, clock.monotonic() - t0

    async def kill_agent(self, pid: int) -> None:
        """Kill a lost channel's agent and all it started (other channels' commands,
        sessions and processes are left alone)."""
        try:
            if pid > 0:
                argv = ["sh", "-c", KILL_AGENT, "sh", str(pid)]
            else:
                argv = ["sh", "-c", "kill -9 -1"]
            await self.runtime.exec_once(self.container_id, argv, timeout_s=30)
        except Exception:  # noqa: BLE001 - best effort; the container is removed on close
            pass

    async def signal_tree(self, shell_pid: int, since_cs: int, tree_sig: int,
                          shell_sig: int | None) -> None:
        """Signal what a session's command started (see ``SIGNAL_TREE``)."""
        script = (f"set -- {shell_pid} {since_cs} {tree_sig} {shell_sig or ''}\n".encode()
                  + SIGNAL_TREE.encode())
        await self.call(script, b"", 30.0, 4096, urgent=True)
