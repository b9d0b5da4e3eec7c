"""How the metadata store (:mod:`.store`) writes a batch of events, on its writer thread.

Each event becomes a row of one of a few statements: a pool's creation or drain, an
instance's upsert, its charge, a launch decision, a task's submission, start or end, a
reuse outcome.  :func:`write` groups a batch's rows by statement and writes each group as
multi-row statements of up to :data:`CHUNK` rows (what is left over in chunks of the powers
of two, whose statements SQLite keeps prepared), the groups in an order that keeps every
row's history (a task's submission before its start before its end; an instance's events
in the order they came, folded into one row per instance that ends as they would: most of
an instance's life -- requested, running, ready; draining, terminating, terminated -- is
seconds apart, and a batch gathers them).  The store is handed only the kinds of event it
writes (:data:`RECORDED`).  A pool's rows, a few in a fleet's life, are written one by one in
the order they came (a pool drained and made again in one batch ends up not drained).

Why not one statement per event: SQLite lets go of Python's GIL while it steps a
statement, and the writer thread must then win the GIL back from the event loop's thread.
It waits at least the interpreter's switch interval (5 ms), and longer while the loop's
thread lets go of the GIL briefly and takes it back (each poll of its selector restarts
that wait): 57 ms a statement on average beside the simulator's never-idle loop.  With one
statement per event the writer's queue grew without bound (912,278 events held 12.5 hours
into a 100,000-task run on the simulator, issue 29: memory, and what a crash would lose);
with a statement per chunk of rows it holds a fifth as many on average at 10,000 tasks.
"""

from __future__ import annotations

import functools
import json
import logging
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from ..catalog.profiles import profile
from .events import TASK_END, Event, EventKind

log = logging.getLogger("flowmesh.store")

_Row = tuple[object, ...]
_Entry = tuple[str, _Row]   # a row to write and the kind of the event it records

CHUNK = 1024   # most rows in one statement (fewer where SQLite allows fewer variables)

_INSTANCE_STATE = {
    EventKind.INSTANCE_REQUESTED: "requested", EventKind.INSTANCE_RUNNING: "running",
    EventKind.INSTANCE_READY: "ready", EventKind.INSTANCE_DRAINING: "draining",
    EventKind.INSTANCE_FAILED: "failed", EventKind.INSTANCE_TERMINATED: "terminated",
    EventKind.INSTANCE_STOPPED: "stopped", EventKind.INSTANCE_TERMINATING: "terminating",
    EventKind.INSTANCE_TERMINATION_FAILED: "termination_failed",
}
_DECISIONS = {EventKind.LAUNCH_DECIDED: "decided", EventKind.LAUNCH_FAILOVER: "failover",
              EventKind.LAUNCH_REFUSED: "refused"}
_REUSE_OUTCOME = {
    EventKind.REUSE_HIT: "hit", EventKind.REUSE_JOINED: "joined", EventKind.REUSE_EXECUTED: "executed",
}
_TASK_STATE = {
    EventKind.TASK_SUCCEEDED: "succeeded", EventKind.TASK_FAILED: "failed",
    EventKind.TASK_TIMED_OUT: "timed_out", EventKind.TASK_REJECTED: "rejected",
    EventKind.TASK_CANCELLED: "cancelled",
}
#: the kinds of event the store records (the bus hands it only these)
RECORDED = frozenset({*_INSTANCE_STATE, *_DECISIONS, *_REUSE_OUTCOME, *TASK_END, EventKind.TASK_SUBMITTED,
                      EventKind.TASK_STARTED, EventKind.POOL_CREATED, EventKind.POOL_DRAINED})


@dataclass(frozen=True)
class _Statement:
    """A statement written for many rows at once: ``head``, the row placeholders repeated
    (comma-separated), ``tail``.  ``key``: for an UPDATE whose rows are joined on this
    column of the row, a batch keeps only the last row per key (a join with two rows for
    one target would take either).  ``fold``: for an upsert keyed on ``key``, the one row
    that leaves the table as the earlier row then the later would: a batch writes one row
    per key."""

    name: str
    head: str
    row: str
    tail: str = ""
    key: int | None = None
    fold: Callable[[_Row, _Row], _Row] | None = None

    @property
    def width(self) -> int:
        return self.row.count("?")

    def sql(self, rows: int) -> str:
        return _sql(self, rows)


@functools.cache
def _sql(stmt: _Statement, rows: int) -> str:
    """The statement for ``rows`` rows, made once (the chunk sizes are a few powers of two)."""
    return f"{stmt.head} {','.join([stmt.row] * rows)}{stmt.tail}"


# a pool's rows: written first, one by one, in the order they came
_POOL = _Statement("pool", "INSERT OR REPLACE INTO pools VALUES", "(?,?,?,?,NULL)")
_DRAINED = _Statement("drained", "UPDATE pools SET drained_at = v.column2 FROM (VALUES", "(?,?,?)",
                      ") AS v WHERE pools.fleet = v.column1 AND pools.name = v.column3")


def _fold_instance(old: _Row, new: _Row) -> _Row:
    """Two of an instance's rows as one: the first's id, fleet, pool, requested_at and run
    (what the insert sets), the last's state and detail, the latest ready_at and
    terminated_at given (what the updates set)."""
    return (*old[:3], new[3], old[4], new[5], old[6], old[7] if new[7] is None else new[7],
            old[8] if new[8] is None else new[8])


# then the rest, grouped, in this order: each row's history is kept (see the module docstring)
# an instance's every event: the row is made by whichever comes first (requested_at is its time);
# ready_at and terminated_at are set by their own events and kept by the others; a batch's rows
# of one instance are folded into one
_INSTANCE = _Statement(
    "instance", "INSERT INTO instances (id, fleet, pool, state, requested_at, detail, run, ready_at,"
    " terminated_at) VALUES", "(?,?,?,?,?,?,?,?,?)",
    " ON CONFLICT(id) DO UPDATE SET state=excluded.state, detail=excluded.detail,"
    " ready_at=COALESCE(excluded.ready_at, ready_at), terminated_at=COALESCE(excluded.terminated_at, terminated_at)",
    key=0, fold=_fold_instance)
_CHARGE = _Statement("charge", "INSERT OR REPLACE INTO charges (id, fleet, pool, provider, region, type, spot,"
                     " price_per_hour, billing_min_s, run) VALUES", "(?,?,?,?,?,?,?,?,?,?)")
_DECISION = _Statement("decision", "INSERT INTO decisions VALUES", "(?,?,?,?,?)")
_SUBMITTED = _Statement("submitted", "INSERT OR REPLACE INTO tasks (id, fleet, pool, name, state, submitted_at,"
                        " run) VALUES", "(?,?,?,?,'submitted',?,?)")
_STARTED = _Statement("started", "UPDATE tasks SET state='running', instance_id = v.column2 FROM (VALUES",
                      "(?,?)", ") AS v WHERE tasks.id = v.column1", key=0)
# a task's end: its row (made by task.submitted, or here when that was not recorded) takes the outcome
_ENDED = _Statement(
    "ended", "INSERT INTO tasks (id, fleet, pool, name, submitted_at, run, state, instance_id, exit_code, queued_s,"
    " scheduling_s, env_startup_s, execution_s, teardown_s, finished_at, detail, tenant, cost, infra_failure)"
    " VALUES", "(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
    " ON CONFLICT(id) DO UPDATE SET state=excluded.state,"
    " instance_id=COALESCE(excluded.instance_id, instance_id), exit_code=excluded.exit_code,"
    " queued_s=excluded.queued_s, scheduling_s=excluded.scheduling_s, env_startup_s=excluded.env_startup_s,"
    " execution_s=excluded.execution_s, teardown_s=excluded.teardown_s, finished_at=excluded.finished_at,"
    " detail=excluded.detail, tenant=excluded.tenant, cost=excluded.cost, infra_failure=excluded.infra_failure")
_REUSE = _Statement("reuse", "INSERT OR REPLACE INTO reuse VALUES", "(?,?,?,?,?,?,?,?,?,?,?,?)")
_ORDER = (_INSTANCE, _CHARGE, _DECISION, _SUBMITTED, _STARTED, _ENDED, _REUSE)


def write(c: sqlite3.Connection, events: Iterable[Event]) -> None:
    """Write ``events`` (in the order they happened) in the current transaction.  An event
    that cannot be recorded is logged and skipped: it does not lose the rest."""
    rows: dict[str, dict[object, _Entry]] = {s.name: {} for s in _ORDER}
    folded: dict[tuple[str, object], list[_Entry]] = {}   # the rows each folded row stands for
    for i, ev in enumerate(events):
        try:
            for stmt, row in _rows(ev):
                if stmt is _POOL or stmt is _DRAINED:
                    _execute(c, stmt, [(ev.kind.value, row)], folded)
                    continue
                # a keyed UPDATE keeps the last row per key, a keyed upsert folds them into one;
                # the rest keep every row, in order
                group = rows[stmt.name]
                key = i if stmt.key is None else row[stmt.key]
                if stmt.fold is not None and (had := group.get(key)) is not None:
                    folded.setdefault((stmt.name, key), [had]).append((ev.kind.value, row))
                    row = stmt.fold(had[1], row)
                group[key] = (ev.kind.value, row)
        except ValueError as exc:
            log.warning("metadata store: could not record %s: %s", ev.kind.value, exc)
    most = c.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
    for stmt in _ORDER:
        todo = list(rows[stmt.name].values())
        size = CHUNK
        while size > 1 and size * stmt.width > most:
            size //= 2
        start = 0
        while start < len(todo):
            while size > len(todo) - start:
                size //= 2   # what is left goes in chunks of the powers of two: a few statements
            _execute(c, stmt, todo[start:start + size], folded)
            start += size


def _execute(c: sqlite3.Connection, stmt: _Statement, chunk: Sequence[_Entry],
             folded: Mapping[tuple[str, object], list[_Entry]]) -> None:
    try:
        c.execute(stmt.sql(len(chunk)), [v for _, row in chunk for v in row])
    except (sqlite3.Error, ValueError, OverflowError) as exc:
        if len(chunk) > 1:
            for one in chunk:   # one bad row does not lose the others
                _execute(c, stmt, [one], folded)
        elif stmt.key is not None and (parts := folded.get((stmt.name, chunk[0][1][stmt.key]))):
            for part in parts:   # nor, where it is folded, the rows it stands for
                _execute(c, stmt, [part], {})
        else:
            log.warning("metadata store: could not record %s: %s", chunk[0][0], exc)


def _rows(ev: Event) -> Iterator[tuple[_Statement, _Row]]:
    """The statements' rows that record ``ev`` (none for an event the store does not keep);
    a row made before a ValueError (an instance's, before its charge's detail) is kept."""
    kind = ev.kind
    if kind in _INSTANCE_STATE:
        yield _INSTANCE, (ev.instance_id, ev.fleet, ev.pool, _INSTANCE_STATE[kind], ev.at, ev.detail, ev.run,
                          ev.at if kind is EventKind.INSTANCE_READY else None,
                          ev.at if kind is EventKind.INSTANCE_TERMINATED else None)
        if kind is EventKind.INSTANCE_REQUESTED and ev.detail.startswith("{"):
            d = json.loads(ev.detail)
            provider = str(d.get("provider", ""))
            yield _CHARGE, (ev.instance_id, ev.fleet, ev.pool, provider, d.get("region"), d.get("type"),
                            int(bool(d.get("spot"))), float(d.get("price_per_hour") or 0.0),
                            profile(provider).billing_min_s, ev.run)
    elif kind is EventKind.TASK_SUBMITTED:
        yield _SUBMITTED, (ev.task_id, ev.fleet, ev.pool, ev.task_name, ev.at, ev.run)
    elif kind is EventKind.TASK_STARTED:
        yield _STARTED, (ev.task_id, ev.instance_id)
    elif kind in TASK_END:
        p = ev.phases
        yield _ENDED, (ev.task_id, ev.fleet, ev.pool, ev.task_name, ev.at, ev.run, _TASK_STATE[kind],
                       ev.instance_id, ev.exit_code, p.queued if p else None, p.scheduling if p else None,
                       p.env_startup if p else None, p.execution if p else None,
                       p.teardown if p else None, ev.at, ev.detail, ev.tenant, ev.cost, ev.infra_failure)
    elif kind in _DECISIONS:
        yield _DECISION, (ev.fleet, ev.pool, _DECISIONS[kind], ev.detail, ev.at)
    elif kind in _REUSE_OUTCOME:
        d = json.loads(ev.detail or "{}")
        yield _REUSE, (ev.task_id, ev.fleet, ev.pool, ev.task_name, _REUSE_OUTCOME[kind],
                       d.get("h_task"), d.get("tenant"), d.get("workflow"), d.get("result"),
                       d.get("computed_by"), d.get("saved_s"), ev.at)
    elif kind is EventKind.POOL_CREATED:
        yield _POOL, (ev.fleet, ev.pool, ev.detail, ev.at)
    elif kind is EventKind.POOL_DRAINED:
        yield _DRAINED, (ev.fleet, ev.at, ev.pool)
