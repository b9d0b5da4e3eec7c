"""Elastic GPU workers (flowmesh_sdk.workers.elastic) on the Vast.ai emulator
(flowmesh_sdk.testing.vast) through the real ``vastai`` client: each rented instance boots
as a real loopback sshd host, and the engine started on it over SSH is the named vLLM
stand-in (flowmesh_sdk.testing.fake_vllm, a TEST FIXTURE: no model, no GPU).

One scenario: a burst of requests makes the queue grow -> workers rented in U order
(the locality term puts the dearer Quebec 4090 first), rent-to-ready lag recorded; an
interruptible worker is outbid while it holds requests (the emulator's switch) -> it is
replaced by the next offer by U and its requests are re-dispatched to another worker and
answered once; the queue drains -> idle workers are drained, then released."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from pathlib import Path

import pytest

from flowmesh_sdk.bidder import ModelSpec, NoFeasibleOffer
from flowmesh_sdk.control.events import EventBus, EventKind
from flowmesh_sdk.errors import SpecError
from flowmesh_sdk.specs import InstanceSpec
from flowmesh_sdk.testing import fake_vllm
from flowmesh_sdk.workers import ClientLimits, ElasticWorkers, ScalingPolicy, ServeCommand, WorkerState

pytest.importorskip("vastai")
pytest.importorskip("paramiko")

from flowmesh_sdk.testing.vast import VastEmulator  # noqa: E402

SPEC = InstanceSpec(cpus=4, memory_gb=16, gpus=1)
MODEL = ModelSpec(params_b=7, kv_cache_gb=6)          # 20 GB: fits a 24 GB RTX 4090
SERVED = "Qwen/Qwen2.5-7B-Instruct"


def standin(logs: Path, delay_s: float = 0.0) -> ServeCommand:
    """The vLLM stand-in as the engine, started on the instance's own loopback address (the
    emulated instances are this machine: the engine's log goes to the test's ``logs``)."""
    return ServeCommand(("env", f"FAKE_VLLM_DELAY_S={delay_s}", sys.executable, fake_vllm.__file__, "serve",
                         "{model}", "--host", "{host}", "--port", "{port}"),
                        model=SERVED, port=18431, bind_host=None, log_path=f"{logs}/engine-{{name}}.log")


async def until(predicate, timeout_s: float = 30.0, what: str = "condition") -> None:
    """Test helper: wait (with a deadline) for a condition of the loop's own records."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while not predicate():
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def details(events, kind):
    return [json.loads(e.detail) for e in events if e.kind is kind]


async def test_offers_are_ranked_by_u_with_the_vram_gate_reliability_and_locality(tmp_path):
    with VastEmulator(first_host=230) as emu:
        prov = emu.provider(ssh=True)
        try:
            def loop(model, resident=(), market="on-demand"):
                return ElasticWorkers(prov, SPEC, model, standin(tmp_path), resident=resident,
                                      scaling=ScalingPolicy(market=market))
            plain = await loop(MODEL).candidates()
            ids = [c.offer.offer_id for c in plain]
            assert ids == ["5001", "5002", "5003", "5005"]        # by U; the 0.90-reliable 3090 is not searched
            assert all(c.score.utility >= n.score.utility for c, n in zip(plain, plain[1:]))
            local = await loop(MODEL, resident=("vast/Quebec, CA",), market="spot").candidates()
            assert [c.offer.offer_id for c in local][:2] == ["5002", "5001"] and local[0].score.g_loc == 1.0
            assert all(c.offer.spot for c in local)
            big = await loop(ModelSpec(params_b=14, kv_cache_gb=8)).candidates()   # 36 GB: no 4090 fits
            assert [c.offer.offer_id for c in big] == ["5003", "5005"]
            with pytest.raises(NoFeasibleOffer, match="vram"):
                await loop(ModelSpec(params_b=100)).candidates()
            with pytest.raises(SpecError, match="min_workers"):
                ScalingPolicy(min_workers=3, max_workers=2)
            assert emu.count("create") == 0
        finally:
            await prov.close()


async def test_workers_follow_the_queue_are_replaced_when_outbid_and_drain_before_release(tmp_path):
    bus = EventBus()
    events: list = []
    bus.on(events.append)
    scaling = ScalingPolicy(min_workers=0, max_workers=2, target_queue_per_worker=3, scale_down_idle_s=0.3,
                            cooldown_s=0.0, interval_s=0.2, worker_concurrency=4, drain_timeout_s=20,
                            ready_timeout_s=60, market="spot")
    with VastEmulator(first_host=200) as emu:
        prov = emu.provider(ssh=True)
        ew = ElasticWorkers(prov, SPEC, MODEL, standin(tmp_path, delay_s=1.0), scaling=scaling, resident=("vast/Quebec, CA",),
                            bus=bus, fleet=f"elastic-{uuid.uuid4().hex[:6]}", role="vllm",
                            limits=ClientLimits(max_batch=1))
        pids: list[int] = []
        try:
            await ew.start()
            # 1. the queue grows: two workers rented in U order, lag measured
            burst = [asyncio.ensure_future(ew.complete(f"p{i}")) for i in range(6)]
            answers = await asyncio.wait_for(asyncio.gather(*burst), 60)
            assert [a.text for a in answers] == [f"ok:p{i}" for i in range(6)]
            await until(lambda: ew.stats().ready == 2, what="two workers ready")
            rented = details(events, EventKind.WORKER_RENTED)
            assert [r["offer_id"] for r in rented] == ["5002", "5001"]       # U order: G_loc beats price
            assert rented[0]["G_loc"] == 1.0 and rented[0]["U"] >= rented[1]["U"]
            assert all(r["spot"] and r["replaces"] is None for r in rented)
            up = details(events, EventKind.WORKERS_SCALED)[0]
            assert up["action"] == "up" and up["count"] == 2 and up["desired"] == 2
            assert [c["offer_id"] for c in up["candidates"]][:3] == ["5002", "5001", "5003"]
            ready = details(events, EventKind.WORKER_READY)
            assert len(ready) == 2 and all(r["lag_s"] > 0 and r["lag_s"] >= r["load_s"] for r in ready)
            assert len(ew.stats().lags) == 2
            pids = [w.pid for w in ew.workers.values() if w.pid]

            # 2. an interruptible worker is outbid while it holds requests
            victim = next(w for w in ew.workers.values() if w.offer_id == "5002")
            second = [asyncio.ensure_future(ew.complete(f"q{i}")) for i in range(8)]
            await until(lambda: victim.assigned > 0, what="requests in flight on the victim")
            held = victim.assigned
            emu.outbid(victim.instance.id)
            answers = await asyncio.wait_for(asyncio.gather(*second), 60)
            assert [a.text for a in answers] == [f"ok:q{i}" for i in range(8)]     # each answered, once
            assert victim.state is WorkerState.FAILED and victim.lost_reason == "outbid"
            outbid = details(events, EventKind.WORKER_OUTBID)
            assert outbid == [{"reason": "outbid", "offer": victim.candidate.offer.key, "offer_id": "5002",
                               "redispatched": held}]
            redispatched = [e for e in events if e.kind is EventKind.TASK_REDISPATCHED]
            assert len(redispatched) == held == ew.stats().redispatched
            assert all(json.loads(e.detail)["from"] == victim.name for e in redispatched)
            assert not any(a.worker == victim.name for a in answers)   # its held requests went elsewhere
            if os.environ.get("ELASTIC_TRACE"):
                for e in events:
                    print(e.kind.value, e.task_name, e.detail[:160])
            await until(lambda: any(r["replaces"] == victim.name for r in details(events, EventKind.WORKER_RENTED)),
                        what="a replacement")
            replacement = next(r for r in details(events, EventKind.WORKER_RENTED) if r["replaces"] == victim.name)
            assert replacement["offer_id"] == "5003"          # next by U; the outbidding machine avoided
            assert any(d["action"] == "replace" for d in details(events, EventKind.WORKERS_SCALED))
            await until(lambda: str(victim.instance.id) not in {str(r["id"]) for r in emu.instances},
                        what="the outbid instance released")
            stats = ew.stats()
            assert stats.answered == 14 and stats.lost == 1

            # 3. the queue drains: idle workers drained, then released, down to min_workers
            await until(lambda: ew.stats().released >= 2 and not ew.stats().ready and not ew.stats().starting,
                        what="idle workers released")
            order = [(e.kind, e.task_name) for e in events
                     if e.kind in (EventKind.WORKER_DRAINING, EventKind.WORKER_RELEASED)]
            for name in {n for _, n in order}:
                mine = [k for k, n in order if n == name]
                assert mine == [EventKind.WORKER_DRAINING, EventKind.WORKER_RELEASED], (name, mine)
            released = details(events, EventKind.WORKER_RELEASED)
            assert all(r["reason"] == "idle" and r["abandoned"] == 0 for r in released)
            assert any(d["action"] == "down" for d in details(events, EventKind.WORKERS_SCALED))
            assert emu.instances == []
            pids = [w.pid for w in ew.workers.values() if w.pid]
        finally:
            await ew.aclose()
            await prov.close()
        assert emu.instances == []

        def gone(pid: int) -> bool:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return True
            return False
        await until(lambda: all(gone(p) for p in pids), timeout_s=15, what="the stand-in engines stopped")


async def test_a_role_made_by_the_fleet_is_charged_to_its_ledger_held_to_its_budget_and_closed_with_it(tmp_path):
    """Fleet.elastic: the role launches through the fleet's provisioner, each worker is a
    charge in the fleet's ledger under the role's name while it runs, a fleet budget too
    small for one worker refuses the rental (nothing is created), and closing the fleet
    closes the role (its instance terminated, its charge ended)."""
    from flowmesh_sdk.fleet import Fleet
    from flowmesh_sdk.pools import ReconcileResult

    scaling = ScalingPolicy(min_workers=1, max_workers=1, interval_s=0.2, cooldown_s=0.0, ready_timeout_s=60)
    with VastEmulator(first_host=240) as emu:
        prov = emu.provider(ssh=True)
        try:
            fleet = Fleet(f"el-{uuid.uuid4().hex[:6]}", home=tmp_path / "home", providers={"vast": prov},
                          reconcile_interval_s=None)
            async with fleet:
                role = await fleet.elastic(["vast"], SPEC, MODEL, standin(tmp_path), role="vllm", scaling=scaling)
                assert role.provisioner is fleet.provisioner and role.ledger is fleet.ledger
                with pytest.raises(SpecError, match="elastic.role"):
                    await fleet.elastic(["vast"], SPEC, MODEL, standin(tmp_path), role="vllm")
                await role.start()
                answer = await asyncio.wait_for(role.complete("hi"), 60)
                assert answer.text == "ok:hi"
                (w,) = [w for w in role.workers.values() if w.state is WorkerState.READY]
                charged = fleet.ledger.summary(pool=("vllm",))
                assert charged.live == 1 and charged.burn_per_hour == pytest.approx(w.candidate.offer.price_per_hour)
                assert fleet.spend().live == 1
                assert (await fleet.reconcile_pools())["vllm"] == ReconcileResult()   # its worker is listed
                await fleet.store.flush()        # what `flowmesh status` reads
                (row,) = fleet.store.instances(live_only=True)
                assert (row.id, row.pool, row.state) == (w.instance.id, "vllm", "ready")
            assert role.closed and emu.instances == []
            assert fleet.ledger.summary(pool=("vllm",)).live == 0

            created = emu.count("create")
            events: list = []
            poor = Fleet(f"el-{uuid.uuid4().hex[:6]}", home=tmp_path / "home2", providers={"vast": prov},
                         reconcile_interval_s=None, budget_per_hour=0.01)
            poor.bus.on(events.append)
            async with poor:
                role = await poor.elastic(["vast"], SPEC, MODEL, standin(tmp_path), role="vllm", scaling=scaling)
                await role.start()
                await until(lambda: any(e.kind is EventKind.WORKER_FAILED for e in events), what="a refused rental")
                failed = [e.detail for e in events if e.kind is EventKind.WORKER_FAILED]
                assert "budget_per_hour" in failed[0]
            assert emu.count("create") == created and emu.instances == []
        finally:
            await prov.close()
