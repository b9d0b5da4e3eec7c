"""Several fleets on one Redis (docs/operations.md says one Redis may hold several): each
fleet's keys are its own (``<namespace>:fleet:<fleet>:...``), so a fleet runs, counts and
adopts only its own work, even where pool names are alike; and the Redis password never
shows in ``flowmesh status`` or ``flowmesh config show``.  Against a real redis-server
(tests/_redis.py), real podman sandboxes on the local provider."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import pytest

from flowmesh_sdk import Fleet, InstanceSpec, PoolSpec, SandboxSpec, Task
from flowmesh_sdk.cas.local import LocalDirStore
from flowmesh_sdk.control.redis import RedisBackend
from flowmesh_sdk.control.redis.dispatch import Job, SharedQueue
from flowmesh_sdk.control.redis.localserver import LocalRedis
from flowmesh_sdk.pools.shared import SharedTasks
from flowmesh_sdk.specs import TaskResult

pytest_plugins = ("_redis",)   # the redis_server fixture

FLEETS = ("fleet-a", "fleet-b")
N = 3
# keys deliberately shared by every fleet of a namespace: none (flowmesh_sdk/control/redis/keys.py)
SHARED_KEYS: frozenset[str] = frozenset()


async def all_keys(url: str) -> list[str]:
    import redis.asyncio as aioredis

    r = aioredis.Redis.from_url(url)
    try:
        return sorted([k.decode() async for k in r.scan_iter(count=1000)])
    finally:
        await r.aclose()


def assert_scoped(keys: list[str], namespace: str, fleets: tuple[str, ...]) -> None:
    stray = [k for k in keys if k not in SHARED_KEYS
             and not any(k.startswith(f"{namespace}:fleet:{f}:") for f in fleets)]
    assert stray == [], f"keys not scoped to their fleet: {stray}"


@dataclass
class Run:
    ids: dict[str, list[str]]
    results: dict[str, list[TaskResult | None]]
    published: dict[str, list[str]]        # the task ids in each fleet's own result store
    executed: dict[str, int]
    keys: list[str]                         # every key in Redis, with both fleets still running


async def two_fleets(url: str, d: Path, image: str) -> Run:
    fleets: dict[str, Fleet] = {}
    tasks: dict[str, SharedTasks] = {}
    try:
        for name in FLEETS:
            from flowmesh_providers.local import LocalProvider

            prov = LocalProvider(cpus=2, memory_gb=8, state_dir=d / name / "local")
            fleets[name] = f = Fleet(name, home=d / name, providers={"local": prov}, state=url,
                                     reconcile_interval_s=None)
            pool = await f.pool(PoolSpec(name="eval", instance=InstanceSpec(cpus=1, memory_gb=2), min_instances=1,
                                         max_instances=1, sandboxes_per_instance=2, warm_per_image=0))
            tasks[name] = SharedTasks(f, pool, results=LocalDirStore(d / name / "cas"), capacity=4)
        sandbox = SandboxSpec(image=image, cpus=0.5, memory_gb=0.25)
        ids = {name: await tasks[name].submit([Task(name=f"{name}-{i}", sandbox=sandbox, command=f"echo {name}-{i}")
                                               for i in range(N)]) for name in FLEETS}
        executed = {}
        for name in reversed(FLEETS):   # fleet-b serves first: it must leave fleet-a's tasks alone
            stats = await asyncio.wait_for(tasks[name].serve(concurrency=2, until_empty=True), 180)
            executed[name] = stats.executed
        results = {name: [await tasks[name].result(i) for i in ids[name]] for name in FLEETS}
        published = {}
        for name in FLEETS:
            root = d / name / "cas" / "refs" / "tasks" / "eval"
            published[name] = sorted(p.name for p in root.iterdir()) if root.exists() else []
        keys = await all_keys(url)
        return Run(ids, results, published, executed, keys)
    finally:
        for f in fleets.values():
            await f.close(timeout_s=60)


@pytest.fixture(scope="module")
def run(redis_server, tmp_path_factory, busybox_image) -> Run:
    return asyncio.run(two_fleets(redis_server.url, tmp_path_factory.mktemp("fleets"), busybox_image))


def test_two_fleets_with_a_pool_of_the_same_name_each_run_only_their_own_tasks(run):
    for name in FLEETS:
        assert run.executed[name] == N, run.executed                    # nobody ran the other's tasks
        assert run.published[name] == sorted(run.ids[name])             # its own store holds its own results
        got = [(r.task_id, r.name, r.ok, r.result.stdout if r.result else None) if r else None
               for r in run.results[name]]
        assert got == [(tid, f"{name}-{i}", True, f"{name}-{i}\n") for i, tid in enumerate(run.ids[name])]


def test_every_key_two_fleets_wrote_is_scoped_to_its_fleet(run):
    assert_scoped(run.keys, "flowmesh", FLEETS)
    for name in FLEETS:   # the run did write the keys of each kind, each fleet its own
        mine = {k[len(f"flowmesh:fleet:{name}:"):] for k in run.keys if k.startswith(f"flowmesh:fleet:{name}:")}
        assert {"coords", "epoch", "events", "charges", "instances", "holder", "q:eval:seq",
                "quota:queue:eval:tenants:default:total"} <= mine, sorted(mine)
        assert any(k.startswith("coord:") for k in mine) and any(k.startswith("q:eval:claim:") for k in mine)


async def _until(pred, what: str, timeout_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not pred():
        if loop.time() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def test_a_fleet_never_adopts_another_fleets_dead_coordinator(redis_server, request):
    """A dead coordinator's permits, claims and instances go to a live coordinator of its
    own fleet; one of another fleet on the same Redis takes nothing."""
    ns = f"adopt{abs(hash(request.node.name)) % 10**6}"
    lease = 0.6
    a1 = RedisBackend(redis_server.url, fleet="fleet-a", namespace=ns, lease_s=lease)
    b = RedisBackend(redis_server.url, fleet="fleet-b", namespace=ns, lease_s=lease)
    a2 = RedisBackend(redis_server.url, fleet="fleet-a", namespace=ns, lease_s=lease)
    await a1.start()
    await b.start()
    try:
        await a1.semaphore("pool:eval", 2).acquire()
        a1.ledger("fleet-a").start("i-a1", pool="eval", provider="ec2", price_per_hour=1.0)
        await _until(lambda: not a1._bg, "the charge to reach Redis")
        dead = a1.coordinator.id
        a1.coordinator._hb.cancel()                    # a1 dies quietly: no more heartbeats
        await asyncio.sleep(lease * 2.5)               # b's reaper ran several times meanwhile
        assert b.coordinator.adoptions == [] and await b.coordinator.reap() == []
        await a2.start()
        await _until(lambda: a2.coordinator.adoptions, "fleet-a's coordinator to adopt its dead peer")
        (adoption,) = a2.coordinator.adoptions
        assert (adoption.dead, adoption.leases, [i.id for i in adoption.adopted]) == (dead, 1, ["i-a1"])
        assert [(i.id, i.holder) for i in (await b.shared_instances("fleet-a")).instances] == [
            ("i-a1", a2.coordinator.id)]
        keys = [k for k in await all_keys(redis_server.url) if k.startswith(f"{ns}:")]
        assert_scoped(keys, ns, ("fleet-a", "fleet-b"))
        assert f"{ns}:fleet:fleet-a:adoptions" in keys
    finally:
        for be in (a2, b, a1):
            await be.close()


async def test_tasks_queued_by_the_layout_without_fleets_are_moved_not_ignored(redis_server, tmp_path, request, caplog):
    """What an older version queued under ``<namespace>:q:<name>`` runs on the first fleet
    that opens a queue of that name -- once no coordinator of the older version holds a lease."""
    import redis.asyncio as aioredis

    ns = f"legacy{abs(hash(request.node.name)) % 10**6}"
    r = aioredis.Redis.from_url(redis_server.url)
    old = f"{ns}:q:eval"
    for i, tid in enumerate(("t1", "t2")):   # what the older Q_PUSH wrote
        await r.hsetnx(f"{old}:tasks", tid, f"default\nbody-{i}".encode())
        await r.hset(f"{old}:order", tid, await r.incr(f"{old}:seq"))
        await r.rpush(f"{old}:ready", tid)
    await r.zadd(f"{ns}:coords", {"old-coord": 0})
    await r.set(f"{ns}:coord:old-coord", "{}", px=60_000)   # an older coordinator still alive

    async def execute(job: Job) -> bytes:
        return hashlib.sha256(job.body).hexdigest().encode()

    be = RedisBackend(redis_server.url, fleet="fleet-a", namespace=ns, lease_s=5.0)
    await be.start()
    try:
        store = LocalDirStore(tmp_path / "cas")
        with caplog.at_level(logging.WARNING, logger="flowmesh.control.redis"):
            stats = await SharedQueue(be, "eval", results=store).serve(execute, until_empty=True)
        assert stats.executed == 0 and "stay there while 1 of its coordinator(s)" in caplog.text
        assert await r.hlen(f"{old}:tasks") == 2

        await r.delete(f"{ns}:coord:old-coord")                  # the older version is stopped
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="flowmesh.control.redis"):
            q = SharedQueue(be, "eval", results=store)
            stats = await q.serve(execute, until_empty=True)
        assert "moved 2 task(s)" in caplog.text
        assert sorted(stats.published) == ["t1", "t2"]
        assert [await q.result(t) for t in ("t1", "t2")] == [
            hashlib.sha256(f"body-{i}".encode()).hexdigest().encode() for i in range(2)]
        assert [k for k in await all_keys(redis_server.url) if k.startswith(f"{old}:")] == []
    finally:
        await be.close()
        await r.aclose()


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    srv = LocalRedis(tmp_path_factory.mktemp("redis-pw"), password="SECRETPW").start()
    try:
        yield srv
    finally:
        srv.stop()


async def test_status_and_config_show_never_print_the_redis_password(secured, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from flowmesh_sdk.cli.main import app

    url = f"redis://:SECRETPW@127.0.0.1:{secured.port}/0"
    shown = f"redis://:***@127.0.0.1:{secured.port}/0"
    monkeypatch.setenv("FLOWMESH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("FLOWMESH_STATE", url)
    runner = CliRunner()
    async with Fleet("secret", home=tmp_path / "coord", reconcile_interval_s=None):   # a coordinator to list
        outs = {}
        for args in (["status"], ["status", "--json"], ["config", "show"], ["config", "show", "--json"]):
            res = await asyncio.to_thread(runner.invoke, app, args)
            assert res.exit_code == 0, res.output
            outs[" ".join(args)] = res.output
    for what, out in outs.items():
        assert "SECRETPW" not in out, what
        assert shown in out, (what, out)
    status = json.loads(outs["status --json"])
    assert status["shared"]["url"] == shown
    assert [c["fleet"] for c in status["shared"]["coordinators"]] == ["secret"]
    (state,) = [s for s in json.loads(outs["config show --json"])["settings"] if s["key"] == "state"]
    assert (state["value"], state["redacted"]) == (shown, True)


def test_every_shown_url_hides_its_password():
    from flowmesh_providers.ec2 import Ec2Provider

    from flowmesh_sdk.control.backend import state_url
    from flowmesh_sdk.errors import ControlPlaneUnavailableError, SpecError
    from flowmesh_sdk.redaction import redact_url

    assert redact_url("redis://:SECRETPW@127.0.0.1:6379/0") == "redis://:***@127.0.0.1:6379/0"
    assert redact_url("rediss://u:p@SECRETPW@[::1]:6380/2") == "rediss://u:***@[::1]:6380/2"   # '@' in it
    assert redact_url("redis://127.0.0.1/0?password=SECRETPW&db=1") == "redis://127.0.0.1/0?password=***&db=1"
    assert redact_url("at redis://h:6379/0 and http://user@h/x") == "at redis://h:6379/0 and http://user@h/x"
    err = ControlPlaneUnavailableError("redis://:SECRETPW@h:1/0 down", url="redis://:SECRETPW@h:1/0")
    assert "SECRETPW" not in str(err) + err.url
    for bad in ("http://:SECRETPW@h:6379", "ftp://u:SECRETPW@h"):
        with pytest.raises(SpecError) as e1:
            state_url(bad)
        with pytest.raises(SpecError) as e2:
            RedisBackend(bad)
        assert "SECRETPW" not in str(e1.value) + str(e2.value)
    prov = Ec2Provider(endpoint_url="http://user:SECRETPW@127.0.0.1:5000", regions=("us-east-1",))
    assert "SECRETPW" not in repr(prov) and "user:***@127.0.0.1:5000" in repr(prov)
