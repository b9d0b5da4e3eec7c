"""What each rollout cost and whether the infrastructure failed it (issue 28), on the real
pools above simulated clouds (virtual time): ``TaskResult.infra_failure`` for each kind the
simulator can produce for real, ``attempts`` under ``retry_infra_failures``, and per-task
costs that add up to the pool's spend."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from flowmesh_sdk.sim import SimInstanceType, unlimited
from flowmesh_sdk.sim.loop import run
from flowmesh_sdk.sim.scenario import REGISTRY, sim_fleet
from flowmesh_sdk import InfraFailure, InstanceSpec, PoolSpec, SandboxSpec, Task
from flowmesh_sdk.control.events import EventKind
from flowmesh_sdk.control.limits import QuotaLimits

SMALL = SimInstanceType("c.2xlarge", 8, 16, 0.36, spot_price_per_hour=0.12)
IMAGES = {"sim/base:1": 50_000_000}
IMAGE = f"{REGISTRY}/sim/base:1"


def _spec(**kw) -> PoolSpec:
    base = dict(name="acct", provider="sim", mode="ephemeral", instance=InstanceSpec(cpus=8, memory_gb=16),
                max_instances=4, warm_per_image=0, heartbeat_s=None)
    return PoolSpec(**{**base, **kw})


def _task(name: str, seconds: float = 60.0, exit_code: int = 0, *, tenant: str = "default",
          image: str = IMAGE) -> Task:
    return Task(name=name, sandbox=SandboxSpec(image=image, cpus=1, memory_gb=2, timeout_s=3600),
                command=f"sim-work {seconds:g} {exit_code}", timeout_s=3600, tenant=tenant)


def _cloud(**kw) -> object:
    return unlimited("sim", (dataclasses.replace(SMALL, **kw),))


async def _preempt_under(fleet, prov, pool, task: Task):
    """Run ``task`` and reclaim its instance as soon as its command starts."""
    started = asyncio.ensure_future(fleet.bus.wait_for(lambda e: e.kind is EventKind.TASK_STARTED, 3600))
    running = asyncio.ensure_future(pool.run_task(task))
    ev = await started
    assert prov.preempt(ev.instance_id)
    return await running


@pytest.mark.parametrize("spot,want", [("only", InfraFailure.PREEMPTED), ("never", InfraFailure.INSTANCE_LOST)])
def test_an_instance_reclaimed_under_a_task_with_no_retry_left_says_so(tmp_path, spot, want):
    async def main():
        async with sim_fleet(_cloud(), IMAGES, home=str(tmp_path)) as (fleet, prov):
            pool = await fleet.pool(_spec(spot=spot, retry_infra_failures=0))
            res = await _preempt_under(fleet, prov, pool, _task("victim", 600))
            await pool.drain()
            return res
    res = run(main())
    assert res.infra_failure is want, res
    assert res.attempts == 1 and not res.ok and res.error


def test_a_reclaimed_task_is_dispatched_again_and_ends_with_no_infra_failure(tmp_path):
    async def main():
        async with sim_fleet(_cloud(), IMAGES, home=str(tmp_path)) as (fleet, prov):
            pool = await fleet.pool(_spec(spot="only", retry_infra_failures=1))
            res = await _preempt_under(fleet, prov, pool, _task("victim", 600))
            await pool.drain()
            return res, len(prov.vms)
    res, vms = run(main())
    assert res.ok and res.infra_failure is None
    assert res.attempts == 2 and vms == 2
    # it paid for both instances: the reclaimed one's time and the one it finished on
    assert res.cost > 0.12 * 600 / 3600


def test_a_failing_command_is_the_task_s_own_outcome(tmp_path):
    async def main():
        async with sim_fleet(_cloud(), IMAGES, home=str(tmp_path)) as (fleet, _):
            pool = await fleet.pool(_spec())
            res = await pool.run_task(_task("wrong", 30, exit_code=3))
            await pool.drain()
            return res
    res = run(main())
    assert res.result is not None and res.result.exit_code == 3
    assert res.infra_failure is None and res.error is None and res.attempts == 1


def test_capacity_quota_budget_and_image_failures_are_marked(tmp_path):
    async def main():
        out = {}
        async with sim_fleet(_cloud(capacity=0), IMAGES, home=str(tmp_path / "cap")) as (fleet, _):
            pool = await fleet.pool(_spec())
            out["capacity"] = await pool.run_task(_task("no-room"))
            await pool.drain()
        async with sim_fleet(_cloud(), IMAGES, home=str(tmp_path / "q"),
                             quotas={"greedy": QuotaLimits(max_in_flight=0)}) as (fleet, _):
            pool = await fleet.pool(_spec())
            out["quota"] = await pool.run_task(_task("over-quota", tenant="greedy"))
            out["image"] = await pool.run_task(_task("no-image", image=f"{REGISTRY}/sim/missing:1"))
            await pool.drain()
        async with sim_fleet(_cloud(), IMAGES, home=str(tmp_path / "b")) as (fleet, _):
            pool = await fleet.pool(_spec(budget_per_hour=0.1))   # one instance is $0.36/h
            out["budget"] = await pool.run_task(_task("too-dear"))
            await pool.drain()
        return out
    out = run(main())
    assert {k: r.infra_failure for k, r in out.items()} == {
        "capacity": InfraFailure.CAPACITY, "quota": InfraFailure.CAPACITY,
        "image": InfraFailure.IMAGE_PULL, "budget": InfraFailure.BUDGET}
    for r in out.values():
        assert r.result is None and r.error and r.cost == 0.0


def test_ephemeral_per_task_costs_add_up_to_the_pool_s_spend(tmp_path):
    async def main():
        async with sim_fleet(_cloud(), IMAGES, home=str(tmp_path), run="acct-run-1") as (fleet, prov):
            pool = await fleet.pool(_spec(max_instances=3))
            results = await pool.map([_task(f"t{i}", 60 * (i + 1)) for i in range(7)])
            await pool.drain()
            return results, pool.spend().spent, prov.cost()
    results, spent, billed = run(main())
    assert all(r.ok for r in results)
    assert {r.run for r in results} == {"acct-run-1"}
    assert sum(r.cost for r in results) == pytest.approx(spent, rel=1e-9)
    assert spent == pytest.approx(billed, rel=0.01)
    # a longer task costs more: each held its own instance for its whole life
    costs = [r.cost for r in results]
    assert costs == sorted(costs) and costs[0] > 0.36 * 60 / 3600


def test_persistent_per_task_costs_are_slot_shares_and_the_rest_is_idle(tmp_path):
    async def main():
        async with sim_fleet(_cloud(), IMAGES, home=str(tmp_path)) as (fleet, _):
            pool = await fleet.pool(_spec(mode="persistent", max_instances=1, sandboxes_per_instance=4,
                                          idle_timeout_s=3600))
            results = await pool.map([_task(f"t{i}", 600) for i in range(4)])
            # a slot is held from admission (its instance launched for it, then booting) to teardown
            held = [r.phases.scheduling + r.phases.env_startup + r.phases.execution + r.phases.teardown
                    for r in results]
            await asyncio.sleep(1200)   # idle warm capacity: the pool's, no task's
            await pool.drain()
            return results, held, pool.spend().spent
    results, held, spent = run(main())
    assert all(r.ok for r in results)
    for r, h in zip(results, held):   # a quarter of the instance for the time its slot was held
        assert r.cost == pytest.approx(0.36 * h / 3600 / 4, rel=0.05)
    idle = spent - sum(r.cost for r in results)
    assert idle >= 0.36 * 1200 / 3600 * 0.99   # at least the idle 20 minutes, shown as the pool's


def test_the_trl_reward_masks_what_the_infrastructure_broke_and_scores_what_the_command_did(tmp_path):
    from flowmesh_sdk.integrations.trl import code_reward

    async def main():
        async with sim_fleet(_cloud(), IMAGES, home=str(tmp_path)) as (fleet, prov):
            pool = await fleet.pool(_spec(spot="only", retry_infra_failures=0))
            spec = SandboxSpec(image=IMAGE, cpus=1, memory_gb=2, timeout_s=3600)
            slow = code_reward(fleet, pool, spec=spec, command="sim-work 600", timeout_s=3600)
            started = asyncio.ensure_future(fleet.bus.wait_for(lambda e: e.kind is EventKind.TASK_STARTED, 3600))
            scoring = asyncio.ensure_future(slow(prompts=["p"], completions=["a"], tests=["t"]))
            prov.preempt((await started).instance_id)
            masked = await scoring
            failing = code_reward(fleet, pool, spec=spec, command="sim-work 5 1", timeout_s=3600)
            scored = await failing(prompts=["p"], completions=["b"], tests=["t"])
            await pool.drain()
            return masked, slow.last[0], scored, failing.last[0]
    masked, why, scored, what = run(main())
    assert masked == [None] and why.infra_kind is InfraFailure.PREEMPTED and why.reason.startswith("infra: preempted")
    assert scored == [0.0] and not what.infra_failure and what.reason == "failed (exit 1)"


def test_cost_report_of_a_known_simulated_run(tmp_path):
    import json
    import os
    import subprocess
    import sys

    async def main():
        async with sim_fleet(_cloud(), IMAGES, home=str(tmp_path), run="known-run") as (fleet, _):
            pool = await fleet.pool(_spec(max_instances=2))
            tasks = [_task("a", 600), _task("b", 1200), _task("c", 600, exit_code=1, tenant="bob"),
                     _task("d", 60, image=f"{REGISTRY}/sim/missing:1", tenant="bob")]
            results = await pool.map(tasks)
            await pool.drain()
            return results, pool.spend().spent
    results, spent = run(main())
    env = dict(os.environ, FLOWMESH_HOME=str(tmp_path), COLUMNS="200")
    env.pop("FLOWMESH_STATE", None)
    out = subprocess.run([sys.executable, "-m", "flowmesh_sdk.cli.main", "cost", "report", "--run", "known-run",
                          "--json"], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    rep = doc["report"]
    assert doc["schema"] == "flowmesh.cost.report/1"
    assert (rep["tasks"], rep["running"], rep["solved"], rep["infra_failed"]) == (4, 0, 2, 1)
    assert rep["infra"] == [["image_pull", 1]]
    assert rep["total_usd"] == pytest.approx(spent, abs=1e-5)            # three instances, ledger's figures
    assert rep["tasks_usd"] == pytest.approx(sum(r.cost for r in results), abs=1e-9)
    assert rep["idle_usd"] == pytest.approx(0.0, abs=1e-5)                # ephemeral: every instance a task's
    assert rep["per_solved_usd"] == pytest.approx(spent / 2, abs=1e-5)
    assert [(p["provider"], p["type"], p["instances"]) for p in rep["by_place"]] == [("sim", "c.2xlarge", 3)]
    bob = next(t for t in rep["by_tenant"] if t["tenant"] == "bob")
    assert (bob["tasks"], bob["solved"], bob["infra_failed"]) == (2, 0, 1)
    assert bob["usd"] == pytest.approx(results[2].cost, abs=1e-9)
    # the longest task cost the most: 20 minutes of $0.36/h, plus its boot
    assert results[1].cost > 0.36 * 1200 / 3600 > results[0].cost
    missing = subprocess.run([sys.executable, "-m", "flowmesh_sdk.cli.main", "cost", "report", "--run", "nope"],
                             capture_output=True, text=True, env=env, timeout=120)
    assert missing.returncode == 1 and "no run 'nope'" in missing.stderr and "known-run" in missing.stderr
    unwritable = subprocess.run([sys.executable, "-m", "flowmesh_sdk.cli.main", "cost", "report", "--plot",
                                 str(tmp_path / "no" / "such" / "dir" / "spend.png")],
                                capture_output=True, text=True, env=env, timeout=120)
    assert unwritable.returncode == 1 and "--plot: cannot write" in unwritable.stderr, unwritable.stderr
    assert "Traceback" not in unwritable.stderr   # it was a FileNotFoundError's
