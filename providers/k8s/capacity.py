"""How many pods of a shape a namespace can take now, as the API reports it.

Nodes' ``status.allocatable`` minus the requests of the pods bound to them that have not
ended (``spec.nodeName`` set, phase neither Succeeded nor Failed) gives what each Ready,
schedulable node still holds; a shape fits a node as many times as its cpu, memory,
``nvidia.com/gpu`` and pod count allow (GPU shapes only on nodes with GPUs, of the named
product when ``gpu_name`` is set: the ``nvidia.com/gpu.product`` label).  The namespace's
ResourceQuotas (``hard`` minus ``used``) bound it further.  A node with a ``NoSchedule`` or
``NoExecute`` taint the pod's tolerations do not tolerate holds none
(:func:`.tolerations.untolerated`, kube-scheduler's filter): a CPU shape does not count the
room of tainted GPU nodes.  Quantities are parsed by the
official client's ``kubernetes.utils.quantity.parse_quantity``.  ``None``: the cluster-wide
pod list is forbidden to these credentials, so only the quota bounds it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal
from typing import Any

from flowmesh_sdk.specs import InstanceSpec

from .pods import GPU_PRODUCT_LABEL, GPU_RESOURCE
from .tolerations import GPU_TOLERATION, Toleration, untolerated

_ENDED = ("Succeeded", "Failed")


def _q(value: Any) -> Decimal:
    from kubernetes.utils.quantity import parse_quantity   # the k8s extra
    return Decimal(parse_quantity(value)) if value not in (None, "") else Decimal(0)


def _requests(pod: Mapping[str, Any]) -> dict[str, Decimal]:
    out: dict[str, Decimal] = {"cpu": Decimal(0), "memory": Decimal(0), GPU_RESOURCE: Decimal(0)}
    for c in (pod.get("spec") or {}).get("containers") or ():
        for k, v in ((c.get("resources") or {}).get("requests") or {}).items():
            if k in out:
                out[k] += _q(v)
    return out


def _need(spec: InstanceSpec, sandbox_cpus: float | None, sandbox_gb: float | None) -> dict[str, Decimal]:
    return {"cpu": Decimal(str(sandbox_cpus if sandbox_cpus is not None else spec.cpus)),
            "memory": Decimal(int((sandbox_gb if sandbox_gb is not None else spec.memory_gb) * 1024)) * (1 << 20),
            GPU_RESOURCE: Decimal(spec.gpus)}


def node_fits(nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]], spec: InstanceSpec,
              sandbox_cpus: float | None = None, sandbox_gb: float | None = None, *,
              tolerations: Sequence[Toleration] | None = None, gpu_label: str = GPU_PRODUCT_LABEL) -> int:
    """``tolerations``: the pod's (None: :data:`~.tolerations.GPU_TOLERATION` for a GPU shape,
    as :func:`.pods.sandbox_pod` gives it); ``gpu_label``: the label ``gpu_name`` is matched on."""
    if tolerations is None:
        tolerations = (GPU_TOLERATION,) if spec.gpus else ()
    need = _need(spec, sandbox_cpus, sandbox_gb)
    used: dict[str, dict[str, Decimal]] = {}
    count: dict[str, int] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or (pod.get("status") or {}).get("phase") in _ENDED:
            continue
        acc = used.setdefault(node, {"cpu": Decimal(0), "memory": Decimal(0), GPU_RESOURCE: Decimal(0)})
        for k, v in _requests(pod).items():
            acc[k] += v
        count[node] = count.get(node, 0) + 1
    total = 0
    for node in nodes:
        meta, status = node.get("metadata") or {}, node.get("status") or {}
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ())
        if not ready or (node.get("spec") or {}).get("unschedulable"):
            continue
        if untolerated((node.get("spec") or {}).get("taints") or (), tolerations) is not None:
            continue
        alloc = status.get("allocatable") or {}
        if spec.gpus and spec.gpu_name and (meta.get("labels") or {}).get(gpu_label) != spec.gpu_name:
            continue
        name = str(meta.get("name"))
        mine = used.get(name, {})
        fits = int(_q(alloc.get("pods", "110"))) - count.get(name, 0)
        for k in ("cpu", "memory", GPU_RESOURCE):
            if need[k] > 0:
                free = _q(alloc.get(k)) - mine.get(k, Decimal(0))
                fits = min(fits, int(free // need[k]))
        total += max(0, fits)
    return total


_QUOTA_KEYS = {"pods": "pods", "requests.cpu": "cpu", "cpu": "cpu", "limits.cpu": "cpu",
               "requests.memory": "memory", "memory": "memory", "limits.memory": "memory",
               f"requests.{GPU_RESOURCE}": GPU_RESOURCE}


def quota_fits(quotas: Iterable[Mapping[str, Any]], spec: InstanceSpec, sandbox_cpus: float | None = None,
               sandbox_gb: float | None = None) -> int | None:
    """How many more pods of the shape the namespace's quotas admit (None: no quota)."""
    need = {**_need(spec, sandbox_cpus, sandbox_gb), "pods": Decimal(1)}
    best: int | None = None
    for quota in quotas:
        status = quota.get("status") or {}
        hard = status.get("hard") or (quota.get("spec") or {}).get("hard") or {}
        used = status.get("used") or {}
        for key, limit in hard.items():
            res = _QUOTA_KEYS.get(key)
            if res is None or need.get(res, Decimal(0)) <= 0:
                continue
            left = int((_q(limit) - _q(used.get(key))) // need[res])
            best = left if best is None else min(best, left)
    return None if best is None else max(0, best)
