"""The ``k8s`` provider against the Kubernetes API emulator (pods are real podman containers
of an image in a local registry) through the official ``kubernetes`` client: ephemeral pools
whose instances are pods (the sandbox IS the pod: no runtime nested in it, one held exec
stream per sandbox), quota and capacity failover, image pulls the kubelet gives up on,
eviction, and gc by label."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from flowmesh_sdk import EventKind, Fleet, ImageNotFoundError, InfraFailure, PoolSpec, SandboxSpec, Task
from flowmesh_sdk.errors import InstanceLost, QuotaError, SandboxClosedError
from flowmesh_sdk.provider import TAG_FLEET, ContainerRequest, LaunchRequest, ProviderState
from flowmesh_sdk.remote.direct import InstanceRuntime

pytest.importorskip("kubernetes")

from flowmesh_providers.k8s import K8sProvider, stream  # noqa: E402

from ._k8s import SPEC, emu, image, prov  # noqa: E402,F401 - fixtures


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


async def test_a_pod_command_sees_the_end_of_its_input(emu, image, prov, tmp_path):
    """v5.channel.k8s.io closes stdin ([255, 0]): `cat` with input ends, and put_file is a
    `cat > PATH` that returns (it waited out its timeout when the close was never sent)."""
    offer = (await prov.offers(SPEC))[0]
    (inst,) = await prov.launch(LaunchRequest(offer=offer, spec=SPEC, count=1, request_id=f"in-{uuid.uuid4().hex[:6]}",
                                              tags={TAG_FLEET: "k8s-stdin"},
                                              container=ContainerRequest(image, _sandbox(image))))
    try:
        runner = prov.runner(inst)
        await runner.wait_reachable(120)
        res = await runner.run(["sh", "-c", "cat; echo end"], timeout_s=20, input=b"hello\n")
        assert res.ok and not res.timed_out and res.stdout == b"hello\nend\n", res.describe()
        src = tmp_path / "f.bin"
        src.write_bytes(bytes(range(256)) * 64)
        await asyncio.wait_for(runner.put_file(str(src), "/tmp/f.bin"), 60)
        back = tmp_path / "back.bin"
        await runner.get_file("/tmp/f.bin", str(back))
        assert back.read_bytes() == src.read_bytes()
    finally:
        await prov.terminate([inst.id])


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
            res = await pool.run_task(Task(name="unpullable", sandbox=_sandbox(image), command="true"))
            assert (res.infra_failure, res.result) == (InfraFailure.IMAGE_PULL, None), res
        assert await prov.list_tagged({"flowmesh:pool": "p"}) == []
    finally:
        emu.fail_pulls(False)


@pytest.mark.parametrize("end,reason", [
    ("evict", "Evicted"),   # the kubelet's reason, whichever news came first
    # the container killed outside the kubelet: the agent's exec stream ends with its shell's
    # 137 before the watch reports the pod Failed, and still ends the command with the loss
    ("kill_container", r"Failed: its container terminated \(Error, exit code 137\)")])
async def test_a_pod_lost_under_a_command_ends_its_sandbox_with_instance_lost(fm_home, emu, image, prov, end, reason):
    async with Fleet(f"k8s-{end.replace('_', '-')}", home=fm_home, providers={"k8s": prov}) as fleet:
        pool = await fleet.pool(PoolSpec(name="e", mode="ephemeral", provider="k8s", instance=SPEC))
        async with pool.sandbox(_sandbox(image)) as sb:
            inst = pool.instances[sb.instance_id].instance
            running = asyncio.ensure_future(sb.exec("sleep 60", timeout_s=90))
            await asyncio.sleep(1)
            getattr(emu, end)("default", inst.address)
            with pytest.raises(InstanceLost, match=reason):
                await asyncio.wait_for(running, 90)
        (seen,) = await prov.describe([inst.id])
        assert seen.state is ProviderState.TERMINATED


async def test_a_command_that_kills_its_agent_shell_ends_at_once_with_the_pod_still_running(fm_home, emu, image,
                                                                                            prov, monkeypatch):
    # the same 137 from inside: the pod still runs commands, so the runner's one probe answers
    # and the exec ends as a closed channel, without waiting for a verdict that never comes
    monkeypatch.setattr(stream, "CUT_VERDICT_S", 3600.0)   # waiting for one would hang the exec
    async with Fleet("k8s-selfkill", home=fm_home, providers={"k8s": prov}) as fleet:
        pool = await fleet.pool(PoolSpec(name="k", mode="ephemeral", provider="k8s", instance=SPEC))
        async with pool.sandbox(_sandbox(image)) as sb:
            execs = emu.count("exec", "pods")
            with pytest.raises(SandboxClosedError):
                await asyncio.wait_for(sb.exec("kill -9 $PPID; sleep 60", timeout_s=90), 60)
            assert emu.count("exec", "pods") > execs   # the runner asked the pod (its probe), which answered
            (seen,) = await prov.describe([pool.instances[sb.instance_id].instance.id])
            assert seen.state is ProviderState.RUNNING


async def test_a_task_whose_pod_is_evicted_with_no_retry_left_ends_instance_lost(fm_home, emu, image, prov):
    async with Fleet("k8s-evict2", home=fm_home, providers={"k8s": prov}) as fleet:
        pool = await fleet.pool(PoolSpec(name="e", mode="ephemeral", provider="k8s", instance=SPEC,
                                         retry_infra_failures=0))
        started = asyncio.ensure_future(fleet.bus.wait_for(lambda e: e.kind is EventKind.TASK_STARTED, 90))
        running = asyncio.ensure_future(pool.run_task(Task(name="victim", sandbox=_sandbox(image),
                                                           command="sleep 60", timeout_s=90)))
        ev = await started
        await asyncio.sleep(1)
        emu.evict("default", pool.instances[ev.instance_id].instance.address)
        res = await asyncio.wait_for(running, 90)
    assert (res.infra_failure, res.attempts, res.result) == (InfraFailure.INSTANCE_LOST, 1, None), res
    assert "Evicted" in (res.error or "")


async def test_a_probe_of_an_evicted_pod_names_the_kubelets_reason(emu, image, prov):
    """The kubelet stops a pod's container before it reports the pod failed: a probe (a
    task's check of its instance after an error) refused in between waits for the watch's
    word and raises ``InstanceLost`` naming the reason, not a bare refused exec.  The runner
    here is not the provider's own, so the watch never ends its streams: only the probe's
    wait can name the reason."""
    from flowmesh_providers.k8s.runners import pod_runner
    (inst,) = await prov.launch(LaunchRequest(
        offer=(await prov.offers(SPEC))[0], spec=SPEC, count=1, request_id=f"pr-{uuid.uuid4().hex[:6]}",
        tags={TAG_FLEET: f"probe-{uuid.uuid4().hex[:6]}"}, container=ContainerRequest(image, _sandbox(image))))
    target, name = prov._where[inst.id]
    runner = pod_runner(target, name, prov._api.configuration(target.context), watch=prov._watch,
                        send=prov._api.send, forward_ports=())
    try:
        await runner.wait_reachable(60)
        await runner.probe(10)                               # up: it answers
        emu.evict("default", name)
        with pytest.raises(InstanceLost, match="Evicted"):
            await runner.probe(10)
    finally:
        await runner.close()
        await prov.terminate([inst.id])


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


async def test_an_egress_allow_list_is_a_network_policy_the_cluster_enforces(fm_home, emu, image, prov):
    from _netcheck import gateway, http_server, nc_get
    from kubernetes import client
    async with Fleet("k8s-egress", home=fm_home, providers={"k8s": prov}) as fleet:
        pool = await fleet.pool(PoolSpec(name="n", mode="ephemeral", provider="k8s", instance=SPEC,
                                         max_instances=3))
        async with pool.sandbox(_sandbox(image, network="all")) as everything:
            gw = gateway()                    # the bridge is up: this host's side of it
            with http_server(gw, "allowed") as p_ok, http_server(gw, "denied") as p_no:
                assert await nc_get(everything, gw, p_no) == "denied"
                async with pool.sandbox(_sandbox(image, network=(f"{gw}:{p_ok}",))) as listed:
                    assert await nc_get(listed, gw, p_ok) == "allowed"
                    assert await nc_get(listed, gw, p_no) == ""          # not listed: refused
                    r = await listed.exec("nc -w 5 169.254.169.254 80 </dev/null 2>&1; echo rc=$?", timeout_s=20)
                    assert "rc=0" not in r.stdout, r                      # never the metadata server
                    pod = pool.instances[listed.instance_id].instance.address
                    # what the cluster holds: a policy of the allow-list's own, selecting the pod
                    net = client.NetworkingV1Api(emu.api_client())
                    labels = client.CoreV1Api(emu.api_client()).read_namespaced_pod(pod, "default").metadata.labels
                    label = labels["flowmesh.io/network"]
                    assert label.startswith("allow-")
                    (pol,) = [p for p in net.list_namespaced_network_policy("default").items
                              if p.spec.pod_selector.match_labels == {"flowmesh.io/network": label}]
                    (rule,) = pol.spec.egress
                    assert [b.ip_block.cidr for b in rule.to] == [f"{gw}/32"]
                    assert sorted((p.protocol, p.port) for p in rule.ports) == [("TCP", p_ok), ("UDP", p_ok)]


async def test_a_private_registry_is_pulled_from_with_the_pods_image_pull_secret(fm_home, emu, k8s_emulator,
                                                                                 busybox_image, tmp_path):
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from flowmesh_sdk.registry.auth import Credentials
    from flowmesh_sdk.registry.local import LocalRegistry
    on_nodes = k8s_emulator[2].pushed[k8s_emulator[1]]
    core = client.CoreV1Api(emu.api_client())
    with LocalRegistry(auth="htpasswd") as reg:
        for fmt in ("v2s2", "oci"):   # a digest no node holds yet, so the kubelet must pull it
            image = reg.push(busybox_image, f"private/busybox:{fmt}", manifest_format=fmt)
            if reg.pushed[image] != on_nodes:
                break
        else:
            pytest.fail("both manifest formats gave the digest already on the nodes")
        # the apiserver's validation: a dockerconfigjson secret needs its key
        with pytest.raises(ApiException) as ei:
            core.create_namespaced_secret("default", {"metadata": {"name": "bad"},
                                                      "type": "kubernetes.io/dockerconfigjson", "data": {}})
        assert ei.value.status == 422 and "data[.dockerconfigjson]: Required value" in ei.value.body
        core.create_namespaced_secret("default", {"metadata": {"name": "regcred"},
                                                  "type": "kubernetes.io/dockerconfigjson",
                                                  "stringData": {".dockerconfigjson": reg.authfile.read_text()}})
        kc = str(emu.kubeconfig(tmp_path / "kc"))
        creds = {reg.host: Credentials(reg.username, reg.password)}   # the coordinator resolves the digest
        anonymous = K8sProvider(kubeconfig=kc, schedule_timeout_s=10)
        with_secret = K8sProvider(kubeconfig=kc, schedule_timeout_s=10, image_pull_secrets=("regcred",))
        try:
            async with Fleet("k8s-private", home=fm_home, providers={"k8s": anonymous},
                             registry_credentials=creds) as fleet:
                pool = await fleet.pool(PoolSpec(name="a", mode="ephemeral", provider="k8s", instance=SPEC))
                with pytest.raises(ImageNotFoundError, match="ErrImagePull|ImagePullBackOff"):
                    async with pool.sandbox(_sandbox(image)):
                        pass
            async with Fleet("k8s-private2", home=fm_home, providers={"k8s": with_secret},
                             registry_credentials=creds) as fleet:
                pool = await fleet.pool(PoolSpec(name="s", mode="ephemeral", provider="k8s", instance=SPEC))
                async with pool.sandbox(_sandbox(image)) as sb:
                    assert (await sb.exec("echo pulled")).stdout == "pulled\n"
                    pod = pool.instances[sb.instance_id].instance.address
                    assert [s.name for s in core.read_namespaced_pod(pod, "default").spec.image_pull_secrets] == \
                        ["regcred"]
        finally:
            for p in (anonymous, with_secret):
                await p.terminate([i.id for i in await p.list_tagged({})])
                await p.close()
            core.delete_namespaced_secret("regcred", "default")
