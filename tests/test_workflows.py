"""Workflows of operators on real pools of the local provider (podman containers)."""

from __future__ import annotations

import asyncio

import pytest

from flowmesh_sdk import EventKind, FlowMeshError, InstanceSpec, PoolSpec, SandboxSpec, SpecError
from flowmesh_sdk.control.events import TASK_END
from flowmesh_sdk.identity import label_digest
from flowmesh_sdk.specs import ReuseKind
from flowmesh_sdk.workflows import OpRef, Workflow

REWARD = label_digest("reward@1")


async def _pool(fleet, name: str, slots: int = 2):
    return await fleet.pool(PoolSpec(name=name, instance=InstanceSpec(cpus=1, memory_gb=2),
                                     min_instances=1, max_instances=1, sandboxes_per_instance=slots,
                                     warm_per_image=0))


def _sb(image: str) -> SandboxSpec:
    return SandboxSpec(image=image, cpus=1, memory_gb=0.5)


class _Events:
    def __init__(self, fleet) -> None:
        self.seen: list[tuple[str, str]] = []
        fleet.bus.on(lambda ev: self.seen.append((ev.kind.value, ev.task_name)),
                     EventKind.TASK_SUBMITTED, EventKind.TASK_STARTED, *TASK_END)

    def started(self) -> list[str]:
        return [n for k, n in self.seen if k == "task.started"]

    def index(self, kind: str, name: str) -> int:
        return self.seen.index((kind, name))


# --------------------------------------------------------------------------- #
# errors before anything runs
# --------------------------------------------------------------------------- #

async def test_a_cycle_is_an_error_before_anything_runs(fleet, busybox_image):
    pool = await _pool(fleet, "p")
    ev = _Events(fleet)
    wf = Workflow("loop")
    wf.sandbox("first", pool="p", image=busybox_image, command="true")   # would be ready at once
    wf.sandbox("a", pool="p", image=busybox_image, command="cat /in", inputs={"/in": "c"})
    wf.sandbox("b", pool="p", image=busybox_image, command="cat /in", inputs={"/in": "a"})
    wf.sandbox("c", pool="p", image=busybox_image, command="cat /in", inputs={"/in": "b"})
    with pytest.raises(SpecError) as ei:
        await wf.run(fleet.results, {"p": pool})
    cycle = str(ei.value).split("cycle: ", 1)[1].split(" -> ")
    assert cycle[0] == cycle[-1] and set(cycle) == {"a", "b", "c"}
    assert ev.seen == []                                  # nothing was submitted
    with pytest.raises(SpecError):
        wf.order()


async def test_a_missing_input_is_an_error_before_anything_runs(fleet, busybox_image):
    pool = await _pool(fleet, "p")
    ev = _Events(fleet)
    wf = Workflow("gap")
    roll = wf.sandbox("rollout", pool="p", image=busybox_image, command="echo patch")
    wf.sandbox("test", pool="p", image=busybox_image, command="cat /p /q",
               inputs={"/p": roll, "/q": "rollout-2"})
    with pytest.raises(SpecError) as ei:
        await wf.run(fleet.results, {"p": pool})
    assert ei.value.field == "workflow.ops['test'].inputs['/q']"
    assert "'rollout-2'" in str(ei.value)
    assert ev.seen == []


async def test_an_unknown_pool_or_image_is_an_error_before_anything_runs(fleet, busybox_image):
    pool = await _pool(fleet, "p")
    ev = _Events(fleet)
    wf = Workflow("where")
    wf.sandbox("ok", pool="p", image=busybox_image, command="true")
    wf.sandbox("lost", pool="gpu", image=busybox_image, command="true")
    with pytest.raises(SpecError) as ei:
        await wf.run(fleet.results, {"p": pool})
    assert ei.value.field == "workflow.ops['lost'].pool"
    wf2 = Workflow("image")
    wf2.sandbox("ok", pool="p", image=busybox_image, command="true")
    wf2.sandbox("bad", pool="p", image="localhost/flowmesh/no-such-image:1", command="true")
    with pytest.raises(SpecError) as ei:
        await wf2.run(fleet.results, {"p": pool})
    assert ei.value.field == "workflow.ops['bad'].sandbox.image"
    assert ev.seen == []


def test_building_checks_each_operator():
    wf = Workflow("w")
    wf.sandbox("a", pool="p", image="localhost/flowmesh/busybox:1", command="true")
    with pytest.raises(SpecError, match="already has"):
        wf.sandbox("a", pool="p", image="localhost/flowmesh/busybox:1", command="true")
    with pytest.raises(SpecError):
        wf.sandbox("b", pool="p", image="localhost/flowmesh/busybox:1", command="   ")
    with pytest.raises(SpecError, match="also one of its files"):
        wf.sandbox("c", pool="p", image="localhost/flowmesh/busybox:1", command="true",
                   inputs={"/x": "a"}, files={"/x": b"1"})
    with pytest.raises(SpecError, match="absolute"):
        wf.sandbox("d", pool="p", image="localhost/flowmesh/busybox:1", command="true", inputs={"x": "a"})
    with pytest.raises(SpecError, match="exactly one"):
        wf.sandbox("e", pool="p", command="true")
    with pytest.raises(SpecError) as ei:
        wf.call("f", lambda i: b"", image_or_model="localhost/flowmesh/busybox:1")
    assert ei.value.field == "workflow.ops['f'].image_or_model"
    with pytest.raises(SpecError):
        wf.call("g", lambda i: b"", image_or_model=REWARD, kind="serve")
    with pytest.raises(SpecError):
        wf.call("h", lambda i: b"", image_or_model=REWARD, seed=-2)
    assert wf.order() == ["a"]


# --------------------------------------------------------------------------- #
# running by readiness, across pools
# --------------------------------------------------------------------------- #

async def test_operators_run_by_readiness_across_pools(fleet, busybox_image):
    gen = await _pool(fleet, "gen")
    test = await _pool(fleet, "test")
    ev = _Events(fleet)
    wf = Workflow("ready", tenant="alice")
    slow = wf.sandbox("slow-rollout", pool="gen", image=busybox_image, command="sleep 3; echo slow")
    fast = wf.sandbox("fast-rollout", pool="gen", image=busybox_image, command="echo fast")
    wf.sandbox("test-slow", pool="test", image=busybox_image, command="cat /p; echo +tested",
               inputs={"/p": slow})
    wf.sandbox("test-fast", pool="test", image=busybox_image, command="cat /p; echo +tested",
               inputs={"/p": fast})
    wf.call("score", lambda ins: b"%d" % sum(len(v) for v in ins.values()), image_or_model=REWARD,
            inputs={"a": "test-slow", "b": "test-fast"})
    run = await wf.run(fleet.results, {"gen": gen, "test": test})
    assert run.ok
    assert run.output("test-fast") == b"fast\n+tested\n"
    assert run.output("test-slow") == b"slow\n+tested\n"
    assert run.output("score") == str(len(b"fast\n+tested\n") + len(b"slow\n+tested\n")).encode()
    # each test started only after its own input finished, and the fast branch did not
    # wait for the slow rollout
    assert ev.index("task.succeeded", "fast-rollout") < ev.index("task.started", "test-fast")
    assert ev.index("task.succeeded", "slow-rollout") < ev.index("task.started", "test-slow")
    assert ev.index("task.started", "test-fast") < ev.index("task.succeeded", "slow-rollout")
    # the in-process operator is not a pool task; the sandbox ones ran where they were sent
    assert sorted(ev.started()) == ["fast-rollout", "slow-rollout", "test-fast", "test-slow"]
    await fleet.store.flush()
    assert {r.name: r.pool for r in fleet.store.tasks(limit=10)} == {
        "slow-rollout": "gen", "fast-rollout": "gen", "test-slow": "test", "test-fast": "test"}


async def test_a_failed_operator_skips_what_depends_on_it(fleet, busybox_image):
    pool = await _pool(fleet, "p")
    ev = _Events(fleet)
    wf = Workflow("broken")
    bad = wf.sandbox("bad", pool="p", image=busybox_image, command="echo half; exit 2")
    wf.sandbox("after", pool="p", image=busybox_image, command="cat /in", inputs={"/in": bad})
    wf.call("reward", lambda ins: b"1", image_or_model=REWARD, inputs={"x": "after"})
    wf.sandbox("independent", pool="p", image=busybox_image, command="echo fine")
    wf.sandbox("lenient", pool="p", image=busybox_image, command="exit 1", ok_exit_codes=(0, 1))
    run = await wf.run(fleet.results, {"p": pool})
    assert not run.ok
    states = {n: o.state for n, o in run.ops.items()}
    assert states == {"bad": "failed", "after": "skipped", "reward": "skipped", "independent": "succeeded",
                      "lenient": "succeeded"}
    assert run.ops["bad"].error == "exit code 2" and run.ops["bad"].output == b"half\n"
    assert run.ops["after"].error == "input bad failed"
    assert "after" not in ev.started()
    with pytest.raises(FlowMeshError, match="skipped"):
        run.output("after")

    boom = Workflow("boom")
    boom.call("explode", lambda ins: 1 / 0, image_or_model=REWARD)
    boom.call("use", lambda ins: b"x", image_or_model=REWARD, inputs={"e": "explode"})
    run = await boom.run(fleet.results)
    assert run.ops["explode"].state == "failed" and "ZeroDivisionError" in run.ops["explode"].error
    assert run.ops["use"].state == "skipped"


# --------------------------------------------------------------------------- #
# cross-workflow reuse and per-workflow lineage
# --------------------------------------------------------------------------- #

def _rl_variant(name: str, tenant: str, image: str, reward_scale: int) -> Workflow:
    """rollout (seeded) -> test (deterministic) -> reward (variant-specific)."""
    wf = Workflow(name, tenant=tenant)
    for i in range(2):
        roll = wf.sandbox(f"rollout-{i}", pool="gen", image=image, seed=i,
                          command=f"sleep 1; echo 'patch {i % 2}'")
        test = wf.sandbox(f"test-{i}", pool="test", image=image, deterministic=True,
                          command="grep -q 'patch 0' /work/patch.diff && echo PASS || echo FAIL",
                          inputs={"/work/patch.diff": roll})
        wf.call(f"reward-{i}", lambda ins, s=reward_scale: b"%d" % (s * (ins["v"] == b"PASS\n")),
                image_or_model=REWARD, params={"scale": reward_scale}, inputs={"v": test},
                deterministic=True)
    return wf


async def test_two_workflows_share_steps_and_keep_their_own_lineage(fleet, busybox_image):
    gen = await _pool(fleet, "gen")
    test = await _pool(fleet, "test")
    ev = _Events(fleet)
    a = _rl_variant("grpo-a", "alice", busybox_image, reward_scale=1)
    b = _rl_variant("grpo-b", "bob", busybox_image, reward_scale=10)
    pools = {"gen": gen, "test": test}
    run_a, run_b = await asyncio.gather(a.run(fleet.results, pools), b.run(fleet.results, pools))
    assert run_a.ok and run_b.ok
    # the shared steps (rollouts, tests) ran once; each variant's reward is its own
    assert sorted(ev.started()) == ["rollout-0", "rollout-1", "test-0", "test-1"]
    assert (run_a.output("reward-0"), run_a.output("reward-1")) == (b"1", b"0")
    assert (run_b.output("reward-0"), run_b.output("reward-1")) == (b"10", b"0")
    for op in ("rollout-0", "rollout-1", "test-0", "test-1"):
        kinds = {run_a.ops[op].reuse, run_b.ops[op].reuse}
        assert ReuseKind.EXECUTED in kinds and kinds & {ReuseKind.JOINED, ReuseKind.HIT}, (op, kinds)
        assert run_a.ops[op].output == run_b.ops[op].output
        assert run_a.ops[op].h_task == run_b.ops[op].h_task
    for i in range(2):
        assert run_a.ops[f"reward-{i}"].reuse is run_b.ops[f"reward-{i}"].reuse is ReuseKind.EXECUTED
        assert run_a.ops[f"reward-{i}"].h_task != run_b.ops[f"reward-{i}"].h_task
    # per-workflow lineage: which workflow asked for what and which result it got, from whom
    for run, wf in ((run_a, "grpo-a"), (run_b, "grpo-b")):
        assert len(run.lineage) == 6
        assert {e.workflow for e in run.lineage} == {wf}
        by_name = {e.name: e for e in run.lineage}
        for op, out in run.ops.items():
            assert by_name[op].h_task == out.h_task
            assert by_name[op].result_digest == out.provenance.result_digest
    shared = run_b.ops["test-0"].provenance
    assert shared == run_a.ops["test-0"].provenance      # one computation, one provenance
    assert shared.workflow in ("grpo-a", "grpo-b") and shared.tenant in ("alice", "bob")

    # a third variant later: every shared step is a hit, nothing runs in a sandbox
    before = len(ev.started())
    run_c = await _rl_variant("grpo-c", "carol", busybox_image, reward_scale=1).run(fleet.results, pools)
    assert len(ev.started()) == before
    assert all(run_c.ops[op].reuse is ReuseKind.HIT for op in run_c.ops)   # same reward as grpo-a too
    assert run_c.count(ReuseKind.HIT) == 6
    await fleet.store.flush()
    rows = await asyncio.to_thread(fleet.store.reuse, workflow="grpo-c")
    assert sorted(r.outcome for r in rows) == ["hit"] * 6


def test_op_refs_and_names_are_interchangeable():
    wf = Workflow("refs")
    r = wf.call("a", lambda i: b"1", image_or_model=REWARD)
    assert r == OpRef("a")
    wf.call("b", lambda i: b"2", image_or_model=REWARD, inputs={"x": r})
    wf.call("c", lambda i: b"3", image_or_model=REWARD, inputs={"x": "b"})
    assert wf.order() == ["a", "b", "c"]


def test_the_rl_recipe_runs_two_tenants_sharing_steps(tmp_path, busybox_image):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out_json = tmp_path / "ops.json"
    proc = subprocess.run([sys.executable, str(root / "recipes" / "rl_reuse_two_tenants.py"), "--tasks", "2",
                           "--rollouts-a", "2", "--rollouts-b", "3", "--image", busybox_image,
                           "--json", str(out_json)],
                          cwd=root, env=dict(os.environ, FLOWMESH_HOME=str(tmp_path / "home")),
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.rstrip().endswith("OK")
    import json
    ops = json.loads(out_json.read_text())
    a, b = ops["grpo-binary"], ops["grpo-shaped"]
    for name in ("rollout-0-0", "rollout-1-1", "test-0-0", "test-1-1"):
        assert a[name]["h_task"] == b[name]["h_task"]
        assert {a[name]["reuse"], b[name]["reuse"]} & {"joined", "hit"}
    assert b["rollout-0-2"]["reuse"] == "executed"          # only bob asked for seed 2
    assert a["reward-0-0"]["h_task"] != b["reward-0-0"]["h_task"]
