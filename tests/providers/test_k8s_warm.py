"""Persistent pools on the ``k8s`` provider keep warm pods (``flowmesh_sdk.pools.warm_pods``):
a stocked pod per warm image, READY with its sandbox's stream open, taken by the next task of
its shape and replaced at once; a pod a task used is deleted, never reused; a cold shape at
the cap gives up a stocked pod; a stocked pod lost to the cluster is replaced; drain leaves
no pod.  Against the Kubernetes API emulator (pods are podman containers)."""

from __future__ import annotations

import asyncio

import pytest

from flowmesh_sdk import Fleet, PoolSpec, SandboxSpec, SpecError
from flowmesh_sdk.pools import WarmPodPool
from flowmesh_sdk.provider import ProviderState

pytest.importorskip("kubernetes")

from ._k8s import SPEC, emu, image, prov  # noqa: E402,F401 - fixtures


def _stocked(pool: WarmPodPool) -> set[str]:
    return {mi.id for shape in pool._shapes.values() for mi, _ in shape.stock}


async def _until(cond, timeout_s: float = 60.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not cond():
            await asyncio.sleep(0.05)


async def test_a_task_takes_the_warm_pod_which_is_replaced_and_deleted_after_use(fm_home, emu, image, prov):
    async with Fleet("k8s-warm", home=fm_home, providers={"k8s": prov}) as fleet:
        pool = await fleet.pool(PoolSpec(name="w", mode="persistent", provider="k8s", instance=SPEC,
                                         max_instances=3, warm_images=(image,)))
        assert isinstance(pool, WarmPodPool)
        (warm,) = _stocked(pool)                      # start() waited for the stock
        assert pool.stats().warm == 1
        creates, execs = emu.count("create", "pods"), emu.count("exec", "pods")
        async with pool.sandbox(image=image) as sb:
            assert sb.instance_id == warm             # the stocked pod, its stream already open
            assert emu.count("exec", "pods") == execs
            out = await sb.exec("echo warm; touch /tmp/used")
            assert out.stdout == "warm\n"
            await _until(lambda: len(_stocked(pool)) == 1)   # replaced at once, while the task runs
            (fresh,) = _stocked(pool)
            assert fresh != warm and emu.count("create", "pods") == creates + 1
        # the used pod is deleted, never handed to the next task
        (seen,) = await prov.describe([warm])
        assert seen.state is ProviderState.TERMINATED
        async with pool.sandbox(image=image) as sb2:
            assert sb2.instance_id == fresh
            assert (await sb2.exec("test -e /tmp/used && echo dirty || echo clean")).stdout == "clean\n"
        await _until(lambda: len(_stocked(pool)) == 1)
    assert await prov.list_tagged({"flowmesh:pool": "w"}) == []   # drain took the stock too


async def test_a_cold_shape_at_the_cap_gives_up_a_stocked_pod_and_the_stock_comes_back(
        fm_home, emu, image, prov):
    async with Fleet("k8s-warm-cap", home=fm_home, providers={"k8s": prov}) as fleet:
        pool = await fleet.pool(PoolSpec(name="c", mode="persistent", provider="k8s", instance=SPEC,
                                         max_instances=1, warm_images=(image,)))
        (warm,) = _stocked(pool)
        other = SandboxSpec(image=image, cpus=0.5, memory_gb=0.25)   # not the stocked shape
        async with pool.sandbox(other) as sb:
            assert sb.instance_id != warm and not _stocked(pool)
            assert (await sb.exec("echo cold")).stdout == "cold\n"
            assert len(pool.instances) == 1           # the cap holds: the stocked pod made room
        await _until(lambda: len(_stocked(pool)) == 1)   # refilled once the cold pod ended
        assert _stocked(pool) != {warm}


async def test_a_stocked_pod_lost_to_the_cluster_is_replaced(fm_home, emu, image, prov):
    async with Fleet("k8s-warm-lost", home=fm_home, providers={"k8s": prov}) as fleet:
        pool = await fleet.pool(PoolSpec(name="l", mode="persistent", provider="k8s", instance=SPEC,
                                         max_instances=2, warm_images=(image,)))
        (warm,) = _stocked(pool)
        emu.evict("default", pool.instances[warm].instance.address)
        for _ in range(100):                          # the watch reports the eviction; reconcile gives it up
            if (await pool.reconcile()).gone:
                break
            await asyncio.sleep(0.1)
        await _until(lambda: _stocked(pool) - {warm} != set())
        async with pool.sandbox(image=image) as sb:
            assert sb.instance_id != warm
            assert (await sb.exec("echo replaced")).stdout == "replaced\n"


async def test_min_instances_is_refused_for_a_pool_of_pods(fm_home, prov):
    async with Fleet("k8s-warm-min", home=fm_home, providers={"k8s": prov}) as fleet:
        with pytest.raises(SpecError, match="pool.min_instances.*warm_per_image"):
            await fleet.pool(PoolSpec(name="m", mode="persistent", provider="k8s", instance=SPEC,
                                      max_instances=2, min_instances=1))
