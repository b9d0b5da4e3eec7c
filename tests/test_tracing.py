"""OpenTelemetry spans of one task's journey, exported to the SDK's in-memory exporter:
a real task on the local provider (podman), in an ephemeral pool so its launch,
bootstrap and provider calls belong to it."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from flowmesh_sdk import InstanceSpec, PoolSpec, SandboxSpec, Task
from flowmesh_sdk.identity import task_identity
from flowmesh_sdk.observe import tracing

EXPORTER = InMemorySpanExporter()


class _Gate(SimpleSpanProcessor):
    """Exports only while a test here runs (the global provider outlives this module)."""

    enabled = False

    def on_end(self, span) -> None:  # type: ignore[no-untyped-def]
        if self.enabled:
            super().on_end(span)


GATE = _Gate(EXPORTER)


@pytest.fixture
def exporter():
    """The process's tracer provider (OpenTelemetry allows setting it once) with an
    in-memory exporter, emptied for each test."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(GATE)
        trace.set_tracer_provider(provider)
    EXPORTER.clear()
    GATE.enabled = True
    yield EXPORTER
    GATE.enabled = False
    EXPORTER.clear()


async def test_one_task_is_one_span_tree(fleet, busybox_image, exporter) -> None:
    pool = await fleet.pool(PoolSpec(name="traced", mode="ephemeral", instance=InstanceSpec(cpus=1, memory_gb=2),
                                     max_instances=1))
    task = Task(name="hello", sandbox=SandboxSpec(image=busybox_image, cpus=0.5, memory_gb=0.25),
                command="echo traced")
    res = await pool.run_task(task)
    assert res.result.exit_code == 0
    spans = exporter.get_finished_spans()
    roots = [s for s in spans if s.name == "flowmesh.task"]
    assert len(roots) == 1
    root = roots[0]
    tid = root.context.trace_id
    mine = [s for s in spans if s.context.trace_id == tid]
    by_id = {s.context.span_id: s for s in mine}
    children = sorted((s for s in mine if s.parent is not None and s.parent.span_id == root.context.span_id),
                      key=lambda s: s.start_time)
    assert [s.name for s in children] == ["flowmesh.admission", "flowmesh.placement", "flowmesh.env_startup",
                                          "flowmesh.exec", "flowmesh.teardown"]
    # the phases follow each other inside the task's span
    for a, b in zip(children, children[1:]):
        assert a.end_time <= b.start_time
    assert root.start_time <= children[0].start_time and children[-1].end_time <= root.end_time
    # exec lasts what PhaseTimings says (same marks)
    exec_span = children[3]
    assert (exec_span.end_time - exec_span.start_time) / 1e9 == pytest.approx(res.phases.execution, abs=0.01)
    attrs = root.attributes
    assert attrs["flowmesh.pool"] == "traced" and attrs["flowmesh.task.name"] == "hello"
    assert attrs["flowmesh.task.id"] == res.task_id and attrs["flowmesh.exit_code"] == 0
    assert attrs["flowmesh.instance"] == res.instance_id
    assert attrs["flowmesh.h_task"] == task_identity(task, res.image_digest).h_task
    # the ephemeral pool's launch, bootstrap and provider calls happened for this task, under its phases

    def ancestors(s):
        while s.parent is not None and s.parent.span_id in by_id:
            s = by_id[s.parent.span_id]
            yield s.name
    launch = [s for s in mine if s.name == "flowmesh.provider.launch"]
    assert launch and launch[0].attributes["flowmesh.provider"] == "local"
    assert "flowmesh.task" in list(ancestors(launch[0]))
    boot = [s for s in mine if s.name == "flowmesh.bootstrap"]
    assert boot and boot[0].attributes["flowmesh.instance"] == res.instance_id
    assert {"flowmesh.task"} <= set(ancestors(boot[0]))


async def test_failed_task_marks_the_span(fleet, busybox_image, exporter) -> None:
    pool = await fleet.pool(PoolSpec(name="traced2", instance=InstanceSpec(cpus=1, memory_gb=2), max_instances=1))
    res = await pool.run_task(Task(name="bad", sandbox=SandboxSpec(image="localhost/flowmesh/nope:1"),
                                   command="true"))
    assert res.error
    (root,) = [s for s in exporter.get_finished_spans() if s.name == "flowmesh.task"]
    assert root.status.status_code is trace.StatusCode.ERROR and "ImageNotFound" in root.status.description


def test_no_tracer_provider_means_no_journey(monkeypatch) -> None:
    """Without an SDK provider the API's spans do not record: pools make no Journey."""
    monkeypatch.setattr(tracing, "tracer", lambda: trace.NoOpTracer())
    assert tracing.journey("p", "t", "n", "default") is None
