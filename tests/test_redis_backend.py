"""The Redis control backend against a real redis-server (Debian's, on a free loopback
port, tests/_redis.py): several coordinators in this process, each its own connection and
lease, sharing the limits, queues, events and spend."""

from __future__ import annotations

import asyncio
import json
import sys

import pytest

from flowmesh_sdk.control import EventBus, EventKind, QuotaLimits
from flowmesh_sdk.control.backend import InProcessBackend
from flowmesh_sdk.control.events import Event
from flowmesh_sdk.control.redis import RedisBackend
from flowmesh_sdk.control.state import open_backend
from flowmesh_sdk.errors import BudgetExceededError, ControlPlaneUnavailableError, FlowMeshError, QuotaError
from flowmesh_sdk.fleet import Fleet

pytest_plugins = ("_redis",)   # the redis_server fixture

LEASE_S = 0.6


@pytest.fixture
async def two(redis_server, request): 
    ns = f"t{abs(hash(request.node.name)) % 10**8}"
    a = RedisBackend(redis_server.url, fleet="f", namespace=ns, lease_s=LEASE_S)
    b = RedisBackend(redis_server.url, fleet="f", namespace=ns, lease_s=LEASE_S)
    await a.start()
    await b.start()
    yield a, b
    await a.close()
    await b.close()


def kill_quietly(be: RedisBackend) -> None:
    """What a paused or dead coordinator looks like to Redis: no more heartbeats."""
    be.coordinator._hb.cancel()


async def test_semaphore_is_fleet_wide_and_gives_every_permit_back(two):
    a, b = two
    running = peak = 0
    order: list[tuple[str, int]] = []

    async def work(be: RedisBackend, who: str, i: int) -> None:
        nonlocal running, peak
        sem = be.semaphore("pool:p", 3)
        await sem.acquire()
        try:
            running += 1
            peak = max(peak, running)
            order.append((who, i))
            await asyncio.sleep(0.01)
        finally:
            running -= 1
            await sem.release_async()

    await asyncio.gather(*(work(a, "a", i) for i in range(12)), *(work(b, "b", i) for i in range(12)))
    assert peak == 3
    assert [i for w, i in order if w == "a"] == list(range(12))   # FIFO within a coordinator
    assert await a.semaphore("pool:p", 3).held() == 0


async def test_dead_holders_permits_come_back_after_its_lease(two):
    a, b = two
    sa, sb = a.semaphore("s", 2), b.semaphore("s", 2)
    await sa.acquire()
    await sa.acquire()
    waiter = asyncio.ensure_future(sb.acquire())
    await asyncio.sleep(0.1)
    assert not waiter.done()
    kill_quietly(a)
    t0 = asyncio.get_running_loop().time()
    await asyncio.wait_for(waiter, 5 * LEASE_S)
    assert asyncio.get_running_loop().time() - t0 < 3 * LEASE_S
    await sb.acquire()                 # the second one too
    assert await sb.held() == 2
    await b.coordinator.reap()          # (or its heartbeat loop did already)
    assert a.coordinator.id in {x.dead for x in b.coordinator.adoptions}


async def test_quota_is_fleet_wide_and_rejects_with_the_numbers(two):
    a, b = two
    qa = a.quota("fleet:f:tenants", QuotaLimits(max_in_flight=2))
    qb = b.quota("fleet:f:tenants", QuotaLimits(max_in_flight=2))
    qa.set("vip", QuotaLimits(max_total=3))
    qb.set("vip", QuotaLimits(max_total=3))
    await qa.admit_async("alice")
    await qb.admit_async("alice")
    with pytest.raises(QuotaError, match="tenant 'alice' has 2 tasks in flight, its quota is 2"):
        await qb.admit_async("alice")
    await qa.release_async("alice")
    await qb.admit_async("alice")
    assert await qa.in_flight_async("alice") == 2
    for q in (qa, qb, qa):
        await q.admit_async("vip")
    with pytest.raises(QuotaError, match=r"used its quota of 3 tasks \(3 admitted\)"):
        await qb.admit_async("vip")


async def test_token_bucket_is_one_rate_for_every_coordinator(two):
    a, b = two
    ba, bb = a.rate_limiter("ec2:us-east-1:launch", 20.0, 4), b.rate_limiter("ec2:us-east-1:launch", 20.0, 4)
    got = [await ba.take() == 0 for _ in range(3)] + [await bb.take() == 0 for _ in range(3)]
    assert got.count(True) == 4       # one burst of 4 between the two, not 4 each
    waited = await bb.acquire()
    assert 0.01 < waited < 1.0         # the next token is due at the shared rate (1/20 s)


async def test_queue_is_fifo_dedups_and_a_dead_claimers_tasks_come_back_first(two):
    a, b = two
    qa, qb = a.queue("pool-q"), b.queue("pool-q")
    assert await qa.push([(f"t{i}", f"{i}".encode()) for i in range(5)] + [("t0", b"again")]) == 5
    first = await qa.claim(2)
    assert [(c.id, c.payload, c.attempt) for c in first] == [("t0", b"0", 1), ("t1", b"1", 1)]
    assert [c.id for c in await qb.claim(1)] == ["t2"]
    kill_quietly(a)
    await asyncio.sleep(LEASE_S * 1.3)
    again = await qb.claim(3)
    assert [(c.id, c.attempt) for c in again] == [("t0", 2), ("t1", 2), ("t3", 1)]
    assert await qb.ack(["t0", "t1", "t2", "t3"]) == 4
    assert await qb.depth() == (1, 0)


async def test_a_claim_whose_reply_is_lost_is_not_claimed_twice(two, monkeypatch):
    """Redis ran the claim, the connection dropped before the reply came back (a restart):
    the retry loop sends it again and gets the same tasks, none left held unseen."""
    import redis.asyncio as aioredis
    a, _ = two
    q = a.queue("lost-reply")
    await q.push([(f"t{i}", b"x") for i in range(4)])
    real, dropped = a.client._execute, []

    async def reply_lost_once(batch):
        results = await real(batch)          # the server has run it
        if not dropped and any(m == "evalsha" and args[0] == "Q_CLAIM" for m, args, _, _ in batch):
            dropped.append(results)
            raise aioredis.ConnectionError("connection dropped before the reply")
        return results

    monkeypatch.setattr(a.client, "_execute", reply_lost_once)
    got = await q.claim(2)
    assert dropped and [c.id for c in got] == ["t0", "t1"] and [c.attempt for c in got] == [1, 1]
    assert await q.depth() == (2, 2)                    # two claimed, by this call only
    assert [c.id for c in await q.claim(5)] == ["t2", "t3"]   # a new call claims afresh


async def test_events_stream_with_consumer_groups(two):
    a, b = two
    bus_a, bus_b = EventBus(), EventBus()
    a.events("f").attach(bus_a)
    b.events("f").attach(bus_b)
    stream = a.events("f")
    await stream.ensure_group("readers")
    await stream.ensure_group("readers")            # idempotent
    for i in range(3):
        bus_a.publish(Event(EventKind.TASK_SUCCEEDED, fleet="f", task_id=f"a{i}"))
        bus_b.publish(Event(EventKind.INSTANCE_READY, fleet="f", instance_id=f"i-{i}"))
    bus_b.publish(Event(EventKind.TASK_FAILED, fleet="other", task_id="x"))   # another fleet: not here
    await asyncio.sleep(0.2)
    got1 = await stream.read("readers", "c1", count=4)
    got2 = await b.events("f").read("readers", "c2", count=10)
    seen = [e.event.task_id or e.event.instance_id for e in got1 + got2]
    assert sorted(seen) == sorted([f"a{i}" for i in range(3)] + [f"i-{i}" for i in range(3)])
    assert {e.coordinator for e in got1 + got2} == {a.coordinator.id, b.coordinator.id}
    await stream.ack("readers", [e.id for e in got2])
    # c1 died before acknowledging: c2 takes its entries over
    stolen = await b.events("f").claim_stale("readers", "c2", min_idle_ms=0)
    assert sorted(e.id for e in stolen) == sorted(e.id for e in got1)


async def test_spend_is_shared_and_a_budget_rejects_with_the_numbers(two):
    a, b = two
    la, lb = a.ledger("f"), b.ledger("f")
    la.start("i-a1", pool="p", provider="ec2", price_per_hour=1.5)
    la.start("i-a2", pool="p", provider="ec2", price_per_hour=1.5)
    await asyncio.sleep(0.1)
    await lb.refresh()
    assert lb.summary().burn_per_hour == pytest.approx(3.0)
    with pytest.raises(BudgetExceededError, match=r"burn \$4\.0000/h \(now \$3\.0000/h\); budget_per_hour is \$3\.5000/h"):
        lb.admit(1, 1.0, "ec2", pool="p", budget_per_hour=3.5, budget_total=None)
    la.end("i-a1")
    await asyncio.sleep(0.1)
    await lb.refresh()
    assert lb.admit(1, 1.0, "ec2", pool="p", budget_per_hour=3.5, budget_total=None) == 1
    from flowmesh_sdk.control.redis.fleet_state import instances
    assert [(i.id, i.holder) for i in await instances(b, "f")] == [("i-a2", a.coordinator.id)]


async def test_unreachable_redis_is_a_clear_error_naming_the_url(monkeypatch, tmp_path):
    from flowmesh_sdk.control.redis.localserver import free_port
    url = f"redis://127.0.0.1:{free_port()}/0"
    with pytest.raises(ControlPlaneUnavailableError, match=f"control state at {url} cannot be reached"):
        await RedisBackend(url).start()
    monkeypatch.setenv("FLOWMESH_STATE", url)
    monkeypatch.setenv("FLOWMESH_HOME", str(tmp_path))
    fleet = Fleet("f", reconcile_interval_s=None)
    assert isinstance(fleet.control, RedisBackend)           # no silent fall-back to in-process
    with pytest.raises(ControlPlaneUnavailableError, match=url):
        async with fleet:
            pass
    await fleet.close()
    monkeypatch.delenv("FLOWMESH_STATE")
    assert isinstance(open_backend(), InProcessBackend)
    with pytest.raises(FlowMeshError, match="redis://host:port"):
        open_backend("http://127.0.0.1:6379")


def test_missing_extra_names_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "redis.asyncio", None)   # as if the package were not installed
    with pytest.raises(FlowMeshError, match=r"flowmesh-sdk\[redis\]"):
        RedisBackend("redis://127.0.0.1:1/0")


async def test_fleet_on_redis_shares_its_quota_and_ledger(redis_server, tmp_path, monkeypatch):
    monkeypatch.setenv("FLOWMESH_HOME", str(tmp_path))
    async with Fleet("shared", state=redis_server.url, quotas={"*": QuotaLimits(max_in_flight=1)},
                     reconcile_interval_s=None) as f1, \
            Fleet("shared", state=redis_server.url, quotas={"*": QuotaLimits(max_in_flight=1)},
                  reconcile_interval_s=None) as f2:
        await f1.quota.admit_async("t")
        with pytest.raises(QuotaError, match="has 1 tasks in flight"):
            await f2.quota.admit_async("t")
        await f1.quota.release_async("t")
        f1.ledger.start("i-1", pool="p", provider="ec2", price_per_hour=2.0)
        await asyncio.sleep(0.1)
        await f2.ledger.refresh()
        assert f2.spend().burn_per_hour == pytest.approx(2.0)


async def test_cli_status_and_pools_show_the_whole_shared_fleet(redis_server, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from flowmesh_sdk.cli.main import app
    from flowmesh_sdk.specs import PhaseTimings

    ns_url = redis_server.url
    monkeypatch.setenv("FLOWMESH_HOME", str(tmp_path / "nobody"))   # no local store: all from Redis
    monkeypatch.setenv("FLOWMESH_STATE", ns_url)
    f1 = await Fleet("cli", state=ns_url, home=tmp_path / "one", reconcile_interval_s=None).start()
    f2 = await Fleet("cli", state=ns_url, home=tmp_path / "two", reconcile_interval_s=None).start()
    try:
        for f, pool in ((f1, "eval"), (f2, "train")):
            f.bus.publish(Event(EventKind.POOL_CREATED, fleet="cli", pool=pool, detail='{"mode": "ephemeral"}'))
            f.bus.publish(Event(EventKind.TASK_SUBMITTED, fleet="cli", pool=pool, task_id=f"{pool}-1", task_name="t"))
            f.bus.publish(Event(EventKind.TASK_SUCCEEDED, fleet="cli", pool=pool, task_id=f"{pool}-1", task_name="t",
                                exit_code=0, phases=PhaseTimings(execution=1.25)))
        f1.ledger.start("i-shared", pool="eval", provider="ec2", price_per_hour=0.5)
        await asyncio.sleep(0.2)
        runner = CliRunner()
        res = await asyncio.to_thread(runner.invoke, app, ["status", "--json"])
        assert res.exit_code == 0, res.output
        doc = json.loads(res.stdout)
        assert sorted((t["pool"], t["state"], t["execution_s"]) for t in doc["tasks"]) == [
            ("eval", "succeeded", 1.25), ("train", "succeeded", 1.25)]
        shared = doc["shared"]
        assert {c["id"] for c in shared["coordinators"]} >= {f1.control.coordinator.id, f2.control.coordinator.id}
        assert [(i["id"], i["holder"]) for i in shared["instances"] if i["fleet"] == "cli"] == [
            ("i-shared", f1.control.coordinator.id)]
        res = await asyncio.to_thread(runner.invoke, app, ["pools", "--json"])
        assert res.exit_code == 0, res.output
        pools = json.loads(res.stdout)["pools"]
        assert sorted((p["pool"], p["tasks"], p["succeeded"]) for p in pools) == [("eval", 1, 1), ("train", 1, 1)]
    finally:
        await f1.close()
        await f2.close()


def test_url_password_never_shown():
    from flowmesh_sdk.redaction import redact_url
    be = RedisBackend("redis://:hunter2@127.0.0.1:1/0")
    assert "hunter2" not in repr(be) and "hunter2" not in repr(be.client)
    assert redact_url("redis://user:hunter2@10.0.0.5:6380/1") == "redis://user:***@10.0.0.5:6380/1"


async def test_real_pools_of_two_coordinators_share_one_cap_on_redis(redis_server, fm_home, busybox_image):
    """Two fleets (coordinators) with the same pool on one Redis: the pool's in-flight cap
    (its semaphore) is one for both; every permit and tenant slot is back after."""
    from flowmesh_providers.local import LocalProvider

    from flowmesh_sdk import InstanceSpec, PoolSpec, SandboxSpec, Task

    def fleet(i: int) -> Fleet:
        prov = LocalProvider(cpus=2, memory_gb=8, state_dir=fm_home / f"c{i}" / "local")
        return Fleet("shared-pools", home=fm_home / f"c{i}", providers={"local": prov}, state=redis_server.url,
                     quotas={"*": QuotaLimits(max_in_flight=16)}, reconcile_interval_s=None)

    spec = PoolSpec(name="eval", mode="ephemeral", instance=InstanceSpec(cpus=1, memory_gb=1), max_instances=1)
    running = peak = 0

    def track(ev: Event) -> None:
        nonlocal running, peak
        if ev.kind is EventKind.TASK_STARTED:
            running += 1
            peak = max(peak, running)
        elif ev.kind in (EventKind.TASK_SUCCEEDED, EventKind.TASK_FAILED):
            running -= 1

    async with fleet(1) as f1, fleet(2) as f2:
        pools = [await f.pool(spec) for f in (f1, f2)]
        for f in (f1, f2):
            f.bus.on(track)
        tasks = [Task(name=f"t{i}", sandbox=SandboxSpec(image=busybox_image, cpus=1, memory_gb=0.5),
                      command="sleep 0.2; echo ok") for i in range(3)]
        results = await asyncio.gather(pools[0].map(tasks), pools[1].map(tasks))
        assert [r.result.stdout.strip() for rs in results for r in rs] == ["ok"] * 6
        assert peak == 1     # max_instances=1 ephemeral: one task at a time across both coordinators
        sem = f1.control.semaphore("fleet:shared-pools:pool:eval", 1)
        assert await sem.held() == 0
        assert await f1.quota.in_flight_async("default") == 0
