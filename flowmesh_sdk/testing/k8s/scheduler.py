"""The cluster's nodes (:class:`Node`, and the Node objects the API serves) and the
emulator's scheduler (:class:`Scheduler`, owned by :class:`.kubelet.Kubelet`).

Scheduling, per pod, in creation order: the first node that is Ready, whose labels match
``spec.nodeSelector`` and whose allocatable cpu, memory, pods and extended resources
(``nvidia.com/gpu``) minus the requests of the non-terminated pods bound to it cover the
pod's requests.  None: the pod stays Pending with ``PodScheduled=False``, reason
``Unschedulable`` and the scheduler's message (``0/2 nodes are available: 2 Insufficient
cpu. preemption: 0/2 nodes are available: 2 No preemption victims found for incoming
pod.``: the filter plugins' reasons as ``FitError.Error()`` joins them); it is tried again
whenever a pod ends or goes and when a node changes.  A pod created with ``spec.nodeName``
skips the scheduler, and the kubelet's admission rejects it when it does not fit (phase
Failed, reason ``OutOfcpu``, ``Pod was rejected: Node didn't have enough resource: cpu,
requested: ..., used: ..., capacity: ...``).  Taints (:class:`~.taints.Taint`, a node's
``taints=``; a lost node's ``node.kubernetes.io/unreachable``) are the first filter, as
kube-scheduler's ``TaintToleration`` runs before ``NodeAffinity`` and ``NodeResourcesFit``: a
``NoSchedule`` or ``NoExecute`` taint none of the pod's tolerations tolerates (:mod:`.taints`)
keeps the pod off the node, ``node(s) had untolerated taint {KEY: VALUE}`` (preemption is
not helpful there).  A pod bound by its creator (``spec.nodeName``) is not checked against
taints, and the taint manager's NoExecute eviction of running pods is not emulated.  Affinity
and priorities are not looked at.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from .objects import TERMINAL, Obj, ObjectStore, now_rfc3339, parse_quantity, pod_requests
from .podstatus import set_condition
from .taints import Taint, untolerated

__all__ = ["DEFAULT_NODES", "UNREACHABLE", "Node", "Scheduler", "Taint", "git_version", "node_object"]

UNREACHABLE = "node.kubernetes.io/unreachable"


@dataclass(frozen=True)
class Node:
    """A node the emulator serves: what it advertises (``status.capacity`` = ``allocatable``)
    and its ``taints`` (:class:`~.taints.Taint` records or ``{"key", "value", "effect"}``
    mappings, e.g. ``Taint("nvidia.com/gpu", "present", "NoSchedule")`` as GPU node pools carry)."""

    name: str
    cpu: str = "8"
    memory: str = "32Gi"
    pods: str = "110"
    gpus: int = 0
    gpu_product: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    ephemeral_storage: str = "100Gi"
    taints: Sequence[Taint | Mapping[str, Any]] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "taints", tuple(Taint.of(t) for t in self.taints))

    def spec_taints(self, ready: bool = True) -> list[Obj]:
        """``spec.taints``: the node's own, and the unreachable ones while it is lost."""
        out: list[Obj] = [Taint.of(t).to_json() for t in self.taints]
        if not ready:
            now = now_rfc3339()
            out += [{"key": UNREACHABLE, "effect": "NoSchedule", "timeAdded": now},
                    {"key": UNREACHABLE, "effect": "NoExecute", "timeAdded": now}]
        return out

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
    if taints := node.spec_taints(ready):
        spec["taints"] = taints
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


class Scheduler:
    """Binds pending pods to ``nodes`` (see the module docstring).  ``ready`` is the
    kubelet's word on each node; ``running`` the uids of the pods it runs already; ``start``
    (namespace, name, uid) hands it a pod that was bound and fits."""

    def __init__(self, store: ObjectStore, nodes: Mapping[str, Node], ready: Mapping[str, bool], *,
                 running: Container[str], start: Callable[[str, str, str], None]) -> None:
        self.store = store
        self.nodes = nodes
        self.ready = ready
        self._running = running
        self._start = start
        self._order: dict[str, int] = {}              # pod uid -> creation sequence (scheduling order)
        self._seq = 0

    def queue(self, pod: Obj) -> None:
        """A pod was created: it is scheduled in its turn."""
        self._seq += 1
        self._order[pod["metadata"]["uid"]] = self._seq

    def forget(self, uid: str) -> None:
        self._order.pop(uid, None)

    def bound(self, node: str) -> list[Obj]:
        """The non-terminated pods bound to ``node``."""
        return [p for p in self.store.items("pods") if (p.get("spec") or {}).get("nodeName") == node
                and (p.get("status") or {}).get("phase") not in TERMINAL]

    def _fit(self, pod: Obj, node: Node) -> tuple[list[str], bool]:
        """Why ``pod`` does not fit ``node`` (the first failing filter's reasons), and
        whether preemption could help (resources) or not (taints, selectors)."""
        taint = untolerated(node.spec_taints(self.ready[node.name]), (pod.get("spec") or {}).get("tolerations") or ())
        if taint is not None:
            return [f"node(s) had untolerated taint {{{taint.get('key')}: {taint.get('value') or ''}}}"], False
        if not self.ready[node.name]:   # a pod that tolerates it all still finds no kubelet there: not placed
            return [f"node(s) had untolerated taint {{{UNREACHABLE}: }}"], False
        selector = (pod.get("spec") or {}).get("nodeSelector") or {}
        labels = node.all_labels()
        if any(labels.get(k) != v for k, v in selector.items()):
            return ["node(s) didn't match Pod's node affinity/selector"], False
        return self._insufficient(pod, node), True

    def _insufficient(self, pod: Obj, node: Node) -> list[str]:
        bound = [p for p in self.bound(node.name) if p["metadata"]["uid"] != pod["metadata"]["uid"]]
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
        pending = [p for p in self.store.items("pods")
                   if p["metadata"]["uid"] not in self._running and not p["metadata"].get("deletionTimestamp")
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
        used = sum((pod_requests(p).get(resource, Fraction(0)) for p in self.bound(node.name)
                    if p["metadata"]["uid"] != meta["uid"]), Fraction(0))
        cap = parse_quantity(node.allocatable().get(resource, "0"))
        scale = 1000 if resource == "cpu" else 1
        message = (f"Pod was rejected: Node didn't have enough resource: {resource}, requested: "
                   f"{int(want * scale)}, used: {int(used * scale)}, capacity: {int(cap * scale)}")

        def reject(p: Obj) -> None:
            p["status"].update(phase="Failed", reason=f"OutOf{resource}", message=message, startTime=now_rfc3339())
        self.store.update("pods", meta["namespace"], meta["name"], reject, uid=meta["uid"])
