"""A pod's status as the kubelet writes it: conditions (:func:`set_condition`), the one
container's status row (:func:`container_status`), and one mutation per step of a pod's
life -- accepted on its node, waiting, running, terminated, ended, restarting after a
back-off, evicted, its node lost -- each changing a pod object in place, for
``ObjectStore.update``.  :mod:`.kubelet` decides when (its module docstring says what a
pod goes through)."""

from __future__ import annotations

from .objects import Obj, now_rfc3339

__all__ = ["accepted", "container_status", "ended", "evicted", "node_lost", "restarting", "running",
           "set_condition", "terminated", "waiting"]


def _condition(ctype: str, status: str, reason: str | None = None, message: str | None = None) -> Obj:
    out: Obj = {"type": ctype, "status": status, "lastProbeTime": None, "lastTransitionTime": now_rfc3339()}
    if reason:
        out["reason"] = reason
    if message:
        out["message"] = message
    return out


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


def container_status(pod: Obj) -> Obj:
    """The status row of the pod's container (made, ContainerCreating, if there is none)."""
    status = pod.setdefault("status", {})
    c = pod["spec"]["containers"][0]
    rows = status.setdefault("containerStatuses", [])
    if not rows:
        rows.append({"name": c["name"], "image": c["image"], "imageID": "", "ready": False,
                     "restartCount": 0, "started": False, "state": {"waiting": {"reason": "ContainerCreating"}},
                     "lastState": {}})
    row: Obj = rows[0]
    return row


def accepted(p: Obj) -> None:
    """The kubelet took the pod: host IP, start time, its containers not ready yet."""
    st = p["status"]
    st["hostIP"] = "127.0.0.1"
    st["hostIPs"] = [{"ip": "127.0.0.1"}]
    st.setdefault("startTime", now_rfc3339())
    set_condition(p, "PodReadyToStartContainers", "True")
    set_condition(p, "Initialized", "True")
    set_condition(p, "PodScheduled", "True")
    c = container_status(p)
    set_condition(p, "ContainersReady", "False", "ContainersNotReady",
                  f"containers with unready status: [{c['name']}]")
    set_condition(p, "Ready", "False", "ContainersNotReady", f"containers with unready status: [{c['name']}]")


def waiting(pod: Obj, reason: str, message: str | None = None) -> None:
    row = container_status(pod)
    row["state"] = {"waiting": {"reason": reason, **({"message": message} if message else {})}}
    row["ready"] = False
    row["started"] = False
    set_condition(pod, "ContainersReady", "False", "ContainersNotReady",
                  f"containers with unready status: [{row['name']}]")
    set_condition(pod, "Ready", "False", "ContainersNotReady",
                  f"containers with unready status: [{row['name']}]")


def running(p: Obj, started: str, cid: str, image_id: str) -> None:
    st = p["status"]
    st["phase"] = "Running"
    st["podIP"] = "127.0.0.1"
    st["podIPs"] = [{"ip": "127.0.0.1"}]
    row = container_status(p)
    row.update(ready=True, started=True, state={"running": {"startedAt": started}},
               containerID=f"podman://{cid}", imageID=image_id)
    set_condition(p, "ContainersReady", "True")
    set_condition(p, "Ready", "True")


def terminated(p: Obj, code: int, reason: str, message: str | None, started: str, finished: str,
               image_id: str, cid: str) -> None:
    row = container_status(p)
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


def ended(p: Obj, code: int) -> None:
    """The pod ended (its restartPolicy starts no new container): Succeeded or Failed."""
    p["status"]["phase"] = "Succeeded" if code == 0 else "Failed"
    if code == 0:
        set_condition(p, "ContainersReady", "False", "PodCompleted")
        set_condition(p, "Ready", "False", "PodCompleted")
    set_condition(p, "PodReadyToStartContainers", "False")


def restarting(p: Obj, delay: float, name: str, namespace: str, uid: str) -> None:
    """A new container is due (``restartCount`` + 1); ``delay``: CrashLoopBackOff until then."""
    row = container_status(p)
    row["lastState"] = {"terminated": row["state"].get("terminated", {})}
    row["restartCount"] = int(row.get("restartCount", 0)) + 1
    if delay:
        msg = (f"back-off {int(delay)}s restarting failed container={row['name']} "
               f"pod={name}_{namespace}({uid})")
        row["state"] = {"waiting": {"reason": "CrashLoopBackOff", "message": msg}}


def evicted(p: Obj, reason: str, message: str, finished: str, had_run: bool) -> None:
    """The kubelet's eviction: phase Failed, the container (if it had one) terminated."""
    st = p["status"]
    st.update(phase="Failed", reason=reason, message=message)
    if had_run:
        row = container_status(p)
        state = row.get("state") or {}
        started = (state.get("running") or {}).get("startedAt", finished)
        if "terminated" not in state:
            row["state"] = {"terminated": {"exitCode": 137, "reason": "Error", "startedAt": started,
                                           "finishedAt": finished}}
        row.update(ready=False, started=False)
    set_condition(p, "DisruptionTarget", "True", "TerminationByKubelet", message)
    set_condition(p, "ContainersReady", "False", "PodFailed")
    set_condition(p, "Ready", "False", "PodFailed")


def node_lost(p: Obj, node: str, finished: str, had_run: bool) -> None:
    """The pod's node stopped reporting: phase Failed, reason NodeLost (as the node
    controller once wrote it)."""
    st = p["status"]
    st.update(phase="Failed", reason="NodeLost",
              message=f"Node {node} which was running pod {p['metadata']['name']} is unresponsive")
    if had_run:
        row = container_status(p)
        if "terminated" not in (row.get("state") or {}):
            row["state"] = {"terminated": {
                "exitCode": 137, "reason": "ContainerStatusUnknown", "finishedAt": finished,
                "message": "The container could not be located when the pod was terminated"}}
        row.update(ready=False, started=False)
    set_condition(p, "DisruptionTarget", "True", "DeletionByTaintManager",
                  "Taint manager: deleting due to NoExecute taint")
    set_condition(p, "Ready", "False", "NodeNotReady")
