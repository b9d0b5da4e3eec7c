"""Fidelity of flowmesh_sdk.testing.k8s (the Kubernetes API server emulator) against the
official clients: the Python client ``kubernetes`` and kubectl.  Pods are real podman
containers from the repo's busybox image, pushed to a LocalRegistry and run by digest."""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from flowmesh_sdk.registry.local import LocalRegistry
from flowmesh_sdk.testing import hygiene
from flowmesh_sdk.testing.k8s import KubeEmulator, Node

kubernetes = pytest.importorskip("kubernetes")
from kubernetes import client, config, watch  # noqa: E402
from kubernetes.stream import stream  # noqa: E402

KUBECTL = shutil.which("kubectl")


def _kubectl_minor() -> int:
    if KUBECTL is None:
        return 0
    out = subprocess.run([KUBECTL, "version", "--client", "-o", "json"], capture_output=True, text=True,
                         timeout=60, env=dict(os.environ, KUBECONFIG=os.devnull)).stdout
    try:
        return int("".join(c for c in json.loads(out)["clientVersion"]["minor"] if c.isdigit()))
    except (ValueError, KeyError):
        return 0


# the emulator is checked with kubectl 1.32 (this machine image's).  kubectl's exec speaks WebSocket
# (v5.channel.k8s.io) by default from 1.31 (KEP-4006); older ones speak only SPDY, which the emulator
# does not serve, and validate manifests against OpenAPI v2 (Debian 12's kubernetes-client is 1.20)
needs_kubectl = pytest.mark.skipif(_kubectl_minor() < 31, reason="needs kubectl >= 1.31 (WebSocket exec)")
NODES = (Node("emu-node-1", cpu="4", memory="8Gi"), Node("emu-node-2", cpu="4", memory="8Gi"))
RUNSC = shutil.which("runsc")
RUNTIME_CLASSES = {"plain": "runc", "broken": "fm-no-such-runtime", **({"gvisor": "runsc"} if RUNSC else {})}
NOWHERE = {"nodeSelector": {"flowmesh.test/nowhere": "true"}}   # a pod that stays Pending, without a container


def wait_for(what: str, fn: Callable[[], Any], timeout_s: float = 90.0, every_s: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(every_s)


def manifest(name: str, image: str, *, labels: dict[str, str] | None = None,
             command: tuple[str, ...] = ("sleep", "600"), resources: dict[str, Any] | None = None,
             **spec: Any) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": image, "command": list(command)}
    if resources:
        container["resources"] = resources
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels or {}},
            "spec": {"restartPolicy": "Never", "containers": [container], **spec}}


def body(exc: Any) -> dict[str, Any]:
    return json.loads(exc.body)


def store_containers(emu: KubeEmulator) -> dict[str, hygiene.Container]:
    return {c.name: c for c in hygiene.containers(emu.store_root)}


# ---- fixtures ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def image(busybox_image: str):
    """The busybox image in a registry on 127.0.0.1, referenced by digest."""
    with LocalRegistry() as reg:
        ref = reg.push(busybox_image, "flowmesh/busybox:1")
        yield f"{reg.host}/flowmesh/busybox@{reg.pushed[ref]}"


@pytest.fixture(scope="module")
def emu(image: str):
    with KubeEmulator(nodes=NODES, runtime_classes=RUNTIME_CLASSES, pull_backoff_s=0.5,
                      bookmark_interval_s=0.2) as k8s:
        root = k8s.store_root
        yield k8s
    assert not root.exists() and root not in hygiene.STORES
    assert not hygiene.conmons_of(hygiene.processes(), root)


@pytest.fixture(scope="module")
def api(emu: KubeEmulator):
    return client.CoreV1Api(emu.api_client())


@pytest.fixture(scope="module")
def kubeconfig(emu: KubeEmulator, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return emu.kubeconfig(tmp_path_factory.mktemp("kube") / "config")


@pytest.fixture(scope="module")
def kubectl(kubeconfig: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    if KUBECTL is None:
        pytest.skip("kubectl is not installed")
    home = kubeconfig.parent / "home"
    home.mkdir()
    env = dict(os.environ, KUBECONFIG=str(kubeconfig), KUBECACHEDIR=str(kubeconfig.parent / "cache"),
               HOME=str(home), NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")

    def run(*args: str, input: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        assert KUBECTL is not None
        return subprocess.run([KUBECTL, *args], env=env, input=input, capture_output=True, text=True,
                              timeout=timeout)
    run.env = env
    return run


def _watch_until(api: Any, rv: str, stop: Callable[[dict[str, Any]], bool], **kwargs: Any) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    w = watch.Watch()
    for ev in w.stream(api.list_namespaced_pod, "default", resource_version=rv, timeout_seconds=120, **kwargs):
        events.append({"type": ev["type"], "object": ev["raw_object"]})
        if stop(ev["raw_object"]):
            w.stop()
    return events


def _ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in (pod.get("status") or {}).get("conditions", []))


@pytest.fixture(scope="module")
def web(emu: KubeEmulator, api: Any, image: str) -> dict[str, Any]:
    """A running pod (labelled app=x), and what a watch from before its creation saw."""
    rv = api.list_namespaced_pod("default").metadata.resource_version
    seen: dict[str, Any] = {}

    def watcher() -> None:
        seen["events"] = _watch_until(api, rv, lambda o: o["metadata"]["name"] == "web-1" and _ready(o))
    th = threading.Thread(target=watcher)
    th.start()
    created = json.loads(api.create_namespaced_pod("default", manifest("web-1", image, labels={"app": "x"}),
                                                   _preload_content=False).data)
    th.join(150)
    assert not th.is_alive()
    return {"name": "web-1", "created": created, "events": seen["events"]}


# ---- auth, discovery, kubeconfig --------------------------------------------------------------
def test_bad_or_missing_token_is_401_status(emu: KubeEmulator) -> None:
    ctx = ssl.create_default_context(cafile=str(emu.ca_cert))
    for headers in ({"Authorization": "Bearer wrong"}, {}):
        req = urllib.request.Request(f"{emu.url}/api/v1/namespaces/default/pods", headers=headers)
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(req, context=ctx, timeout=30)
        assert info.value.code == 401
        assert info.value.headers["Content-Type"].startswith("application/json")
        assert json.loads(info.value.read()) == {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                                 "status": "Failure", "message": "Unauthorized",
                                                 "reason": "Unauthorized", "code": 401}
    bad = emu.api_client()
    bad.configuration.api_key = {"authorization": "not-the-token"}
    with pytest.raises(client.ApiException) as exc:
        client.CoreV1Api(bad).list_namespaced_pod("default")
    assert exc.value.status == 401 and body(exc.value)["reason"] == "Unauthorized"


def test_kubeconfig_serves_the_python_client(emu: KubeEmulator, kubeconfig: Path) -> None:
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    assert cfg.host == emu.url
    core = client.CoreV1Api(client.ApiClient(cfg))
    assert "default" in {ns.metadata.name for ns in core.list_namespace().items}
    nodes = {n.metadata.name: n for n in core.list_node().items}
    assert set(nodes) == {"emu-node-1", "emu-node-2"}
    node = nodes["emu-node-1"]
    assert node.status.allocatable == {"cpu": "4", "memory": "8Gi", "pods": "110", "ephemeral-storage": "100Gi"}
    assert node.metadata.labels["kubernetes.io/hostname"] == "emu-node-1"
    assert [(c.type, c.status) for c in node.status.conditions if c.type == "Ready"] == [("Ready", "True")]
    assert client.VersionApi(core.api_client).get_code().git_version == "v1.32.0"


@needs_kubectl
def test_kubeconfig_serves_kubectl(emu: KubeEmulator, kubectl: Any) -> None:
    res = kubectl("version", "-o", "json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["serverVersion"]["gitVersion"] == "v1.32.0"
    res = kubectl("get", "nodes", "-o", "name")
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["node/emu-node-1", "node/emu-node-2"]
    res = kubectl("api-resources", "-o", "name")
    assert res.returncode == 0, res.stderr
    assert {"pods", "nodes", "namespaces", "resourcequotas", "networkpolicies.networking.k8s.io",
            "runtimeclasses.node.k8s.io"} <= set(res.stdout.split())


def test_gpu_node_advertises_its_gpus() -> None:
    # no pods: nothing runs, only the node objects are looked at
    with KubeEmulator(nodes=[Node("g", cpu="16", memory="64Gi", gpus=2, gpu_product="NVIDIA-H100-80GB-HBM3")]) as k8s:
        node = client.CoreV1Api(k8s.api_client()).read_node("g")
    assert node.status.capacity["nvidia.com/gpu"] == "2" == node.status.allocatable["nvidia.com/gpu"]
    assert node.metadata.labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"


# ---- pods ---------------------------------------------------------------------------------------
def test_pod_from_registry_digest_runs_and_watch_sees_it(emu: KubeEmulator, api: Any, web: dict[str, Any]) -> None:
    events = [e for e in web["events"] if e["object"]["metadata"]["name"] == "web-1"]
    assert events[0]["type"] == "ADDED" and events[0]["object"]["status"]["phase"] == "Pending"
    assert events[-1]["type"] == "MODIFIED" and _ready(events[-1]["object"])
    assert {e["type"] for e in events[1:]} == {"MODIFIED"}
    uid = web["created"]["metadata"]["uid"]
    assert {e["object"]["metadata"]["uid"] for e in events} == {uid}
    assert {e["object"]["metadata"]["creationTimestamp"] for e in events} == {web["created"]["metadata"]
                                                                                ["creationTimestamp"]}
    rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert rvs == sorted(rvs) and len(set(rvs)) == len(rvs)

    pod = api.read_namespaced_pod("web-1", "default")
    assert pod.status.phase == "Running" and pod.spec.node_name in ("emu-node-1", "emu-node-2")
    assert pod.status.pod_ip == "127.0.0.1" and pod.status.host_ip == "127.0.0.1"
    cs = pod.status.container_statuses[0]
    assert cs.ready and cs.state.running.started_at is not None and cs.restart_count == 0
    assert {c.type: c.status for c in pod.status.conditions} == {
        "PodReadyToStartContainers": "True", "Initialized": "True", "Ready": "True", "ContainersReady": "True",
        "PodScheduled": "True"}
    container = store_containers(emu)[f"k8s_default_web-1_{uid[:8]}"]
    assert container.state == "running"
    assert container.labels["io.kubernetes.pod.uid"] == uid
    assert container.labels["io.flowmesh.k8s-emulator"] == emu.id
    assert "app" not in container.labels   # the pod's labels are not the container's


def test_pod_names_are_validated_and_unique(emu: KubeEmulator, api: Any, image: str) -> None:
    with pytest.raises(client.ApiException) as exc:
        api.create_namespaced_pod("default", manifest("Bad_Name", image, **NOWHERE))
    assert exc.value.status == 422
    status = body(exc.value)
    assert status["reason"] == "Invalid" and status["details"]["causes"][0]["field"] == "metadata.name"
    assert status["message"].startswith('Pod "Bad_Name" is invalid: metadata.name: Invalid value: "Bad_Name": '
                                        "a lowercase RFC 1123 subdomain")
    generated = api.create_namespaced_pod("default", {**manifest("", image, **NOWHERE),
                                                      "metadata": {"generateName": "gen-"}})
    name = generated.metadata.name
    assert name.startswith("gen-") and len(name) == len("gen-") + 5
    with pytest.raises(client.ApiException) as exc:   # an object read back is no object to create
        api.create_namespaced_pod("default", generated)
    assert exc.value.status == 400
    assert body(exc.value)["message"] == "resourceVersion should not be set on objects to be created"
    two = manifest("two", image, **NOWHERE)
    two["spec"]["containers"].append({"name": "side", "image": image})
    with pytest.raises(client.ApiException) as exc:
        api.create_namespaced_pod("default", two)
    assert exc.value.status == 422 and body(exc.value)["details"]["causes"][0]["field"] == "spec.containers"
    with pytest.raises(client.ApiException) as exc:
        api.create_namespaced_pod("default", manifest(name, image, **NOWHERE))
    assert exc.value.status == 409
    assert body(exc.value)["reason"] == "AlreadyExists"
    assert body(exc.value)["message"] == f'pods "{name}" already exists'
    api.delete_namespaced_pod(name, "default")
    with pytest.raises(client.ApiException) as exc:
        api.read_namespaced_pod(name, "default")
    assert exc.value.status == 404 and body(exc.value)["message"] == f'pods "{name}" not found'


@needs_kubectl
def test_kubectl_get_by_label_lists_exactly_those(emu: KubeEmulator, api: Any, kubectl: Any, image: str,
                                                  web: dict[str, Any]) -> None:
    api.create_namespaced_pod("default", manifest("web-2", image, labels={"app": "x", "tier": "b"}, **NOWHERE))
    api.create_namespaced_pod("default", manifest("db-1", image, labels={"app": "y"}, **NOWHERE))
    try:
        res = kubectl("get", "pods", "-l", "app=x", "-o", "name")
        assert res.returncode == 0, res.stderr
        assert sorted(res.stdout.split()) == ["pod/web-1", "pod/web-2"]
        res = kubectl("get", "pods", "-l", "app in (x,y),!tier", "-o", "name")
        assert sorted(res.stdout.split()) == ["pod/db-1", "pod/web-1"]
        running = api.list_namespaced_pod("default", label_selector="app", field_selector="status.phase=Running")
        assert [p.metadata.name for p in running.items] == ["web-1"]
        res = kubectl("get", "pods", "web-1")   # the server's Table: kubectl's usual columns
        assert res.returncode == 0, res.stderr
        header, row = res.stdout.splitlines()[:2]
        assert header.split()[:4] == ["NAME", "READY", "STATUS", "RESTARTS"]
        assert row.split()[:4] == ["web-1", "1/1", "Running", "0"]
    finally:
        api.delete_collection_namespaced_pod("default", label_selector="app,app!=x")
        api.delete_namespaced_pod("web-2", "default")
    assert [p.metadata.name for p in api.list_namespaced_pod("default", label_selector="app").items] == ["web-1"]


@needs_kubectl
def test_kubectl_exec_prints_output_and_exits_with_the_code(emu: KubeEmulator, kubectl: Any,
                                                          web: dict[str, Any]) -> None:
    before = emu.count("exec", "pods")
    res = kubectl("exec", "web-1", "--", "sh", "-c", "echo hi; exit 3")
    assert res.returncode == 3
    assert res.stdout == "hi\n"
    assert "command terminated with exit code 3" in res.stderr
    res = kubectl("exec", "-i", "web-1", "--", "sh", "-c", "tr a-z A-Z", input="piped in\n")
    assert (res.returncode, res.stdout) == (0, "PIPED IN\n")
    assert emu.count("exec", "pods") == before + 2


def test_python_stream_runs_many_commands_over_one_shell(emu: KubeEmulator, api: Any, web: dict[str, Any]) -> None:
    before = emu.count("exec", "pods")
    ws = stream(api.connect_get_namespaced_pod_exec, "web-1", "default", command=["/bin/sh"], stdin=True,
                stdout=True, stderr=True, tty=False, _preload_content=False)
    try:
        assert ws.subprotocol == "v5.channel.k8s.io"
        outputs = []
        for i in range(3):
            ws.write_stdin(f"echo step-{i}; echo oops-{i} >&2\n")
            outputs.append(ws.readline_stdout(timeout=60))
        assert outputs == ["step-0", "step-1", "step-2"]
        ws.write_stdin("printf no-newline\n")   # output without a line end arrives as it is written
        got = ""
        deadline = time.monotonic() + 60
        while got != "no-newline" and time.monotonic() < deadline:
            got += ws.read_stdout(timeout=1)
        assert got == "no-newline"
        assert ws.returncode is None
        ws.write_stdin("exit 5\n")
        ws.run_forever(timeout=60)
        assert ws.returncode == 5
        assert ws.read_stderr() == "oops-0\noops-1\noops-2\n"
    finally:
        ws.close()
    assert emu.count("exec", "pods") == before + 1
    out = stream(api.connect_get_namespaced_pod_exec, "web-1", "default", command=["sh", "-c", "echo $((6*7))"],
                 stdin=False, stdout=True, stderr=True, tty=False)
    assert out == "42\n"


def test_exec_channel_protocol_on_the_wire(emu: KubeEmulator, web: dict[str, Any]) -> None:
    import websocket   # websocket-client: what the Python client speaks through

    url = (emu.url.replace("https://", "wss://") + "/api/v1/namespaces/default/pods/web-1/exec?"
           "command=sh&command=-c&command=head%20-n%201%3B%20echo%20bye%20%3E%262%3B%20exit%202"
           "&stdin=true&stdout=true&stderr=true&tty=false")
    for offered, expected in ((["v4.channel.k8s.io"], "v4.channel.k8s.io"),
                              (["v4.channel.k8s.io", "v5.channel.k8s.io"], "v5.channel.k8s.io"),
                              (["channel.k8s.io"], "channel.k8s.io")):
        ws = websocket.create_connection(url, header=[f"Authorization: Bearer {emu.token}"], subprotocols=offered,
                                         sslopt={"ca_certs": str(emu.ca_cert)}, timeout=60)
        frames: dict[int, bytes] = {}
        try:
            assert ws.getsubprotocol() == expected
            ws.send_binary(b"\x00")                      # an empty stdin frame, as some clients send first
            ws.send_binary(b"\x00hello\nnot read\n")
            while True:
                opcode, data = ws.recv_data()
                if opcode == websocket.ABNF.OPCODE_CLOSE:
                    break
                frames[data[0]] = frames.get(data[0], b"") + data[1:]
        finally:
            ws.close()
        assert frames[1] == b"hello\n" and frames[2] == b"bye\n"
        assert json.loads(frames[3]) == {
            "metadata": {}, "status": "Failure", "reason": "NonZeroExitCode",
            "message": "command terminated with non-zero exit code: error executing command "
                       "[sh -c head -n 1; echo bye >&2; exit 2], exit code 2",
            "details": {"causes": [{"reason": "ExitCode", "message": "2"}]}}


def test_exec_client_going_away_kills_the_command(emu: KubeEmulator, api: Any, web: dict[str, Any]) -> None:
    def sleepers() -> list[str]:
        out = stream(api.connect_get_namespaced_pod_exec, "web-1", "default", command=["ps", "-o", "args"],
                     stdin=False, stdout=True, stderr=True, tty=False)
        return [line for line in out.splitlines() if line.strip() == "sleep 4242"]
    ws = stream(api.connect_get_namespaced_pod_exec, "web-1", "default", command=["sleep", "4242"], stdin=True,
                stdout=True, stderr=True, tty=False, _preload_content=False)
    wait_for("the exec'd sleep", sleepers)
    ws.close()
    wait_for("the sleep to be killed", lambda: not sleepers())


@needs_kubectl
def test_kubectl_wait_logs_and_delete(emu: KubeEmulator, api: Any, kubectl: Any, image: str) -> None:
    api.create_namespaced_pod("default", manifest("logger", image,
                                                  command=("sh", "-c", "echo line-1; echo line-2 >&2; sleep 600")))
    res = kubectl("wait", "--for=condition=Ready", "pod/logger", "--timeout=90s")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "pod/logger condition met"
    logs = wait_for("both log lines", lambda: (r := kubectl("logs", "logger")).returncode == 0
                    and "line-2" in r.stdout and r.stdout)
    assert logs.splitlines() == ["line-1", "line-2"]
    uid = api.read_namespaced_pod("logger", "default").metadata.uid
    assert f"k8s_default_logger_{uid[:8]}" in store_containers(emu)
    res = kubectl("delete", "pod", "logger")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == 'pod "logger" deleted'
    with pytest.raises(client.ApiException) as exc:   # gone when kubectl returns
        api.read_namespaced_pod("logger", "default")
    assert exc.value.status == 404
    assert f"k8s_default_logger_{uid[:8]}" not in store_containers(emu)


@needs_kubectl
def test_kubectl_get_watch_streams_changes(emu: KubeEmulator, api: Any, kubectl: Any, image: str) -> None:
    proc = subprocess.Popen([str(KUBECTL), "get", "pods", "-w", "-l", "watched=yes", "-o", "name"],
                            env=kubectl.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    try:
        api.create_namespaced_pod("default", manifest("watched", image, labels={"watched": "yes"}, **NOWHERE))
        assert proc.stdout is not None
        reader = threading.Thread(target=lambda: lines.append(proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(90)
        assert [line.strip() for line in lines] == ["pod/watched"]
    finally:
        proc.kill()
        proc.communicate()
        api.delete_namespaced_pod("watched", "default")


def test_restart_policy_restarts_a_failing_container(api: Any, image: str) -> None:
    api.create_namespaced_pod("default", manifest("flaky", image, command=("sh", "-c", "echo try; exit 4"),
                                                  restartPolicy="OnFailure"))
    try:
        cs = wait_for("a restart", lambda: next(iter(
            [c for c in api.read_namespaced_pod("flaky", "default").status.container_statuses or []
             if c.restart_count >= 1 and c.last_state.terminated is not None]), None))
        assert cs.last_state.terminated.exit_code == 4 and cs.last_state.terminated.reason == "Error"
        assert api.read_namespaced_pod("flaky", "default").status.phase == "Running"   # restarting, not ended
        api.create_namespaced_pod("default", manifest("once", image, command=("sh", "-c", "exit 0"),
                                                      restartPolicy="OnFailure"))
        done = wait_for("once to succeed", lambda: (p := api.read_namespaced_pod("once", "default"))
                        .status.phase == "Succeeded" and p)
        term = done.status.container_statuses[0].state.terminated
        assert (term.exit_code, term.reason, done.status.container_statuses[0].restart_count) == (0, "Completed", 0)
    finally:
        api.delete_collection_namespaced_pod("default", field_selector="metadata.name=flaky")
        api.delete_collection_namespaced_pod("default", field_selector="metadata.name=once")


@needs_kubectl
def test_kubectl_create_and_apply_manifests(api: Any, kubectl: Any, image: str) -> None:
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "applied"}}
    res = kubectl("apply", "-f", "-", input=json.dumps(ns))
    assert (res.returncode, res.stdout.strip()) == (0, "namespace/applied created"), res.stderr
    res = kubectl("create", "-n", "applied", "-f", "-", input=json.dumps(manifest("made", image, **NOWHERE)))
    assert (res.returncode, res.stdout.strip()) == (0, "pod/made created"), res.stderr
    assert api.read_namespaced_pod("made", "applied").spec.containers[0].image == image
    res = kubectl("delete", "namespace", "applied")
    assert res.returncode == 0, res.stderr
    assert "applied" not in {n.metadata.name for n in api.list_namespace().items}


@needs_kubectl
def test_exec_into_a_pod_not_running_is_refused(api: Any, kubectl: Any, image: str) -> None:
    api.create_namespaced_pod("default", manifest("parked", image, **NOWHERE))
    try:
        res = kubectl("exec", "parked", "--", "true")
        assert res.returncode != 0
        assert "pod parked does not have a host assigned" in res.stderr
    finally:
        api.delete_namespaced_pod("parked", "default")


# ---- scheduling, quota, admission ------------------------------------------------------------------
def test_pod_larger_than_any_node_stays_pending_unschedulable(emu: KubeEmulator, api: Any, image: str) -> None:
    api.create_namespaced_pod("default", manifest("huge", image, resources={"requests": {"cpu": "64"}}))
    try:
        cond = wait_for("PodScheduled=False", lambda: next(
            (c for c in api.read_namespaced_pod("huge", "default").status.conditions or []
             if c.type == "PodScheduled" and c.status == "False"), None))
        assert cond.reason == "Unschedulable"
        assert cond.message == ("0/2 nodes are available: 2 Insufficient cpu. preemption: 0/2 nodes are available: "
                                "2 No preemption victims found for incoming pod.")
        pod = api.read_namespaced_pod("huge", "default")
        assert pod.status.phase == "Pending" and pod.spec.node_name is None
        assert not [n for n in store_containers(emu) if n.startswith("k8s_default_huge_")]
    finally:
        api.delete_namespaced_pod("huge", "default")


def test_pod_bound_by_its_creator_meets_the_kubelets_admission(api: Any, image: str) -> None:
    api.create_namespaced_pod("default", manifest("pinned", image, resources={"requests": {"cpu": "5"}},
                                                  nodeName="emu-node-2"))
    try:
        pod = wait_for("the kubelet's verdict", lambda: (p := api.read_namespaced_pod("pinned", "default"))
                       .status.phase == "Failed" and p)
        assert pod.spec.node_name == "emu-node-2" and pod.status.reason == "OutOfcpu"
        assert pod.status.message == ("Pod was rejected: Node didn't have enough resource: cpu, requested: 5000, "
                                      "used: 0, capacity: 4000")
    finally:
        api.delete_namespaced_pod("pinned", "default")


def test_quota_refuses_the_pod_over_it(emu: KubeEmulator, api: Any, image: str) -> None:
    api.create_namespace({"metadata": {"name": "quota-a"}})
    api.create_namespaced_resource_quota("quota-a", {"metadata": {"name": "one-pod"}, "spec": {"hard": {"pods": "1"}}})
    api.create_namespaced_pod("quota-a", manifest("first", image, **NOWHERE))
    with pytest.raises(client.ApiException) as exc:
        api.create_namespaced_pod("quota-a", manifest("second", image, **NOWHERE))
    assert exc.value.status == 403
    status = body(exc.value)
    assert status["reason"] == "Forbidden"
    assert status["message"].startswith('pods "second" is forbidden: exceeded quota:')
    assert status["message"] == ('pods "second" is forbidden: exceeded quota: one-pod, requested: pods=1, '
                                 'used: pods=1, limited: pods=1')

    api.create_namespace({"metadata": {"name": "quota-b"}})
    api.create_namespaced_resource_quota("quota-b", {"metadata": {"name": "cpu"},
                                                     "spec": {"hard": {"requests.cpu": "2", "requests.memory": "1Gi"}}})
    res = {"requests": {"cpu": "1500m", "memory": "512Mi"}}
    api.create_namespaced_pod("quota-b", manifest("a", image, resources=res, **NOWHERE))
    assert api.read_namespaced_resource_quota("cpu", "quota-b").status.used == {"requests.cpu": "1500m",
                                                                                "requests.memory": "512Mi"}
    with pytest.raises(client.ApiException) as exc:
        api.create_namespaced_pod("quota-b", manifest("b", image, resources={"requests": {"cpu": "1",
                                                                                         "memory": "1Mi"}},
                                                      **NOWHERE))
    assert body(exc.value)["message"] == ('pods "b" is forbidden: exceeded quota: cpu, requested: requests.cpu=1, '
                                          'used: requests.cpu=1500m, limited: requests.cpu=2')
    with pytest.raises(client.ApiException) as exc:
        api.create_namespaced_pod("quota-b", manifest("c", image, **NOWHERE))
    assert body(exc.value)["message"] == ('pods "c" is forbidden: failed quota: cpu: must specify '
                                          'requests.cpu for: main; requests.memory for: main')
    for ns in ("quota-a", "quota-b"):
        api.delete_namespace(ns)
    wait_for("the namespaces to go", lambda: not {"quota-a", "quota-b"} & {
        n.metadata.name for n in api.list_namespace().items})


def test_runtime_class_admission_and_handler(emu: KubeEmulator, api: Any, image: str) -> None:
    with pytest.raises(client.ApiException) as exc:
        api.create_namespaced_pod("default", manifest("rc-x", image, runtimeClassName="kata"))
    assert exc.value.status == 403
    assert body(exc.value)["message"] == 'pods "rc-x" is forbidden: pod rejected: RuntimeClass "kata" not found'
    classes = client.NodeV1Api(emu.api_client()).list_runtime_class().items
    assert {(c.metadata.name, c.handler) for c in classes} == set(RUNTIME_CLASSES.items())
    # the handler is podman's --runtime: one podman does not know fails the start
    api.create_namespaced_pod("default", manifest("rc-broken", image, runtimeClassName="broken"))
    try:
        pod = wait_for("the pod to fail", lambda: (p := api.read_namespaced_pod("rc-broken", "default"))
                       .status.phase == "Failed" and p)
        term = pod.status.container_statuses[0].state.terminated
        assert term.reason == "StartError" and term.exit_code == 128
        assert "fm-no-such-runtime" in term.message
    finally:
        api.delete_namespaced_pod("rc-broken", "default")


@pytest.mark.skipif(RUNSC is None, reason="gVisor's runsc is not installed")
def test_gvisor_runtime_class_runs_the_pod_under_gvisor(api: Any, image: str) -> None:
    api.create_namespaced_pod("default", manifest("sandboxed", image, runtimeClassName="gvisor"))
    try:
        wait_for("sandboxed running", lambda: api.read_namespaced_pod("sandboxed", "default").status.phase
                 == "Running")
        out = stream(api.connect_get_namespaced_pod_exec, "sandboxed", "default", command=["dmesg"], stdin=False,
                     stdout=True, stderr=True, tty=False)
        assert "Starting gVisor" in out
    finally:
        api.delete_namespaced_pod("sandboxed", "default")


def test_missing_image_backs_off(emu: KubeEmulator, api: Any, image: str) -> None:
    missing = image.split("/flowmesh/")[0] + "/flowmesh/missing@sha256:" + "0" * 64
    rv = api.list_namespaced_pod("default").metadata.resource_version
    api.create_namespaced_pod("default", manifest("no-image", image=missing))
    try:
        def waiting(o: dict[str, Any]) -> dict[str, Any]:
            rows = (o.get("status") or {}).get("containerStatuses") or [{}]
            return (rows[0].get("state") or {}).get("waiting") or {}
        events = _watch_until(api, rv, lambda o: waiting(o).get("reason") == "ImagePullBackOff",
                              field_selector="metadata.name=no-image")
        reasons = [waiting(e["object"]).get("reason") for e in events]
        assert "ErrImagePull" in reasons and reasons.index("ErrImagePull") < reasons.index("ImagePullBackOff")
        err = next(waiting(e["object"]) for e in events if waiting(e["object"]).get("reason") == "ErrImagePull")
        assert "manifest unknown" in err["message"]
        assert waiting(events[-1]["object"])["message"] == f'Back-off pulling image "{missing}"'
    finally:
        api.delete_namespaced_pod("no-image", "default")


# ---- disruption -------------------------------------------------------------------------------------
def test_evicted_pod_fails_and_watch_sees_it(emu: KubeEmulator, api: Any, image: str) -> None:
    api.create_namespaced_pod("default", manifest("victim", image))
    wait_for("victim running", lambda: api.read_namespaced_pod("victim", "default").status.phase == "Running")
    rv = api.list_namespaced_pod("default").metadata.resource_version
    seen: dict[str, Any] = {}
    th = threading.Thread(target=lambda: seen.setdefault("events", _watch_until(
        api, rv, lambda o: o["status"].get("phase") == "Failed", field_selector="metadata.name=victim")))
    th.start()
    emu.evict("default", "victim")
    th.join(120)
    try:
        last = seen["events"][-1]
        assert last["type"] == "MODIFIED"
        assert last["object"]["status"]["phase"] == "Failed" and last["object"]["status"]["reason"] == "Evicted"
        pod = api.read_namespaced_pod("victim", "default")
        assert pod.status.reason == "Evicted" and pod.status.message.startswith("The node was low on resource")
        assert pod.status.container_statuses[0].state.terminated.exit_code == 137
        name = f"k8s_default_victim_{pod.metadata.uid[:8]}"
        assert store_containers(emu)[name].state != "running"
    finally:
        api.delete_namespaced_pod("victim", "default")


def test_eviction_api_deletes_the_pod(api: Any, image: str) -> None:
    api.create_namespaced_pod("default", manifest("to-evict", image, **NOWHERE))
    api.create_namespaced_pod_eviction("to-evict", "default", client.V1Eviction(
        metadata=client.V1ObjectMeta(name="to-evict", namespace="default")))
    with pytest.raises(client.ApiException) as exc:
        api.read_namespaced_pod("to-evict", "default")
    assert exc.value.status == 404


def test_throttled_request_is_429_with_retry_after(emu: KubeEmulator, api: Any) -> None:
    emu.throttle(1, retry_after=3)
    with pytest.raises(client.ApiException) as exc:   # a POST: urllib3 retries no POST on its own
        api.create_namespace({"metadata": {"name": "throttled"}})
    assert exc.value.status == 429
    assert exc.value.headers["Retry-After"] == "3"
    assert body(exc.value)["reason"] == "TooManyRequests"
    assert body(exc.value)["details"] == {"retryAfterSeconds": 3}
    api.create_namespace({"metadata": {"name": "throttled"}})   # the next one is served
    api.delete_namespace("throttled")


# ---- watch ----------------------------------------------------------------------------------------
def test_watch_from_a_compacted_version_is_410(emu: KubeEmulator, api: Any) -> None:
    old = api.list_namespaced_pod("default").metadata.resource_version
    api.create_namespace({"metadata": {"name": "bump"}})   # something newer than `old`
    api.delete_namespace("bump")
    emu.compact()
    resp = api.list_namespaced_pod("default", watch=True, resource_version=old, _preload_content=False)
    try:
        first = json.loads(resp.readline())
    finally:
        resp.close()
    assert first["type"] == "ERROR"
    assert first["object"]["code"] == 410 and first["object"]["reason"] == "Expired"
    assert first["object"]["message"].startswith(f"too old resource version: {old} (")
    with pytest.raises(client.ApiException) as exc:   # the client retries once, then gives up
        for _ in watch.Watch().stream(api.list_namespaced_pod, "default", resource_version=old):
            pass
    assert exc.value.status == 410


def test_watch_bookmarks_arrive_when_asked_for(emu: KubeEmulator, api: Any, web: dict[str, Any]) -> None:
    rv = int(api.list_namespaced_pod("default").metadata.resource_version)
    kinds, bookmarks = [], []
    for ev in watch.Watch().stream(api.list_namespaced_pod, "default", resource_version=str(rv),
                                   allow_watch_bookmarks=True, timeout_seconds=1):
        kinds.append(ev["type"])
        if ev["type"] == "BOOKMARK":
            bookmarks.append(ev["raw_object"])
    assert bookmarks, kinds
    assert {b["kind"] for b in bookmarks} == {"Pod"}
    assert all(int(b["metadata"]["resourceVersion"]) >= rv for b in bookmarks)
    before = emu.count("watch", "pods")
    plain = [(ev["type"], ev["raw_object"]["metadata"].get("namespace"))
             for ev in watch.Watch().stream(api.list_pod_for_all_namespaces, timeout_seconds=1)]
    assert plain and {t for t, _ in plain} == {"ADDED"}   # no resourceVersion: the current pods first
    assert emu.count("watch", "pods") == before + 1


def test_watch_selector_sends_deleted_when_a_pod_stops_matching(api: Any, image: str) -> None:
    api.create_namespaced_pod("default", manifest("relabel", image, labels={"stage": "one"}, **NOWHERE))
    try:
        rv = api.list_namespaced_pod("default").metadata.resource_version
        api.patch_namespaced_pod("relabel", "default", {"metadata": {"labels": {"stage": "two"}}})
        events = _watch_until(api, rv, lambda o: True, label_selector="stage=one")
        assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("DELETED", "relabel")]
        assert events[0]["object"]["metadata"]["labels"] == {"stage": "one"}
    finally:
        api.delete_namespaced_pod("relabel", "default")


def test_list_pages_and_all_namespaces(api: Any, image: str) -> None:
    api.create_namespace({"metadata": {"name": "paging"}})
    for i in range(3):
        api.create_namespaced_pod("paging", manifest(f"p{i}", image, **NOWHERE))
    api.create_namespaced_pod("default", manifest("page-d", image, **NOWHERE))
    first = api.list_namespaced_pod("paging", limit=2)
    assert [p.metadata.name for p in first.items] == ["p0", "p1"]
    assert first.metadata.remaining_item_count == 1 and first.metadata._continue
    rest = api.list_namespaced_pod("paging", limit=2, _continue=first.metadata._continue)
    assert [p.metadata.name for p in rest.items] == ["p2"] and not rest.metadata._continue
    every = {(p.metadata.namespace, p.metadata.name) for p in api.list_pod_for_all_namespaces().items}
    assert {("paging", "p0"), ("paging", "p1"), ("paging", "p2"), ("default", "page-d")} <= every
    api.delete_namespaced_pod("page-d", "default")
    api.delete_namespace("paging")


# ---- network policy ---------------------------------------------------------------------------------
def test_deny_all_egress_policy_runs_the_pod_without_network(emu: KubeEmulator, api: Any, image: str) -> None:
    net = client.NetworkingV1Api(emu.api_client())
    net.create_namespaced_network_policy("default", {
        "metadata": {"name": "deny-egress"},
        "spec": {"podSelector": {"matchLabels": {"sandbox": "isolated"}}, "policyTypes": ["Egress"]}})
    try:
        api.create_namespaced_pod("default", manifest("isolated", image, labels={"sandbox": "isolated"}))
        api.create_namespaced_pod("default", manifest("connected", image))
        interfaces = {}
        for name in ("isolated", "connected"):
            wait_for(f"{name} running", lambda n=name: api.read_namespaced_pod(n, "default").status.phase == "Running")
            out = stream(api.connect_get_namespaced_pod_exec, name, "default", command=["cat", "/proc/net/dev"],
                         stdin=False, stdout=True, stderr=True, tty=False)
            interfaces[name] = {line.split(":")[0].strip() for line in out.splitlines()[2:] if ":" in line}
        assert interfaces["isolated"] == {"lo"}
        assert "lo" in interfaces["connected"] and len(interfaces["connected"]) > 1
    finally:
        for name in ("isolated", "connected"):
            api.delete_namespaced_pod(name, "default", grace_period_seconds=0)
        net.delete_namespaced_network_policy("deny-egress", "default")


# ---- a lost node, and the end -------------------------------------------------------------------
def test_lost_node_fails_its_pods_and_stop_leaves_nothing(image: str) -> None:
    k8s = KubeEmulator(nodes=[Node("solo", cpu="2", memory="4Gi")]).start()
    root = k8s.store_root
    try:
        core = client.CoreV1Api(k8s.api_client())
        core.create_namespaced_pod("default", manifest("lonely", image))
        wait_for("lonely running", lambda: core.read_namespaced_pod("lonely", "default").status.phase == "Running")
        k8s.lose_node("solo")
        pod = core.read_namespaced_pod("lonely", "default")
        assert (pod.status.phase, pod.status.reason) == ("Failed", "NodeLost")
        ready = next(c for c in core.read_node("solo").status.conditions if c.type == "Ready")
        assert ready.status == "Unknown"
        core.create_namespaced_pod("default", manifest("later", image))
        cond = wait_for("later unschedulable", lambda: next(
            (c for c in core.read_namespaced_pod("later", "default").status.conditions or []
             if c.type == "PodScheduled" and c.status == "False"), None))
        assert "untolerated taint {node.kubernetes.io/unreachable: }" in cond.message
        assert [c.name for c in hygiene.containers(root)]   # the lost pod's container is kept until it is deleted
    finally:
        k8s.stop()
    assert not root.exists() and root not in hygiene.STORES
    assert not hygiene.conmons_of(hygiene.processes(), root)
