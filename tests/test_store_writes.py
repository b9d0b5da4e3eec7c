"""The metadata store's writer turns a batch of events into a few multi-row statements
(flowmesh_sdk/control/store_writes.py) and still records each row's whole history: an
instance's events in the order they came, a task's submission, starts and end, a pool
drained and made again.  A batch is written in statements of many rows (SQLite's
variable limit respected), and a row that cannot be written loses only itself."""

from __future__ import annotations

import json
import logging
import sqlite3
from pathlib import Path

import pytest

from flowmesh_sdk.control import store_writes
from flowmesh_sdk.control.events import Event, EventKind
from flowmesh_sdk.control.store import MetadataStore
from flowmesh_sdk.specs import PhaseTimings


def _write(path: Path, events: list[Event], *, variables: int | None = None) -> list[str]:
    """``events`` written as ONE batch on a connection of their own; the statements run."""
    run: list[str] = []
    c = sqlite3.connect(path)
    if variables is not None:
        c.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, variables)
    c.set_trace_callback(run.append)
    with c:
        store_writes.write(c, events)
    c.close()
    return [s for s in run if not s.startswith(("BEGIN", "COMMIT"))]


@pytest.fixture
def store(tmp_path: Path):
    s = MetadataStore(tmp_path / "m.db")   # makes the schema
    yield s
    s.close()


def test_one_batch_keeps_every_rows_history(store: MetadataStore) -> None:
    requested = json.dumps({"provider": "aws", "region": "us-east-1", "type": "c5.2xlarge", "spot": True,
                            "price_per_hour": 0.34})
    ev = [
        Event(EventKind.POOL_CREATED, "f", "p", detail="{}", at=1.0, run="r"),
        Event(EventKind.INSTANCE_REQUESTED, "f", "p", instance_id="i-1", detail=requested, at=2.0, run="r"),
        Event(EventKind.TASK_SUBMITTED, "f", "p", task_id="t-1", task_name="one", at=2.5, run="r"),
        Event(EventKind.INSTANCE_RUNNING, "f", "p", instance_id="i-1", at=3.0, run="r"),
        Event(EventKind.INSTANCE_READY, "f", "p", instance_id="i-1", detail="booted", at=4.0, run="r"),
        Event(EventKind.TASK_STARTED, "f", "p", task_id="t-1", instance_id="i-1", at=4.5, run="r"),
        # its instance is lost; the task is started again on another, then succeeds
        Event(EventKind.TASK_STARTED, "f", "p", task_id="t-1", instance_id="i-2", at=5.0, run="r"),
        Event(EventKind.TASK_SUCCEEDED, "f", "p", task_id="t-1", task_name="one", exit_code=0,
              phases=PhaseTimings(0.5, 1.0, 1.5, 2.0, 0.25), detail="", at=6.0, run="r", tenant="a", cost=0.01),
        Event(EventKind.INSTANCE_TERMINATING, "f", "p", instance_id="i-1", at=7.0, run="r"),
        Event(EventKind.INSTANCE_TERMINATED, "f", "p", instance_id="i-1", detail='{"cost": 0.02}', at=8.0, run="r"),
        Event(EventKind.LAUNCH_DECIDED, "f", "p", detail='{"n": 1}', at=2.0, run="r"),
        Event(EventKind.POOL_DRAINED, "f", "p", at=9.0, run="r"),
        # a pool drained and made again in the same batch is not drained
        Event(EventKind.POOL_CREATED, "f", "q", detail="{}", at=1.0, run="r"),
        Event(EventKind.POOL_DRAINED, "f", "q", at=2.0, run="r"),
        Event(EventKind.POOL_CREATED, "f", "q", detail='{"again": true}', at=3.0, run="r"),
    ]
    _write(Path(store.path), ev)

    (inst,) = store.instances()
    assert (inst.state, inst.requested_at, inst.ready_at, inst.terminated_at) == ("terminated", 2.0, 4.0, 8.0)
    (task,) = store.tasks_of()
    assert (task.state, task.instance_id, task.exit_code, task.submitted_at, task.finished_at) == \
        ("succeeded", "i-2", 0, 2.5, 6.0)
    assert (task.queued_s, task.execution_s, task.teardown_s) == (0.5, 2.0, 0.25)
    (charge,) = store.charges()
    assert (charge.provider, charge.type, charge.spot, charge.price_per_hour, charge.cost) == \
        ("aws", "c5.2xlarge", True, 0.34, 0.02)
    assert [d.detail for d in store.decisions()] == ['{"n": 1}']
    pools = {p.name: p for p in store.pools()}
    assert pools["p"].drained_at == 9.0
    assert (pools["q"].drained_at, pools["q"].spec) == (None, '{"again": true}')


def test_a_large_batch_is_a_few_statements_within_sqlites_variable_limit(store: MetadataStore) -> None:
    ev = []
    for i in range(1000):
        ev.append(Event(EventKind.TASK_SUBMITTED, "f", "p", task_id=f"t-{i}", task_name=f"n{i}", at=float(i)))
        ev.append(Event(EventKind.TASK_FAILED if i % 3 else EventKind.TASK_SUCCEEDED, "f", "p", task_id=f"t-{i}",
                        task_name=f"n{i}", exit_code=i % 3, at=float(i) + 0.5))
    statements = _write(Path(store.path), ev)
    # 2,000 events: 1,000 rows of each of two statements, in chunks of 512+256+128+64+32+8 rows
    assert len(statements) == 2 * 6
    rows = store.tasks_of()
    assert len(rows) == 1000
    assert {r.id: (r.state, r.exit_code, r.finished_at) for r in rows}["t-500"] == ("failed", 2, 500.5)

    # where SQLite allows fewer variables, the chunks are smaller: a task's end binds 19
    ev = [Event(EventKind.TASK_SUCCEEDED, "f", "p", task_id=f"u-{i}", task_name="u", exit_code=0, at=1.0)
          for i in range(100)]
    statements = _write(Path(store.path), ev, variables=100)   # 5 rows (95 variables) at most
    assert len(statements) == 100 // 4   # 4 rows a statement: the largest power of two that fits
    assert sum(r.id.startswith("u-") for r in store.tasks_of()) == 100


def test_a_row_that_cannot_be_written_loses_only_itself(store: MetadataStore,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    ev = [Event(EventKind.TASK_SUBMITTED, "f", "p", task_id=f"t-{i}", task_name="n", at=float(i))
          for i in range(200)]
    ev[77] = Event(EventKind.TASK_SUBMITTED, "f", "p", task_id="bad", task_name=object(),  # type: ignore[arg-type]
                   at=77.0)
    ev.append(Event(EventKind.INSTANCE_REQUESTED, "f", "p", instance_id="i-1", detail="{not json", at=1.0))
    with caplog.at_level(logging.WARNING, logger="flowmesh.store"):
        _write(Path(store.path), ev)
    ids = {r.id for r in store.tasks_of()}
    assert len(ids) == 199 and "bad" not in ids and "t-78" in ids
    (inst,) = store.instances()           # the instance's row is written; its charge could not be
    assert inst.id == "i-1" and store.charges() == []
    warned = [r.getMessage() for r in caplog.records]
    assert sum("could not record task.submitted" in m for m in warned) == 1
    assert sum("could not record instance.requested" in m for m in warned) == 1


def test_the_store_is_handed_exactly_the_kinds_it_writes() -> None:
    # the bus hands the store only store_writes.RECORDED: a kind it writes that were left
    # out would be lost without a word, one it does not write costs it queueing for nothing
    def sample(kind: EventKind) -> Event:
        return Event(kind, "f", "p", instance_id="i-1", task_id="t-1", task_name="n",
                     detail='{"provider": "aws"}' if kind is EventKind.INSTANCE_REQUESTED else "", at=1.0)

    written = {k for k in EventKind if list(store_writes._rows(sample(k)))}
    assert written == store_writes.RECORDED
    assert EventKind.SANDBOX_READY not in written and EventKind.INSTANCE_READY in written


def test_an_instances_rows_in_one_batch_are_one_row_that_ends_as_they_would(store: MetadataStore,
                                                                              caplog: pytest.LogCaptureFixture) -> None:
    # i-1 is made in an earlier batch; i-2 and i-3 are made and end within this one
    _write(Path(store.path), [Event(EventKind.INSTANCE_REQUESTED, "f", "p", instance_id="i-1", detail="asked",
                                    at=1.0, run="r0")])
    life = [(EventKind.INSTANCE_RUNNING, "", 2.0), (EventKind.INSTANCE_READY, "booted", 3.0),
            (EventKind.INSTANCE_DRAINING, "", 4.0), (EventKind.INSTANCE_TERMINATED, '{"cost": 1}', 5.0)]
    ev = [Event(k, "f", "p", instance_id="i-1", detail=d, at=at, run="r1") for k, d, at in life]
    ev += [Event(EventKind.INSTANCE_REQUESTED, "f", "q", instance_id="i-2", detail="asked", at=1.5, run="r1"),
           Event(EventKind.INSTANCE_READY, "f", "q", instance_id="i-2", detail="up", at=2.5, run="r1"),
           Event(EventKind.INSTANCE_DRAINING, "f", "q", instance_id="i-2", detail="", at=3.5, run="r1")]
    statements = _write(Path(store.path), ev)
    assert sum(s.startswith("INSERT INTO instances") for s in statements) == 1   # 7 events, one statement of 2 rows
    rows = {r.id: r for r in store.instances()}
    one, two = rows["i-1"], rows["i-2"]
    # what the insert set is the first event's; state and detail the last's; ready_at and terminated_at the latest given
    assert (one.state, one.requested_at, one.ready_at, one.terminated_at, one.detail) == \
        ("terminated", 1.0, 3.0, 5.0, '{"cost": 1}')
    assert (two.pool, two.state, two.requested_at, two.ready_at, two.terminated_at, two.detail) == \
        ("q", "draining", 1.5, 2.5, None, "")

    # a folded row that cannot be written is written as the rows it stands for: only the bad one is lost
    bad = [Event(EventKind.INSTANCE_REQUESTED, "f", "p", instance_id="i-3", detail="asked", at=1.0),
           Event(EventKind.INSTANCE_READY, "f", "p", instance_id="i-3", detail="up", at=2.0),
           Event(EventKind.INSTANCE_DRAINING, "f", "p", instance_id="i-3", detail=object(),  # type: ignore[arg-type]
                 at=3.0)]
    with caplog.at_level(logging.WARNING, logger="flowmesh.store"):
        _write(Path(store.path), bad)
    three = {r.id: r for r in store.instances()}["i-3"]
    assert (three.state, three.ready_at, three.detail) == ("ready", 2.0, "up")
    warned = [r.getMessage() for r in caplog.records if "could not record" in r.getMessage()]
    assert len(warned) == 1 and "could not record instance.draining" in warned[0]
