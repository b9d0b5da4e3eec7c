"""Persistent and ephemeral pools on the local provider with real podman containers."""

import asyncio

import pytest

from flowmesh_sdk import (EventKind, FlowMeshError, ImageNotFoundError, InstanceSpec, PoolClosedError, PoolSpec,
                          QuotaError, QuotaLimits, SandboxSpec, SpecError, Task)
from flowmesh_sdk.control.events import TASK_END


def _spec(image: str, **kw) -> SandboxSpec:
    kw.setdefault("memory_gb", 0.5)
    return SandboxSpec(image=image, cpus=1, **kw)


async def test_persistent_pool_reuses_instance_with_fresh_containers(fleet, busybox_image):
    pool = await fleet.pool(PoolSpec(name="warm", instance=InstanceSpec(cpus=1, memory_gb=2),
                                     min_instances=1, max_instances=1, sandboxes_per_instance=2,
                                     warm_per_image=1, warm_images=(busybox_image,)))
    assert pool.stats().ready == 1
    spec = _spec(busybox_image)
    seen_hosts, seen_instances = set(), set()
    for i in range(3):
        async with pool.sandbox(spec) as sb:
            assert (await sb.exec("cat /tmp/marker 2>/dev/null || echo clean")).stdout == "clean\n"
            await sb.exec("echo dirty > /tmp/marker")
            seen_hosts.add((await sb.exec("hostname")).stdout)
            seen_instances.add(sb.instance_id)
    assert len(seen_hosts) == 3          # a fresh container each time
    assert len(seen_instances) == 1      # on the same warm instance
    rows = fleet.store.tasks(pool="warm")
    await fleet.store.flush()
    rows = fleet.store.tasks(pool="warm")
    assert [r.state for r in rows] == ["succeeded"] * 3


async def test_warm_acquire_skips_container_start(fleet, busybox_image):
    pool = await fleet.pool(PoolSpec(name="w2", instance=InstanceSpec(cpus=1, memory_gb=2),
                                     min_instances=1, max_instances=1, sandboxes_per_instance=1,
                                     warm_per_image=1))
    spec = _spec(busybox_image)
    ready = fleet.bus.subscribe(EventKind.SANDBOX_READY)
    async with pool.sandbox(spec):
        pass
    await ready.next(30)  # the task's own container
    await ready.next(30)  # the warm one made after it
    created_before = ready.queue.qsize()
    async with pool.sandbox(spec) as sb:
        # taken from the warm stack: no new container was started for this task
        assert ready.queue.qsize() == created_before
        assert (await sb.exec("echo hi")).stdout == "hi\n"


async def test_warm_per_image_stocks_that_many_and_a_burst_takes_them_all(fleet, busybox_image):
    """warm_per_image=3 means three started containers of the shape, not one (a defect
    found by bench/sandbox_burst.py: each refill started one, so the stock stayed at 1)."""
    pool = await fleet.pool(PoolSpec(name="w3", instance=InstanceSpec(cpus=1, memory_gb=3),
                                     min_instances=1, max_instances=1, sandboxes_per_instance=3,
                                     warm_per_image=3, warm_images=(busybox_image,)))
    ready = fleet.bus.subscribe(EventKind.SANDBOX_READY)
    while pool.stats().warm < 3:
        await ready.next(60)
    spec = pool.default_sandbox(busybox_image)
    made_before = ready.queue.qsize()
    async with pool.sandbox(spec) as a, pool.sandbox(spec) as b, pool.sandbox(spec) as c:
        assert ready.queue.qsize() == made_before          # all three from the stock: none started for them
        assert len({a.container_id, b.container_id, c.container_id}) == 3
    while pool.stats().warm < 3:                            # and the stock is back to three
        await ready.next(60)
    assert pool.stats().warm == 3


async def test_map_scales_up_to_max_and_never_exceeds_capacity(fleet, busybox_image):
    pool = await fleet.pool(PoolSpec(name="elastic", instance=InstanceSpec(cpus=1, memory_gb=2),
                                     min_instances=0, max_instances=2, sandboxes_per_instance=2,
                                     warm_per_image=0))
    running = peak = 0
    per_instance: dict[str, int] = {}

    def track(ev):
        nonlocal running, peak
        if ev.kind is EventKind.TASK_STARTED:
            running += 1
            peak = max(peak, running)
            per_instance[ev.instance_id] = per_instance.get(ev.instance_id, 0) + 1
        elif ev.kind in TASK_END and ev.instance_id:
            running -= 1

    fleet.bus.on(track)
    tasks = [Task(name=f"t{i}", sandbox=_spec(busybox_image, memory_gb=1),
                  command="cat /in/n; sleep 0.3; exit $(( $(cat /in/n) % 3 == 0 ))",
                  files={"/in/n": str(i).encode()}) for i in range(10)]
    results = await pool.map(tasks)
    assert [r.name for r in results] == [t.name for t in tasks]
    assert [r.result.stdout.strip() for r in results] == [str(i) for i in range(10)]
    assert [r.result.exit_code for r in results] == [1 if i % 3 == 0 else 0 for i in range(10)]
    assert peak <= 4
    assert len(per_instance) == 2       # scaled out to max_instances
    assert all(r.phases.execution > 0 and r.phases.total >= r.phases.execution for r in results)
    await fleet.store.flush()
    states = {r.name: r.state for r in fleet.store.tasks(pool="elastic")}
    assert states == {f"t{i}": ("failed" if i % 3 == 0 else "succeeded") for i in range(10)}


async def test_idle_instances_are_reclaimed_down_to_min(fleet, busybox_image):
    pool = await fleet.pool(PoolSpec(name="idle", instance=InstanceSpec(cpus=1, memory_gb=1),
                                     min_instances=0, max_instances=1, idle_timeout_s=0.5,
                                     warm_per_image=0))
    terminated = fleet.bus.subscribe(EventKind.INSTANCE_TERMINATED)
    async with pool.sandbox(_spec(busybox_image)) as sb:
        inst = sb.instance_id
    ev = await terminated.next(30)
    assert ev.instance_id == inst
    assert pool.stats().instances == 0
    # and it comes back on demand
    async with pool.sandbox(_spec(busybox_image)) as sb:
        assert (await sb.exec("true")).exit_code == 0


async def test_ephemeral_pool_fresh_instance_per_task(fleet, busybox_image):
    pool = await fleet.pool(PoolSpec(name="eph", mode="ephemeral",
                                     instance=InstanceSpec(cpus=1, memory_gb=1), max_instances=2))
    terminated = fleet.bus.subscribe(EventKind.INSTANCE_TERMINATED)
    results = await pool.map([Task(name=f"e{i}", sandbox=_spec(busybox_image), command="hostname")
                              for i in range(3)])
    assert all(r.ok for r in results)
    assert len({r.instance_id for r in results}) == 3
    gone = {(await terminated.next(30)).instance_id for _ in range(3)}
    assert gone == {r.instance_id for r in results}
    assert pool.stats().instances == 0
    assert await fleet.provider("local").list_tagged({"flowmesh:pool": "eph"}) == []


async def test_missing_image_fails_before_any_instance(fleet):
    pool = await fleet.pool(PoolSpec(name="noimg", mode="ephemeral",
                                     instance=InstanceSpec(cpus=1, memory_gb=1)))
    events = fleet.bus.subscribe()
    with pytest.raises(ImageNotFoundError, match="localhost/flowmesh/does-not-exist:1"):
        async with pool.sandbox(_spec("localhost/flowmesh/does-not-exist:1")):
            pass
    kinds = []
    while not events.queue.empty():
        kinds.append(events.queue.get_nowait().kind)
    assert EventKind.TASK_REJECTED in kinds
    assert EventKind.INSTANCE_REQUESTED not in kinds
    res = await pool.run_task(Task(name="x", sandbox=_spec("localhost/flowmesh/does-not-exist:1"),
                                   command="true"))
    assert not res.ok and res.error.startswith("ImageNotFoundError")


async def test_impossible_size_and_unknown_provider(fleet):
    with pytest.raises(SpecError, match=r"pool.instance: no offer of provider 'local' fits: this host has 2 cpus"):
        await fleet.pool(PoolSpec(name="huge", instance=InstanceSpec(cpus=64, memory_gb=1)))
    with pytest.raises(SpecError, match="unknown provider 'nimbus'"):
        await fleet.pool(PoolSpec(name="cloud", provider="nimbus"))
    pool = await fleet.pool(PoolSpec(name="small", instance=InstanceSpec(cpus=1, memory_gb=1)))
    with pytest.raises(SpecError, match="sandbox.memory_gb"):
        async with pool.sandbox(SandboxSpec(image="x", memory_gb=4)):
            pass


async def test_tenant_quota_rejects_at_submission(fm_home, busybox_image):
    from flowmesh_sdk import Fleet
    from flowmesh_providers.local import LocalProvider
    prov = LocalProvider(cpus=2, memory_gb=8, state_dir=fm_home / "q")
    async with Fleet("quota", home=fm_home, providers={"local": prov},
                     quotas={"*": QuotaLimits(max_in_flight=1)}) as fleet:
        pool = await fleet.pool(PoolSpec(name="q", instance=InstanceSpec(cpus=1, memory_gb=2),
                                         sandboxes_per_instance=2, warm_per_image=0))
        async with pool.sandbox(_spec(busybox_image), tenant="alice"):
            with pytest.raises(QuotaError, match="tenant 'alice'"):
                async with pool.sandbox(_spec(busybox_image), tenant="alice"):
                    pass
            async with pool.sandbox(_spec(busybox_image), tenant="bob") as sb:
                assert (await sb.exec("echo bob")).stdout == "bob\n"


async def test_drain_waits_for_in_flight_then_terminates(fleet, busybox_image):
    pool = await fleet.pool(PoolSpec(name="drain", instance=InstanceSpec(cpus=1, memory_gb=2),
                                     min_instances=1, warm_per_image=1, warm_images=(busybox_image,)))
    started = asyncio.Event()

    async def long_task() -> str:
        async with pool.sandbox(_spec(busybox_image)) as sb:
            started.set()
            return (await sb.exec("sleep 1; echo finished")).stdout

    job = asyncio.ensure_future(long_task())
    await started.wait()
    drain = asyncio.ensure_future(pool.drain())
    await asyncio.sleep(0)
    with pytest.raises(PoolClosedError):
        async with pool.sandbox(_spec(busybox_image)):
            pass
    assert await job == "finished\n"
    await drain
    assert pool.stats().instances == 0
    assert await fleet.provider("local").list_tagged({"flowmesh:pool": "drain"}) == []


async def test_a_drain_without_a_deadline_says_what_it_waits_for(fleet, busybox_image, caplog, monkeypatch):
    from flowmesh_sdk.pools import base
    monkeypatch.setattr(base, "DRAIN_NOTICE_S", 0.2)
    pool = await fleet.pool(PoolSpec(name="notice", instance=InstanceSpec(cpus=1, memory_gb=2), warm_per_image=0))
    held = pool.sandbox(_spec(busybox_image))
    await held.__aenter__()                  # left open, as a deployment never stopped
    drain = asyncio.ensure_future(pool.drain())
    deadline = asyncio.get_running_loop().time() + 60   # a bound on the wait, not a timing claim
    while not any("drain has waited" in r.getMessage() for r in caplog.records):
        assert asyncio.get_running_loop().time() < deadline, "no notice from a drain that waits"
        await asyncio.sleep(0.05)
    (notice, *_) = [r.getMessage() for r in caplog.records if "drain has waited" in r.getMessage()]
    assert "pool notice" in notice and "1 task(s) or sandbox(es) in flight" in notice
    assert not drain.done()                  # it still waits for the open sandbox
    await held.__aexit__(None, None, None)
    await asyncio.wait_for(drain, 120)
    assert await fleet.provider("local").list_tagged({"flowmesh:pool": "notice"}) == []


async def test_a_fleet_left_with_an_exception_waits_for_no_sandbox_left_open(fleet, busybox_image):
    # Hostile use: a sandbox (or a SWE-ReX deployment) opened and never closed, then the block
    # raises.  Before: Fleet.__aexit__ drained without a deadline and never returned.
    pool = await fleet.pool(PoolSpec(name="left-open", instance=InstanceSpec(cpus=1, memory_gb=2),
                                     warm_per_image=0))
    held = pool.sandbox(_spec(busybox_image))
    sb = await held.__aenter__()
    assert (await sb.exec("echo open")).stdout == "open\n"

    async def block() -> None:
        async with fleet:
            raise RuntimeError("the caller's own error")

    with pytest.raises(RuntimeError, match="the caller's own error"):
        await asyncio.wait_for(block(), 120)    # a bound on a hang, not a timing claim
    assert await fleet.provider("local").list_tagged({"flowmesh:pool": "left-open"}) == []
    with pytest.raises(FlowMeshError):
        await sb.exec("true")
    await held.__aexit__(None, None, None)     # closing it late is harmless


async def test_a_closed_fleet_makes_no_pool(fleet, busybox_image):
    # Hostile use: a pool asked of a fleet already closed.  Before: it launched an instance
    # on the closed store and providers, and nothing was left to terminate it.
    await fleet.close()
    with pytest.raises(PoolClosedError, match="fleet test is closed"):
        await fleet.pool(PoolSpec(name="late", instance=InstanceSpec(cpus=1, memory_gb=1), min_instances=1))
    assert await fleet.provider("local").list_tagged({"flowmesh:pool": "late"}) == []


async def test_cancelled_task_is_recorded_and_sandbox_closed(fleet, busybox_image):
    pool = await fleet.pool(PoolSpec(name="cancel", instance=InstanceSpec(cpus=1, memory_gb=1),
                                     warm_per_image=0))
    events = fleet.bus.subscribe(EventKind.TASK_CANCELLED, EventKind.SANDBOX_CLOSED)
    started = asyncio.Event()

    async def body() -> None:
        async with pool.sandbox(_spec(busybox_image), name="to-cancel") as sb:
            started.set()
            await sb.exec("sleep 60")

    job = asyncio.ensure_future(body())
    await started.wait()
    job.cancel()
    with pytest.raises(asyncio.CancelledError):
        await job
    kinds = {(await events.next(30)).kind for _ in range(2)}
    assert kinds == {EventKind.TASK_CANCELLED, EventKind.SANDBOX_CLOSED}
    await fleet.store.flush()
    (row,) = [r for r in fleet.store.tasks(pool="cancel") if r.name == "to-cancel"]
    assert row.state == "cancelled"
    assert pool.stats().in_flight == 0 and pool.stats().free_slots == 1


async def test_region_filter_and_idle_reclaim_reports_draining(fleet, busybox_image):
    with pytest.raises(SpecError, match="in region 'us-east-1'"):
        await fleet.pool(PoolSpec(name="far", region="us-east-1", instance=InstanceSpec(cpus=1, memory_gb=1)))
    pool = await fleet.pool(PoolSpec(name="near", region="local", instance=InstanceSpec(cpus=1, memory_gb=1),
                                     idle_timeout_s=0.3, warm_per_image=0))
    seen = fleet.bus.subscribe(EventKind.INSTANCE_DRAINING, EventKind.INSTANCE_TERMINATED)
    async with pool.sandbox(_spec(busybox_image)):
        pass
    first, second = await seen.next(30), await seen.next(30)
    assert (first.kind, first.detail, second.kind) == (EventKind.INSTANCE_DRAINING, "idle",
                                                       EventKind.INSTANCE_TERMINATED)


def test_sync_facade(fm_home, busybox_image):
    from flowmesh_sdk.sync import SyncFleet
    from flowmesh_providers.local import LocalProvider
    prov = LocalProvider(cpus=2, memory_gb=8, state_dir=fm_home / "sync")
    done: list[str] = []
    with SyncFleet("sync", home=fm_home, providers={"local": prov}) as fleet:
        pool = fleet.pool(name="s", instance=InstanceSpec(cpus=1, memory_gb=2))
        with pool.sandbox(image=busybox_image) as sb:
            sb.write_file("/tmp/x", b"abc", mode=0o640)
            assert sb.read_file("/tmp/x") == b"abc"
            r = sb.exec("yes | head -c 5000", output_cap=10)
            assert r.stdout_truncated and r.stdout_bytes == 5000
            # sessions keep their state; background processes stream and take stdin
            sh = sb.session()
            sh.run("cd /tmp && export WHO=sync")
            assert sh.run('echo "$PWD $WHO"').stdout == "/tmp sync\n"
            proc = sb.start("while read -r line; do echo got:$line; done")
            proc.write_stdin("one\ntwo\n")
            proc.close_stdin()
            assert b"".join(proc.stdout) == b"got:one\ngot:two\n"
            assert proc.wait().exit_code == 0 and proc.returncode == 0
            sleeper = sb.start("exec sleep 100")
            sleeper.kill()
            assert sleeper.wait(timeout_s=30).exit_code == 137        # 128 + SIGKILL, as in exec
        res = pool.map([Task(name=f"m{i}", sandbox=pool.default_sandbox(busybox_image), command="true")
                        for i in range(2)], on_result=lambda r: done.append(r.name))
        assert all(r.ok for r in res) and sorted(done) == ["m0", "m1"]
    assert fleet.fleet.pools["s"].closed
    with pytest.raises(SpecError):
        SyncFleet("Bad Name")


async def test_ephemeral_burst_shares_one_launch_call(fm_home, busybox_image):
    from flowmesh_sdk import Fleet
    from flowmesh_providers.local import LocalProvider

    class Counting(LocalProvider):
        calls: list[int] = []

        async def launch(self, request):
            self.calls.append(request.count)
            return await super().launch(request)

    prov = Counting(cpus=4, memory_gb=8, state_dir=fm_home / "burst")
    async with Fleet("burst", home=fm_home, providers={"local": prov}) as fleet:
        pool = await fleet.pool(PoolSpec(name="b", mode="ephemeral", instance=InstanceSpec(cpus=1, memory_gb=1),
                                         max_instances=3))
        results = await pool.map([Task(name=f"b{i}", sandbox=_spec(busybox_image), command="hostname")
                                  for i in range(3)])
        assert all(r.ok for r in results) and len({r.instance_id for r in results}) == 3
        assert prov.calls == [3]               # one launch call for the burst of three
        assert pool.stats().instances == 0    # and each instance went with its task
