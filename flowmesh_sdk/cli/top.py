"""``flowmesh top``: a live terminal view of a fleet, read from the metadata store of this
``FLOWMESH_HOME`` (any process's fleet: the store is shared on disk) every ``--interval``.

:func:`snapshot` reads what the screen shows into a :class:`TopSnapshot`; :func:`render`
draws it with rich.  Nothing here changes the store.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from rich.console import Group
from rich.table import Table
from rich.text import Text

from ..control.store import MetadataStore

PHASES = ("queued", "scheduling", "env_startup", "execution", "teardown")
RECENT = 2000        # tasks the phase statistics are taken over (newest first)
WINDOW_S = 60.0      # throughput window


@dataclass(frozen=True, slots=True)
class PhaseStat:
    phase: str
    mean_s: float
    p95_s: float
    max_s: float


@dataclass(frozen=True, slots=True)
class TopSnapshot:
    at: float
    fleet: str | None
    places: tuple[tuple[str, str, str, int], ...]     # provider, region, state, instances
    tasks: dict[str, int]                             # state -> count
    finished_last_window: int
    failovers: int
    refusals: int
    spent_usd: float
    burn_usd_per_hour: float
    phases: tuple[PhaseStat, ...]                     # slowest mean first
    slowest: tuple[tuple[str, str, float], ...]       # (task, pool, seconds) of the slowest recent tasks


def _p95(values: list[float]) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, int(0.95 * len(s)))]


def snapshot(store: MetadataStore, fleet: str | None = None, now: float | None = None) -> TopSnapshot:
    at = time.time() if now is None else now
    recent = [t for t in store.tasks(limit=RECENT) if fleet is None or t.fleet == fleet]
    stats = []
    for name in PHASES:
        vals = [v for t in recent if (v := getattr(t, f"{name}_s")) is not None]
        stats.append(PhaseStat(name, sum(vals) / len(vals) if vals else 0.0, _p95(vals), max(vals, default=0.0)))
    stats.sort(key=lambda s: s.mean_s, reverse=True)
    totals = []
    for t in recent:
        parts = [getattr(t, f"{n}_s") for n in PHASES]
        if t.finished_at is not None and any(p is not None for p in parts):
            totals.append((t.name, t.pool, sum(p or 0.0 for p in parts)))
    totals.sort(key=lambda x: x[2], reverse=True)
    decisions = [d for d in store.decisions(limit=1_000_000) if fleet is None or d.fleet == fleet]
    spend = [r for r in store.spend(now=at) if fleet is None or r.fleet == fleet]
    return TopSnapshot(
        at=at, fleet=fleet, places=tuple(store.instance_places(fleet=fleet)), tasks=store.task_counts(fleet=fleet),
        finished_last_window=sum(store.task_counts(fleet=fleet, finished_since=at - WINDOW_S).values()),
        failovers=sum(d.kind == "failover" for d in decisions), refusals=sum(d.kind == "refused" for d in decisions),
        spent_usd=sum(r.spent for r in spend), burn_usd_per_hour=sum(r.burn_per_hour for r in spend),
        phases=tuple(stats), slowest=tuple(totals[:5]))


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f}" if seconds < 10 else f"{seconds:,.1f} s"


def render(s: TopSnapshot, home: str) -> Group:
    head = Text.assemble(
        ("flowmesh top", "bold"), f"  {home}" + (f"  fleet {s.fleet}" if s.fleet else "  all fleets"),
        f"  {time.strftime('%H:%M:%S', time.localtime(s.at))}\n",
        ("throughput ", "bold"), f"{s.finished_last_window} tasks in the last {WINDOW_S:.0f} s "
        f"({s.finished_last_window / WINDOW_S * 60:.1f}/min)   ",
        ("failovers ", "bold"), f"{s.failovers}   ", ("budget refusals ", "bold"), f"{s.refusals}   ",
        ("spent ", "bold"), f"${s.spent_usd:,.4f}   ", ("burn ", "bold"), f"${s.burn_usd_per_hour:,.4f}/h")
    inst = Table(title="instances (not terminated)", title_justify="left")
    for col in ("provider", "region", "state", "instances"):
        inst.add_column(col, justify="right" if col == "instances" else "left")
    for provider, region, state, n in s.places:
        inst.add_row(provider or "?", region or "?", state, str(n))
    if not s.places:
        inst.add_row("-", "-", "-", "0")
    tasks = Table(title="tasks by phase", title_justify="left")
    tasks.add_column("state")
    tasks.add_column("tasks", justify="right")
    order = ("submitted", "running", "succeeded", "failed", "timed_out", "rejected", "cancelled")
    for state in sorted(s.tasks, key=lambda x: order.index(x) if x in order else len(order)):
        tasks.add_row(state, str(s.tasks[state]))
    phases = Table(title="phases, slowest first (ms)", title_justify="left")
    for col in ("phase", "mean", "p95", "max"):
        phases.add_column(col, justify="left" if col == "phase" else "right")
    for p in s.phases:
        phases.add_row(p.phase, _ms(p.mean_s), _ms(p.p95_s), _ms(p.max_s))
    slow = Table(title="slowest recent tasks", title_justify="left")
    for col in ("task", "pool", "total"):
        slow.add_column(col, justify="right" if col == "total" else "left")
    for name, pool, total in s.slowest:
        slow.add_row(name, pool, _ms(total))
    grid = Table.grid(padding=(1, 3))
    grid.add_row(inst, tasks)
    grid.add_row(phases, slow)
    return Group(head, grid)


def as_json(s: TopSnapshot) -> str:
    from .output import document
    return json.dumps(document("top", snapshot=s))
