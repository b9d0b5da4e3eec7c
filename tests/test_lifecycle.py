import pytest

from flowmesh_sdk.errors import LifecycleError
from flowmesh_sdk.lifecycle import (INSTANCE_TRANSITIONS, TASK_TRANSITIONS, InstanceState, TaskState,
                                    instance_lifecycle, task_lifecycle)


def test_instance_happy_path_records_history():
    lc = instance_lifecycle("i-1")
    for s in (InstanceState.RUNNING, InstanceState.READY, InstanceState.DRAINING, InstanceState.TERMINATED):
        lc.to(s)
    states = [t.state for t in lc.history]
    assert states == [InstanceState.REQUESTED, InstanceState.RUNNING, InstanceState.READY,
                      InstanceState.DRAINING, InstanceState.TERMINATED]
    stamps = [t.at for t in lc.history]
    assert stamps == sorted(stamps)
    assert lc.terminal
    assert lc.entered(InstanceState.READY) == stamps[2]


def test_invalid_transition_raises_with_allowed_states():
    lc = instance_lifecycle("i-2")
    with pytest.raises(LifecycleError, match="requested -> ready.*allowed: failed, running, terminated"):
        lc.to(InstanceState.READY)
    lc.to(InstanceState.TERMINATED)
    with pytest.raises(LifecycleError):
        lc.to(InstanceState.RUNNING)


def test_task_table_terminal_states_have_no_exit():
    for state in (TaskState.SUCCEEDED, TaskState.FAILED, TaskState.TIMED_OUT, TaskState.REJECTED,
                  TaskState.CANCELLED):
        assert TASK_TRANSITIONS[state] == frozenset()
    lc = task_lifecycle("t")
    lc.to(TaskState.REJECTED)
    with pytest.raises(LifecycleError):
        lc.to(TaskState.QUEUED)


def test_tables_cover_every_state():
    assert set(INSTANCE_TRANSITIONS) == set(InstanceState)
    assert set(TASK_TRANSITIONS) == set(TaskState)
    # every target is itself a known state
    for table in (INSTANCE_TRANSITIONS, TASK_TRANSITIONS):
        for targets in table.values():
            assert targets <= set(table)
