"""The simulator: virtual time, fair-share links, and the real pools on simulated clouds
(capacity failover, spot interruptions re-dispatched, one launch per burst)."""

from __future__ import annotations

import asyncio

import pytest

from flowmesh_providers.sim import ec2
from flowmesh_providers.sim.network import Link
from flowmesh_sdk.sim import SimInstanceType, Workload, run_scenario, unlimited
from flowmesh_sdk.sim.loop import VirtualTimeLoop, run
from flowmesh_sdk import clock
from flowmesh_sdk.errors import SpecError

SMALL = SimInstanceType("c.2xlarge", 8, 16, 0.34, nic_gbps=0.1)


def test_virtual_time_jumps_to_the_next_timer():
    async def main() -> tuple[float, bool]:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, VirtualTimeLoop)
        t0 = clock.monotonic()
        await asyncio.sleep(6000)                      # a hundred simulated minutes
        slept = clock.monotonic() - t0
        try:
            await asyncio.wait_for(asyncio.Event().wait(), 30)
            timed_out = False
        except asyncio.TimeoutError:
            timed_out = True
        return slept, timed_out

    slept, timed_out = run(main())
    assert slept == pytest.approx(6000.0)
    assert timed_out


def test_a_link_shares_its_capacity_fairly():
    async def main() -> dict[str, float]:
        link = Link("l", 100.0)                        # 100 bytes/s
        done: dict[str, float] = {}

        async def send(name: str, size: float, after: float) -> None:
            await asyncio.sleep(after)
            await link.carry(size)
            done[name] = clock.monotonic()

        await asyncio.gather(send("a", 100, 0), send("b", 300, 0), send("c", 50, 3))
        return done

    done = run(main())
    # a and b share 50/50 until a is done at 2 s; b alone until c joins at 3 s (b has 150
    # left); then 50 each: c's 50 bytes take 1 s (t=4), b's last 50 at 100/s (t=4.5)
    assert done["a"] == pytest.approx(2.0)
    assert done["c"] == pytest.approx(4.0)
    assert done["b"] == pytest.approx(4.5)


def test_ephemeral_batch_on_ec2_limits_is_deterministic_and_meets_its_bound():
    w = Workload(tasks=30, minutes=100, instance_type="c.2xlarge", mode="ephemeral")
    a = run_scenario(ec2((SMALL,)), w, seed=3)
    b = run_scenario(ec2((SMALL,)), w, seed=3)
    c = run_scenario(ec2((SMALL,)), w, seed=4)
    assert (a.succeeded, a.failed, a.instances_launched) == (30, 0, 30)
    assert a.makespan_s >= a.lower_bound_s - 1e-6          # the bound is a bound
    assert a.lower_bound_s > 6000 + 60                      # work + a 0.75 GB pull at 100 Mbit/s
    assert (a.makespan_s, a.cost_usd, a.api_calls) == (b.makespan_s, b.cost_usd, b.api_calls)
    assert a.makespan_s != c.makespan_s                     # other boot times drawn
    assert a.api_calls["launch"] == 1                       # one call for the burst
    assert a.phases_p50.execution == pytest.approx(6000.0)
    # 30 VMs of $0.34/h, each billed from launch to termination (> 100 minutes)
    assert 30 * 0.34 * 6000 / 3600 < a.cost_usd < 30 * 0.34 * a.makespan_s / 3600 + 1


def test_capacity_error_fails_over_to_the_next_type_and_both_are_billed():
    scarce = SimInstanceType("a.cheap", 8, 16, 0.30, capacity=3)
    dear = SimInstanceType("b.dear", 8, 16, 0.50)
    cloud = unlimited("cap", (scarce, dear))
    w = Workload(tasks=5, minutes=10, instance_type="a.cheap", mode="ephemeral")
    # the pool sees both types' offers when the workload names none in particular:
    from flowmesh_sdk.sim import scenario
    r = scenario.run_scenario(cloud, w, seed=1, instance_types=("a.cheap", "b.dear"))
    assert r.succeeded == 5 and r.failovers >= 1
    by_type = r.api_calls
    assert by_type["launch"] >= 2
    assert r.cost_usd > 5 * 0.30 * 600 / 3600     # some of it at the dearer price


def test_spot_interruptions_are_redispatched_and_every_task_completes():
    spot = SimInstanceType("s.2xlarge", 8, 16, 0.34, spot_price_per_hour=0.10)
    cloud = unlimited("spotty", (spot,), spot_interruptions_per_hour=0.3)
    w = Workload(tasks=20, minutes=60, instance_type="s.2xlarge", mode="ephemeral", spot=True)
    r = run_scenario(cloud, w, seed=11)
    assert r.redispatched > 0 and r.interrupted >= r.redispatched
    assert r.succeeded == 20 and r.failed == 0
    assert r.instances_launched >= 20 + r.redispatched       # a fresh VM for each re-dispatch
    # interrupted VMs are billed until they went away, spot price throughout
    assert r.cost_usd < r.instances_launched * 0.10 * r.makespan_s / 3600


def test_persistent_burst_packs_tasks_and_launches_once():
    big = SimInstanceType("m.16xlarge", 64, 256, 3.0, nic_gbps=1.0)
    w = Workload(tasks=40, minutes=30, instance_type="m.16xlarge", mode="persistent",
                 tasks_per_instance=8)
    r = run_scenario(ec2((big,)), w, seed=2)
    assert r.succeeded == 40 and r.instances_launched == 5
    assert r.api_calls["launch"] == 1


def test_bad_workload_names_the_field():
    with pytest.raises(SpecError) as ei:
        Workload(tasks=0, minutes=10, instance_type="x")
    assert ei.value.field == "workload.tasks"
    with pytest.raises(SpecError) as ei:
        run_scenario(ec2((SMALL,)), Workload(tasks=1, minutes=1, instance_type="nope"))
    assert ei.value.field == "sim.instance_type"


def test_images_wanted_by_sandboxes_being_made_are_never_evicted():
    # 40 tasks at once on one machine whose image budget (80% of 20 GB) holds 16 of their
    # 1 GB images: pulls cross the high-water mark while other tasks' images wait for their
    # containers; none of those may be evicted (they once were: "image not known")
    big = SimInstanceType("m.big", 64, 256, 3.0, nic_gbps=1.0)
    w = Workload(tasks=40, minutes=5, instance_type="m.big", mode="persistent", tasks_per_instance=40,
                 image_gb=1.0, disk_gb=20, prewarmed=True)
    r = run_scenario(unlimited("disk", (big,)), w, seed=0)
    assert (r.succeeded, r.failed) == (40, 0)


@pytest.mark.slow
def test_ten_thousand_concurrent_tasks_through_the_real_control_plane():
    # the control plane at MegaFlow's largest scale, on a 2-core machine: 10,000 hundred-
    # minute tasks, one simulated c5.2xlarge each, under EC2's published API limits
    w = Workload(tasks=10_000, minutes=100, instance_type="c.2xlarge", mode="ephemeral")
    r = run_scenario(ec2((SMALL,)), w, seed=5)
    assert (r.succeeded, r.failed, r.instances_launched) == (10_000, 0, 10_000)
    # launches follow the resource bucket: what it holds (1,000), then calls of ~10 s of
    # refill (20 instances at 2/s) -- not 10,000 calls, and not one call that cannot be served
    assert r.api_calls["launch"] == 1 + (10_000 - 1_000) // 20
    # the 10,000th instance cannot be asked for before (10,000 - 1,000) / 2 s = 75 min
    assert r.lower_bound_s > 6000 + 75 * 60
    assert r.lower_bound_s <= r.makespan_s <= 1.02 * r.lower_bound_s
    assert r.phases_p50.execution == pytest.approx(6000.0)


def test_offers_are_shapes_priced_by_the_clouds_catalog():
    from flowmesh_providers.sim import SimProvider
    from flowmesh_sdk.sim import sim_catalog
    from flowmesh_sdk.specs import InstanceSpec
    spot = SimInstanceType("s.2xlarge", 8, 16, 0.34, spot_price_per_hour=0.10)
    cloud = unlimited("spotty", (spot, SMALL))
    rows = cloud.catalog_rows()
    assert [(r.provider, r.region, r.instance_type, r.on_demand_per_hour, r.spot_per_hour, r.source)
            for r in rows] == [("spotty", "sim-1", "s.2xlarge", 0.34, 0.10, "simulated"),
                               ("spotty", "sim-1", "c.2xlarge", 0.34, None, "simulated")]
    assert sim_catalog(cloud, ec2((SMALL,))).rows == rows + ec2((SMALL,)).catalog_rows()
    prov = SimProvider(cloud, images={})
    offers = run(prov.offers(InstanceSpec(cpus=8, memory_gb=16)))
    assert [o.instance_type for o in offers] == ["s.2xlarge", "c.2xlarge"]
    assert all(o.price_per_hour is None and not o.spot and o.provider == "spotty" for o in offers)
    assert prov.capabilities.spot and not prov.capabilities.free


def test_spot_preference_decides_the_market():
    spot = SimInstanceType("s.2xlarge", 8, 16, 0.34, spot_price_per_hour=0.10)
    cloud = unlimited("spotty", (spot,))
    base = dict(tasks=4, minutes=10, instance_type="s.2xlarge", mode="ephemeral")
    never = run_scenario(cloud, Workload(**base), seed=1)
    only = run_scenario(cloud, Workload(**base, spot="only"), seed=1)
    assert Workload(**base, spot=True).spot == "prefer" and Workload(**base).spot == "never"
    assert only.cost_usd == pytest.approx(never.cost_usd * 0.10 / 0.34)
    with pytest.raises(SpecError) as ei:
        Workload(**base, spot="sometimes")
    assert ei.value.field == "workload.spot"


def _sim_pool_run(body, *, sticky: int = 0, min_instances: int = 1, pool_options=None, **fleet_options):
    """Run ``body(fleet, prov, pool)`` on a persistent pool over one simulated cloud
    (``pool_options``: PoolSpec fields besides its defaults here)."""
    import tempfile

    from flowmesh_sdk.sim.scenario import sim_fleet
    from flowmesh_sdk.specs import InstanceSpec, PoolSpec

    async def main():
        with tempfile.TemporaryDirectory(prefix="fm-sim-") as home:
            async with sim_fleet(ec2((SMALL,)), {"sim/base:1": 10**8}, home=home, sticky_terminations=sticky,
                                 **fleet_options) as (fleet, prov):
                pool = await fleet.pool(PoolSpec(name="p", provider="ec2", mode="persistent",
                                                 instance=InstanceSpec(cpus=8, memory_gb=16),
                                                 min_instances=min_instances, max_instances=2,
                                                 **{"warm_per_image": 0, **(pool_options or {})}))
                return await body(fleet, prov, pool)
    return run(main())


def test_sticky_terminations_keep_an_instance_listed_until_terminate_is_called_again():
    from flowmesh_sdk.provider import TAG_FLEET, ProviderState

    async def body(fleet, prov, pool):
        (iid,) = list(prov.vms)
        await prov.terminate([iid])
        after_one = (await prov.describe([iid]))[0].state, len(await prov.list_tagged({TAG_FLEET: "sim"}))
        cost_then = prov.cost()
        await asyncio.sleep(600)
        still_billed = prov.cost() > cost_then
        await prov.terminate([iid])
        after_two = (await prov.describe([iid]))[0].state, len(await prov.list_tagged({TAG_FLEET: "sim"}))
        prov.stick(iid, 5)                   # per instance; it is gone already: no effect
        return after_one, still_billed, after_two, prov.terminate_calls(iid)

    after_one, still_billed, after_two, calls = _sim_pool_run(body, sticky=1)
    assert after_one == (ProviderState.RUNNING, 1) and still_billed
    assert after_two == (ProviderState.TERMINATED, 0) and calls == 2


def test_preempt_removes_an_instance_behind_the_sdks_back_and_stop_reads_stopped():
    from flowmesh_sdk.provider import TAG_FLEET, ProviderState

    async def body(fleet, prov, pool):
        (iid,) = list(prov.vms)
        assert prov.preempt(iid) and not prov.preempt(iid)
        gone = (await prov.describe([iid]))[0].state, await prov.list_tagged({TAG_FLEET: "sim"})
        billed = prov.cost()
        await asyncio.sleep(3600)
        assert prov.cost() == billed         # no billing after the preemption
        other = (await prov.launch(_request(prov)))[0].id
        assert prov.stop(other) and not prov.stop(other)
        stopped = (await prov.describe([other]))[0].state
        listed = [i.id for i in await prov.list_tagged({})]
        await prov.terminate([other])
        with pytest.raises(SpecError):
            prov.preempt("ec2-nope")
        return gone, stopped, listed, other, prov.stats()

    (state, listed_after), stopped, listed, other, stats = _sim_pool_run(body, reconcile_interval_s=None)
    assert state is ProviderState.TERMINATED and listed_after == []
    assert stopped is ProviderState.STOPPED and other in listed
    assert stats["interrupted"] == 1 and stats["stopped"] == 1


def test_a_terminated_instance_is_listed_for_an_hour_then_forgotten_its_bill_kept():
    from flowmesh_providers.sim.provider import FORGET_AFTER_S
    from flowmesh_sdk.provider import ProviderState

    async def body(fleet, prov, pool):
        (iid,) = list(prov.vms)
        assert prov.preempt(iid)
        billed, stats = prov.cost(), prov.stats()
        await asyncio.sleep(FORGET_AFTER_S - 1)
        listed = [i.state for i in await prov.describe([iid])]
        await asyncio.sleep(2)
        return (billed, stats), listed, (await prov.describe([iid]), iid in prov.vms, prov.cost(), prov.stats())

    (billed, stats), listed, (described, kept, cost, stats_after) = _sim_pool_run(body, reconcile_interval_s=None)
    assert listed == [ProviderState.TERMINATED]                # within the hour: listed, terminated
    assert described == [] and not kept                        # after it: forgotten (EC2's "less than one hour")
    assert billed > 0 and cost == pytest.approx(billed)         # its bill stays
    assert (stats_after["vms"], stats_after["interrupted"]) == (stats["vms"], 1) == (1, 1)
    assert stats_after["listed"] == 0


def _request(prov):
    from flowmesh_sdk.provider import TAG_FLEET, LaunchRequest
    from flowmesh_sdk.specs import InstanceSpec, Offer
    offer = Offer(provider="ec2", region="us-east-1", instance_type="c.2xlarge", cpus=8, memory_gb=16,
                  price_per_hour=0.34)
    return LaunchRequest(offer=offer, spec=InstanceSpec(cpus=8, memory_gb=16), count=1, request_id="extra",
                         tags={TAG_FLEET: "other"})


def test_sessions_and_processes_on_a_simulated_sandbox_take_virtual_time():
    """A program written against sessions and start() runs on the simulator unchanged:
    sim-work takes its virtual seconds there too, and interrupts, kills and timeouts end it."""
    from flowmesh_sdk.sim.scenario import REGISTRY
    from flowmesh_sdk.specs import SandboxSpec

    async def body(fleet, prov, pool):
        async with pool.sandbox(SandboxSpec(image=f"{REGISTRY}/sim/base:1", cpus=1, memory_gb=1)) as sb:
            sh = sb.session()
            t0 = clock.monotonic()
            r = await sh.run("sim-work 30")
            ran = clock.monotonic() - t0
            assert (r.exit_code, r.stdout) == (0, "ok\n")
            long = asyncio.ensure_future(sh.run("sim-work 1000"))
            await asyncio.sleep(5)
            assert sh.running
            await sh.interrupt()
            assert (await long).exit_code == 130
            late = await sh.run("sim-work 1000", timeout_s=20)
            assert late.timed_out
            assert (await sh.run("sim-work 1 3")).exit_code == 3        # the session goes on
            proc = await sb.start("sim-work 60")
            assert proc.pid > 0
            assert await proc.stdout.read() == b"ok\n"
            assert (await proc.wait()).exit_code == 0
            sleeper = await sb.start("sim-work 1000")
            await sleeper.kill()
            assert (await sleeper.wait(timeout_s=60)).exit_code == 137
            return ran

    assert _sim_pool_run(body) == pytest.approx(30.0, abs=0.5)


def test_warm_refills_wait_for_a_lull_in_the_takes_and_no_longer_than_their_cap(monkeypatch):
    """A burst of takes from the warm stock is not slowed by the container starts of its own
    refills: they start once no take has come for WARM_REFILL_QUIET_S.  Under takes that never
    pause, each refill starts WARM_REFILL_MAX_WAIT_S after its take at the latest."""
    from flowmesh_providers.sim.machine import SimMachine
    from flowmesh_sdk.provider import LABEL_TASK
    from flowmesh_sdk.pools import persistent
    from flowmesh_sdk.sim.scenario import REGISTRY

    starts: list[float] = []   # when each warm container's start began (not the takes' own cold ones)
    opened = SimMachine.open_channel

    async def open_channel(self, argv):
        if list(argv[:3]) == ["podman", "run", "-i"] and f"{LABEL_TASK}=warm" in argv:
            starts.append(clock.monotonic())
        return await opened(self, argv)

    monkeypatch.setattr(SimMachine, "open_channel", open_channel)
    image = f"{REGISTRY}/sim/base:1"
    quiet, cap = persistent.WARM_REFILL_QUIET_S, persistent.WARM_REFILL_MAX_WAIT_S

    async def take(pool, at: float) -> None:
        await asyncio.sleep(at)
        async with pool.sandbox(pool.default_sandbox(image)) as sb:   # the stock's shape
            assert (await sb.exec("true")).ok

    async def body(fleet, prov, pool):
        await asyncio.sleep(60)                       # the stock of 4 is up
        stocked = len(starts)
        t0 = clock.monotonic()
        # a burst: four takes half the quiet window apart
        await asyncio.gather(*(take(pool, i * quiet / 2) for i in range(4)))
        last_take = t0 + 3 * quiet / 2
        await asyncio.sleep(5)
        burst_refills = starts[stocked:]
        # takes that never pause (half the quiet window apart, for three times the cap)
        t1 = clock.monotonic()
        before = len(starts)
        await asyncio.gather(*(take(pool, i * quiet / 2) for i in range(int(3 * cap / (quiet / 2)))))
        stream_refills = starts[before:]
        return stocked, last_take, burst_refills, t1, stream_refills

    stocked, last_take, burst, t1, stream = _sim_pool_run(
        body, pool_options={"warm_per_image": 4, "sandboxes_per_instance": 64, "warm_images": (image,)})
    assert stocked == 4
    assert len(burst) == 4                                         # each take replaced
    assert min(burst) >= last_take + quiet - 1e-9                  # none during the burst
    assert max(burst) <= last_take + quiet + 1.0                   # and soon after it (two at a time)
    assert stream and min(stream) <= t1 + cap + 1e-6               # the cap, under takes that never pause
    assert min(stream) >= t1 + cap - 1e-6                          # (and not before: no lull came)


@pytest.mark.parametrize("mode", ["ephemeral", "persistent"])
def test_finished_tasks_leave_no_reference_cycles_and_no_runtimes_behind(mode):
    """What a task's journey made is freed when it ends, by reference counting: nothing of
    it waits for the collector's full passes, which walk the coordinator's whole heap
    (issue 29: a sandbox and its channels once held each other, and the fleet kept every
    instance's runtime for its life).  The garbage is caught with ``DEBUG_SAVEALL``."""
    import collections
    import gc
    import tempfile

    from flowmesh_sdk.remote.runtime import ContainerRuntime
    from flowmesh_sdk.sim.scenario import REGISTRY, sim_fleet
    from flowmesh_sdk.specs import InstanceSpec, PoolSpec, SandboxSpec, Task

    n = 24

    async def main():
        with tempfile.TemporaryDirectory(prefix="fm-sim-") as home:
            async with sim_fleet(ec2((SMALL,)), {"sim/base:1": 10**8}, home=home) as (fleet, prov):
                pool = await fleet.pool(PoolSpec(name="p", provider="ec2", mode=mode,
                                                 instance=InstanceSpec(cpus=8, memory_gb=16), max_instances=n,
                                                 sandboxes_per_instance=4 if mode == "persistent" else 1,
                                                 warm_per_image=0))
                sandbox = SandboxSpec(image=f"{REGISTRY}/sim/base:1", cpus=1, memory_gb=1)
                tasks = [Task(name=f"t{i}", sandbox=sandbox, command="sim-work 10") for i in range(n)]
                gc.collect()
                gc.set_debug(gc.DEBUG_SAVEALL)
                try:
                    results = await pool.map(tasks)
                    gc.collect()
                    garbage = collections.Counter(f"{type(o).__module__}.{type(o).__qualname__}"
                                                  for o in gc.garbage)
                finally:
                    gc.set_debug(0)
                    gc.garbage.clear()
                machines = {id(vm.machine) for vm in prov.vms.values()}   # this run's (not other tests')
                runtimes = sum(isinstance(o, ContainerRuntime) and id(o.runner) in machines
                               for o in gc.get_objects())
                return results, garbage, runtimes, len(pool.instances)

    results, garbage, runtimes, instances = run(main())
    assert [r.ok for r in results] == [True] * n
    assert garbage == collections.Counter(), garbage.most_common(10)
    assert runtimes <= instances   # the live instances' own; none of those terminated
    if mode == "ephemeral":
        assert instances == 0       # each was terminated after its task


def test_a_long_launch_holds_no_instance_whose_task_ended():
    """An ephemeral pool's one launch for a batch is let out by the cloud's rate limit over
    a long time; the instances whose tasks have ended are freed meanwhile, not held by the
    launch until its last instance is up (issue 29: a 100,000-task launch held every
    instance it had launched, with its runtime and bootstrap records, for 14 hours)."""
    import gc
    import tempfile

    from flowmesh_sdk.descriptor import ApiRate
    from flowmesh_sdk.pools.instance import ManagedInstance
    from flowmesh_sdk.sim.scenario import REGISTRY, sim_fleet
    from flowmesh_sdk.specs import InstanceSpec, PoolSpec, SandboxSpec, Task

    n = 60
    # 10 instances at once, then one a second: the launch of 60 lasts about 50 s; each boots in
    # about 2 s and its task takes 5
    cloud = unlimited("slow", (SMALL,), boot_median_s=2.0, boot_p90_s=3.0,
                      rates=(ApiRate("launch", rate_per_s=1.0, burst=10, per_instance=True),))

    async def main():
        with tempfile.TemporaryDirectory(prefix="fm-sim-") as home:
            async with sim_fleet(cloud, {"sim/base:1": 10**6}, home=home) as (fleet, prov):
                pool = await fleet.pool(PoolSpec(name="p", provider="slow", mode="ephemeral",
                                                 instance=InstanceSpec(cpus=8, memory_gb=16), max_instances=n))
                sandbox = SandboxSpec(image=f"{REGISTRY}/sim/base:1", cpus=1, memory_gb=1)
                tasks = [Task(name=f"t{i}", sandbox=sandbox, command="sim-work 5") for i in range(n)]
                seen = []

                def look():   # mid-launch: how many instances exist, how many the pool still has
                    gc.collect()
                    alive = [o for o in gc.get_objects() if isinstance(o, ManagedInstance) and o.provider is prov]
                    seen.append((len(prov.vms), len(alive), len(pool.instances)))

                asyncio.get_running_loop().call_later(40.0, look)
                results = await pool.map(tasks)
                return results, seen

    results, seen = run(main())
    assert [r.ok for r in results] == [True] * n
    ((launched, alive, pooled),) = seen
    assert 30 <= launched < n          # the launch was under way, many tasks already done
    assert alive <= pooled + 2 < launched / 2   # the ended ones were freed (a call's own up to 2 aside)
