"""Result reuse over the content-addressable store, against the real local provider
(podman containers), real processes, and moto's S3 in server mode."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from flowmesh_sdk import EventKind, InstanceSpec, PoolSpec, SandboxSpec, SpecError, Task
from flowmesh_sdk.cas import LocalDirStore
from flowmesh_sdk.identity import label_digest
from flowmesh_sdk.reuse import ResultReuse, ReusePolicy
from flowmesh_sdk.specs import ReuseKind

ROOT = Path(__file__).resolve().parents[1]


def _spec(image: str) -> SandboxSpec:
    return SandboxSpec(image=image, cpus=1, memory_gb=0.5)


async def _pool(fleet, name: str = "reuse", slots: int = 2):
    return await fleet.pool(PoolSpec(name=name, instance=InstanceSpec(cpus=1, memory_gb=2),
                                     min_instances=1, max_instances=1, sandboxes_per_instance=slots,
                                     warm_per_image=0))


class _Runs:
    """Counts the tasks the pools really ran, from the fleet's own events."""

    def __init__(self, fleet) -> None:
        self.started: list[str] = []
        fleet.bus.on(lambda ev: self.started.append(ev.task_name), EventKind.TASK_STARTED)


async def test_a_hit_returns_the_stored_result_with_its_provenance(fleet, busybox_image):
    pool = await _pool(fleet)
    runs = _Runs(fleet)
    task = Task(name="grade", sandbox=_spec(busybox_image), command="cat /work/patch; echo ok",
                files={"/work/patch": b"fix\n"}, deterministic=True, tenant="alice")
    first = await fleet.run(task, pool="reuse", workflow="wf-a")
    assert first.ok and first.reuse is ReuseKind.EXECUTED
    prov = first.provenance
    assert prov is not None and prov.published and prov.task_id == first.task_id
    assert (prov.tenant, prov.workflow, prov.pool, prov.fleet) == ("alice", "wf-a", "reuse", "test")
    assert prov.instance_id == first.instance_id and prov.compute_s > 0

    again = await fleet.run(Task(name="grade-bob", sandbox=_spec(busybox_image),
                                 command="cat /work/patch; echo ok", files={"/work/patch": b"fix\n"},
                                 deterministic=True, tenant="bob"), pool=pool, workflow="wf-b")
    assert again.reuse is ReuseKind.HIT
    assert again.result.stdout == first.result.stdout == "fix\nok\n"
    assert again.result.exit_code == 0 and again.ok
    assert again.provenance == prov                 # who computed it first, when, where
    assert again.image_digest == first.image_digest
    assert runs.started == ["grade"]                # the hit ran nothing
    c = fleet.results.counts()
    assert (c.executions, c.hits, c.joins, c.published) == (1, 1, 0, 1)
    assert c.compute_saved_s == pytest.approx(prov.compute_s)
    lineage = fleet.results.lineage()
    assert [(e.tenant, e.workflow, e.outcome) for e in lineage] == [
        ("alice", "wf-a", ReuseKind.EXECUTED), ("bob", "wf-b", ReuseKind.HIT)]
    assert lineage[0].result_digest == lineage[1].result_digest == prov.result_digest
    # the metadata store recorded both requests (the `flowmesh status` numbers)
    await fleet.store.flush()
    summary = await asyncio.to_thread(fleet.store.reuse_summary)
    assert [(s.fleet, s.hits, s.joins, s.executions) for s in summary] == [("test", 1, 0, 1)]
    rows = await asyncio.to_thread(fleet.store.reuse, workflow="wf-b")
    assert [(r.outcome, r.tenant, r.result) for r in rows] == [("hit", "bob", prov.result_digest)]


async def test_identical_tasks_in_flight_across_pools_and_tenants_run_once(fleet, busybox_image):
    pool_a = await _pool(fleet, "pool-a")
    pool_b = await _pool(fleet, "pool-b")
    runs = _Runs(fleet)
    tasks = [Task(name=f"t-{tenant}-{i}", sandbox=_spec(busybox_image), command="sleep 1; echo $((6*7))",
                  deterministic=True, tenant=tenant) for tenant in ("a", "b") for i in range(3)]
    results = await asyncio.gather(*(fleet.run(t, pool=pool_a if t.tenant == "a" else pool_b)
                                     for t in tasks))
    assert len(runs.started) == 1
    kinds = sorted(r.reuse.value for r in results)
    assert kinds == ["executed"] + ["joined"] * 5
    assert {r.result.stdout for r in results} == {"42\n"}
    assert len({r.provenance.result_digest for r in results}) == 1
    lineage = fleet.results.lineage()
    assert sorted(e.tenant for e in lineage) == ["a", "a", "a", "b", "b", "b"]
    assert {e.computed_by for e in lineage} == {results[[r.reuse for r in results].index(ReuseKind.EXECUTED)].task_id}
    assert fleet.results.in_flight() == 0


async def test_one_byte_of_input_never_shares(fleet, busybox_image):
    pool = await _pool(fleet)
    runs = _Runs(fleet)
    mk = lambda data: Task(name="t", sandbox=_spec(busybox_image), command="sleep 0.5; cat /in",  # noqa: E731
                           files={"/in": data}, deterministic=True)
    a, b = await asyncio.gather(fleet.run(mk(b"patch-0"), pool=pool), fleet.run(mk(b"patch-1"), pool=pool))
    assert len(runs.started) == 2
    assert (a.result.stdout, b.result.stdout) == ("patch-0", "patch-1")
    assert a.reuse is b.reuse is ReuseKind.EXECUTED
    assert a.provenance.h_task != b.provenance.h_task
    assert a.provenance.h_exec == b.provenance.h_exec      # same container shape


@pytest.fixture
def second_image(busybox_image):
    """busybox plus one label: the same files under another image digest."""
    ref = f"localhost/flowmesh/reuse-test:{uuid.uuid4().hex[:8]}"
    subprocess.run(["podman", "build", "-q", "-t", ref, "-f", "-", "."], check=True, capture_output=True,
                   input=f"FROM {busybox_image}\nLABEL flowmesh.test=reuse\n".encode(), cwd="/tmp")
    yield ref
    subprocess.run(["podman", "rmi", "-f", ref], capture_output=True)


async def test_the_same_patch_on_two_image_digests_never_shares(fleet, busybox_image, second_image):
    pool = await _pool(fleet)
    runs = _Runs(fleet)
    mk = lambda image: Task(name=image, sandbox=_spec(image), command="cat /p",  # noqa: E731
                            files={"/p": b"same patch"}, deterministic=True)
    a = await fleet.run(mk(busybox_image), pool=pool)
    b = await fleet.run(mk(second_image), pool=pool)
    assert len(runs.started) == 2
    assert a.reuse is b.reuse is ReuseKind.EXECUTED
    assert a.image_digest != b.image_digest
    assert a.provenance.h_task != b.provenance.h_task
    assert (await fleet.run(mk(second_image), pool=pool)).reuse is ReuseKind.HIT


async def test_non_deterministic_work_is_reused_only_with_a_seed(fleet, busybox_image):
    pool = await _pool(fleet)
    runs = _Runs(fleet)
    plain = Task(name="sample", sandbox=_spec(busybox_image), command="echo $RANDOM")
    r1 = await fleet.run(plain, pool=pool)
    r2 = await fleet.run(plain, pool=pool)
    assert r1.reuse is r2.reuse is ReuseKind.BYPASSED and r1.provenance is None
    assert len(runs.started) == 2
    assert await fleet.results.cas.list_refs("results/") == []          # nothing stored
    seeded = lambda s: Task(name="sample", sandbox=_spec(busybox_image),  # noqa: E731
                            command="echo seeded", seed=s)
    assert (await fleet.run(seeded(7), pool=pool)).reuse is ReuseKind.EXECUTED
    assert (await fleet.run(seeded(7), pool=pool)).reuse is ReuseKind.HIT
    assert (await fleet.run(seeded(8), pool=pool)).reuse is ReuseKind.EXECUTED
    assert len(runs.started) == 4
    c = fleet.results.counts()
    assert (c.bypassed, c.executions, c.hits) == (2, 2, 1)


async def test_failure_policy(fleet, busybox_image):
    pool = await _pool(fleet)
    runs = _Runs(fleet)

    def mk(name: str, command: str, **kw) -> Task:
        return Task(name=name, sandbox=_spec(busybox_image), command=command, deterministic=True, **kw)

    # a failing verdict is not cached by default ...
    verdict = mk("verdict", "echo 'FAILED test_x'; exit 1")
    assert (await fleet.run(verdict, pool=pool)).reuse is ReuseKind.EXECUTED
    again = await fleet.run(verdict, pool=pool)
    assert again.reuse is ReuseKind.EXECUTED and again.result.exit_code == 1
    assert len(runs.started) == 2
    # ... and is with cache_failures: it is a real verdict
    verdict2 = mk("verdict2", "echo 'FAILED test_y'; exit 1")
    first = await fleet.run(verdict2, pool=pool, cache_failures=True)
    hit = await fleet.run(verdict2, pool=pool, cache_failures=True)
    assert hit.reuse is ReuseKind.HIT and hit.result.exit_code == 1 and not hit.ok
    assert hit.result.stdout == first.result.stdout == "FAILED test_y\n"
    # a timeout is never cached, whatever the policy; waiting requests do not inherit it
    slow = mk("slow", "sleep 5; echo late", timeout_s=0.5)
    outs = await asyncio.gather(*(fleet.results.run(slow, pool, cache_failures=True) for _ in range(2)))
    assert all(o.result.timed_out for o in outs)
    assert [o.reuse for o in outs] == [ReuseKind.EXECUTED, ReuseKind.EXECUTED]
    assert all(o.provenance is not None and not o.provenance.published for o in outs)
    # killed by a signal (exit >= 128): never cached
    killed = mk("killed", "kill -9 $$")
    k1 = await fleet.run(killed, pool=pool, cache_failures=True)
    assert k1.result.exit_code == 137
    assert (await fleet.run(killed, pool=pool, cache_failures=True)).reuse is ReuseKind.EXECUTED
    # an infra error (the image does not exist) is never cached either
    missing = Task(name="missing", sandbox=_spec("localhost/flowmesh/no-such-image:1"), command="true",
                   deterministic=True)
    m = await fleet.run(missing, pool=pool)
    assert m.error and "ImageNotFoundError" in m.error and m.provenance is None
    refs = await fleet.results.cas.list_refs("results/")
    assert len(refs) == 1                       # only verdict2, stored under cache_failures
    assert (await fleet.results.stored(hit.provenance.h_task)) == first.provenance


async def test_a_corrupted_cas_object_is_detected_and_recomputed(fleet, busybox_image):
    pool = await _pool(fleet)
    runs = _Runs(fleet)
    corrupt_events = fleet.bus.subscribe(EventKind.REUSE_CORRUPT)
    task = Task(name="t", sandbox=_spec(busybox_image), command="echo the answer", deterministic=True)
    first = await fleet.run(task, pool=pool)
    store: LocalDirStore = fleet.results.cas  # type: ignore[assignment]
    path = store.object_path(first.provenance.result_digest)
    raw = bytearray(path.read_bytes())
    raw[raw.index(b"the answer")] ^= 0x20          # "The answer": one bit
    path.write_bytes(bytes(raw))

    second = await fleet.run(task, pool=pool)
    assert second.reuse is ReuseKind.EXECUTED      # detected, not served: computed again
    assert second.result.stdout == "the answer\n"
    assert len(runs.started) == 2
    ev = await corrupt_events.next(5)
    assert first.provenance.result_digest in ev.detail     # names what was corrupt
    assert path.read_bytes() != bytes(raw)          # the republish repaired the object
    third = await fleet.run(task, pool=pool)
    assert third.reuse is ReuseKind.HIT and third.result.stdout == "the answer\n"
    assert fleet.results.counts().corrupt == 1

    # a corrupted index ref: the same
    ref = store.ref_path(f"results/sha256/{first.provenance.h_task.split(':')[1]}")
    ref.write_bytes(ref.read_bytes()[:-3] + b"xyz")
    fourth = await fleet.run(task, pool=pool)
    assert fourth.reuse is ReuseKind.EXECUTED and len(runs.started) == 3
    assert (await fleet.run(task, pool=pool)).reuse is ReuseKind.HIT
    corrupt_events.close()


# --------------------------------------------------------------------------- #
# real processes
# --------------------------------------------------------------------------- #

_CHILD = textwrap.dedent("""
    import asyncio, json, sys
    from pathlib import Path
    from flowmesh_sdk import EventKind, Fleet, InstanceSpec, PoolSpec, SandboxSpec, Task
    from flowmesh_sdk.cas import LocalDirStore
    from flowmesh_sdk.reuse import ResultReuse
    from flowmesh_providers.local import LocalProvider

    home, cas_root, image, me, command = sys.argv[1:6]

    async def main():
        prov = LocalProvider(cpus=1, memory_gb=2, state_dir=Path(home) / "local" / "instances")
        async with Fleet(me, home=home, providers={"local": prov}) as fleet:
            fleet.results = ResultReuse(LocalDirStore(cas_root), resolver=fleet.images, bus=fleet.bus,
                                        fleet=fleet.name)
            pool = await fleet.pool(PoolSpec(name="p", instance=InstanceSpec(cpus=1, memory_gb=2),
                                             min_instances=1, max_instances=1, warm_per_image=0))
            fleet.bus.on(lambda ev: print("started", flush=True), EventKind.TASK_STARTED)
            task = Task(name="t", sandbox=SandboxSpec(image=image, cpus=1, memory_gb=0.5),
                        command=command, deterministic=True, tenant=me)
            print("ready", flush=True)
            assert sys.stdin.readline().strip() == "go"
            tr = await fleet.run(task, pool=pool)
            c = fleet.results.counts()
            print(json.dumps({"task_id": tr.task_id, "reuse": tr.reuse.value, "stdout": tr.result.stdout,
                              "by": tr.provenance.task_id, "tenant": tr.provenance.tenant,
                              "h_task": tr.provenance.h_task, "result": tr.provenance.result_digest,
                              "published": c.published, "lost": c.lost_races}), flush=True)

    asyncio.run(main())
""")


def _child(tmp_path: Path, me: str, cas_root: Path, image: str, command: str) -> subprocess.Popen:
    home = tmp_path / f"home-{me}"
    home.mkdir()
    return subprocess.Popen([sys.executable, "-c", _CHILD, str(home), str(cas_root), image, me, command],
                            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, FLOWMESH_HOME=str(home)))


async def _readline(proc: subprocess.Popen, timeout: float = 120) -> str:
    return (await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), timeout)).strip()


async def test_two_processes_publishing_the_same_h_task_one_wins_the_other_reads_it(tmp_path, busybox_image):
    cas_root = tmp_path / "shared-cas"
    procs = [_child(tmp_path, me, cas_root, busybox_image, "sleep 1; echo same answer") for me in ("p-one", "p-two")]
    try:
        for p in procs:
            assert await _readline(p) == "ready"
        for p in procs:                      # both look up (and miss) before either publishes
            p.stdin.write("go\n")
            p.stdin.flush()
        outs = []
        for p in procs:
            lines = [line for line in (await asyncio.to_thread(p.communicate, timeout=120))[0].splitlines()
                     if line.startswith("{")]
            assert p.returncode == 0
            outs.append(json.loads(lines[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [o["reuse"] for o in outs] == ["executed", "executed"]   # both ran (same moment) ...
    winners = [o for o in outs if o["by"] == o["task_id"]]
    losers = [o for o in outs if o["by"] != o["task_id"]]
    assert len(winners) == 1 and len(losers) == 1                   # ... one published
    w, loser = winners[0], losers[0]
    assert (w["published"], w["lost"]) == (1, 0) and (loser["published"], loser["lost"]) == (0, 1)
    assert loser["by"] == w["task_id"] and loser["tenant"] == w["tenant"]   # it reads the winner's
    assert loser["result"] == w["result"] and loser["stdout"] == w["stdout"] == "same answer\n"
    assert await LocalDirStore(cas_root).list_refs("results/") == [
        "results/sha256/" + w["h_task"].split(":")[1]]


async def test_runner_crash_mid_task_leaves_nothing_half_written(tmp_path, busybox_image):
    from flowmesh_sdk import Fleet
    from flowmesh_providers.local import LocalProvider

    cas_root = tmp_path / "cas"
    command = "sleep 3; echo finished"
    proc = _child(tmp_path, "crash", cas_root, busybox_image, command)
    try:
        assert await _readline(proc) == "ready"
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert await _readline(proc) == "started"     # the sandbox runs the task ...
        os.kill(proc.pid, signal.SIGKILL)              # ... and its coordinator dies
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    store = LocalDirStore(cas_root)
    assert await store.list_refs("") == []
    assert not [p for p in (cas_root / "objects").rglob("*") if p.is_file()]

    # a restarted coordinator reclaims the orphan, and the work is computed afresh
    home = tmp_path / "home-crash"
    async with Fleet("crash", home=home, providers={"local": LocalProvider(
            cpus=1, memory_gb=2, state_dir=home / "local" / "instances")}) as fleet:
        report = await fleet.reconcile()
        assert len(report.terminated) == 1
        left = subprocess.run(["podman", "ps", "-a", "--filter", "label=flowmesh.fleet=crash", "--format",
                               "{{.Names}}"], capture_output=True, text=True, check=True).stdout.split()
        assert left == []
        fleet.results = ResultReuse(store, resolver=fleet.images, bus=fleet.bus, fleet="crash")
        pool = await _pool(fleet)
        task = Task(name="t", sandbox=SandboxSpec(image=busybox_image, cpus=1, memory_gb=0.5),
                    command=command, deterministic=True, tenant="crash")
        tr = await fleet.run(task, pool=pool)
        assert tr.reuse is ReuseKind.EXECUTED and tr.result.stdout == "finished\n"
        assert tr.provenance.published


# --------------------------------------------------------------------------- #
# in-process operators, and the S3 store
# --------------------------------------------------------------------------- #

async def _until(pred, timeout_s: float = 10.0) -> None:
    """Wait (with a deadline) until ``pred()`` holds: the reuse layer exposes gauges, not events."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not pred():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


async def test_calls_single_flight_and_a_failed_leader_is_not_shared(tmp_path):
    reuse = ResultReuse(LocalDirStore(tmp_path / "cas"), fleet="calls")
    model = label_digest("policy@1")
    calls: list[bytes] = []
    gate = asyncio.Event()

    async def infer(inputs):
        calls.append(inputs["prompt"])
        await gate.wait()
        return b"answer to " + inputs["prompt"]

    req = dict(image_or_model=model, params={"temperature": 0.0}, kind="inference", deterministic=True)
    pending = [asyncio.ensure_future(reuse.call("q", infer, inputs={"prompt": b"2+2"}, tenant=t, **req))
               for t in ("a", "b", "c")]
    other = asyncio.ensure_future(reuse.call("q", infer, inputs={"prompt": b"2+3"}, **req))
    await _until(lambda: len(calls) == 2 and reuse.waiting() == 2)
    gate.set()
    outs = await asyncio.gather(*pending, other)
    assert sorted(calls) == [b"2+2", b"2+3"]   # one run each, in whatever order they started
    assert [o.output for o in outs] == [b"answer to 2+2"] * 3 + [b"answer to 2+3"]
    assert sorted(o.reuse.value for o in outs[:3]) == ["executed", "joined", "joined"]
    # a later request is a hit; another seed is other work
    assert (await reuse.call("q", infer, inputs={"prompt": b"2+2"}, **req)).reuse is ReuseKind.HIT
    seeded = await reuse.call("q", infer, inputs={"prompt": b"2+2"}, seed=3, **req)
    assert seeded.reuse is ReuseKind.EXECUTED

    # a failing leader: nothing stored, waiting requests run their own
    attempts = 0
    release = asyncio.Event()

    async def flaky(inputs):
        nonlocal attempts
        attempts += 1
        await release.wait()
        if attempts == 1:
            raise RuntimeError("GPU fell over")
        return b"ok"

    futs = [asyncio.ensure_future(reuse.call("f", flaky, image_or_model=model, deterministic=True))
            for _ in range(3)]
    await _until(lambda: attempts == 1 and reuse.waiting() == 2)   # one leader, two parked on it
    release.set()
    res = await asyncio.gather(*futs)
    assert sum(r.error is not None for r in res) == 1 and "GPU fell over" in next(r.error for r in res if r.error)
    assert [r.output for r in res if r.error is None] == [b"ok", b"ok"]
    assert attempts == 3
    with pytest.raises(SpecError):
        await reuse.call("x", flaky, image_or_model="localhost/flowmesh/busybox:1")


async def test_reuse_over_s3(fleet, busybox_image):
    from flowmesh_sdk.testing.moto_s3 import MotoS3

    pool = await _pool(fleet)
    runs = _Runs(fleet)
    with MotoS3() as moto:
        store = moto.store("flowmesh-results", prefix="team")
        try:
            fleet.results = ResultReuse(store, resolver=fleet.images, bus=fleet.bus, fleet=fleet.name,
                                        policy=ReusePolicy(cache_failures=True))
            task = Task(name="t", sandbox=_spec(busybox_image), command="echo from s3; exit 3",
                        deterministic=True)
            a = await fleet.run(task, pool=pool)
            b = await fleet.run(task, pool=pool)
            assert (a.reuse, b.reuse) == (ReuseKind.EXECUTED, ReuseKind.HIT)
            assert b.result.stdout == "from s3\n" and b.result.exit_code == 3
            assert len(runs.started) == 1
            keys = [o["Key"] for o in moto.s3_client().list_objects_v2(Bucket="flowmesh-results")["Contents"]]
            assert f"team/refs/results/sha256/{a.provenance.h_task.split(':')[1]}" in keys
            assert f"team/objects/sha256/{a.provenance.result_digest.split(':')[1]}" in keys
        finally:
            await store.close()


def test_status_shows_hits_joins_executions_and_saved_compute(fm_home):
    from typer.testing import CliRunner

    from flowmesh_sdk.cli.main import app
    from flowmesh_sdk.control.events import Event
    from flowmesh_sdk.control.store import MetadataStore

    store = MetadataStore(fm_home / "flowmesh.db")
    try:
        for i, (kind, saved) in enumerate([(EventKind.REUSE_EXECUTED, 0.0), (EventKind.REUSE_HIT, 2.5),
                                           (EventKind.REUSE_JOINED, 2.5), (EventKind.REUSE_HIT, 2.5)]):
            store.record(Event(kind, fleet="rl", pool="p", task_id=f"r{i}", task_name="t",
                               detail=json.dumps({"h_task": "sha256:" + "1" * 64, "tenant": "a",
                                                  "workflow": "w", "saved_s": saved})))
        asyncio.run(store.flush())
    finally:
        store.close()
    out = CliRunner().invoke(app, ["status"], env={"FLOWMESH_HOME": str(fm_home), "COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    row = next(line for line in out.output.splitlines() if " rl " in f" {line} " and "7.5" in line)
    cells = [c.strip() for c in row.replace("│", "|").split("|") if c.strip()]
    assert cells == ["rl", "2", "1", "1", "7.5", "75%"]


def test_the_dedup_bench_runs_and_reports_no_wrong_reuse(tmp_path, busybox_image):
    import re

    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "dedup_rl_step.py"), "--tasks", "2",
                           "--rollouts", "4", "--full-tasks", "8", "--full-rollouts", "16",
                           "--dup-share", "0.8", "--image", busybox_image],
                          cwd=ROOT, env=dict(os.environ, FLOWMESH_HOME=str(tmp_path)),
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    m = re.fullmatch(r"executions_saved_pct=(\d+\.\d) wrong_reuse=(\d+)", last)
    assert m, last
    assert float(m.group(1)) > 0 and m.group(2) == "0"
    assert "executions = distinct" in proc.stdout and "NOT MET" not in proc.stdout
