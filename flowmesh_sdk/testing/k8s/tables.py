"""Server-side printing: the ``meta.k8s.io/v1 Table`` kubectl asks for (``Accept:
application/json;as=Table;v=v1;g=meta.k8s.io``) for pods and nodes, with the columns and
cells of the apiserver's printers (``pkg/printers/internalversion/printers.go``:
``printPod``'s READY/STATUS/RESTARTS, ``printNode``'s STATUS, ``duration.HumanDuration``
ages).  Other resources are answered as plain objects, which kubectl prints as NAME/AGE."""

from __future__ import annotations

import calendar
import time
from typing import Any

__all__ = ["TABLE_KINDS", "human_duration", "table", "wants_table"]

Obj = dict[str, Any]
TABLE_KINDS = ("pods", "nodes")
_NAME_HELP = ("Name must be unique within a namespace. Is required when creating resources, although some resources "
              "may allow a client to request the generation of an appropriate name automatically. Name is primarily "
              "intended for creation idempotence and configuration definition. Cannot be updated. More info: "
              "https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names")
_AGE_HELP = ("CreationTimestamp is a timestamp representing the server time when this object was created. It is not "
             "guaranteed to be set in happens-before order across separate operations. Clients may not set this "
             "value. It is represented in RFC3339 form and is in UTC.")


def _col(name: str, description: str, priority: int = 0, fmt: str = "") -> Obj:
    return {"name": name, "type": "string", "format": fmt, "description": description, "priority": priority}


_COLUMNS = {
    "pods": [_col("Name", _NAME_HELP, fmt="name"),
             _col("Ready", "The aggregate readiness state of this pod for accepting traffic."),
             _col("Status", "The aggregate status of the containers in this pod."),
             _col("Restarts", "The number of times the containers in this pod have been restarted and when the "
                              "last container in this pod has restarted."),
             _col("Age", _AGE_HELP),
             _col("IP", "IP address allocated to the pod. Routable at least within the cluster. Empty if not yet "
                        "allocated.", 1),
             _col("Node", "NodeName indicates in which node this pod is scheduled.", 1),
             _col("Nominated Node", "nominatedNodeName is set only when this pod preempts other pods on the node.",
                  1),
             _col("Readiness Gates", "If specified, all readiness gates will be evaluated for pod readiness.", 1)],
    "nodes": [_col("Name", _NAME_HELP, fmt="name"),
              _col("Status", "The status of the node"),
              _col("Roles", "The roles of the node"),
              _col("Age", _AGE_HELP),
              _col("Version", "Kubelet Version reported by the node."),
              _col("Internal-IP", "List of addresses reachable to the node. Queried from cloud provider, if "
                                  "available.", 1),
              _col("External-IP", "List of addresses reachable to the node. Queried from cloud provider, if "
                                  "available.", 1),
              _col("OS-Image", "OS Image reported by the node from /etc/os-release (e.g. Debian GNU/Linux 7 "
                               "(wheezy)).", 1),
              _col("Kernel-Version", "Kernel Version reported by the node from 'uname -r' (e.g. "
                                     "3.16.0-0.bpo.4-amd64).", 1),
              _col("Container-Runtime", "ContainerRuntime Version reported by the node through runtime remote API "
                                        "(e.g. containerd://1.4.2).", 1)],
}


def wants_table(accept: str, resource: str) -> bool:
    return resource in TABLE_KINDS and "as=Table" in accept and "g=meta.k8s.io" in accept


def human_duration(seconds: float) -> str:
    """apimachinery's ``duration.HumanDuration``."""
    s = int(max(0, seconds))
    if s < 120:
        return f"{s}s"
    m = s // 60
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if m < 180:
        return f"{m}m"
    h = m // 60
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    d = h // 24
    if h < 24 * 8:
        return f"{d}d{h % 24}h" if h % 24 else f"{d}d"
    if h < 24 * 365 * 2:
        return f"{d}d"
    if h < 24 * 365 * 8:
        return f"{d // 365}y{d % 365}d" if d % 365 else f"{d // 365}y"
    return f"{d // 365}y"


def _age(obj: Obj) -> str:
    stamp = (obj.get("metadata") or {}).get("creationTimestamp")
    if not stamp:
        return "<unknown>"
    return human_duration(time.time() - calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")))


def _pod_cells(pod: Obj) -> list[Any]:
    meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
    rows = status.get("containerStatuses") or []
    total = len(spec.get("containers") or [])
    reason = status.get("reason") or status.get("phase") or ""
    ready = restarts = 0
    running = False
    last_restart = ""
    for c in reversed(rows):
        restarts += int(c.get("restartCount") or 0)
        finished = ((c.get("lastState") or {}).get("terminated") or {}).get("finishedAt")
        if finished and finished > last_restart:
            last_restart = finished
        state = c.get("state") or {}
        if (state.get("waiting") or {}).get("reason"):
            reason = state["waiting"]["reason"]
        elif (state.get("terminated") or {}).get("reason"):
            reason = state["terminated"]["reason"]
        elif "terminated" in state:
            term = state["terminated"]
            reason = f"Signal:{term['signal']}" if term.get("signal") else f"ExitCode:{term.get('exitCode', 0)}"
        elif c.get("ready") and "running" in state:
            running = True
            ready += 1
    if reason == "Completed" and running:
        reason = "Running"
    if meta.get("deletionTimestamp"):
        reason = "Unknown" if status.get("reason") == "NodeLost" else "Terminating"
    shown = str(restarts)
    if last_restart:
        then = calendar.timegm(time.strptime(last_restart, "%Y-%m-%dT%H:%M:%SZ"))
        shown += f" ({human_duration(time.time() - then)} ago)"
    return [meta["name"], f"{ready}/{total}", reason, shown, _age(pod), status.get("podIP") or "<none>",
            spec.get("nodeName") or "<none>", status.get("nominatedNodeName") or "<none>", "<none>"]


def _node_cells(node: Obj) -> list[Any]:
    status, spec = node.get("status") or {}, node.get("spec") or {}
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    shown = "Ready" if ready and ready.get("status") == "True" else ("NotReady" if ready else "Unknown")
    if spec.get("unschedulable"):
        shown += ",SchedulingDisabled"
    info = status.get("nodeInfo") or {}
    internal = next((a["address"] for a in status.get("addresses") or [] if a.get("type") == "InternalIP"), "<none>")
    return [node["metadata"]["name"], shown, "<none>", _age(node), info.get("kubeletVersion", ""), internal, "<none>",
            info.get("osImage", "<unknown>") or "<unknown>", info.get("kernelVersion", "") or "<unknown>",
            info.get("containerRuntimeVersion", "")]


def table(resource: str, objects: list[Obj], list_meta: Obj, include: str = "Metadata") -> Obj:
    """A Table of ``objects``; ``include`` (``includeObject``): None, Metadata or Object."""
    cells = _pod_cells if resource == "pods" else _node_cells
    rows = []
    for obj in objects:
        row: Obj = {"cells": cells(obj)}
        if include == "Object":
            row["object"] = obj
        elif include != "None":
            row["object"] = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                             "metadata": obj.get("metadata") or {}}
        rows.append(row)
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": dict(list_meta),
            "columnDefinitions": _COLUMNS[resource], "rows": rows}
