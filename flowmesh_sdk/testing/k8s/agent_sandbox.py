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

from .objects import ApiError, Event, Obj, ObjectStore, generate_name, now_rfc3339
from .resources import Resource
from .writes import Writes

__all__ = ["CORE_GROUP", "EXT_GROUP", "RESOURCES", "VERSION", "AgentSandboxControllers", "install", "name_hash"]

log = logging.getLogger("flowmesh.testing.k8s")
CORE_GROUP = "agents.x-k8s.io"
EXT_GROUP = "extensions.agents.x-k8s.io"
VERSION = "v1beta1"
_RW = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
RESOURCES = (
    Resource("sandboxes", "Sandbox", CORE_GROUP, True, _RW, ("sandbox",), VERSION),
    Resource("sandboxtemplates", "SandboxTemplate", EXT_GROUP, True, _RW, ("sandboxtemplate",), VERSION),
    Resource("sandboxclaims", "SandboxClaim", EXT_GROUP, True, _RW, ("sandboxclaim",), VERSION),
    Resource("sandboxwarmpools", "SandboxWarmPool", EXT_GROUP, True, _RW, ("swp",), VERSION),
)
SANDBOXES, TEMPLATES, CLAIMS, POOLS = (r.key for r in RESOURCES)

# labels and annotations of the published API (api/v1beta1, extensions/api/v1beta1)
NAME_HASH = "agents.x-k8s.io/sandbox-name-hash"
WARM_POOL = "agents.x-k8s.io/warm-pool-sandbox"
TEMPLATE_REF_HASH = "agents.x-k8s.io/sandbox-template-ref-hash"
TEMPLATE_HASH = "agents.x-k8s.io/sandbox-template-hash"
LAUNCH_TYPE = "agents.x-k8s.io/launch-type"
CREATED_BY = "agents.x-k8s.io/created-by"
CLAIM_UID = "agents.x-k8s.io/claim-uid"
POD_NAME = "agents.x-k8s.io/pod-name"
TEMPLATE_REF = "agents.x-k8s.io/sandbox-template-ref"
ASSIGNED = "agents.x-k8s.io/sandbox-name"
PROPAGATED = "agents.x-k8s.io/propagated-labels"
_SYSTEM = ("agents.x-k8s.io/", "extensions.agents.x-k8s.io/")


def name_hash(name: str) -> str:
    """The controllers' ``NameHash``: FNV-1a (32 bit) of the name as 8 hex digits."""
    h = 0x811C9DC5
    for b in name.encode():
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return f"{h:08x}"


# ---- admission: the CRDs' schema defaults and required fields ---------------------------------
def _require(kind: str, body: Obj, path: str) -> Any:
    node: Any = body
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    if node in (None, "", {}):
        name = str((body.get("metadata") or {}).get("name") or "")
        group = CORE_GROUP if kind == "Sandbox" else EXT_GROUP
        raise ApiError.invalid(kind, name, [(path, "Required value")], group)
    return node


def _admit_pool(body: Obj) -> None:
    spec = body.setdefault("spec", {})
    spec.setdefault("replicas", 1)
    replicas = spec["replicas"]
    if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
        raise ApiError.invalid("SandboxWarmPool", str(body["metadata"].get("name") or ""),
                               [("spec.replicas", f"Invalid value: {replicas!r}: spec.replicas in body should be "
                                                  "greater than or equal to 0")], EXT_GROUP)
    _require("SandboxWarmPool", body, "spec.sandboxTemplateRef.name")
    body.pop("status", None)


def _admit_claim(body: Obj) -> None:
    _require("SandboxClaim", body, "spec.warmPoolRef.name")
    body.pop("status", None)


def _admit_template(body: Obj) -> None:
    _require("SandboxTemplate", body, "spec.podTemplate.spec")
    spec = body["spec"]
    spec.setdefault("networkPolicyManagement", "Managed")
    spec.setdefault("envVarsInjectionPolicy", "Disallowed")
    spec.setdefault("volumeClaimTemplatesPolicy", "Disallowed")


def _admit_sandbox(body: Obj) -> None:
    _require("Sandbox", body, "spec.podTemplate.spec")
    body["spec"].setdefault("operatingMode", "Running")
    body.pop("status", None)


ADMISSION: dict[str, Callable[[Obj], None]] = {SANDBOXES: _admit_sandbox, TEMPLATES: _admit_template,
                                               CLAIMS: _admit_claim, POOLS: _admit_pool}


# ---- helpers ------------------------------------------------------------------------------------
def _meta(obj: Obj) -> Obj:
    meta: Obj = obj.setdefault("metadata", {})
    return meta


def _deleting(obj: Obj) -> bool:
    return bool(_meta(obj).get("deletionTimestamp"))


def _owner(obj: Obj, kind: str, api_version: str) -> Obj:
    meta = _meta(obj)
    return {"apiVersion": api_version, "kind": kind, "name": meta["name"], "uid": meta["uid"],
            "controller": True, "blockOwnerDeletion": True}


def _controller_uid(obj: Obj) -> str | None:
    for ref in _meta(obj).get("ownerReferences") or ():
        if ref.get("controller"):
            return str(ref.get("uid"))
    return None


def _condition(obj: Obj, ctype: str) -> Obj | None:
    for c in (obj.get("status") or {}).get("conditions") or ():
        if c.get("type") == ctype:
            return dict(c)
    return None


def _ready(obj: Obj) -> bool:
    c = _condition(obj, "Ready")
    return c is not None and c.get("status") == "True"


def _cond(old: Obj, ctype: str, status: str, reason: str, message: str) -> Obj:
    """A metav1.Condition; its lastTransitionTime kept while its status stays."""
    prev = _condition(old, ctype)
    when = prev.get("lastTransitionTime") if prev and prev.get("status") == status else None
    return {"type": ctype, "status": status, "lastTransitionTime": when or now_rfc3339(), "reason": reason,
            "message": message}


def _system(key: str) -> bool:
    return key.startswith(_SYSTEM)


class AgentSandboxControllers:
    """The Sandbox, SandboxWarmPool and SandboxClaim controllers and the garbage collector
    (module docstring), fed by the store's changes.  ``spawn`` runs a pod's removal."""

    def __init__(self, store: ObjectStore, writes: Writes, *, spawn: Callable[[Awaitable[Any]], None],
                 allowed_label_domains: Sequence[str] = ("sandbox.users.io",)) -> None:
        self.store = store
        self.writes = writes
        self._spawn = spawn
        self.allowed_label_domains = tuple(allowed_label_domains)
        self._dirty: dict[tuple[str, str, str], None] = {}   # (kind, namespace, name or owner uid), in order
        self._scheduled = False
        self._pod_errors: dict[tuple[str, str], str] = {}     # (namespace, sandbox) -> why its pod was refused
        store.on_change.append(self._changed)

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
        handlers = {"sandbox": self._sandbox, "pool": self._pool, "claim": self._claim,
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

    # ---- SandboxWarmPool --------------------------------------------------------------------------
    def _members(self, pool: Obj) -> list[Obj]:
        meta = _meta(pool)
        h = name_hash(meta["name"])
        return [sb for sb in self.store.items(SANDBOXES, meta["namespace"])
                if (_meta(sb).get("labels") or {}).get(WARM_POOL) == h and _controller_uid(sb) == meta["uid"]
                and not _deleting(sb)]

    def _pool(self, ns: str, name: str) -> None:
        pool = self.store.peek(POOLS, ns, name)
        if pool is None or _deleting(pool):
            return
        spec = pool.get("spec") or {}
        tname = str((spec.get("sandboxTemplateRef") or {}).get("name") or "")
        template = self.store.peek(TEMPLATES, ns, tname)
        members = self._members(pool)
        desired = int(spec.get("replicas", 1))
        if template is not None:
            for _ in range(desired - len(members)):
                members.append(self.store.create(SANDBOXES, self._warm_sandbox(pool, template)))
        if len(members) > desired:   # the unready and newest go first
            extra = sorted(members, key=lambda s: (_ready(s), _meta(s)["creationTimestamp"]))[:len(members) - desired]
            for sb in extra:
                self.store.delete(SANDBOXES, ns, _meta(sb)["name"])
                members.remove(sb)
        status = {"replicas": len(members), "readyReplicas": sum(1 for s in members if _ready(s)),
                  "selector": f"{WARM_POOL}={name_hash(name)}"}
        self.store.update(POOLS, ns, name, lambda p: p.__setitem__("status", status))

    def _blueprint(self, template: Obj) -> Obj:
        """The template's SandboxBlueprint (podTemplate, volumeClaimTemplates, service), with
        the extensions' secure default: no service-account token unless the template says so."""
        tspec = template.get("spec") or {}
        out = {k: copy.deepcopy(tspec[k]) for k in ("podTemplate", "volumeClaimTemplates", "service") if k in tspec}
        out["podTemplate"].setdefault("spec", {}).setdefault("automountServiceAccountToken", False)
        out["podTemplate"].setdefault("metadata", {})
        return out

    def _warm_sandbox(self, pool: Obj, template: Obj) -> Obj:
        meta = _meta(pool)
        tname = _meta(template)["name"]
        spec = self._blueprint(template)
        pod_labels = spec["podTemplate"]["metadata"].setdefault("labels", {})
        pod_labels.update({WARM_POOL: name_hash(meta["name"]), TEMPLATE_REF_HASH: name_hash(tname)})
        return {"kind": "Sandbox", "apiVersion": f"{CORE_GROUP}/{VERSION}",
                "metadata": {"name": generate_name(f"{meta['name']}-"), "namespace": meta["namespace"],
                             "labels": {WARM_POOL: name_hash(meta["name"]), TEMPLATE_REF_HASH: name_hash(tname),
                                        LAUNCH_TYPE: "warm", CREATED_BY: "controller"},
                             "annotations": {TEMPLATE_REF: tname},
                             "ownerReferences": [_owner(pool, "SandboxWarmPool", f"{EXT_GROUP}/{VERSION}")]},
                "spec": {**spec, "operatingMode": "Running"}}

    # ---- SandboxClaim -----------------------------------------------------------------------------
    def _claim(self, ns: str, name: str) -> None:
        claim = self.store.peek(CLAIMS, ns, name)
        if claim is None or _deleting(claim):
            return
        meta = _meta(claim)
        assigned = (meta.get("annotations") or {}).get(ASSIGNED) or ((claim.get("status") or {}).get("sandbox")
                                                                    or {}).get("name")
        error: tuple[str, str] | None = None
        sb: Obj | None = None
        if assigned:
            sb = self.store.peek(SANDBOXES, ns, str(assigned))
            if sb is not None and _controller_uid(sb) != meta["uid"]:
                sb = None
        else:
            try:
                sb = self._bind(claim)
            except _ClaimError as exc:
                error = (exc.reason, exc.message)
        status = self._claim_status(claim, sb, error)
        self.store.update(CLAIMS, ns, name, lambda c: c.__setitem__("status", status))

    def _bind(self, claim: Obj) -> Obj:
        meta = _meta(claim)
        ns, spec = meta["namespace"], claim.get("spec") or {}
        pool_name = str((spec.get("warmPoolRef") or {}).get("name") or "")
        extra = spec.get("additionalPodMetadata") or {}
        self._validate_metadata(extra)
        pool = self.store.peek(POOLS, ns, pool_name)
        if pool is None:
            raise _ClaimError("WarmPoolNotFound", f'SandboxWarmPool "{pool_name}" not found')
        tname = str(((pool.get("spec") or {}).get("sandboxTemplateRef") or {}).get("name") or "")
        template = self.store.peek(TEMPLATES, ns, tname)
        if template is None:
            raise _ClaimError("TemplateNotFound", f'SandboxTemplate "{tname}" of SandboxWarmPool "{pool_name}" '
                                                  "not found")
        pod_meta = self._merged_metadata(claim, template, extra)
        env = spec.get("env") or []
        if env and (template.get("spec") or {}).get("envVarsInjectionPolicy", "Disallowed") == "Disallowed":
            raise _ClaimError("EnvVarsInjectionRejected", "the template's envVarsInjectionPolicy is Disallowed: "
                                                          "the claim may not set spec.env")
        candidates = [] if env else sorted(self._members(pool), key=lambda s: (not _ready(s),
                                                                              _meta(s)["creationTimestamp"],
                                                                              _meta(s)["name"]))
        if candidates:
            chosen = _meta(candidates[0])["name"]

            def adopt(s: Obj) -> None:
                labels = s["metadata"].setdefault("labels", {})
                for k in (WARM_POOL, TEMPLATE_HASH):
                    labels.pop(k, None)
                labels.update({LAUNCH_TYPE: "warm", CLAIM_UID: meta["uid"], TEMPLATE_REF_HASH: name_hash(tname)})
                s["metadata"]["ownerReferences"] = [_owner(claim, "SandboxClaim", f"{EXT_GROUP}/{VERSION}")]
                s["metadata"].setdefault("annotations", {})[POD_NAME] = chosen
                s["spec"]["podTemplate"]["metadata"] = pod_meta
            sb = self.store.update(SANDBOXES, ns, chosen, adopt)
            assert sb is not None
        else:
            body: Obj = {"kind": "Sandbox", "apiVersion": f"{CORE_GROUP}/{VERSION}",
                    "metadata": {"name": meta["name"], "namespace": ns,
                                 "labels": {LAUNCH_TYPE: "cold", CLAIM_UID: meta["uid"],
                                            TEMPLATE_REF_HASH: name_hash(tname)},
                                 "annotations": {TEMPLATE_REF: tname},
                                 "ownerReferences": [_owner(claim, "SandboxClaim", f"{EXT_GROUP}/{VERSION}")]},
                    "spec": {**self._blueprint(template), "operatingMode": "Running"}}
            body["spec"]["podTemplate"]["metadata"] = pod_meta
            containers = body["spec"]["podTemplate"]["spec"].get("containers") or []
            for e in env:
                target = next((c for c in containers if c.get("name") == e.get("containerName")),
                              containers[0] if containers else None)
                if target is not None:
                    target.setdefault("env", []).append({"name": e.get("name"), "value": e.get("value")})
            sb = self.store.create(SANDBOXES, body)
        self.store.update(CLAIMS, ns, meta["name"], lambda c: c["metadata"].setdefault("annotations", {})
                          .__setitem__(ASSIGNED, _meta(sb)["name"]))
        return sb

    def _validate_metadata(self, extra: Obj) -> None:
        for key, value in (extra.get("labels") or {}).items():
            domain = key.split("/", 1)[0].lower() if "/" in key else ""
            if not domain:
                raise _ClaimError("InvalidMetadata", f'failed to validate label "{key}": label "{key}" must have a '
                                                     "domain prefix (e.g. 'sandbox.users.io/my-label') to prevent "
                                                     "opting into unintended policy domains")
            if not any(domain == d or domain.endswith("." + d) for d in self.allowed_label_domains):
                raise _ClaimError("InvalidMetadata", f'failed to validate label "{key}": label domain "{domain}" '
                                                     "is not in the allowlist")
        for key in (extra.get("annotations") or {}):
            domain = key.split("/", 1)[0].lower() if "/" in key else ""
            if any(domain == d or domain.endswith("." + d) for d in ("kubernetes.io", "k8s.io", "x-k8s.io")):
                raise _ClaimError("InvalidMetadata", f'failed to validate annotation "{key}": restricted system '
                                                     f'domain: "{key}" is not allowed in AdditionalPodMetadata')

    def _merged_metadata(self, claim: Obj, template: Obj, extra: Obj) -> Obj:
        base = copy.deepcopy(((template.get("spec") or {}).get("podTemplate") or {}).get("metadata") or {})
        labels = base.setdefault("labels", {})
        labels.update({CLAIM_UID: _meta(claim)["uid"], TEMPLATE_REF_HASH: name_hash(_meta(template)["name"])})
        for part in ("labels", "annotations"):
            mine = base.setdefault(part, {})
            for k, v in (extra.get(part) or {}).items():
                if k in mine and mine[k] != v:
                    raise _ClaimError("InvalidMetadata", f'metadata override conflict: {part[:-1]} "{k}" is defined '
                                                         f'in template with value "{mine[k]}", but claim requests '
                                                         f'"{v}"')
                mine[k] = v
        return base

    def _claim_status(self, claim: Obj, sb: Obj | None, error: tuple[str, str] | None) -> Obj:
        if error is not None:
            ready = _cond(claim, "Ready", "False", *error)
        elif sb is None:
            ready = _cond(claim, "Ready", "False", "SandboxMissing", "Sandbox does not exist")
        else:
            forwarded = _condition(sb, "Ready")
            ready = _cond(claim, "Ready", str(forwarded.get("status")), str(forwarded.get("reason")),
                          str(forwarded.get("message") or "")) if forwarded else \
                _cond(claim, "Ready", "False", "SandboxNotReady", "Sandbox is not ready")
        out: Obj = {"conditions": [ready]}
        if sb is not None:
            ips = list((sb.get("status") or {}).get("podIPs") or ())
            out["sandbox"] = {"name": _meta(sb)["name"], **({"podIPs": ips} if ips else {})}
        return out


class _ClaimError(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason, self.message = reason, message


def install(api: Any, store: ObjectStore, *, spawn: Callable[[Awaitable[Any]], None],
            allowed_label_domains: Iterable[str] = ("sandbox.users.io",)) -> AgentSandboxControllers:
    """Serve the CRDs on ``api`` (a :class:`~.api.KubeApi`) and run their controllers."""
    api.serve(RESOURCES)
    api.writes.admit.update(ADMISSION)
    return AgentSandboxControllers(store, api.writes, spawn=spawn, allowed_label_domains=tuple(allowed_label_domains))
