"""GPU workers as pods: the ``k8s`` provider's GPU shapes on the Kubernetes API emulator
(flowmesh_sdk.testing.k8s: pods are real podman containers) through the official
``kubernetes`` client.

The GPU nodes are tainted ``nvidia.com/gpu=present:NoSchedule`` as GPU node pools are, and
have no GPU (the emulator only advertises ``nvidia.com/gpu``); the engine in each pod is the
named vLLM stand-in (flowmesh_sdk.testing.fake_vllm, a TEST FIXTURE: no model, no GPU),
inside the stand-in worker image pulled by the kubelet from a local registry.  The
coordinator reaches it only through ``pods/portforward`` (the provider's loopback
listeners): the pods' network is ``none``, and nothing but the API server is on this side.

* scheduling: taints and tolerations as kube-scheduler filters them (the emulator's
  scheduler, unit-tested on its own store), the provider's tolerations and capacity;
* port-forward: the emulator checked with the official client's ``kubernetes.stream.portforward`` and with
  ``kubectl port-forward`` (SPDY/3.1 tunnelled in a WebSocket);
* the inference role: a GPU pod on the tainted node, its engine started and health-checked
  over the held exec stream and reached through the port-forward;
* elastic workers on k8s: rented as GPU pods while the queue grows, released when idle.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import shutil
import subprocess
import uuid

import httpx
import pytest

from flowmesh_sdk import InstanceSpec
from flowmesh_sdk.bidder import ModelSpec
from flowmesh_sdk.control.events import EventBus, EventKind
from flowmesh_sdk.errors import SpecError
from flowmesh_sdk.imagebuild import GPU_WORKER_ENTRYPOINT
from flowmesh_sdk.provider import TAG_FLEET, LaunchRequest
from flowmesh_sdk.testing.fake_vllm import build_standin_worker_image
from flowmesh_sdk.testing.k8s.objects import ObjectStore
from flowmesh_sdk.testing.k8s.scheduler import Node, Scheduler, Taint
from flowmesh_sdk.workers import (ElasticWorkers, InferenceEndpoint, ScalingPolicy, ServeCommand, WorkerState,
                                  wait_until_healthy)

pytest.importorskip("kubernetes")

from flowmesh_providers.k8s import capacity, pods  # noqa: E402
from flowmesh_providers.k8s.tolerations import GPU_TOLERATION, Toleration, untolerated  # noqa: E402

GPU = "NVIDIA-L4"                       # GPU Feature Discovery's product label (24 GB: the catalog knows it)
GPU_TAINT = Taint("nvidia.com/gpu", "present", "NoSchedule")
NODES = (Node("cpu-1", cpu="4", memory="8Gi"),
         Node("gpu-1", cpu="8", memory="32Gi", gpus=2, gpu_product=GPU, taints=[GPU_TAINT]))
GPU_SPEC = InstanceSpec(cpus=2, memory_gb=4, gpus=1, gpu_name=GPU)
MODEL = ModelSpec(params_b=7, kv_cache_gb=6)   # 20 GB: fits one 24 GB L4
SERVED = "fake-llama"


# --------------------------------------------------------------------------- #
# taints and tolerations: the emulator's scheduler on its own store (no podman)
# --------------------------------------------------------------------------- #

def _pending(store: ObjectStore, sched: Scheduler, name: str, tolerations=(), gpus: int = 1) -> dict:
    resources = {"cpu": "1", "memory": "1Gi", **({"nvidia.com/gpu": str(gpus)} if gpus else {})}
    pod = store.create("pods", {"metadata": {"name": name, "namespace": "default"},
                                "spec": {"containers": [{"name": "c", "image": "x",
                                                         "resources": {"requests": resources, "limits": resources}}],
                                         "tolerations": list(tolerations)},
                                "status": {"phase": "Pending"}})
    sched.queue(pod)
    return pod


def _scheduler(nodes) -> tuple[ObjectStore, Scheduler, list[str]]:
    store = ObjectStore()
    started: list[str] = []
    running: set[str] = set()

    def start(ns: str, name: str, uid: str) -> None:   # as the kubelet takes a bound pod over
        started.append(name)
        running.add(uid)
    sched = Scheduler(store, {n.name: n for n in nodes}, {n.name: True for n in nodes}, running=running,
                      start=start)
    return store, sched, started


def _condition(store: ObjectStore, name: str) -> dict:
    pod = store.get("pods", "default", name)
    return next(c for c in pod["status"].get("conditions", []) if c["type"] == "PodScheduled")


def test_the_emulators_scheduler_honours_taints_as_kube_scheduler_does():
    nodes = (Node("g1", gpus=1, taints=[GPU_TAINT]), Node("g2", gpus=1, taints=[{"key": "nvidia.com/gpu",
                                                                                 "value": "present",
                                                                                 "effect": "NoExecute"}]))
    store, sched, started = _scheduler(nodes)
    _pending(store, sched, "none")
    _pending(store, sched, "wrong-value", [{"key": "nvidia.com/gpu", "operator": "Equal", "value": "absent"}])
    _pending(store, sched, "noschedule-only", [{"key": "nvidia.com/gpu", "operator": "Exists",
                                                "effect": "NoSchedule"}])
    sched.schedule()
    assert started == ["noschedule-only"]                     # g1 only: g2's NoExecute taint is not tolerated
    assert store.get("pods", "default", "noschedule-only")["spec"]["nodeName"] == "g1"
    for name in ("none", "wrong-value"):
        cond = _condition(store, name)
        assert (cond["status"], cond["reason"]) == ("False", "Unschedulable")
        assert cond["message"] == ("0/2 nodes are available: 2 node(s) had untolerated taint "
                                   "{nvidia.com/gpu: present}. preemption: 0/2 nodes are available: "
                                   "2 Preemption is not helpful for scheduling.")
    # Equal with the value (any effect), and the empty key with Exists (every taint)
    _pending(store, sched, "equal", [{"key": "nvidia.com/gpu", "operator": "Equal", "value": "present"}])
    _pending(store, sched, "everything", [{"operator": "Exists"}])
    sched.schedule()
    assert started == ["noschedule-only", "equal"]            # g2 (g1 is full); then no GPU is left
    cond = _condition(store, "everything")
    assert cond["message"].startswith("0/2 nodes are available: 2 Insufficient nvidia.com/gpu.")


def test_prefer_no_schedule_is_no_filter_and_the_unreachable_taint_is_one():
    store, sched, started = _scheduler((Node("soft", taints=[Taint("team", "rl", "PreferNoSchedule")]),))
    _pending(store, sched, "p", gpus=0)
    sched.schedule()
    assert started == ["p"]
    store, sched, started = _scheduler((Node("lost"),))
    sched.ready["lost"] = False
    _pending(store, sched, "q", [{"operator": "Exists"}], gpus=0)     # tolerates everything: still no kubelet there
    sched.schedule()
    assert started == [] and "untolerated taint {node.kubernetes.io/unreachable: }" in _condition(store, "q")["message"]


def test_provider_tolerations_pods_and_capacity():
    with pytest.raises(SpecError, match="value must be empty"):
        Toleration("k", "Exists", "v")
    with pytest.raises(SpecError, match="operator must be Exists"):
        Toleration("", "Equal")
    with pytest.raises(SpecError, match="effect"):
        Toleration("k", effect="Sometimes")
    with pytest.raises(SpecError, match="NoExecute"):
        Toleration("k", "Exists", effect="NoSchedule", toleration_seconds=30)
    assert Toleration.of({"key": "k", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 5}) == \
        Toleration("k", "Exists", effect="NoExecute", toleration_seconds=5)
    taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    assert untolerated([taint], [GPU_TOLERATION]) is None
    assert untolerated([taint], [Toleration("nvidia.com/gpu", "Equal", "absent")]) == taint
    assert untolerated([{**taint, "effect": "PreferNoSchedule"}], []) is None

    gpu = pods.sandbox_pod("p", request_tags={}, spec=GPU_SPEC, container=None, image="i", instance_type="t",
                           price_per_hour=0.0, runtime_class=None)
    assert gpu["spec"]["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert gpu["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": GPU}
    aks = pods.sandbox_pod("p", request_tags={}, spec=GPU_SPEC, container=None, image="i", instance_type="t",
                           price_per_hour=0.0, runtime_class=None, gpu_label="cloud.google.com/gke-accelerator",
                           tolerations=(Toleration("sku", "Equal", "gpu", "NoSchedule"),))
    assert aks["spec"]["tolerations"] == [{"key": "sku", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]
    assert aks["spec"]["nodeSelector"] == {"cloud.google.com/gke-accelerator": GPU}
    cpu = pods.sandbox_pod("p", request_tags={}, spec=InstanceSpec(cpus=1, memory_gb=1), container=None, image="i",
                           instance_type="t", price_per_hour=0.0, runtime_class=None)
    assert "tolerations" not in cpu["spec"]

    def node(name, gpus=0, taints=()):
        alloc = {"cpu": "8", "memory": "32Gi", "pods": "110", **({"nvidia.com/gpu": str(gpus)} if gpus else {})}
        return {"metadata": {"name": name, "labels": {"nvidia.com/gpu.product": GPU} if gpus else {}},
                "spec": {"taints": list(taints)},
                "status": {"allocatable": alloc, "conditions": [{"type": "Ready", "status": "True"}]}}
    nodes = [node("c"), node("g", gpus=2, taints=[taint])]
    small = InstanceSpec(cpus=4, memory_gb=8)
    assert capacity.node_fits(nodes, [], small) == 2            # the tainted GPU node holds no CPU sandbox
    assert capacity.node_fits(nodes, [], small, tolerations=(GPU_TOLERATION,)) == 4
    assert capacity.node_fits(nodes, [], GPU_SPEC) == 2         # the GPU shape tolerates it by default
    assert capacity.node_fits(nodes, [], GPU_SPEC, tolerations=()) == 0


# --------------------------------------------------------------------------- #
# the emulator with GPU nodes, and the stand-in worker image in its registry
# --------------------------------------------------------------------------- #

@pytest.fixture(scope="module")
def gpu_cluster(images_mod):
    from flowmesh_sdk.registry.local import LocalRegistry
    from flowmesh_sdk.testing.k8s import KubeEmulator

    images_mod.build_swe_base()
    local = build_standin_worker_image(str(GPU_WORKER_ENTRYPOINT), base=images_mod.SWE_BASE_IMAGE,
                                       build_args=images_mod.podman_build_args())
    with LocalRegistry() as reg, KubeEmulator(nodes=NODES) as emu:
        yield emu, reg.push(local, "flowmesh/gpu-worker-standin:k8s")


@pytest.fixture
async def gprov(gpu_cluster, tmp_path):
    from flowmesh_providers.k8s import K8sProvider
    emu, image = gpu_cluster
    p = K8sProvider(kubeconfig=str(emu.kubeconfig(tmp_path / "kubeconfig")), image=image, forward_ports=(8000,),
                    schedule_timeout_s=20)
    yield p
    await p.terminate([i.id for i in await p.list_tagged({})])
    await p.close()


def _until(predicate, timeout_s: float = 120.0, what: str = "condition"):
    """Test helper (sync): wait, with a deadline, for a condition of the emulator's records."""
    import time
    end = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_portforward_with_the_official_client(gpu_cluster, tmp_path):
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException
    from kubernetes.stream import portforward

    emu, image = gpu_cluster
    core = client.CoreV1Api(emu.api_client())
    name = f"pf-{uuid.uuid4().hex[:6]}"
    # the stand-in listens on the pod's own 127.0.0.1 only: reachable from inside its namespace, nowhere else
    core.create_namespaced_pod("default", {
        "metadata": {"name": name},
        "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                 "containers": [{"name": "engine", "image": image,
                                 "command": ["python3", "/opt/flowmesh/fake_vllm.py", "serve", "m",
                                             "--served-model-name", SERVED, "--host", "127.0.0.1", "--port", "8000"],
                                 "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}]}})
    try:
        _until(lambda: core.read_namespaced_pod(name, "default").status.phase == "Running", what="the pod running")
        before = emu.count("portforward", "pods")

        def models() -> tuple[int, dict, str | None]:
            pf = portforward(core.connect_get_namespaced_pod_portforward, name, "default", ports="8000,8001")
            conn = http.client.HTTPConnection("pod", 8000, timeout=30)
            conn.sock = pf.socket(8000)
            conn.request("GET", "/v1/models")
            resp = conn.getresponse()
            body = json.loads(resp.read())
            conn.close()
            _until(lambda: pf.error(8001) is not None, 30, "the error of the port nothing listens on")
            err = pf.error(8001)
            pf.close()
            return resp.status, body, err

        answer: list = []

        def served() -> bool:
            try:
                answer[:] = [models()]
            except (OSError, http.client.HTTPException, ValueError):
                return False   # the stand-in is still starting
            return True
        _until(served, 60, "the stand-in answering through the port-forward")
        status, body, err = answer[0]
        assert status == 200 and [m["id"] for m in body["data"]] == [SERVED]
        assert err.startswith("error forwarding port 8001 to pod ") and "connection refused" in err, err
        assert emu.count("portforward", "pods") > before
        with pytest.raises(ApiException) as refused:   # no WebSocket upgrade (as SPDY asks for one): refused
            core.connect_get_namespaced_pod_portforward(name, "default", ports="8000")
        assert refused.value.status == 400 and "no SPDY" in refused.value.body
        kubectl = shutil.which("kubectl")
        if kubectl is not None:   # kubectl 1.31+ speaks SPDY/3.1 tunnelled in a WebSocket: a data+error pair each
            home = tmp_path / "home"
            home.mkdir()
            env = dict(os.environ, KUBECONFIG=str(emu.kubeconfig(tmp_path / "kc")), HOME=str(home),
                       KUBECACHEDIR=str(tmp_path / "cache"), NO_PROXY="127.0.0.1", no_proxy="127.0.0.1")
            before = emu.count("portforward", "pods")
            assert _kubectl_port_forward(kubectl, name, env) == [(200, [SERVED])] * 2
            assert emu.count("portforward", "pods") == before + 1   # one tunnel, many forwarded connections
    finally:
        core.delete_namespaced_pod(name, "default", grace_period_seconds=0)


def _kubectl_port_forward(kubectl: str, pod: str, env: dict) -> list[tuple[int, list[str]]]:
    """Test helper: ``kubectl port-forward pod/POD 0:8000``, two HTTP requests through it (two local
    connections, so two stream pairs in the one SPDY session), then kubectl terminated."""
    proc = subprocess.Popen([kubectl, "port-forward", f"pod/{pod}", "0:8000"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()   # "Forwarding from 127.0.0.1:PORT -> 8000", once the tunnel is up
        if not line.startswith("Forwarding from 127.0.0.1:"):
            proc.kill()
            raise AssertionError(f"kubectl port-forward: {line!r} {proc.communicate(timeout=30)}")
        port = int(line.split("127.0.0.1:", 1)[1].split()[0])
        answers = []
        for _ in range(2):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            conn.request("GET", "/v1/models", headers={"Connection": "close"})
            resp = conn.getresponse()
            answers.append((resp.status, [m["id"] for m in json.loads(resp.read())["data"]]))
            conn.close()
        return answers
    finally:
        proc.terminate()
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def test_tolerations_are_validated_by_the_emulators_api(gpu_cluster):
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core = client.CoreV1Api(gpu_cluster[0].api_client())
    with pytest.raises(ApiException) as bad:
        core.create_namespaced_pod("default", {
            "metadata": {"name": "bad-toleration"},
            "spec": {"containers": [{"name": "c", "image": "x"}],
                     "tolerations": [{"key": "k", "operator": "Exists", "value": "v"},
                                     {"key": "k", "operator": "Maybe"}]}})
    body = json.loads(bad.value.body)
    assert bad.value.status == 422 and body["reason"] == "Invalid"
    assert "spec.tolerations[0].operator: Invalid value: value must be empty when `operator` is 'Exists'" in \
        body["message"]
    assert 'spec.tolerations[1].operator: Unsupported value: "Maybe"' in body["message"]


# --------------------------------------------------------------------------- #
# the inference role in a GPU pod, and elastic workers on k8s
# --------------------------------------------------------------------------- #

async def test_an_inference_worker_runs_in_a_gpu_pod_reached_through_port_forward(gpu_cluster, gprov):
    emu, _ = gpu_cluster
    offers = await gprov.offers(GPU_SPEC)
    assert [o.available for o in offers] == [2]                           # the tainted node's two GPUs
    assert [o.available for o in await gprov.offers(InstanceSpec(cpus=4, memory_gb=4))] == [1]   # cpu-1 only
    (inst,) = await gprov.launch(LaunchRequest(offer=offers[0], spec=GPU_SPEC, count=1, request_id="gpu-inf",
                                               tags={TAG_FLEET: "k8s-gpu"}))
    pod = emu.pod("default", inst.address)
    assert pod["spec"]["nodeName"] == "gpu-1" and pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": GPU}
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["spec"]["tolerations"]
    assert pod["metadata"]["labels"]["flowmesh.io/network"] == "none"      # no network but the port-forward

    runner = gprov.runner(inst)
    await runner.wait_reachable(240)          # the kubelet pulls the stand-in worker image
    engine = ServeCommand.vllm(SERVED)       # `vllm serve`: the stand-in's vllm in this image
    base = engine.base_url(inst, runner)
    host = runner.target.host
    assert base == f"http://{host}:8000" and host.startswith("127.") and host != "127.0.0.1"
    res = await runner.run(["sh", "-c", engine.shell(inst, runner, "w1")], timeout_s=60)
    assert res.ok and res.stdout.strip().isdigit(), res.describe()
    forwards = emu.count("portforward", "pods")
    async with httpx.AsyncClient() as probe:
        report = await wait_until_healthy(probe, base, SERVED, timeout_s=60, what="the stand-in in the pod")
    assert SERVED in report.models
    endpoint = InferenceEndpoint(base, SERVED, worker="w1")
    try:
        answers = await asyncio.gather(*(endpoint.complete(f"p{i}") for i in range(4)))
    finally:
        await endpoint.aclose()
    assert [a.text for a in answers] == [f"ok:p{i}" for i in range(4)]
    assert emu.count("portforward", "pods") > forwards                     # every byte went through the API server
    made = runner.target.streams
    await gprov.terminate([inst.id])
    with pytest.raises(httpx.TransportError):                              # its listener went with the pod
        async with httpx.AsyncClient() as after:
            await after.get(f"{base}/health", timeout=5)
    assert made >= 1


async def test_elastic_workers_scale_as_gpu_pods(gpu_cluster, gprov, tmp_path):
    emu, _ = gpu_cluster
    bus = EventBus()
    events: list = []
    bus.on(events.append)
    scaling = ScalingPolicy(min_workers=0, max_workers=2, target_queue_per_worker=2, scale_down_idle_s=0.3,
                            cooldown_s=0.0, interval_s=0.2, worker_concurrency=2, drain_timeout_s=20,
                            ready_timeout_s=240)
    engine = ServeCommand(("env", "FAKE_VLLM_DELAY_S=0.5", "vllm", "serve", "{model}", "--host", "{host}",
                           "--port", "{port}"), model=SERVED)
    fleet = f"k8s-elastic-{uuid.uuid4().hex[:6]}"
    ew = ElasticWorkers(gprov, GPU_SPEC, MODEL, engine, scaling=scaling, bus=bus, fleet=fleet, role="vllm")
    try:
        await ew.start()
        answers = await asyncio.wait_for(asyncio.gather(*(ew.complete(f"q{i}") for i in range(6))), 300)
        assert [a.text for a in answers] == [f"ok:q{i}" for i in range(6)]
        rented = [json.loads(e.detail) for e in events if e.kind is EventKind.WORKER_RENTED]
        assert len(rented) == 2 and all(r["offer"].startswith("k8s/") for r in rented)
        placed = [p for p in emu.pods("default") if p["metadata"]["labels"].get("flowmesh.io/fleet") == fleet]
        assert len(placed) == 2 and {p["spec"]["nodeName"] for p in placed} == {"gpu-1"}
        ready = [json.loads(e.detail) for e in events if e.kind is EventKind.WORKER_READY]
        assert all(r["url"].startswith("http://127.") and r["url"].endswith(":8000") for r in ready)
        assert len({r["url"] for r in ready}) == 2                     # one loopback address per pod

        async def released() -> None:
            while ew.stats().released < 2:
                await asyncio.sleep(0.1)
        await asyncio.wait_for(released(), 60)                          # idle: drained, then released
        assert all(w.state is WorkerState.STOPPED for w in ew.workers.values())
    finally:
        await ew.aclose()

    async def gone() -> None:
        while [i for i in await gprov.list_tagged({TAG_FLEET: fleet})]:
            await asyncio.sleep(0.1)
    await asyncio.wait_for(gone(), 60)


# --------------------------------------------------------------------------- #
# the roles themselves in a pod: the pod's own processes (InstanceWorkerProcess)
# --------------------------------------------------------------------------- #

async def _gpu_pod(gprov, request_id: str):
    offers = await gprov.offers(GPU_SPEC)
    (inst,) = await gprov.launch(LaunchRequest(offer=offers[0], spec=GPU_SPEC, count=1, request_id=request_id,
                                               tags={TAG_FLEET: "k8s-roles"}))
    runner = gprov.runner(inst)
    await runner.wait_reachable(240)          # the kubelet pulls the stand-in worker image
    return inst, runner


async def _alive(runner, pid: int) -> bool:
    return (await runner.run(["sh", "-c", f"kill -0 {pid}"], timeout_s=30)).ok


async def test_an_inference_worker_joins_and_leaves_as_the_gpu_pods_own_process(gpu_cluster, gprov):
    from flowmesh_sdk.workers import InferenceSpec, InferenceWorker

    _, image = gpu_cluster
    inst, runner = await _gpu_pod(gprov, "gpu-role-inf")
    bus = EventBus()
    events: list = []
    bus.on(events.append)
    spec = InferenceSpec("fake/llama", image, served_model_name=SERVED, num_heads=32, start_timeout_s=120,
                         env={"FAKE_GPUS": "2", "FAKE_VLLM_LOAD_S": "1"})   # the stand-in nvidia-smi lists 2
    try:
        worker = InferenceWorker.on_instance(runner, spec, fleet="k8s-roles", instance_id=inst.id, bus=bus)
        endpoint = await worker.join()
        assert worker.state is WorkerState.READY and worker.tensor_parallel == 2   # planned in the pod:
        assert worker.launch_argv[:3] == ["vllm", "serve", "fake/llama"]             # its entrypoint's argv
        assert endpoint.base_url == f"http://{runner.target.host}:8000"    # the pod's forwarded address
        assert (pid := worker.container.pid) is not None and await _alive(runner, pid)
        answers = await asyncio.gather(*(endpoint.complete(f"r{i}") for i in range(4)))
        assert [a.text for a in answers] == [f"ok:r{i}" for i in range(4)]
        async with httpx.AsyncClient() as http:            # the argv the stand-in was exec'd with, in the pod
            launch = (await http.get(f"{endpoint.base_url}/fake/launch", timeout=30)).json()
        assert "--tensor-parallel-size" in json.dumps(launch) and "fake/llama" in json.dumps(launch)
        report = await worker.leave(timeout_s=30)
        assert worker.state is WorkerState.STOPPED and report.abandoned == 0
        assert not await _alive(runner, pid)                 # SIGTERM ended it: the process is gone
        assert [e.kind for e in events] == [EventKind.WORKER_STARTING, EventKind.WORKER_READY,
                                            EventKind.WORKER_DRAINING, EventKind.WORKER_STOPPED]
        with pytest.raises(httpx.TransportError):           # nothing listens on the pod's port any more
            async with httpx.AsyncClient() as after:
                await after.get(f"{endpoint.base_url}/health", timeout=5)
    finally:
        await gprov.terminate([inst.id])


async def test_a_refused_plan_and_a_dying_server_in_a_pod_fail_as_in_a_container(gpu_cluster, gprov):
    from flowmesh_sdk.remote.direct import InstanceRuntime
    from flowmesh_sdk.workers import InferenceSpec, InferenceWorker, WorkerStartError

    _, image = gpu_cluster
    inst, runner = await _gpu_pod(gprov, "gpu-role-bad")
    try:
        # the pool's runtime of an instance that is a container: the worker runs as its process
        refused = InferenceWorker(InstanceRuntime(runner, inst.id, image),
                                  InferenceSpec("m", image, tensor_parallel=4, env={"FAKE_GPUS": "2"}))
        with pytest.raises(SpecError, match="inference: argument --tensor-parallel: 4 is more than the 2 visible"):
            await refused.join()
        assert refused.state is WorkerState.FAILED and refused.container.pid is None   # nothing started
        dying = InferenceWorker(InstanceRuntime(runner, inst.id, image), InferenceSpec(
            "m", image, env={"FAKE_GPUS": "1"}, start_timeout_s=60, extra_args=("--max-model-len", "lots")))
        with pytest.raises(WorkerStartError, match=r"stopped before it was healthy.*process exited \(exit 2\)"):
            await dying.join()
        assert dying.state is WorkerState.FAILED
    finally:
        await gprov.terminate([inst.id])


async def test_a_training_job_in_container_mode_runs_as_the_pods_process(gpu_cluster, gprov, tmp_path):
    from flowmesh_sdk.cas.local import LocalDirStore
    from flowmesh_sdk.workers import TrainingFailedError, TrainingSpec, TrainingWorker

    _, image = gpu_cluster
    inst, runner = await _gpu_pod(gprov, "gpu-role-train")
    store = LocalDirStore(tmp_path / "cas")
    try:
        # the plan runs in the pod: a folder of this machine is not there
        here = TrainingSpec("sft", "/opt/model", str(tmp_path), "/tmp/out-a", image=image, gpus="none",
                            num_processes=1)
        with pytest.raises(SpecError, match=f"training: argument --dataset: {tmp_path} does not exist"):
            await TrainingWorker.on_instance(runner, here, store=store).start()
        # planned and started as the pod's process; the stand-in image has no accelerate: the job fails
        spec = TrainingSpec("sft", "/opt/model", "/opt/flowmesh", "/tmp/out-b", image=image, num_processes=1,
                            max_steps=1, timeout_s=120, env={"FAKE_GPUS": "1"})   # the pod's one GPU
        worker = TrainingWorker.on_instance(runner, spec, store=store)
        argv = await worker.start()
        assert argv[:4] == ["accelerate", "launch", "--num_processes", "1"] and worker.state is WorkerState.READY
        with pytest.raises(TrainingFailedError) as failed:
            await worker.wait()
        assert failed.value.exit_code not in (0, None) and worker.state is WorkerState.FAILED
        assert "No module named 'accelerate'" in failed.value.log_tail, failed.value.log_tail
        assert (await runner.run(["test", "-d", "/tmp/out-b"], timeout_s=30)).ok   # made in the pod
    finally:
        await gprov.terminate([inst.id])
