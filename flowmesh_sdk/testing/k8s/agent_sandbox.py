"""agent-sandbox in the emulator (``KubeEmulator(agent_sandbox=True)``): the CRDs of
kubernetes-sigs/agent-sandbox served as ``v1beta1``, and its controllers' behaviour, on the
emulator's store and kubelet (each sandbox's pod is a real podman container like any other).

Followed: the project's release v0.5.6 (commit 211b7579cabed9460c1a692eb687084ff4c5879d):
``api/v1beta1/sandbox_types.go``, ``extensions/api/v1beta1/{sandboxclaim,sandboxtemplate,
sandboxwarmpool}_types.go``, the CRDs under ``k8s/crds/`` (plurals, short names ``sandbox``,
``sandboxtemplate``, ``sandboxclaim``, ``swp``; ``v1beta1`` the storage version, ``v1alpha1``
deprecated), and the controllers ``controllers/sandbox_controller.go`` and
``extensions/controllers/{sandboxwarmpool,sandboxclaim}_controller.go``.

Served: ``agents.x-k8s.io/v1beta1`` sandboxes and ``extensions.agents.x-k8s.io/v1beta1``
sandboxtemplates, sandboxclaims, sandboxwarmpools -- discovery, create, get, list, watch,
patch/update (spec, labels, annotations; ``status`` is the controllers'), delete and
deletecollection, in the API's JSON shapes.  On create, the schema's defaults and required
fields: a warm pool's ``spec.replicas`` 1 and ``sandboxTemplateRef.name``, a claim's
``warmPoolRef.name``, a sandbox's ``spec.podTemplate``, a template's ``networkPolicyManagement``
``Managed`` and its injection policies ``Disallowed``.  ``v1alpha1`` is not served.

Controllers (run on the emulator's loop after each change, as a work queue):

* Sandbox -- a pod named after the sandbox (or its ``agents.x-k8s.io/pod-name``
  annotation), from ``spec.podTemplate``, labelled ``agents.x-k8s.io/sandbox-name-hash``
  (FNV-1a of the name, 8 hex digits) plus the template's labels and the extension labels
  (warm pool, template ref hash, claim uid), owned by the sandbox; created through the
  API's admission (quota, RuntimeClass: a refusal is ``Ready=False`` ``ReconcilerError``
  ``Error seen: ...``, tried again when a pod of the namespace goes).  Its labels follow the
  sandbox's.  Status: ``Ready`` (``DependenciesReady`` once the pod runs, is Ready and has an
  IP; ``DependenciesNotReady``, ``PodSucceeded``, ``PodFailed``), ``PodScheduled`` mirrored
  from the pod, ``Finished`` when the pod ended, ``podIPs``, ``nodeName``, ``selector``.  A pod
  deleted under a live sandbox is made again.
* SandboxWarmPool -- keeps ``spec.replicas`` sandboxes of its template (``generateName``
  ``<pool>-``, label ``agents.x-k8s.io/warm-pool-sandbox`` = the pool name's hash, launch type
  ``warm``, owned by the pool), deletes extras, status ``replicas``, ``readyReplicas``,
  ``selector``.
* SandboxClaim -- adopts a member of its warm pool (a Ready one first, else the oldest):
  the warm-pool label goes, ownership moves to the claim, the claim's uid becomes the label
  ``agents.x-k8s.io/claim-uid`` (on the pod too), ``spec.additionalPodMetadata`` is merged
  into the pod's (label domains outside ``allowed_label_domains``, default
  ``sandbox.users.io``, are ``InvalidMetadata``; a value the template sets otherwise is a
  conflict), the claim is annotated ``agents.x-k8s.io/sandbox-name``; the pool refills.
  With no member, a cold sandbox named after the claim.  Status: ``Ready`` forwarded from
  the sandbox (or ``WarmPoolNotFound``, ``TemplateNotFound``, ``InvalidMetadata``,
  ``EnvVarsInjectionRejected``, ``SandboxMissing``), ``sandbox.name``, ``sandbox.podIPs``.
* Garbage collection -- deleting a claim or warm pool deletes the sandboxes it owns; deleting
  a sandbox deletes its pod (background propagation).

Not modelled: ``v1alpha1``, ``lifecycle`` (shutdownTime, TTL), ``operatingMode: Suspended``,
headless Services, the template's managed NetworkPolicy and secure DNS, volume claim templates,
update strategies, the sandbox router, metrics, adoption conflicts (one loop writes).
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

from .agent_sandbox_api import (ADMISSION, ASSIGNED, CLAIM_UID, CLAIMS, CORE_GROUP, CREATED_BY, EXT_GROUP,
                                LAUNCH_TYPE, NAME_HASH, POD_NAME, POOLS, PROPAGATED, RESOURCES, SANDBOXES,
                                TEMPLATE_HASH, TEMPLATE_REF, TEMPLATE_REF_HASH, TEMPLATES, VERSION, WARM_POOL,
                                _cond, _controller_uid, _deleting, _meta, _owner, _system, name_hash)
from .agent_sandbox_ext import ClaimController, WarmPoolController
from .objects import ApiError, Event, Obj, ObjectStore
from .writes import Writes

__all__ = ["CORE_GROUP", "EXT_GROUP", "RESOURCES", "VERSION", "AgentSandboxControllers", "install", "name_hash",
           # the API's names, importable from here as before the split (agent_sandbox_api.py holds them)
           "ADMISSION", "ASSIGNED", "CLAIMS", "CLAIM_UID", "CREATED_BY", "LAUNCH_TYPE", "NAME_HASH", "POD_NAME",
           "POOLS", "PROPAGATED", "SANDBOXES", "TEMPLATES", "TEMPLATE_HASH", "TEMPLATE_REF", "TEMPLATE_REF_HASH",
           "WARM_POOL"]

log = logging.getLogger("flowmesh.testing.k8s")


class AgentSandboxControllers:
    """The Sandbox controller and the garbage collector (module docstring), with the
    SandboxWarmPool and SandboxClaim controllers it owns (``pools``, ``claims``:
    :mod:`.agent_sandbox_ext`), fed by the store's changes.  ``spawn`` runs a pod's removal."""

    def __init__(self, store: ObjectStore, writes: Writes, *, spawn: Callable[[Awaitable[Any]], None],
                 allowed_label_domains: Sequence[str] = ("sandbox.users.io",)) -> None:
        self.store = store
        self.writes = writes
        self._spawn = spawn
        self.pools = WarmPoolController(store)
        self.claims = ClaimController(store, self.pools.members, allowed_label_domains=allowed_label_domains)
        self._dirty: dict[tuple[str, str, str], None] = {}   # (kind, namespace, name or owner uid), in order
        self._scheduled = False
        self._pod_errors: dict[tuple[str, str], str] = {}     # (namespace, sandbox) -> why its pod was refused
        store.on_change.append(self._changed)

    @property
    def allowed_label_domains(self) -> tuple[str, ...]:
        """The label domains a claim's ``additionalPodMetadata`` may use (the claim controller's)."""
        return self.claims.allowed_label_domains

    @allowed_label_domains.setter
    def allowed_label_domains(self, value: Sequence[str]) -> None:
        self.claims.allowed_label_domains = tuple(value)

    # ---- the work queue ---------------------------------------------------------------------
    def _queue(self, kind: str, namespace: str, name: str) -> None:
        self._dirty[(kind, namespace, name)] = None
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._drain)

    def _changed(self, ev: Event) -> None:
        obj, ns = ev.obj, ev.namespace
        meta = _meta(obj)
        name, uid = str(meta.get("name")), str(meta.get("uid"))
        if ev.resource == "pods":
            for ref in meta.get("ownerReferences") or ():
                if ref.get("kind") == "Sandbox":
                    self._queue("sandbox", ns, str(ref.get("name")))
            if ev.type == "DELETED":   # room freed: sandboxes whose pod was refused try again
                for (pns, sb) in list(self._pod_errors):
                    if pns == ns:
                        self._queue("sandbox", ns, sb)
        elif ev.resource == SANDBOXES:
            self._queue("sandbox", ns, name)
            for pool in self.store.items(POOLS, ns):
                self._queue("pool", ns, _meta(pool)["name"])
            for claim in self.store.items(CLAIMS, ns):
                self._queue("claim", ns, _meta(claim)["name"])
            if ev.type == "DELETED":
                self._queue("gc-pods", ns, uid)
        elif ev.resource == POOLS:
            self._queue("pool", ns, name)
            if ev.type == "DELETED":
                self._queue("gc-sandboxes", ns, uid)
        elif ev.resource == CLAIMS:
            self._queue("claim", ns, name)
            if ev.type == "DELETED":
                self._queue("gc-sandboxes", ns, uid)
        elif ev.resource == TEMPLATES:
            for kind, key in (("pool", POOLS), ("claim", CLAIMS)):
                for obj2 in self.store.items(key, ns):
                    self._queue(kind, ns, _meta(obj2)["name"])

    def _drain(self) -> None:
        self._scheduled = False
        handlers = {"sandbox": self._sandbox, "pool": self.pools.reconcile, "claim": self.claims.reconcile,
                    "gc-sandboxes": self._gc_sandboxes, "gc-pods": self._gc_pods}
        for _ in range(100):   # writes queue more work; the store only reports real changes, so this settles
            if not self._dirty:
                return
            items, self._dirty = list(self._dirty), {}
            for kind, ns, name in items:
                try:
                    handlers[kind](ns, name)
                except Exception:  # a bug here must not stop the emulator's other controllers
                    log.exception("agent-sandbox controller: %s %s/%s", kind, ns, name)
        if self._dirty and not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._drain)

    # ---- garbage collection -----------------------------------------------------------------
    def _gc_sandboxes(self, ns: str, owner_uid: str) -> None:
        for sb in list(self.store.items(SANDBOXES, ns)):
            if _controller_uid(sb) == owner_uid:
                self.store.delete(SANDBOXES, ns, _meta(sb)["name"])

    def _gc_pods(self, ns: str, owner_uid: str) -> None:
        for pod in list(self.store.items("pods", ns)):
            if _controller_uid(pod) == owner_uid and not _deleting(pod):
                self._spawn(self.writes.delete_pod(copy.deepcopy(pod), {}))

    # ---- Sandbox --------------------------------------------------------------------------------
    def _pod_labels(self, sb: Obj) -> dict[str, str]:
        tmpl = ((sb.get("spec") or {}).get("podTemplate") or {}).get("metadata") or {}
        labels = {k: v for k, v in (tmpl.get("labels") or {}).items() if not _system(k)}
        if CLAIM_UID in (tmpl.get("labels") or {}):
            labels[CLAIM_UID] = tmpl["labels"][CLAIM_UID]
        for k in (WARM_POOL, TEMPLATE_REF_HASH, CREATED_BY):
            if k in (_meta(sb).get("labels") or {}):
                labels[k] = _meta(sb)["labels"][k]
        labels[NAME_HASH] = name_hash(_meta(sb)["name"])
        return labels

    def _sandbox(self, ns: str, name: str) -> None:
        sb = self.store.peek(SANDBOXES, ns, name)
        if sb is None or _deleting(sb):
            self._pod_errors.pop((ns, name), None)
            return
        sb_uid = _meta(sb)["uid"]
        pod_name = (_meta(sb).get("annotations") or {}).get(POD_NAME) or name
        pod = self.store.peek("pods", ns, pod_name)
        labels = self._pod_labels(sb)
        tmpl = (sb.get("spec") or {}).get("podTemplate") or {}
        managed = sorted(k for k in labels if not _system(k))
        if pod is None:
            body: Obj = {"metadata": {"name": pod_name, "namespace": ns, "labels": labels,
                                      "annotations": {**((tmpl.get("metadata") or {}).get("annotations") or {}),
                                                      **({PROPAGATED: ",".join(managed)} if managed else {})},
                                      "ownerReferences": [_owner(sb, "Sandbox", f"{CORE_GROUP}/{VERSION}")]},
                         "spec": copy.deepcopy(tmpl.get("spec") or {})}
            try:
                pod = self.writes.create_pod(body)
                self._pod_errors.pop((ns, name), None)
            except ApiError as exc:
                self._pod_errors[(ns, name)] = exc.message
                pod = None
        elif _controller_uid(pod) == sb_uid:
            before = set(((_meta(pod).get("annotations") or {}).get(PROPAGATED) or "").split(",")) - {""}
            keep = {k: v for k, v in (_meta(pod).get("labels") or {}).items() if k not in before and not _system(k)}
            want = {**keep, **labels}
            if want != (_meta(pod).get("labels") or {}):
                def relabel(p: Obj) -> None:
                    p["metadata"]["labels"] = want
                    notes = p["metadata"].setdefault("annotations", {})
                    if managed:
                        notes[PROPAGATED] = ",".join(managed)
                    else:
                        notes.pop(PROPAGATED, None)
                self.store.update("pods", ns, pod_name, relabel)
        owned = pod is not None and _controller_uid(pod) == sb_uid
        self.store.update(SANDBOXES, ns, name, lambda s: s.__setitem__("status", self._sandbox_status(
            s, pod if owned else None, self._pod_errors.get((ns, name)))))

    def _sandbox_status(self, sb: Obj, pod: Obj | None, error: str | None) -> Obj:
        conds = []
        status: Obj = {}
        if pod is not None:
            pst = pod.get("status") or {}
            phase = str(pst.get("phase") or "Pending")
            sched = next((c for c in pst.get("conditions") or () if c.get("type") == "PodScheduled"), None)
            if sched is None:
                conds.append(_cond(sb, "PodScheduled", "Unknown", "PodSchedulingUnknown", ""))
            else:
                conds.append(_cond(sb, "PodScheduled", str(sched.get("status")),
                                   str(sched.get("reason") or ("PodScheduled" if sched.get("status") == "True"
                                                               else "PodSchedulingUnknown")),
                                   str(sched.get("message") or "")))
            ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in pst.get("conditions") or ())
            ips = [str(i.get("ip")) for i in pst.get("podIPs") or () if i.get("ip")]
            if phase == "Succeeded":
                conds.append(_cond(sb, "Ready", "False", "PodSucceeded", "Pod completed successfully"))
            elif phase == "Failed":
                conds.append(_cond(sb, "Ready", "False", "PodFailed", "Pod failed"))
            elif phase == "Running" and ready and ips:
                conds.append(_cond(sb, "Ready", "True", "DependenciesReady", "Pod is Ready"))
            else:
                why = ("Pod is Ready but has no podIPs yet" if phase == "Running" and ready else
                       "Pod is Running but not Ready" if phase == "Running" else f"Pod exists with phase: {phase}")
                conds.append(_cond(sb, "Ready", "False", "DependenciesNotReady", why))
            if phase in ("Succeeded", "Failed"):
                conds.append(_cond(sb, "Finished", "True", f"Pod{phase}", ""))
            status.update({"podIPs": ips} if ips else {})
            if (pod.get("spec") or {}).get("nodeName"):
                status["nodeName"] = pod["spec"]["nodeName"]
            status["selector"] = f"{NAME_HASH}={name_hash(_meta(sb)['name'])}"
        elif error is not None:
            conds.append(_cond(sb, "Ready", "False", "ReconcilerError", f"Error seen: {error}"))
        else:
            conds.append(_cond(sb, "Ready", "False", "DependenciesNotReady", "Pod does not exist"))
        status["conditions"] = conds
        return status


def install(api: Any, store: ObjectStore, *, spawn: Callable[[Awaitable[Any]], None],
            allowed_label_domains: Iterable[str] = ("sandbox.users.io",)) -> AgentSandboxControllers:
    """Serve the CRDs on ``api`` (a :class:`~.api.KubeApi`) and run their controllers."""
    api.serve(RESOURCES)
    api.writes.admit.update(ADMISSION)
    return AgentSandboxControllers(store, api.writes, spawn=spawn, allowed_label_domains=tuple(allowed_label_domains))
