"""A pool's heartbeat: a machine that hangs silently (a frozen VM, a stopped sshd, a
black-holed network path: no FIN, no RST) is given up within a bound, not when a task's
own timeout runs out.

Every ``PoolSpec.heartbeat_s`` each machine under a READY instance of the pool is asked
to run ``true`` (:meth:`Runner.probe`; over SSH a new session channel on the very
transports that carry the held-open sandbox channels, so the transport, sshd and the
host are tested together), and must answer within one period.  One probe per machine,
not per sandbox or per instance (instances sharing a machine share its runner); at most
``MAX_CONCURRENT`` probes of a pool are in flight at once.  A runner that says its
machine cannot hang unnoticed (``Runner.needs_heartbeat``: this host's, a simulated
one) is never probed.  After ``PoolSpec.heartbeat_misses`` probes in a row without an
answer every READY instance on that machine is given up (``give_up`` of what it
watches, a :class:`Watched`: the pool's :class:`~.machines.Machines`, which fails,
reports and terminates it) and every sandbox open on it is aborted, so the task
waiting on it sees its instance lost and is dispatched again.

The bound: a hang at time h is acted on by ``h + heartbeat_s * (heartbeat_misses + 1)``
(the probe in flight, or the next one, starts within a period; each probe gives up after
one period; the next starts when the last failed) plus the time the event loop takes to
get there -- and, with more than ``MAX_CONCURRENT`` of a pool's machines hanging at once,
the wait for a probe's turn.  A miss is logged as a warning, a loss as an error
(``flowmesh.pools``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Protocol

from .. import clock
from ..errors import FlowMeshError
from ..lifecycle import InstanceState
from ..remote.runner import Runner
from .instance import ManagedInstance

log = logging.getLogger("flowmesh.pools")

MAX_CONCURRENT = 64   # probes of one pool in flight at once (the SSH runners' worker threads are 64)


class Watched(Protocol):
    """What a heartbeat watches (a pool's :class:`~.machines.Machines` is one): the pool's
    name, its instances, and how one of them is given up."""

    @property
    def pool(self) -> str: ...

    @property
    def instances(self) -> Mapping[str, ManagedInstance]: ...

    def give_up(self, mi: ManagedInstance, detail: str) -> None: ...


class Heartbeat:
    """The heartbeat of one pool's instances, as ``machines`` (a :class:`Watched`) holds
    them (see the module docstring).  :meth:`run` is the pool's daemon; it ends the
    per-machine loops when cancelled."""

    def __init__(self, machines: Watched, period_s: float, misses: int) -> None:
        self.machines = machines
        self.period_s = period_s
        self.misses = misses
        self._sem = asyncio.Semaphore(MAX_CONCURRENT)
        self._beats: dict[int, asyncio.Task[None]] = {}   # id(runner) -> its probe loop
        self.probes = 0   # probes sent (for stats and tests)

    @property
    def bound_s(self) -> float:
        """How long after a hang its instances are given up, at most (event loop lag aside)."""
        return self.period_s * (self.misses + 1)

    def _runners(self) -> dict[int, Runner]:
        return {id(mi.runtime.runner): mi.runtime.runner for mi in self.machines.instances.values()
                if mi.state is InstanceState.READY and mi.runtime.runner.needs_heartbeat}

    async def run(self) -> None:
        """Every period: a probe loop for each machine under a READY instance, the loops
        of machines with none left ended."""
        try:
            while True:
                runners = self._runners()
                for key in [k for k in self._beats if k not in runners]:
                    self._beats.pop(key).cancel()
                for key, runner in runners.items():
                    beat = self._beats.get(key)
                    if beat is not None and beat.done():   # only an error outside the error tree ends one
                        log.error("pool %s: the heartbeat of %s failed: %r", self.machines.pool, runner.label,
                                  beat.exception())
                        beat = None
                    if beat is None:
                        self._beats[key] = asyncio.ensure_future(self._beat(runner))
                await asyncio.sleep(self.period_s)
        finally:
            beats = list(self._beats.values())
            self._beats.clear()
            for t in beats:
                t.cancel()
            await asyncio.gather(*beats, return_exceptions=True)

    async def _beat(self, runner: Runner) -> None:
        missed = 0
        while True:
            started = clock.monotonic()
            try:
                async with self._sem:
                    self.probes += 1
                    await runner.probe(self.period_s)
                missed = 0
            except (FlowMeshError, OSError) as exc:
                missed += 1
                if missed >= self.misses:
                    self._lost(runner, f"heartbeat: no answer from {runner.label} in {self.period_s:g} s "
                                       f"({missed} misses): {exc}")
                    return
                log.warning("pool %s: heartbeat miss %d of %d on %s: %s", self.machines.pool, missed,
                            self.misses, runner.label, exc)
            await asyncio.sleep(max(0.0, started + self.period_s - clock.monotonic()))

    def _lost(self, runner: Runner, detail: str) -> None:
        lost = [mi for mi in self.machines.instances.values()
                if mi.state is InstanceState.READY and mi.runtime.runner is runner]
        log.error("pool %s: %s; giving up %s", self.machines.pool, detail, ", ".join(mi.id for mi in lost))
        self._beats.pop(id(runner), None)
        for mi in lost:
            self.machines.give_up(mi, detail)
