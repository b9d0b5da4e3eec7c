"""The ``k8s`` provider against the Kubernetes API emulator (pods are real podman containers
of an image in a local registry) through the official ``kubernetes`` client: ephemeral pools
whose instances are pods (the sandbox IS the pod: no runtime nested in it, one held exec
stream per sandbox), quota and capacity failover, image pulls the kubelet gives up on,
eviction, and gc by label."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from flowmesh_sdk import EventKind, Fleet, ImageNotFoundError, InstanceSpec, PoolSpec, SandboxSpec, Task
from flowmesh_sdk.errors import InstanceLost, QuotaError
from flowmesh_sdk.provider import TAG_FLEET, ContainerRequest, LaunchRequest, ProviderState
from flowmesh_sdk.remote.direct import InstanceRuntime

pytest.importorskip("kubernetes")

from flowmesh_providers.k8s import K8sProvider  # noqa: E402

SPEC = InstanceSpec(cpus=1, memory_gb=1)


@pytest.fixture
def emu(k8s_emulator):
    return k8s_emulator[0]


@pytest.fixture
def image(k8s_emulator):
    return k8s_emulator[1]


@pytest.fixture
async def prov(emu, tmp_path):
    p = K8sProvider(kubeconfig=str(emu.kubeconfig(tmp_path / "kubeconfig")), schedule_timeout_s=10)
    yield p
    await p.terminate([i.id for i in await p.list_tagged({})])
    await p.close()


def _sandbox(image: str, **kw) -> SandboxSpec:
    return SandboxSpec(image=image, cpus=0.5, memory_gb=0.25, **kw)


async def test_an_ephemeral_pool_runs_each_task_in_a_pod_of_its_image(fm_home, emu, image, prov):
    before = {k: emu.count(*k) for k in (("create", "pods"), ("exec", "pods"), ("delete", "pods"))}
    async with Fleet("k8s-eph", home=fm_home, providers={"k8s": prov}) as fleet:
        pool = await fleet.pool(PoolSpec(name="pods", mode="ephemeral", provider="k8s", instance=SPEC,
                                         max_instances=3))
        results = await pool.map([Task(name=f"t{i}", sandbox=_sandbox(image),
                                       command=f"echo hi-{i}; cat /proc/1/cmdline | tr '\\0' ' '; "
                                               "command -v podman || echo no-runtime")
                                  for i in range(3)])
        assert [r.ok for r in results] == [True] * 3, [r.error for r in results]
        for i, r in enumerate(results):
            out = r.result.stdout
            assert out.startswith(f"hi-{i}\n") and "no-runtime" in out, out   # the pod is the sandbox
            assert "sleep 86400" in out                                       # its PID 1 is the idle loop
        assert len({r.instance_id for r in results}) == 3
        assert await prov.list_tagged({"flowmesh:pool": "pods"}) == []
    made = {k: emu.count(*k) - before[k] for k in before}
    # per sandbox: one create, one exec stream (the agent's shell, every command over it), one delete
    assert made == {("create", "pods"): 3, ("exec", "pods"): 3, ("delete", "pods"): 3}, made


async def test_many_commands_ride_one_held_stream(fm_home, emu, image, prov):
    async with Fleet("k8s-stream", home=fm_home, providers={"k8s": prov}) as fleet:
        pool = await fleet.pool(PoolSpec(name="s", mode="ephemeral", provider="k8s", instance=SPEC))
        async with pool.sandbox(_sandbox(image)) as sb:
            assert isinstance(pool.instances[sb.instance_id].runtime, InstanceRuntime)
            execs = emu.count("exec", "pods")
            outs = [await sb.exec(f"echo {i}; exit {i % 3}") for i in range(10)]
            assert [o.exit_code for o in outs] == [i % 3 for i in range(10)]
            assert [o.stdout for o in outs] == [f"{i}\n" for i in range(10)]
            assert emu.count("exec", "pods") == execs      # no API exec per command


async def test_a_full_namespace_is_seen_in_offers_refused_with_a_quota_error_and_the_pool_lands_elsewhere(
        fm_home, emu, image, tmp_path):
    ns_full, ns_room = f"full-{uuid.uuid4().hex[:6]}", f"room-{uuid.uuid4().hex[:6]}"
    from kubernetes import client
    core = client.CoreV1Api(emu.api_client())      # set up as an admin would, with the official client
    for ns in (ns_full, ns_room):
        core.create_namespace({"metadata": {"name": ns}})
    core.create_namespaced_resource_quota(ns_full, {"metadata": {"name": "cap"}, "spec": {"hard": {"pods": "0"}}})
    prov = K8sProvider(kubeconfig=str(emu.kubeconfig(tmp_path / "kc")), namespaces=[ns_full, ns_room],
                       schedule_timeout_s=10)
    try:
        offers = {o.zone: o for o in await prov.offers(SPEC)}
        assert offers[ns_full].available == 0 and offers[ns_room].available > 0
        with pytest.raises(QuotaError, match="exceeded quota"):
            await prov.launch(LaunchRequest(offer=offers[ns_full], spec=SPEC, count=1, request_id="q1",
                                            tags={TAG_FLEET: "q"},
                                            container=ContainerRequest(image, _sandbox(image))))
        core.create_namespaced_resource_quota(ns_room, {"metadata": {"name": "one"}, "spec": {"hard": {"pods": "1"}}})
        with pytest.raises(QuotaError):   # all or nothing: the first of two pods goes with the error
            await prov.launch(LaunchRequest(offer=offers[ns_room], spec=SPEC, count=2, request_id="q2",
                                            tags={TAG_FLEET: "q"},
                                            container=ContainerRequest(image, _sandbox(image))))
        assert emu.pods(ns_room) == [] and await prov.list_tagged({TAG_FLEET: "q"}) == []
        core.delete_namespaced_resource_quota("one", ns_room)
        async with Fleet("k8s-quota", home=fm_home, providers={"k8s": prov}) as fleet:
            requested = fleet.bus.subscribe(EventKind.INSTANCE_REQUESTED)
            pool = await fleet.pool(PoolSpec(name="q", mode="ephemeral", instance=SPEC,
                                             infra=(f"k8s/emu/{ns_full}", f"k8s/emu/{ns_room}")))
            res = await pool.run_task(Task(name="q", sandbox=_sandbox(image), command="echo landed"))
            assert res.ok and res.result.stdout == "landed\n", res.error
            event = await requested.next(10)
            assert f'"zone": "{ns_room}"' in (event.detail or ""), event.detail
    finally:
        await prov.terminate([i.id for i in await prov.list_tagged({})])
        await prov.close()


async def test_an_image_the_kubelet_cannot_pull_fails_the_task_at_once(fm_home, emu, k8s_emulator, prov,
                                                                      busybox_image):
    reg = k8s_emulator[2]
    # the same layers under a manifest of the other format: another digest, so on no node yet
    for fmt in ("v2s2", "oci"):
        image = reg.push(busybox_image, f"flowmesh/busybox:unpulled-{fmt}", manifest_format=fmt)
        if reg.pushed[image] != reg.pushed[k8s_emulator[1]]:
            break
    else:
        pytest.fail("both manifest formats gave the digest already on the nodes")
    emu.fail_pulls(True)
    try:
        async with Fleet("k8s-pull", home=fm_home, providers={"k8s": prov}) as fleet:
            pool = await fleet.pool(PoolSpec(name="p", mode="ephemeral", provider="k8s", instance=SPEC))
            creates = emu.count("create", "pods")
            with pytest.raises(ImageNotFoundError, match="ErrImagePull|ImagePullBackOff"):
                async with pool.sandbox(_sandbox(image)):
                    pass
            assert emu.count("create", "pods") - creates == 1      # no retry storm: one pod, given up
        assert await prov.list_tagged({"flowmesh:pool": "p"}) == []
    finally:
        emu.fail_pulls(False)


async def test_an_evicted_pod_ends_its_sandbox_with_instance_lost(fm_home, emu, image, prov):
    async with Fleet("k8s-evict", home=fm_home, providers={"k8s": prov}) as fleet:
        pool = await fleet.pool(PoolSpec(name="e", mode="ephemeral", provider="k8s", instance=SPEC))
        async with pool.sandbox(_sandbox(image)) as sb:
            inst = pool.instances[sb.instance_id].instance
            running = asyncio.ensure_future(sb.exec("sleep 60", timeout_s=90))
            await asyncio.sleep(1)
            emu.evict("default", inst.address)
            with pytest.raises(InstanceLost, match="Evicted"):   # the kubelet's reason, whichever news came first
                await asyncio.wait_for(running, 90)
        (seen,) = await prov.describe([inst.id])
        assert seen.state is ProviderState.TERMINATED


async def test_leftover_pods_are_found_by_label_and_terminated(emu, image, prov):
    fleet = f"gc-{uuid.uuid4().hex[:6]}"
    launched = await prov.launch(LaunchRequest(
        offer=(await prov.offers(SPEC))[0], spec=SPEC, count=2, request_id=f"gc-{uuid.uuid4().hex[:6]}",
        tags={TAG_FLEET: fleet}, container=ContainerRequest(image, _sandbox(image))))
    other = K8sProvider(kubeconfig=prov._kubeconfig)          # a restarted coordinator
    try:
        found = await other.list_tagged({TAG_FLEET: fleet})
        assert sorted(i.id for i in found) == sorted(i.id for i in launched)
        await other.terminate([i.id for i in found])
        assert await other.list_tagged({TAG_FLEET: fleet}) == []
    finally:
        await other.close()
