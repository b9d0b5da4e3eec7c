"""Placement, capacity and routing through the public API on the real local provider
(podman): an ephemeral burst wider than the host queues instead of failing (issue 12,
defect 7), ``Pool.map`` cancels the batch on an unexpected error (defect 12), auto mode
routes by isolation (issue 11), and every launch decision is explained."""

from __future__ import annotations

import asyncio
import json

import pytest

from flowmesh_sdk import EventKind, InstanceSpec, PoolSpec, SandboxSpec, SpecError, Task
from flowmesh_sdk.control.events import Event

from conftest import podman_names


def _collect(fleet, *kinds):
    got: list[Event] = []
    fleet.bus.on(got.append, *kinds)
    return got


async def test_an_ephemeral_burst_wider_than_the_host_queues_for_capacity(fleet, busybox_image):
    # the fixture's host has 2 cpus: at most 2 one-cpu instances at once, 6 tasks asked
    pool = await fleet.pool(PoolSpec(name="wide", mode="ephemeral", max_instances=6,
                                     instance=InstanceSpec(cpus=1, memory_gb=1)))
    spec = SandboxSpec(image=busybox_image, cpus=1, memory_gb=0.5)
    results = await pool.map([Task(name=f"t{i}", sandbox=spec, command=f"echo {i}") for i in range(6)])
    assert [r.error for r in results] == [None] * 6
    assert [r.result.stdout.strip() for r in results] == [str(i) for i in range(6)]
    assert len({r.instance_id for r in results}) == 6        # a fresh instance each
    await pool.drain()


async def test_map_refuses_a_batch_with_a_non_task_before_running_anything(fleet, busybox_image):
    pool = await fleet.pool(PoolSpec(name="bad", instance=InstanceSpec(cpus=1, memory_gb=1)))
    spec = SandboxSpec(image=busybox_image, cpus=1, memory_gb=0.5)
    started = _collect(fleet, EventKind.TASK_STARTED)
    with pytest.raises(SpecError, match=r"tasks\[1\]: must be a Task, got str"):
        await pool.map([Task(name="ok", sandbox=spec, command="true"), "echo hi"])
    assert started == []
    await pool.drain()


async def test_a_raising_on_result_cancels_the_rest_and_frees_their_slots(fleet, busybox_image):
    pool = await fleet.pool(PoolSpec(name="cb", max_instances=1, sandboxes_per_instance=2,
                                     instance=InstanceSpec(cpus=2, memory_gb=2)))
    spec = SandboxSpec(image=busybox_image, cpus=1, memory_gb=0.5)
    tasks = [Task(name="fast", sandbox=spec, command="true"),
             Task(name="slow", sandbox=spec, command="sleep 300"),
             Task(name="queued", sandbox=spec, command="sleep 300")]

    def boom(res):
        if res.name == "fast":
            raise RuntimeError("callback failed")

    with pytest.raises(RuntimeError, match="callback failed"):
        await asyncio.wait_for(pool.map(tasks, on_result=boom), 120)
    st = pool.stats()
    assert st.in_flight == 0 and st.waiting == 0            # nothing left running or holding a slot
    # the cancelled tasks' containers are gone; only the pool's warm container may remain
    assert set(podman_names("flowmesh.pool=cb")) <= set(podman_names("flowmesh.task=warm"))
    await pool.drain()


async def test_auto_mode_routes_each_task_by_its_isolation(fleet, busybox_image):
    routed = _collect(fleet, EventKind.TASK_ROUTED)
    pool = await fleet.pool(PoolSpec(name="auto", mode="auto", isolation="shared", max_instances=1,
                                     sandboxes_per_instance=2, instance=InstanceSpec(cpus=1, memory_gb=2)))
    spec = SandboxSpec(image=busybox_image, cpus=0.5, memory_gb=0.5)
    res = await pool.map([Task(name="a", sandbox=spec, command="echo a"),
                          Task(name="b", sandbox=spec, command="echo b"),
                          Task(name="s", sandbox=spec, command="echo s", isolation="strict")])
    assert [r.error for r in res] == [None] * 3
    by = {r.name: r for r in res}
    assert by["a"].pool == by["b"].pool == "auto-shared"
    assert by["a"].instance_id == by["b"].instance_id      # a warm instance, shared
    assert by["s"].pool == "auto-strict" and by["s"].instance_id != by["a"].instance_id
    paths = {ev.task_name: json.loads(ev.detail) for ev in routed}
    assert paths["a"] == {"path": "shared", "why": "the pool's default isolation", "to": "auto-shared"}
    assert paths["s"] == {"path": "strict", "why": "asked by the task", "to": "auto-strict"}
    async with pool.sandbox(spec, isolation="strict") as sb:
        assert (await sb.exec("echo hi")).stdout == "hi\n"
    await pool.drain()
    assert pool.closed


async def test_every_launch_decision_is_published_with_its_terms(fleet, busybox_image):
    decided = _collect(fleet, EventKind.LAUNCH_DECIDED)
    pool = await fleet.pool(PoolSpec(name="why", instance=InstanceSpec(cpus=1, memory_gb=1)))
    spec = SandboxSpec(image=busybox_image, cpus=1, memory_gb=0.5)
    await pool.run_task(Task(name="t", sandbox=spec, command="true"))
    assert decided, "no launch.decided event"
    d = json.loads(decided[0].detail)
    assert d["count"] == 1 and d["winner"]["offer"].startswith("local/local/")
    assert set(d["winner"]) >= {"T", "C", "G_loc", "U", "price_per_hour", "slots"}
    assert d["winner"]["price_per_hour"] == 0.0 and d["runner_up"] is None
    await pool.drain()


@pytest.mark.parametrize("kwargs, field, words", [
    ({"infra": ("",)}, r"pool.infra\[0\]", "provider/region"),
    ({"infra": "ec2"}, "pool.infra", "tuple"),
    ({"infra": ("EC2",)}, r"pool.infra\[0\]", "lowercase"),
    ({"infra": ("ec2/us-east-1/a/b",)}, r"pool.infra\[0\]", "provider/region/zone"),
    ({"infra": ("ec2",), "provider": "ssh"}, "pool.infra", "not both"),
    ({"spot": "sometimes"}, "pool.spot", "never, prefer, only"),
    ({"budget_per_hour": 0}, "pool.budget_per_hour", r"\(0, inf\)"),
    ({"budget_total": -5.0}, "pool.budget_total", r"\(0, inf\)"),
    ({"max_price": 0.0}, "pool.max_price", r"\(0, inf\)"),
    ({"policy": "cheap"}, "pool.policy", "latency, cost, balanced"),
    ({"isolation": "strict"}, "pool.isolation", "mode='auto'"),
    ({"mode": "auto", "isolation": "loose"}, "pool.isolation", "strict, shared"),
    ({"concurrency": 0}, "pool.concurrency", r"\[1, "),
])
def test_bad_placement_fields_are_refused_naming_the_field(kwargs, field, words):
    with pytest.raises(SpecError, match=field) as ei:
        PoolSpec(name="p", **kwargs)
    assert __import__("re").search(words, str(ei.value)), str(ei.value)


def test_all_zero_weights_are_refused():
    from flowmesh_sdk.bidder import Policy

    with pytest.raises(SpecError, match="w_t"):
        PoolSpec(name="p", policy=Policy(0, 0, 0))


@pytest.mark.parametrize("infra, field, words", [
    (("nimbus",), "pool.infra[0]", "unknown provider 'nimbus'; installed providers: "),
    (("zz*",), "pool.infra[0]", "'zz*' matches no installed provider"),
    # issue 24, defect 12: a wildcard matching nothing is refused even when another entry matches
    (("local", "zz*"), "pool.infra[1]", "'zz*' matches no installed provider"),
    # defect 13: an unknown provider is named by its entry, not as pool.provider
    (("local", "nimbus", "local/local"), "pool.infra[1]", "unknown provider 'nimbus'"),
    # the index is the one the user wrote: a repeated entry does not shift it
    (("local", "local", "local/l?cal", "zz?"), "pool.infra[3]", "'zz?' matches no installed provider"),
])
async def test_an_entry_naming_no_installed_provider_is_refused_naming_the_entry(fleet, infra, field, words):
    with pytest.raises(SpecError) as ei:
        await fleet.pool(PoolSpec(name="u", infra=infra, instance=InstanceSpec(cpus=1, memory_gb=1)))
    assert ei.value.field == field and words in str(ei.value), (ei.value.field, str(ei.value))
    assert "u" not in fleet.pools


async def test_an_unknown_provider_given_as_provider_and_an_entry_matching_no_offer(fleet):
    with pytest.raises(SpecError, match=r"pool.provider: unknown provider 'nimbus'"):
        await fleet.pool(PoolSpec(name="u", provider="nimbus"))   # the field the user set
    with pytest.raises(SpecError, match=r"pool.infra\[1\]: no offer of provider 'local' in region 'mars-1'"):
        await fleet.pool(PoolSpec(name="r", infra=("local", "local/mars-1"),
                                  instance=InstanceSpec(cpus=1, memory_gb=1)))
