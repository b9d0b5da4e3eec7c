"""The emulator's scheduler and kubelet: every pod is a real podman container in the
emulator's own container store (one store for all nodes: an image pulled for one node is
present on every node).

Per pod, on the server's loop (asyncio subprocesses; the loop never blocks):

1. schedule -- the first node that is Ready, whose labels match ``spec.nodeSelector`` and
   whose allocatable cpu, memory, pods and extended resources (``nvidia.com/gpu``) minus the
   requests of the non-terminated pods bound to it cover the pod's requests.  None: the pod
   stays Pending with ``PodScheduled=False``, reason ``Unschedulable`` and the scheduler's
   message (``0/2 nodes are available: 2 Insufficient cpu. preemption: 0/2 nodes are
   available: 2 No preemption victims found for incoming pod.``: the filter plugins' reasons
   as ``FitError.Error()`` joins them); it is tried again whenever a pod ends or goes and
   when a node changes.  A pod created with ``spec.nodeName`` skips the scheduler, and the
   kubelet's admission rejects it when it does not fit (phase Failed, reason ``OutOfcpu``,
   ``Pod was rejected: Node didn't have enough resource: cpu, requested: ..., used: ...,
   capacity: ...``).  Affinity, tolerations and priorities are not looked at.
2. pull -- ``podman pull --tls-verify=false IMAGE`` unless the image is in the store
   (``imagePullPolicy: Always`` pulls on every start; ``Never`` never pulls:
   ``ErrImageNeverPull``).  Only registries on 127.0.0.0/8 (or ``localhost``) are pulled
   from: any other reference fails as a pull does.  A failed pull shows ``ErrImagePull``
   (podman's error as the message), then ``ImagePullBackOff`` (``Back-off pulling image
   "X"``) while it waits ``pull_backoff_s``, doubled per failure up to 300 s, and tries again.
3. run -- ``podman run -d --pull=never --name k8s_<ns>_<pod>_<uid8>`` labelled only
   ``io.flowmesh.k8s-emulator=<emulator id>`` and ``io.kubernetes.pod.uid=<uid>``, with the
   container's ``command`` (as the entrypoint: the image's CMD is dropped, as Kubernetes
   does) and ``args`` (``$(VAR)`` expanded from its env), ``env`` (``value`` and the
   ``fieldRef`` downward API; ``secretKeyRef``/``configMapKeyRef`` give
   ``CreateContainerConfigError``: no Secrets or ConfigMaps are served), ``workingDir``,
   ``securityContext.runAsUser/runAsGroup``, ``stdin``/``tty``, ``limits.cpu`` as
   ``--cpus`` and ``limits.memory`` as ``--memory``/``--memory-swap``, the host's runtime
   and ulimit pins (``flowmesh_sdk.imagebuild.build``), ``--runtime HANDLER`` for a
   configured ``runtimeClassName`` (a ``runsc`` handler gets the SDK's gVisor flags,
   ``remote.runtime.gvisor_run_args``: ``--runtime-flag network=none``, so such a pod has
   only its loopback), and ``--network=none`` when a deny-all-egress NetworkPolicy
   selects the pod (decided when the container starts; other policies are stored, not
   enforced; a pod without one is on podman's default network).  The pod is then
   Running: the container running and ready (readiness probes are not run), conditions
   Initialized/ContainersReady/Ready True,
   ``podIP`` and ``hostIP`` 127.0.0.1.  One container per pod: the API refuses more, and
   init containers.  The container's end (``podman wait``): restartPolicy Never, or
   OnFailure after exit 0, ends the pod (Succeeded, or Failed; terminated ``Completed``,
   ``Error`` or ``OOMKilled`` with the exit code); otherwise a new container is started,
   ``restartCount`` + 1, the first at once and then after ``CrashLoopBackOff`` waits
   (``restart_backoff_s``, doubled up to 300 s).  A container that cannot start is
   terminated ``StartError``, exit code 128, podman's error as the message.
4. delete -- ``podman rm -f -t 0`` (a grace period is recorded on the pod as
   ``deletionTimestamp``/``deletionGracePeriodSeconds`` but not waited for), then the
   object goes.

Switches: :meth:`Kubelet.evict` (as the kubelet's eviction manager: the container killed,
phase Failed, ``status.reason`` ``Evicted``, a ``DisruptionTarget`` condition with reason
``TerminationByKubelet``), :meth:`Kubelet.lose_node` (the node's ``Ready`` goes
``Unknown`` with the ``node.kubernetes.io/unreachable`` taints; its pods' containers are
killed and the pods are marked -- not deleted -- phase Failed, ``status.reason``
``NodeLost``, ``Node N which was running pod P is unresponsive``, as the node controller
once wrote it) and :meth:`Kubelet.restore_node`.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from ...remote.runtime import gvisor_run_args
from .. import hygiene
from .objects import TERMINAL, Obj, ObjectStore, match_label_selector, now_rfc3339, parse_quantity, pod_requests

__all__ = ["DEFAULT_NODES", "Kubelet", "Node", "node_object"]

EMULATOR_LABEL = "io.flowmesh.k8s-emulator"
POD_UID_LABEL = "io.kubernetes.pod.uid"
UNREACHABLE = "node.kubernetes.io/unreachable"
MAX_BACKOFF_S = 300.0   # the kubelet's MaxContainerBackOff / image back-off cap


@dataclass(frozen=True)
class Node:
    """A node the emulator serves: what it advertises (``status.capacity`` = ``allocatable``)."""

    name: str
    cpu: str = "8"
    memory: str = "32Gi"
    pods: str = "110"
    gpus: int = 0
    gpu_product: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    ephemeral_storage: str = "100Gi"

    def allocatable(self) -> dict[str, str]:
        out = {"cpu": self.cpu, "memory": self.memory, "pods": self.pods, "ephemeral-storage": self.ephemeral_storage}
        if self.gpus:
            out["nvidia.com/gpu"] = str(self.gpus)
        return out

    def all_labels(self) -> dict[str, str]:
        out = {"kubernetes.io/hostname": self.name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
               "beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": "amd64"}
        if self.gpus:
            out["nvidia.com/gpu.count"] = str(self.gpus)
        if self.gpu_product:
            out["nvidia.com/gpu.product"] = self.gpu_product
        out.update(self.labels)
        return out


DEFAULT_NODES: tuple[Node, ...] = (Node("emu-node-1"), Node("emu-node-2"))


def _condition(ctype: str, status: str, reason: str | None = None, message: str | None = None) -> Obj:
    out: Obj = {"type": ctype, "status": status, "lastProbeTime": None, "lastTransitionTime": now_rfc3339()}
    if reason:
        out["reason"] = reason
    if message:
        out["message"] = message
    return out


def git_version(version: str) -> str:
    """``1.32`` -> ``v1.32.0`` (a release's gitVersion)."""
    return "v" + (version if version.count(".") >= 2 else version + ".0")


def node_object(node: Node, version: str, *, ready: bool = True) -> Obj:
    now = now_rfc3339()

    def cond(ctype: str, status: str, reason: str, message: str) -> Obj:
        return {"type": ctype, "status": status, "lastHeartbeatTime": now, "lastTransitionTime": now,
                "reason": reason, "message": message}

    lost = "Kubelet stopped posting node status."
    if ready:
        conditions = [cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory "
                                                                                     "available"),
                      cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                      cond("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                      cond("Ready", "True", "KubeletReady", "kubelet is posting ready status")]
    else:
        conditions = [cond(t, "Unknown", "NodeStatusUnknown", lost)
                      for t in ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready")]
    spec: Obj = {}
    if not ready:
        spec["taints"] = [{"key": UNREACHABLE, "effect": "NoSchedule", "timeAdded": now},
                          {"key": UNREACHABLE, "effect": "NoExecute", "timeAdded": now}]
    alloc = node.allocatable()
    return {"kind": "Node", "apiVersion": "v1",
            "metadata": {"name": node.name, "labels": node.all_labels()},
            "spec": spec,
            "status": {"capacity": dict(alloc), "allocatable": dict(alloc), "conditions": conditions,
                       "addresses": [{"type": "InternalIP", "address": "127.0.0.1"},
                                     {"type": "Hostname", "address": node.name}],
                       "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
                       "nodeInfo": {"machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": "",
                                    "osImage": "flowmesh k8s emulator", "containerRuntimeVersion": "podman://",
                                    "kubeletVersion": git_version(version), "kubeProxyVersion": git_version(version),
                                    "operatingSystem": "linux", "architecture": "amd64"}}}


def set_condition(pod: Obj, ctype: str, status: str, reason: str | None = None, message: str | None = None) -> None:
    """Set a pod condition (its lastTransitionTime kept unless the status changes)."""
    conds: list[Obj] = pod.setdefault("status", {}).setdefault("conditions", [])
    new = _condition(ctype, status, reason, message)
    for i, c in enumerate(conds):
        if c.get("type") == ctype:
            if c.get("status") == status:
                new["lastTransitionTime"] = c.get("lastTransitionTime")
            conds[i] = new
            return
    order = ["PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled",
             "DisruptionTarget"]
    conds.append(new)
    conds.sort(key=lambda c: order.index(c["type"]) if c["type"] in order else len(order))


def _registry_allowed(image: str) -> bool:
    """Whether an image reference names a registry on 127.0.0.0/8 (or localhost)."""
    first = image.split("/", 1)[0] if "/" in image else ""
    if not first or not ("." in first or ":" in first or first == "localhost"):
        return False   # a short name: podman would search registries elsewhere
    host = first.rsplit(":", 1)[0] if first.count(":") == 1 else first
    return host == "localhost" or re.fullmatch(r"127\.\d{1,3}\.\d{1,3}\.\d{1,3}", host) is not None


def _expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion (``$$`` escapes a ``$``; unknown references stay)."""
    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", sub, text)


class ConfigError(Exception):
    """A container's configuration the emulator cannot honour (CreateContainerConfigError)."""


@dataclass
class _PodRun:
    uid: str
    namespace: str
    name: str
    container: str                       # the podman container's name
    task: asyncio.Task[None] | None = None
    cid: str = ""                         # the running container's id


class Kubelet:
    """The scheduler and kubelet of every node (see the module docstring)."""

    def __init__(self, store: ObjectStore, nodes: Sequence[Node], *, root: Path, emulator_id: str, version: str,
                 runtime_classes: Mapping[str, str], pull_backoff_s: float = 10.0,
                 restart_backoff_s: float = 10.0) -> None:
        from ...imagebuild.build import podman_run_ulimit_args, podman_runtime_args
        self.store = store
        self.nodes = {n.name: n for n in nodes}
        self.ready = {n.name: True for n in nodes}
        self.root = root
        self.env = hygiene.store_env(root)
        self.id = emulator_id
        self.version = version
        self.runtime_classes = dict(runtime_classes)
        self.pull_backoff_s = pull_backoff_s
        self.refuse_pulls: str | None = None   # every pull fails with this (the node cannot reach the registry)
        self.restart_backoff_s = restart_backoff_s
        self._runtime_flags = podman_runtime_args()
        self._ulimit_flags = podman_run_ulimit_args()
        self._runs: dict[str, _PodRun] = {}           # by pod uid
        self._procs: set[asyncio.subprocess.Process] = set()
        self._pull_locks: dict[str, asyncio.Lock] = {}
        self._order: dict[str, int] = {}              # pod uid -> creation sequence (scheduling order)
        self._seq = 0
        self.pulls: list[str] = []                    # every image pull started, in order
        self.closing = False

    # ---- podman ------------------------------------------------------------------------
    async def podman(self, *args: str, kill_on_cancel: bool = True) -> tuple[int, str, str]:
        """Run podman in the store; (exit code, stdout, stderr).  Cancelled: the process is
        killed (or, ``kill_on_cancel=False``, waited for) before the cancel goes on."""
        proc = await asyncio.create_subprocess_exec("podman", *args, env=self.env, stdin=subprocess.DEVNULL,
                                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self._procs.add(proc)
        try:
            out, err = await proc.communicate()
        except asyncio.CancelledError:
            if kill_on_cancel or self.closing:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
            await proc.wait()
            raise
        finally:
            self._procs.discard(proc)
        return proc.returncode or 0, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")

    def track(self, proc: asyncio.subprocess.Process) -> None:
        """A process started elsewhere (an exec, ``podman logs -f``) that shutdown must end."""
        self._procs.add(proc)

    def untrack(self, proc: asyncio.subprocess.Process) -> None:
        self._procs.discard(proc)

    def container_name(self, pod: Obj) -> str:
        meta = pod["metadata"]
        return f"k8s_{meta['namespace']}_{meta['name']}_{meta['uid'][:8]}"

    def container_id(self, pod: Obj) -> str:
        """The running container of a pod ('' when none)."""
        run = self._runs.get(pod["metadata"]["uid"])
        return run.cid if run else ""

    # ---- status helpers -------------------------------------------------------------------
    def _update(self, run: _PodRun, mutate: Any) -> Obj | None:
        return self.store.update("pods", run.namespace, run.name, mutate, uid=run.uid)

    def _cstatus(self, pod: Obj) -> Obj:
        status = pod.setdefault("status", {})
        c = pod["spec"]["containers"][0]
        rows = status.setdefault("containerStatuses", [])
        if not rows:
            rows.append({"name": c["name"], "image": c["image"], "imageID": "", "ready": False,
                         "restartCount": 0, "started": False, "state": {"waiting": {"reason": "ContainerCreating"}},
                         "lastState": {}})
        row: Obj = rows[0]
        return row

    def _waiting(self, run: _PodRun, reason: str, message: str | None = None) -> None:
        def mutate(pod: Obj) -> None:
            row = self._cstatus(pod)
            row["state"] = {"waiting": {"reason": reason, **({"message": message} if message else {})}}
            row["ready"] = False
            row["started"] = False
            set_condition(pod, "ContainersReady", "False", "ContainersNotReady",
                          f"containers with unready status: [{row['name']}]")
            set_condition(pod, "Ready", "False", "ContainersNotReady",
                          f"containers with unready status: [{row['name']}]")
        self._update(run, mutate)

    # ---- scheduling ---------------------------------------------------------------------------
    def admit(self, pod: Obj) -> None:
        """A pod was created: schedule it (now or when something frees)."""
        self._seq += 1
        self._order[pod["metadata"]["uid"]] = self._seq
        self.schedule()

    def _bound(self, node: str) -> list[Obj]:
        return [p for p in self.store.items("pods") if (p.get("spec") or {}).get("nodeName") == node
                and (p.get("status") or {}).get("phase") not in TERMINAL]

    def _fit(self, pod: Obj, node: Node) -> tuple[list[str], bool]:
        """Why ``pod`` does not fit ``node`` (the first failing filter's reasons), and
        whether preemption could help (resources) or not (taints, selectors)."""
        if not self.ready[node.name]:
            return [f"node(s) had untolerated taint {{{UNREACHABLE}: }}"], False
        selector = (pod.get("spec") or {}).get("nodeSelector") or {}
        labels = node.all_labels()
        if any(labels.get(k) != v for k, v in selector.items()):
            return ["node(s) didn't match Pod's node affinity/selector"], False
        return self._insufficient(pod, node), True

    def _insufficient(self, pod: Obj, node: Node) -> list[str]:
        bound = [p for p in self._bound(node.name) if p["metadata"]["uid"] != pod["metadata"]["uid"]]
        alloc = {k: parse_quantity(v) for k, v in node.allocatable().items()}
        reasons = []
        if len(bound) + 1 > alloc["pods"]:
            reasons.append("Too many pods")
        want = pod_requests(pod)
        used: dict[str, Fraction] = {}
        for p in bound:
            for k, v in pod_requests(p).items():
                used[k] = used.get(k, Fraction(0)) + v
        for k in ["cpu", "memory", "ephemeral-storage"] + sorted(set(want) - {"cpu", "memory", "ephemeral-storage"}):
            if want.get(k, 0) > 0 and alloc.get(k, Fraction(0)) - used.get(k, Fraction(0)) < want[k]:
                reasons.append(f"Insufficient {k}")
        return reasons

    def schedule(self) -> None:
        """Bind every pending pod that fits somewhere; mark the others Unschedulable."""
        if self.closing:
            return
        pending = [p for p in self.store.items("pods")
                   if p["metadata"]["uid"] not in self._runs and not p["metadata"].get("deletionTimestamp")
                   and (p.get("status") or {}).get("phase") == "Pending" and p["metadata"]["uid"] in self._order]
        pending.sort(key=lambda p: self._order.get(p["metadata"]["uid"], 0))
        for pod in pending:
            meta = pod["metadata"]
            target = (pod.get("spec") or {}).get("nodeName")
            if target:
                node = self.nodes.get(target)
                if node is None or not self.ready[target]:
                    continue   # a kubelet that does not exist (or is away) never picks it up
                self._kubelet_admit(pod, node)
                continue
            counts: dict[str, int] = {}
            helpless = 0
            chosen = None
            for node in self.nodes.values():
                reasons, resolvable = self._fit(pod, node)
                if not reasons:
                    chosen = node
                    break
                for r in reasons:
                    counts[r] = counts.get(r, 0) + 1
                helpless += 0 if resolvable else 1
            if chosen is None:
                n = len(self.nodes)
                why = ", ".join(sorted(f"{c} {r}" for r, c in counts.items()))
                pre = []
                if helpless:
                    pre.append(f"{helpless} Preemption is not helpful for scheduling")
                if n - helpless:
                    pre.append(f"{n - helpless} No preemption victims found for incoming pod")
                message = (f"0/{n} nodes are available: {why}. preemption: 0/{n} nodes are available: "
                           f"{', '.join(sorted(pre))}.")

                def unschedulable(p: Obj, m: str = message) -> None:
                    set_condition(p, "PodScheduled", "False", "Unschedulable", m)
                self.store.update("pods", meta["namespace"], meta["name"], unschedulable, uid=meta["uid"])
                continue

            def bind(p: Obj, node: Node = chosen) -> None:
                p["spec"]["nodeName"] = node.name
                set_condition(p, "PodScheduled", "True")
            self.store.update("pods", meta["namespace"], meta["name"], bind, uid=meta["uid"])
            self._start(meta["namespace"], meta["name"], meta["uid"])

    def _kubelet_admit(self, pod: Obj, node: Node) -> None:
        """A pod bound by its creator: the kubelet's own resource admission."""
        meta = pod["metadata"]
        reasons = self._insufficient(pod, node)
        if not reasons:
            self._start(meta["namespace"], meta["name"], meta["uid"])
            return
        first = reasons[0]
        resource = "pods" if first == "Too many pods" else first.removeprefix("Insufficient ")
        want = pod_requests(pod).get(resource, Fraction(1))
        used = sum((pod_requests(p).get(resource, Fraction(0)) for p in self._bound(node.name)
                    if p["metadata"]["uid"] != meta["uid"]), Fraction(0))
        cap = parse_quantity(node.allocatable().get(resource, "0"))
        scale = 1000 if resource == "cpu" else 1
        message = (f"Pod was rejected: Node didn't have enough resource: {resource}, requested: "
                   f"{int(want * scale)}, used: {int(used * scale)}, capacity: {int(cap * scale)}")

        def reject(p: Obj) -> None:
            p["status"].update(phase="Failed", reason=f"OutOf{resource}", message=message, startTime=now_rfc3339())
        self.store.update("pods", meta["namespace"], meta["name"], reject, uid=meta["uid"])

    # ---- a pod's life -------------------------------------------------------------------------
    def _start(self, namespace: str, name: str, uid: str) -> None:
        pod = self.store.peek("pods", namespace, name)
        assert pod is not None
        run = _PodRun(uid, namespace, name, self.container_name(pod))
        self._runs[uid] = run

        def accept(p: Obj) -> None:
            st = p["status"]
            st["hostIP"] = "127.0.0.1"
            st["hostIPs"] = [{"ip": "127.0.0.1"}]
            st.setdefault("startTime", now_rfc3339())
            set_condition(p, "PodReadyToStartContainers", "True")
            set_condition(p, "Initialized", "True")
            set_condition(p, "PodScheduled", "True")
            c = self._cstatus(p)
            set_condition(p, "ContainersReady", "False", "ContainersNotReady",
                          f"containers with unready status: [{c['name']}]")
            set_condition(p, "Ready", "False", "ContainersNotReady", f"containers with unready status: [{c['name']}]")
        self._update(run, accept)
        run.task = asyncio.ensure_future(self._life(run))

    async def _life(self, run: _PodRun) -> None:
        restarts = 0
        while True:
            pod = self.store.peek("pods", run.namespace, run.name)
            if pod is None or pod["metadata"]["uid"] != run.uid:
                return
            spec = copy.deepcopy(pod["spec"])
            image_id = await self._ensure_image(run, spec["containers"][0])
            code = await self._run_once(run, pod, spec, image_id)
            policy = spec.get("restartPolicy", "Always")
            if policy == "Never" or (policy == "OnFailure" and code == 0):
                self._finish(run, code)
                return
            restarts += 1
            delay = 0.0 if restarts == 1 else min(self.restart_backoff_s * 2 ** (restarts - 2), MAX_BACKOFF_S)
            await self._backoff_restart(run, delay)

    async def _ensure_image(self, run: _PodRun, container: Obj) -> str:
        image = container["image"]
        policy = container.get("imagePullPolicy", "IfNotPresent")
        backoff = self.pull_backoff_s
        while True:
            lock = self._pull_locks.setdefault(image, asyncio.Lock())
            async with lock:
                rc, out, _ = await self.podman("image", "inspect", "--format", "{{.Id}} {{.Digest}}", image)
                if rc == 0 and policy != "Always":
                    return _image_id(image, out)
                err = ""
                if policy == "Never":
                    pass
                elif self.refuse_pulls is not None:
                    err = self.refuse_pulls
                elif not _registry_allowed(image):
                    err = (f"the k8s emulator pulls only from registries on 127.0.0.0/8 or localhost, "
                           f"not {image!r}")
                else:
                    self.pulls.append(image)
                    rc, _, stderr = await self.podman("pull", "--tls-verify=false", "--quiet", image)
                    if rc == 0:
                        rc, out, _ = await self.podman("image", "inspect", "--format", "{{.Id}} {{.Digest}}", image)
                        return _image_id(image, out)
                    err = _last_error(stderr) or f"podman pull exited {rc}"
            if policy == "Never":
                self._waiting(run, "ErrImageNeverPull",
                              f'Container image "{image}" is not present with pull policy of Never')
                await asyncio.Event().wait()
            self._waiting(run, "ErrImagePull", err)
            await asyncio.sleep(min(1.0, backoff))
            self._waiting(run, "ImagePullBackOff", f'Back-off pulling image "{image}"')
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_S)

    def _argv(self, pod: Obj, spec: Obj) -> list[str]:
        c = spec["containers"][0]
        meta = pod["metadata"]
        env: dict[str, str] = {}
        for e in c.get("env") or []:
            name = e["name"]
            if "value" in e or "valueFrom" not in e:
                env[name] = _expand(str(e.get("value", "")), env)
                continue
            ref = (e.get("valueFrom") or {}).get("fieldRef")
            if ref is None:
                kinds = ", ".join(sorted((e.get("valueFrom") or {}).keys()))
                raise ConfigError(f"env {name}: {kinds} is not served by the k8s emulator "
                                  "(no Secrets or ConfigMaps)")
            env[name] = _field_ref(pod, str(ref.get("fieldPath", "")))
        argv = ["run", "-d", "--pull=never", "--name", self.container_name(pod),
                "--label", f"{EMULATOR_LABEL}={self.id}", "--label", f"{POD_UID_LABEL}={meta['uid']}"]
        handler = self.runtime_classes[spec["runtimeClassName"]] if spec.get("runtimeClassName") else None
        if handler is None:
            argv += self._runtime_flags
        elif Path(handler).name == "runsc":   # gVisor as the SDK runs it: its own loopback only
            argv += gvisor_run_args([], 0)[0]
        else:
            argv += ["--runtime", handler]
        argv += self._ulimit_flags
        hostname = meta["name"][:63].rstrip("-.")
        argv += ["--hostname", hostname]
        if self.denies_egress(pod):
            argv.append("--network=none")
        limits = ((c.get("resources") or {}).get("limits") or {})
        if "cpu" in limits:
            argv += ["--cpus", f"{float(parse_quantity(limits['cpu'])):g}"]
        if "memory" in limits:
            mem = str(int(parse_quantity(limits["memory"])))
            argv += ["--memory", mem, "--memory-swap", mem]
        if c.get("workingDir"):
            argv += ["--workdir", str(c["workingDir"])]
        sec = c.get("securityContext") or {}
        if "runAsUser" in sec:
            argv += ["--user", f"{sec['runAsUser']}" + (f":{sec['runAsGroup']}" if "runAsGroup" in sec else "")]
        if c.get("stdin"):
            argv.append("-i")
        if c.get("tty"):
            argv.append("-t")
        for k, v in env.items():
            argv += ["--env", f"{k}={v}"]
        if c.get("command"):
            argv += ["--entrypoint", json.dumps([_expand(str(a), env) for a in c["command"]])]
        argv.append(c["image"])
        argv += [_expand(str(a), env) for a in c.get("args") or []]
        return argv

    def denies_egress(self, pod: Obj) -> bool:
        """Whether NetworkPolicies deny the pod all egress: one selects it with Egress in
        its policyTypes, and no policy selecting it for egress allows any."""
        meta = pod["metadata"]
        egress_policies = []
        for pol in self.store.items("networkpolicies.networking.k8s.io", meta["namespace"]):
            spec = pol.get("spec") or {}
            types = spec.get("policyTypes") or (["Ingress", "Egress"] if "egress" in spec else ["Ingress"])
            if "Egress" in types and match_label_selector(spec.get("podSelector"), meta.get("labels")):
                egress_policies.append(spec)
        return bool(egress_policies) and not any(spec.get("egress") for spec in egress_policies)

    async def _run_once(self, run: _PodRun, pod: Obj, spec: Obj, image_id: str) -> int:
        """Start the container, wait for its end, record it; its exit code."""
        await self.podman("rm", "-f", "-t", "0", "--ignore", run.container, kill_on_cancel=False)
        try:
            argv = self._argv(pod, spec)
        except ConfigError as exc:
            self._waiting(run, "CreateContainerConfigError", str(exc))
            await asyncio.Event().wait()
            raise
        rc, out, err = await self.podman(*argv, kill_on_cancel=False)
        started = now_rfc3339()
        if rc != 0:
            await self.podman("rm", "-f", "-t", "0", "--ignore", run.container, kill_on_cancel=False)
            message = _last_error(err) or f"podman run exited {rc}"
            self._terminated(run, 128, "StartError", message, started, image_id, "")
            return 128
        cid = out.strip().splitlines()[-1] if out.strip() else ""
        run.cid = cid

        def running(p: Obj) -> None:
            st = p["status"]
            st["phase"] = "Running"
            st["podIP"] = "127.0.0.1"
            st["podIPs"] = [{"ip": "127.0.0.1"}]
            row = self._cstatus(p)
            row.update(ready=True, started=True, state={"running": {"startedAt": started}},
                       containerID=f"podman://{cid}", imageID=image_id)
            set_condition(p, "ContainersReady", "True")
            set_condition(p, "Ready", "True")
        self._update(run, running)
        rc, out, err = await self.podman("wait", cid)
        code = int(out.strip().splitlines()[-1]) if rc == 0 and out.strip() else 137
        rc2, info, _ = await self.podman("inspect", "--format", "{{.State.OOMKilled}}", cid)
        oom = rc2 == 0 and info.strip() == "true"
        reason = "OOMKilled" if oom else ("Completed" if code == 0 else "Error")
        run.cid = ""
        self._terminated(run, code, reason, None, started, image_id, cid)
        return code

    def _terminated(self, run: _PodRun, code: int, reason: str, message: str | None, started: str,
                    image_id: str, cid: str) -> None:
        finished = now_rfc3339()

        def mutate(p: Obj) -> None:
            row = self._cstatus(p)
            term: Obj = {"exitCode": code, "reason": reason, "startedAt": started, "finishedAt": finished}
            if message:
                term["message"] = message
            if cid:
                term["containerID"] = f"podman://{cid}"
            row.update(ready=False, started=False, state={"terminated": term}, imageID=image_id)
            if cid:
                row["containerID"] = f"podman://{cid}"
            set_condition(p, "ContainersReady", "False", "ContainersNotReady",
                          f"containers with unready status: [{row['name']}]")
            set_condition(p, "Ready", "False", "ContainersNotReady", f"containers with unready status: [{row['name']}]")
        self._update(run, mutate)

    def _finish(self, run: _PodRun, code: int) -> None:
        def mutate(p: Obj) -> None:
            p["status"]["phase"] = "Succeeded" if code == 0 else "Failed"
            if code == 0:
                set_condition(p, "ContainersReady", "False", "PodCompleted")
                set_condition(p, "Ready", "False", "PodCompleted")
            set_condition(p, "PodReadyToStartContainers", "False")
        self._update(run, mutate)
        self.schedule()

    async def _backoff_restart(self, run: _PodRun, delay: float) -> None:
        def mutate(p: Obj) -> None:
            row = self._cstatus(p)
            row["lastState"] = {"terminated": row["state"].get("terminated", {})}
            row["restartCount"] = int(row.get("restartCount", 0)) + 1
            if delay:
                msg = (f"back-off {int(delay)}s restarting failed container={row['name']} "
                       f"pod={run.name}_{run.namespace}({run.uid})")
                row["state"] = {"waiting": {"reason": "CrashLoopBackOff", "message": msg}}
        self._update(run, mutate)
        if delay:
            await asyncio.sleep(delay)

    # ---- ending pods ------------------------------------------------------------------------
    async def _stop_run(self, uid: str, *, remove: bool) -> _PodRun | None:
        """End a pod's task and its container: removed (``remove``) or only killed (kept
        for its logs)."""
        run = self._runs.get(uid)
        if run is None:
            return None
        if run.task is not None and not run.task.done():
            run.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await run.task
        run.task = None
        run.cid = ""
        if remove:
            await self.podman("rm", "-f", "-t", "0", "--ignore", run.container, kill_on_cancel=False)
            self._runs.pop(uid, None)
        else:
            await self.podman("kill", run.container, kill_on_cancel=False)
        return run

    async def remove(self, pod: Obj) -> None:
        """The pod is being deleted: its container goes (``podman rm -f -t 0``)."""
        uid = pod["metadata"]["uid"]
        self._order.pop(uid, None)
        await self._stop_run(uid, remove=True)

    def forget(self, pod: Obj) -> None:
        self._order.pop(pod["metadata"]["uid"], None)

    async def evict(self, namespace: str, name: str, reason: str, message: str) -> Obj:
        pod = self.store.get("pods", namespace, name)
        uid = pod["metadata"]["uid"]
        run = await self._stop_run(uid, remove=False)
        finished = now_rfc3339()

        def mutate(p: Obj) -> None:
            st = p["status"]
            st.update(phase="Failed", reason=reason, message=message)
            if run is not None:
                row = self._cstatus(p)
                state = row.get("state") or {}
                started = (state.get("running") or {}).get("startedAt", finished)
                if "terminated" not in state:
                    row["state"] = {"terminated": {"exitCode": 137, "reason": "Error", "startedAt": started,
                                                   "finishedAt": finished}}
                row.update(ready=False, started=False)
            set_condition(p, "DisruptionTarget", "True", "TerminationByKubelet", message)
            set_condition(p, "ContainersReady", "False", "PodFailed")
            set_condition(p, "Ready", "False", "PodFailed")
        out = self.store.update("pods", namespace, name, mutate, uid=uid)
        self.schedule()
        assert out is not None
        return out

    async def lose_node(self, node: str) -> None:
        if node not in self.nodes:
            raise KeyError(f"no node {node!r}")
        self.ready[node] = False
        self._put_node(node)
        for pod in [p for p in self._bound(node)]:
            meta = pod["metadata"]
            run = await self._stop_run(meta["uid"], remove=False)
            finished = now_rfc3339()

            def mutate(p: Obj, had: bool = run is not None) -> None:
                st = p["status"]
                st.update(phase="Failed", reason="NodeLost",
                          message=f"Node {node} which was running pod {p['metadata']['name']} is unresponsive")
                if had:
                    row = self._cstatus(p)
                    if "terminated" not in (row.get("state") or {}):
                        row["state"] = {"terminated": {
                            "exitCode": 137, "reason": "ContainerStatusUnknown", "finishedAt": finished,
                            "message": "The container could not be located when the pod was terminated"}}
                    row.update(ready=False, started=False)
                set_condition(p, "DisruptionTarget", "True", "DeletionByTaintManager",
                              "Taint manager: deleting due to NoExecute taint")
                set_condition(p, "Ready", "False", "NodeNotReady")
            self.store.update("pods", meta["namespace"], meta["name"], mutate, uid=meta["uid"])
        self.schedule()

    def restore_node(self, node: str) -> None:
        self.ready[node] = True
        self._put_node(node)
        self.schedule()

    def _put_node(self, name: str) -> None:
        fresh = node_object(self.nodes[name], self.version, ready=self.ready[name])

        def mutate(obj: Obj) -> None:
            obj["spec"] = fresh["spec"]
            obj["status"] = fresh["status"]
        self.store.update("nodes", "", name, mutate)

    # ---- the end ----------------------------------------------------------------------------
    async def shutdown(self, timeout_s: float = 20.0) -> None:
        """Cancel every pod's task and kill every podman process still running."""
        self.closing = True
        tasks = [r.task for r in self._runs.values() if r.task is not None]
        for t in tasks:
            t.cancel()
        for proc in list(self._procs):
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s)
        for proc in list(self._procs):
            with contextlib.suppress(ProcessLookupError, asyncio.TimeoutError):
                await asyncio.wait_for(proc.wait(), 5)


def _image_id(image: str, inspect_out: str) -> str:
    parts = inspect_out.split()
    digest = parts[1] if len(parts) > 1 else ""
    repo = image.split("@", 1)[0]
    if ":" in repo.rsplit("/", 1)[-1]:
        repo = repo.rsplit(":", 1)[0]
    return f"{repo}@{digest}" if digest else (f"sha256:{parts[0]}" if parts else "")


def _last_error(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("Error:")]
    return (errors[-1] if errors else lines[-1]) if lines else ""


def _field_ref(pod: Obj, path: str) -> str:
    meta, spec = pod["metadata"], pod.get("spec") or {}
    simple = {"metadata.name": meta.get("name"), "metadata.namespace": meta.get("namespace"),
              "metadata.uid": meta.get("uid"), "spec.nodeName": spec.get("nodeName"),
              "spec.serviceAccountName": spec.get("serviceAccountName"), "status.podIP": "127.0.0.1",
              "status.hostIP": "127.0.0.1", "status.podIPs": "127.0.0.1", "status.hostIPs": "127.0.0.1"}
    if path in simple:
        return str(simple[path] or "")
    m = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if m:
        return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
    raise ConfigError(f"fieldRef {path!r} is not supported")

