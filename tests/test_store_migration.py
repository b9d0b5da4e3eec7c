"""Metadata stores written by older versions are migrated when opened: an unversioned
store with the first release's three tables (no reuse, charges or decisions), its rows
kept and readable; a store from a newer FlowMesh is refused, not written."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

import pytest

from flowmesh_sdk.control.events import Event, EventBus, EventKind
from flowmesh_sdk.control.store import SCHEMA_VERSION, MetadataStore
from flowmesh_sdk.errors import FlowMeshError, StoreSchemaError

# the schema of flowmesh_sdk/control/store.py as first committed (f6f2876), verbatim
OLDEST = """
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
"""


def _old_store(path: Path) -> None:
    db = sqlite3.connect(path)
    db.executescript(OLDEST)
    db.execute("INSERT INTO pools VALUES ('f', 'p', '{\"mode\": \"persistent\"}', 100.0, NULL)")
    db.execute("INSERT INTO instances VALUES ('i-1', 'f', 'p', 'ready', 101.0, 102.0, NULL, '')")
    db.execute("INSERT INTO tasks VALUES ('t-1', 'f', 'p', 'old task', 'succeeded', 'i-1', 0, 0.1, 0.2, 0.3, 1.5,"
               " 0.1, 103.0, 105.0, '')")
    db.commit()
    assert db.execute("PRAGMA user_version").fetchone()[0] == 0
    db.close()


def test_an_unversioned_old_store_is_migrated_and_keeps_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "flowmesh.db"
    _old_store(path)
    store = MetadataStore(path)
    try:
        assert store.schema_version() == SCHEMA_VERSION
        (task,) = store.tasks()
        assert (task.name, task.state, task.execution_s, task.instance_id) == ("old task", "succeeded", 1.5, "i-1")
        assert [p.name for p in store.pools()] == ["p"]
        # the tables the old store lacked now take events
        bus = EventBus()
        store.attach(bus)
        bus.publish(Event(EventKind.INSTANCE_REQUESTED, fleet="f", pool="p", instance_id="i-2", detail=json.dumps(
            {"provider": "ec2", "region": "us-east-1", "type": "c6a.2xlarge", "spot": False, "price_per_hour": 0.3})))
        bus.publish(Event(EventKind.LAUNCH_REFUSED, fleet="f", pool="p", detail='{"reason": "budget"}'))
        bus.publish(Event(EventKind.REUSE_HIT, fleet="f", pool="p", task_id="r-1", detail='{"h_task": "x", "saved_s": 2}'))
        asyncio.run(store.flush())
        assert [(s.provider, s.live) for s in store.spend()] == [("ec2", 1)]
        assert [d.kind for d in store.decisions()] == ["refused"]
        assert store.reuse_summary()[0].hits == 1
        assert ("ec2", "us-east-1", "requested", 1) in store.instance_places()
        assert ("", "", "ready", 1) in store.instance_places()     # the old instance has no charge row
        assert store.task_counts() == {"succeeded": 1}
        assert store.task_counts(finished_since=104.0) == {"succeeded": 1}
        assert store.task_counts(finished_since=106.0) == {}
    finally:
        store.close()
    db = sqlite3.connect(path)
    indexes = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    db.close()
    assert {"tasks_pool", "reuse_workflow", "decisions_pool", "instances_state", "tasks_finished"} <= indexes
    # opening it again changes nothing
    again = MetadataStore(path)
    try:
        assert again.schema_version() == SCHEMA_VERSION and len(again.tasks()) == 1
    finally:
        again.close()


def test_a_store_from_a_newer_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "flowmesh.db"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE future (x)")
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.commit()
    db.close()
    with pytest.raises(StoreSchemaError) as err:
        MetadataStore(path)
    assert isinstance(err.value, FlowMeshError) and str(SCHEMA_VERSION + 1) in str(err.value)
    db = sqlite3.connect(path)
    assert {r[0] for r in db.execute("SELECT name FROM sqlite_master")} == {"future"}   # untouched
    db.close()


def test_a_fresh_store_starts_at_the_current_version(tmp_path: Path) -> None:
    store = MetadataStore(tmp_path / "new.db")
    try:
        assert store.schema_version() == SCHEMA_VERSION >= 2 and store.tasks() == []
    finally:
        store.close()


def test_an_event_after_close_is_dropped_quietly(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A late event (a sandbox closed after its fleet closed the store) is not an error."""
    store = MetadataStore(tmp_path / "flowmesh.db")
    bus = EventBus()
    store.attach(bus)
    store.close()
    with caplog.at_level("WARNING", logger="flowmesh"):
        bus.publish(Event(EventKind.SANDBOX_CLOSED, fleet="f", pool="p"))
    assert not [r for r in caplog.records if r.levelname in ("WARNING", "ERROR")]
