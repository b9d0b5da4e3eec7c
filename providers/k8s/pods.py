"""Pods as the ``k8s`` provider writes and reads them (core/v1 JSON, as plain dicts).

A sandbox pod (:func:`sandbox_pod`): one container named ``sandbox`` running the task's
image, pinned by digest, whose PID 1 idles until the agent's shell is exec'd into it
(:data:`flowmesh_sdk.remote.runtime.IDLE_PID1`).  Requests and limits are the sandbox's
cpus and memory (``nvidia.com/gpu`` for a GPU shape, with a node selector on the
``nvidia.com/gpu.product`` label GPU Feature Discovery writes, or the label the provider is
given); its tolerations are :mod:`.tolerations`' (by default, a GPU shape's tolerate the
``nvidia.com/gpu`` NoSchedule taint of GPU node pools); the SDK's tags are labels
(:class:`~flowmesh_sdk.tags.KubeLabels`), so gc finds pods by label selector.  Hardening, as
the container runtime does on a VM (docs/security.md): no service-account token mounted, no
service links, ``allowPrivilegeEscalation: false``, every capability dropped but the
sandbox's few, ``restartPolicy: Never`` (a container that exits is a lost sandbox, never a
silent restart), and the gVisor tier as the cluster's ``runtimeClassName``.  The network is
a label that one NetworkPolicy per namespace selects (:func:`network_policies`): ``none``
denies all egress, ``all`` allows every destination but the cloud metadata addresses, and
an allow-list gets a policy of its own (:func:`allow_list_policy`, label ``allow-<hash>``):
its CIDRs, and its ``host:port`` entries as the addresses the coordinator resolved them to
(a NetworkPolicy cannot name hosts), TCP and UDP on that port; the first address of each name
is in the pod's ``hostAliases`` (its ``/etc/hosts``).

:func:`instance_of` reads a pod back: Running and Ready -> RUNNING; a pull the kubelet
gave up on (``ErrImagePull``, ``ImagePullBackOff``, ``InvalidImageName``) -> an IMAGE
fault at once; phase Failed (``Evicted``, preempted, a lost node) or Succeeded, or deleting
-> TERMINATED with a LOST fault carrying the kubelet's reason.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import ipaddress
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from flowmesh_sdk.errors import SpecError
from flowmesh_sdk.provider import ContainerRequest, FaultKind, Instance, InstanceFault, ProviderState
from flowmesh_sdk.remote.runtime import IDLE_PID1, SANDBOX_CAPABILITIES
from flowmesh_sdk.specs import InstanceSpec, allow_list_host
from flowmesh_sdk.tags import KubeLabels

from .config import Target
from .errors import PROVIDER
from .tolerations import GPU_TOLERATION, Toleration

TAGS = KubeLabels()
CONTAINER = "sandbox"
NETWORK_LABEL = "flowmesh.io/network"
ANNOTATION = "flowmesh.io/"
GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"   # GPU Feature Discovery's node label
IMAGE_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull",
                           "RegistryUnavailable"})
POLICY_NONE = "flowmesh-egress-none"
POLICY_ALL = "flowmesh-egress-all"
_NAME_BAD = re.compile(r"[^a-z0-9-]+")


def pod_name(request_id: str, index: int = 0) -> str:
    """A DNS-1123 label from the launch's request id and the pod's place in it (unique per
    launch: idempotency by name)."""
    base = _NAME_BAD.sub("-", request_id.lower()).strip("-")
    digest = hashlib.sha256(request_id.encode()).hexdigest()[:8]
    return f"fm-{base[:40].strip('-')}-{digest}-{index}"


def quantity_cpu(cpus: float) -> str:
    return f"{round(cpus * 1000)}m"


def quantity_memory(gb: float) -> str:
    return f"{max(6, round(gb * 1024))}Mi"


def sandbox_pod(name: str, *, request_tags: Mapping[str, str], spec: InstanceSpec,
                container: ContainerRequest | None, image: str, instance_type: str, price_per_hour: float,
                runtime_class: str | None, pull_secrets: Sequence[str] = (),
                resolved: Mapping[str, Sequence[str]] | None = None,
                tolerations: Sequence[Toleration] | None = None,
                gpu_label: str = GPU_PRODUCT_LABEL) -> dict[str, Any]:
    """``resolved``: the addresses of an allow-list's host names (:func:`allow_list_policy`);
    ``tolerations``: the pod's (None: :data:`~.tolerations.GPU_TOLERATION` for a GPU shape);
    ``gpu_label``: the node label whose value a GPU shape's ``gpu_name`` must be."""
    sandbox = container.sandbox if container is not None else None
    cpus = sandbox.cpus if sandbox is not None else float(spec.cpus)
    memory = sandbox.memory_gb if sandbox is not None else spec.memory_gb
    network = network_label(sandbox.network if sandbox is not None else False, resolved)
    resources: dict[str, Any] = {"cpu": quantity_cpu(cpus), "memory": quantity_memory(memory)}
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 0,
        "containers": [{
            "name": CONTAINER, "image": image, "imagePullPolicy": "IfNotPresent",
            "command": ["/bin/sh", "-c", IDLE_PID1],
            "resources": {"requests": dict(resources), "limits": dict(resources)},
            "securityContext": {"allowPrivilegeEscalation": False,
                                "capabilities": {"drop": ["ALL"], "add": list(SANDBOX_CAPABILITIES)}},
        }],
    }
    if spec.gpus:
        for part in ("requests", "limits"):
            pod_spec["containers"][0]["resources"][part][GPU_RESOURCE] = str(spec.gpus)
        if spec.gpu_name:
            pod_spec["nodeSelector"] = {gpu_label: spec.gpu_name}
    if tolerations is None:
        tolerations = (GPU_TOLERATION,) if spec.gpus else ()
    if tolerations:
        pod_spec["tolerations"] = [t.to_json() for t in tolerations]
    if runtime_class:
        pod_spec["runtimeClassName"] = runtime_class
    if pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s} for s in pull_secrets]
    if resolved:   # the allow-list's names, as a machine's sandbox has them in /etc/hosts
        pod_spec["hostAliases"] = [{"ip": addrs[0], "hostnames": [name]} for name, addrs in sorted(resolved.items())]
    labels = TAGS.encode(request_tags)
    labels[NETWORK_LABEL] = network
    annotations = {ANNOTATION + "instance-type": instance_type, ANNOTATION + "price-per-hour": repr(price_per_hour),
                   ANNOTATION + "cpus": str(spec.cpus), ANNOTATION + "memory-gb": repr(spec.memory_gb),
                   ANNOTATION + "gpus": str(spec.gpus)}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": labels, "annotations": annotations},
            "spec": pod_spec}


def network_policies(metadata_networks: Sequence[str]) -> list[dict[str, Any]]:
    """The namespace's two policies: deny all egress for ``network=none`` pods; allow all but
    the metadata networks for ``network=all`` ones (NetworkPolicies add up, so a pod selected
    by the second reaches exactly what it allows).  Enforced by the cluster's CNI."""
    v4 = [n for n in metadata_networks if ":" not in n]
    v6 = [n for n in metadata_networks if ":" in n]
    allow = [{"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": v4}}, {"ipBlock": {"cidr": "::/0", "except": v6}}]}]
    return [
        {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": POLICY_NONE},
         "spec": {"podSelector": {"matchLabels": {NETWORK_LABEL: "none"}}, "policyTypes": ["Egress"], "egress": []}},
        {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": POLICY_ALL},
         "spec": {"podSelector": {"matchLabels": {NETWORK_LABEL: "all"}}, "policyTypes": ["Egress"],
                  "egress": allow}},
    ]


def network_label(network: bool | str | tuple[str, ...], resolved: Mapping[str, Sequence[str]] | None) -> str:
    """The value of the pod's network label: ``none``, ``all`` or ``allow-<hash>`` of the
    allow-list and what its host names resolved to (a new resolution, a new policy)."""
    if not isinstance(network, tuple):
        return "all" if network else "none"
    if resolved is None:
        raise SpecError("sandbox.network", "an allow-list pod needs its host names resolved first")
    key = json.dumps([list(network), {k: list(v) for k, v in sorted(resolved.items())}])
    return "allow-" + hashlib.sha256(key.encode()).hexdigest()[:16]


def allow_names(network: tuple[str, ...]) -> list[str]:
    """The host names of an allow-list, to resolve before its policy is written."""
    return sorted({h for e in network if (h := allow_list_host(e)) is not None})


def _subnet_of(inner: ipaddress.IPv4Network | ipaddress.IPv6Network,
               outer: ipaddress.IPv4Network | ipaddress.IPv6Network) -> bool:
    """``inner`` lies inside ``outer`` (never across IP versions)."""
    if isinstance(inner, ipaddress.IPv4Network) and isinstance(outer, ipaddress.IPv4Network):
        return inner.subnet_of(outer)
    if isinstance(inner, ipaddress.IPv6Network) and isinstance(outer, ipaddress.IPv6Network):
        return inner.subnet_of(outer)
    return False


def allow_list_policy(label: str, network: tuple[str, ...], resolved: Mapping[str, Sequence[str]],
                      metadata_networks: Sequence[str]) -> dict[str, Any]:
    """The NetworkPolicy of one allow-list: egress only to its entries (a CIDR on every port;
    an address or a resolved name on its port, TCP and UDP), never to the metadata networks
    (cut out of a CIDR that holds them; an entry inside them is dropped)."""
    meta = [ipaddress.ip_network(n, strict=False) for n in metadata_networks]
    rules: list[dict[str, Any]] = []
    for entry in network:
        if "/" in entry:
            net = ipaddress.ip_network(entry, strict=False)
            if any(_subnet_of(net, m) for m in meta):
                continue
            block: dict[str, Any] = {"cidr": str(net)}
            inside = [str(m) for m in meta if _subnet_of(m, net)]
            if inside:
                block["except"] = inside
            rules.append({"to": [{"ipBlock": block}]})
            continue
        host, _, port = entry.rpartition(":")
        addrs = list(resolved.get(host, ())) if host in resolved else [host.strip("[]")]
        peers = []
        for addr in addrs:
            ip = ipaddress.ip_address(addr)
            if any(ip in m for m in meta):
                continue
            peers.append({"ipBlock": {"cidr": f"{ip}/{ip.max_prefixlen}"}})
        if peers:
            rules.append({"to": peers, "ports": [{"protocol": proto, "port": int(port)} for proto in ("TCP", "UDP")]})
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": f"flowmesh-egress-{label}", "labels": {NETWORK_LABEL: label}},
            "spec": {"podSelector": {"matchLabels": {NETWORK_LABEL: label}}, "policyTypes": ["Egress"],
                     "egress": rules}}


def timestamp(text: str | None) -> float:
    """An API object's RFC 3339 time (``creationTimestamp``) as epoch seconds (0 for none)."""
    if not text:
        return 0.0
    return _dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _condition(pod: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for c in (pod.get("status") or {}).get("conditions") or ():
        if c.get("type") == kind:
            return c
    return None


def unschedulable(pod: Mapping[str, Any]) -> str | None:
    """The scheduler's message when it could not place the pod, else None."""
    cond = _condition(pod, "PodScheduled")
    if cond is not None and cond.get("status") == "False" and cond.get("reason") == "Unschedulable":
        return str(cond.get("message") or "unschedulable")
    return None


def scheduled(pod: Mapping[str, Any]) -> bool:
    cond = _condition(pod, "PodScheduled")
    return bool(cond is not None and cond.get("status") == "True") or bool((pod.get("spec") or {}).get("nodeName"))


def _container_end(status: Mapping[str, Any]) -> str | None:
    """How the pod's container ended, as ``kubectl describe`` shows it (OOMKilled, Error...)."""
    for cs in status.get("containerStatuses") or ():
        ended = (cs.get("state") or {}).get("terminated")
        if ended:
            return f"its container terminated ({ended.get('reason') or 'no reason'}, exit code {ended.get('exitCode')})"
    return None


def _fault(pod: Mapping[str, Any]) -> tuple[ProviderState, InstanceFault | None]:
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    phase = status.get("phase") or "Pending"
    if phase in ("Failed", "Succeeded"):
        why = status.get("reason") or _container_end(status) or "the sandbox's container exited"
        text = f"pod {meta.get('name')} {phase}: {why}" + (f": {status['message']}" if status.get("message") else "")
        return ProviderState.TERMINATED, InstanceFault(FaultKind.LOST, text)
    if meta.get("deletionTimestamp"):
        return ProviderState.TERMINATED, None
    for cs in status.get("containerStatuses") or ():
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in IMAGE_REASONS:
            return ProviderState.PENDING, InstanceFault(
                FaultKind.IMAGE, f"the kubelet could not pull {cs.get('image')}: {waiting.get('reason')}"
                                 + (f": {waiting['message']}" if waiting.get("message") else ""))
    ready = _condition(pod, "Ready")
    if phase == "Running" and ready is not None and ready.get("status") == "True":
        return ProviderState.RUNNING, None
    return ProviderState.PENDING, None


def instance_of(pod: Mapping[str, Any], target: Target) -> Instance:
    meta = pod.get("metadata") or {}
    notes = meta.get("annotations") or {}
    state, fault = _fault(pod)
    spec = InstanceSpec(cpus=int(notes.get(ANNOTATION + "cpus") or 1),
                        memory_gb=float(notes.get(ANNOTATION + "memory-gb") or 1.0),
                        gpus=int(notes.get(ANNOTATION + "gpus") or 0))
    return Instance(id=str(meta.get("uid")), provider=PROVIDER, region=target.context,
                    instance_type=str(notes.get(ANNOTATION + "instance-type") or "pod"), spec=spec, state=state,
                    tags=TAGS.decode(meta.get("labels") or {}), launched_at=timestamp(meta.get("creationTimestamp")),
                    price_per_hour=float(notes.get(ANNOTATION + "price-per-hour") or 0.0),
                    address=str(meta.get("name")), zone=target.namespace, fault=fault)
