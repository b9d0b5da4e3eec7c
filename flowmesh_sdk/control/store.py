"""The metadata store: pools, instances and tasks with per-phase timings (SQLite).

It subscribes to the event bus and writes each event as it happens, on one worker
thread (the event loop never waits on the disk), so a crash loses at most the events
of the last moment, never a finished task that was already reported.

Schema versions: ``PRAGMA user_version`` says which of :data:`MIGRATIONS` a store has
(0: written before versions existed).  Opening a store runs the missing ones in order,
each in one ``BEGIN IMMEDIATE`` transaction that re-reads the version (two processes
opening an old store migrate it once); a store newer than this code is refused with
:class:`~flowmesh_sdk.errors.StoreSchemaError` rather than written wrongly.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..errors import StoreSchemaError
from . import store_writes
from .events import Event, EventBus
from .rows import ChargeRow, DecisionRow, InstanceRow, PoolRow, ReuseRow, ReuseSummary, SpendRow, TaskRow

log = logging.getLogger("flowmesh.store")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS pools (
  fleet TEXT, name TEXT, spec TEXT, created_at REAL, drained_at REAL,
  PRIMARY KEY (fleet, name));
CREATE TABLE IF NOT EXISTS instances (
  id TEXT PRIMARY KEY, fleet TEXT, pool TEXT, state TEXT, requested_at REAL,
  ready_at REAL, terminated_at REAL, detail TEXT);
CREATE TABLE IF NOT EXISTS tasks (
  id TEXT PRIMARY KEY, fleet TEXT, pool TEXT, name TEXT, state TEXT, instance_id TEXT,
  exit_code INTEGER, queued_s REAL, scheduling_s REAL, env_startup_s REAL, execution_s REAL,
  teardown_s REAL, submitted_at REAL, finished_at REAL, detail TEXT);
CREATE INDEX IF NOT EXISTS tasks_pool ON tasks (fleet, pool);
CREATE TABLE IF NOT EXISTS reuse (
  id TEXT PRIMARY KEY, fleet TEXT, pool TEXT, name TEXT, outcome TEXT, h_task TEXT, tenant TEXT,
  workflow TEXT, result TEXT, computed_by TEXT, saved_s REAL, at REAL);
CREATE INDEX IF NOT EXISTS reuse_workflow ON reuse (workflow);
CREATE TABLE IF NOT EXISTS charges (
  id TEXT PRIMARY KEY, fleet TEXT, pool TEXT, provider TEXT, region TEXT, type TEXT, spot INTEGER,
  price_per_hour REAL, billing_min_s REAL);
CREATE TABLE IF NOT EXISTS decisions (
  fleet TEXT, pool TEXT, kind TEXT, detail TEXT, at REAL);
CREATE INDEX IF NOT EXISTS decisions_pool ON decisions (fleet, pool);
"""

#: version N -> N+1 is ``MIGRATIONS[N]``; append, never edit one that shipped
MIGRATIONS: tuple[str, ...] = (
    # 0 -> 1: the first schema; stores written before versions may lack reuse, charges, decisions
    _SCHEMA,
    # 1 -> 2: what the live view (flowmesh top) reads at 10,000 instances: live instances, recent tasks
    """CREATE INDEX IF NOT EXISTS instances_state ON instances (state);
CREATE INDEX IF NOT EXISTS tasks_finished ON tasks (finished_at);""",
    # 2 -> 3: run scope (Fleet(run=...)) and per-task accounting (TaskResult.cost, .infra_failure)
    """ALTER TABLE tasks ADD COLUMN run TEXT;
ALTER TABLE tasks ADD COLUMN tenant TEXT;
ALTER TABLE tasks ADD COLUMN cost REAL;
ALTER TABLE tasks ADD COLUMN infra_failure TEXT;
ALTER TABLE instances ADD COLUMN run TEXT;
ALTER TABLE charges ADD COLUMN run TEXT;
CREATE INDEX IF NOT EXISTS tasks_run ON tasks (run);""",
)
SCHEMA_VERSION = len(MIGRATIONS)


class MetadataStore:
    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._local = threading.local()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="flowmesh-store")
        self._queue: collections.deque[Event] = collections.deque()
        self._scheduled = False
        self._flag = threading.Lock()
        self._closed = False
        try:
            self._pool.submit(self._init).result()
        except BaseException:
            self._pool.shutdown(wait=True)
            raise

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=30.0)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            self._local.conn = conn
        return conn

    def _init(self) -> None:
        c = self._conn()
        c.isolation_level = None     # explicit transactions below; DDL in SQLite is transactional
        try:
            if c.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION:
                return
            c.execute("BEGIN IMMEDIATE")
            try:
                version = int(c.execute("PRAGMA user_version").fetchone()[0])
                if version > SCHEMA_VERSION:
                    raise StoreSchemaError(self.path, version, SCHEMA_VERSION)
                for v in range(version, SCHEMA_VERSION):
                    for stmt in filter(str.strip, MIGRATIONS[v].split(";")):
                        c.execute(stmt)
                    log.info("metadata store %s: schema %d -> %d", self.path, v, v + 1)
                c.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                c.execute("COMMIT")
            except BaseException:
                c.execute("ROLLBACK")
                raise
        finally:
            c.isolation_level = "DEFERRED"   # the sqlite3 default (implicit BEGIN)

    def schema_version(self) -> int:
        return int(self._query("PRAGMA user_version")[0][0])

    # ---- writing ---------------------------------------------------------------
    def attach(self, bus: EventBus) -> None:
        bus.on(self.record, *store_writes.RECORDED)

    def record(self, ev: Event) -> None:
        """Queue ``ev`` for the writer thread (never blocks).  The writer takes everything
        queued at once and writes it in one transaction: a burst of events costs one
        commit, not one each."""
        if self._closed:   # an event after the fleet closed its store (a late sandbox close): not recorded
            log.debug("metadata store %s is closed: %s not recorded", self.path, ev.kind.value)
            return
        self._queue.append(ev)
        with self._flag:
            if self._scheduled:
                return
            self._scheduled = True
        self._pool.submit(self._drain)

    async def flush(self) -> None:
        """Wait until every event recorded so far is on disk."""
        await asyncio.wrap_future(self._pool.submit(self._drain))

    def _drain(self) -> None:
        with self._flag:
            self._scheduled = False
        batch = []
        try:
            while True:
                batch.append(self._queue.popleft())
        except IndexError:
            pass
        if not batch:
            return
        c = self._conn()
        with c:
            store_writes.write(c, batch)   # a few multi-row statements, not one per event

    # ---- reading ---------------------------------------------------------------
    def _query(self, sql: str, args: tuple = ()) -> list[tuple]:
        return self._pool.submit(lambda: self._conn().execute(sql, args).fetchall()).result()

    def pools(self) -> list[PoolRow]:
        return [PoolRow(*r) for r in self._query("SELECT * FROM pools ORDER BY created_at")]

    def instances(self, *, live_only: bool = False) -> list[InstanceRow]:
        sql = "SELECT * FROM instances"
        if live_only:
            sql += " WHERE state NOT IN ('terminated')"
        return [InstanceRow(*r) for r in self._query(sql + " ORDER BY requested_at")]

    def tasks(self, *, pool: str | None = None, limit: int = 1000) -> list[TaskRow]:
        if pool:
            rows = self._query("SELECT * FROM tasks WHERE pool=? ORDER BY submitted_at DESC LIMIT ?",
                               (pool, limit))
        else:
            rows = self._query("SELECT * FROM tasks ORDER BY submitted_at DESC LIMIT ?", (limit,))
        return [TaskRow(*r) for r in rows]

    def reuse(self, *, workflow: str | None = None, limit: int = 1000) -> list[ReuseRow]:
        """Requests answered by the reuse layer (flowmesh_sdk.reuse), newest first: the
        lineage of a workflow when ``workflow`` is given."""
        if workflow is not None:
            rows = self._query("SELECT * FROM reuse WHERE workflow=? ORDER BY at DESC LIMIT ?",
                               (workflow, limit))
        else:
            rows = self._query("SELECT * FROM reuse ORDER BY at DESC LIMIT ?", (limit,))
        return [ReuseRow(*r) for r in rows]

    def reuse_summary(self) -> list[ReuseSummary]:
        """Per fleet: hits, joins, executions and the compute seconds hits and joins saved."""
        rows = self._query(
            "SELECT fleet, SUM(outcome='hit'), SUM(outcome='joined'), SUM(outcome='executed'),"
            " COALESCE(SUM(saved_s), 0) FROM reuse GROUP BY fleet ORDER BY fleet")
        return [ReuseSummary(f, int(h or 0), int(j or 0), int(e or 0), float(s or 0.0))
                for f, h, j, e, s in rows]

    def spend(self, *, now: float | None = None) -> list[SpendRow]:
        """Per fleet, pool and provider: $ spent (each instance from its launch to its
        confirmed termination -- or now -- at its offer's price, at least the billing
        minimum) and the burn rate of what is still live ($/h)."""
        at = time.time() if now is None else now
        rows = self._query(
            "SELECT c.fleet, c.pool, c.provider, c.price_per_hour, c.billing_min_s, i.requested_at,"
            " i.terminated_at FROM charges c JOIN instances i ON i.id = c.id")
        acc: dict[tuple[str, str, str], list[float]] = {}
        for fleet, pool, provider, price, minimum, start, end in rows:
            a = acc.setdefault((fleet, pool, provider), [0.0, 0.0, 0])
            a[0] += price * max(minimum or 0.0, ((end or at) - (start or at))) / 3600.0
            if end is None:
                a[1] += price
                a[2] += 1
        return [SpendRow(f, p, prov, v[0], v[1], int(v[2])) for (f, p, prov), v in sorted(acc.items())]

    def tasks_of(self, *, run: str | None = None, pool: str | None = None) -> list[TaskRow]:
        """Every task of one run (or all) and pool (or all), oldest first."""
        rows = self._query("SELECT * FROM tasks WHERE (? IS NULL OR run = ?) AND (? IS NULL OR pool = ?)"
                           " ORDER BY submitted_at", (run, run, pool, pool))
        return [TaskRow(*r) for r in rows]

    def charges(self, *, run: str | None = None, pool: str | None = None) -> list[ChargeRow]:
        """Every priced instance of one run (or all) and pool (or all), oldest first."""
        rows = self._query(
            "SELECT c.id, c.fleet, c.pool, c.provider, c.region, c.type, c.spot, c.price_per_hour,"
            " c.billing_min_s, c.run, i.requested_at, i.terminated_at, i.state, i.detail FROM charges c"
            " JOIN instances i ON i.id = c.id WHERE (? IS NULL OR c.run = ?) AND (? IS NULL OR c.pool = ?)"
            " ORDER BY i.requested_at", (run, run, pool, pool))
        out = []
        for cid, fleet, pool_, prov, region, itype, spot, price, minimum, run_, start, end, state, detail in rows:
            cost = None
            if state == "terminated" and (detail or "").startswith("{"):
                with contextlib.suppress(ValueError, TypeError, KeyError):
                    cost = float(json.loads(detail)["cost"])
            out.append(ChargeRow(cid, fleet, pool_, prov, region, itype, bool(spot), float(price or 0.0),
                                 float(minimum or 0.0), run_, start, end, cost))
        return out

    def instance_places(self, *, fleet: str | None = None) -> list[tuple[str, str, str, int]]:
        """Instances not terminated (of one fleet, or all), counted by (provider, region, state)."""
        rows = self._query(
            "SELECT COALESCE(c.provider, ''), COALESCE(c.region, ''), i.state, COUNT(*) FROM instances i"
            " LEFT JOIN charges c ON c.id = i.id WHERE i.state != 'terminated' AND (? IS NULL OR i.fleet = ?)"
            " GROUP BY 1, 2, 3 ORDER BY 1, 2, 3", (fleet, fleet))
        return [(str(p), str(r), str(s), int(n)) for p, r, s, n in rows]

    def task_counts(self, *, fleet: str | None = None, finished_since: float | None = None) -> dict[str, int]:
        """Tasks by state (submitted, running, succeeded, ...) of one fleet (or all); with
        ``finished_since`` (a time.time()), only those that finished since then."""
        rows = self._query("SELECT state, COUNT(*) FROM tasks WHERE (? IS NULL OR fleet = ?)"
                           " AND (? IS NULL OR finished_at >= ?) GROUP BY state",
                           (fleet, fleet, finished_since, finished_since))
        return {str(s): int(n) for s, n in rows}

    def decisions(self, *, pool: str | None = None, limit: int = 50) -> list[DecisionRow]:
        """Launch decisions, failovers and budget refusals, newest first."""
        if pool is not None:
            rows = self._query("SELECT * FROM decisions WHERE pool=? ORDER BY at DESC LIMIT ?", (pool, limit))
        else:
            rows = self._query("SELECT * FROM decisions ORDER BY at DESC LIMIT ?", (limit,))
        return [DecisionRow(*r) for r in rows]

    def close(self) -> None:
        def _close() -> None:
            conn = getattr(self._local, "conn", None)
            if conn is not None:
                conn.close()
                self._local.conn = None
        self._closed = True
        self._pool.submit(_close).result()
        self._pool.shutdown(wait=True)


