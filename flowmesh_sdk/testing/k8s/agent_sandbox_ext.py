"""The agent-sandbox extensions' controllers in the emulator (:mod:`.agent_sandbox`):
SandboxWarmPool (keeps its replicas of warm sandboxes) and SandboxClaim (adopts a warm
sandbox, or makes a cold one), as ``extensions/controllers/{sandboxwarmpool,
sandboxclaim}_controller.go`` behave: each a part :class:`~.agent_sandbox.AgentSandboxControllers`
owns, given the store (and the claims the pool's members)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

from .agent_sandbox_api import (ASSIGNED, CLAIM_UID, CLAIMS, CORE_GROUP, CREATED_BY, EXT_GROUP, LAUNCH_TYPE, POD_NAME,
                                POOLS, SANDBOXES, TEMPLATE_HASH, TEMPLATE_REF, TEMPLATE_REF_HASH, TEMPLATES, VERSION,
                                WARM_POOL, _cond, _condition, _controller_uid, _deleting, _meta, _owner, _ready,
                                name_hash)
from .objects import Obj, ObjectStore, generate_name


class WarmPoolController:
    """The SandboxWarmPool controller: keeps each pool's replicas of warm sandboxes."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    def members(self, pool: Obj) -> list[Obj]:
        """The pool's warm sandboxes (labelled for it, owned by it, not being deleted)."""
        meta = _meta(pool)
        h = name_hash(meta["name"])
        return [sb for sb in self.store.items(SANDBOXES, meta["namespace"])
                if (_meta(sb).get("labels") or {}).get(WARM_POOL) == h and _controller_uid(sb) == meta["uid"]
                and not _deleting(sb)]

    def reconcile(self, ns: str, name: str) -> None:
        pool = self.store.peek(POOLS, ns, name)
        if pool is None or _deleting(pool):
            return
        spec = pool.get("spec") or {}
        tname = str((spec.get("sandboxTemplateRef") or {}).get("name") or "")
        template = self.store.peek(TEMPLATES, ns, tname)
        members = self.members(pool)
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

    def _warm_sandbox(self, pool: Obj, template: Obj) -> Obj:
        meta = _meta(pool)
        tname = _meta(template)["name"]
        spec = blueprint(template)
        pod_labels = spec["podTemplate"]["metadata"].setdefault("labels", {})
        pod_labels.update({WARM_POOL: name_hash(meta["name"]), TEMPLATE_REF_HASH: name_hash(tname)})
        return {"kind": "Sandbox", "apiVersion": f"{CORE_GROUP}/{VERSION}",
                "metadata": {"name": generate_name(f"{meta['name']}-"), "namespace": meta["namespace"],
                             "labels": {WARM_POOL: name_hash(meta["name"]), TEMPLATE_REF_HASH: name_hash(tname),
                                        LAUNCH_TYPE: "warm", CREATED_BY: "controller"},
                             "annotations": {TEMPLATE_REF: tname},
                             "ownerReferences": [_owner(pool, "SandboxWarmPool", f"{EXT_GROUP}/{VERSION}")]},
                "spec": {**spec, "operatingMode": "Running"}}

class ClaimController:
    """The SandboxClaim controller: adopts a warm sandbox of the claim's pool (``members``:
    the pool's, as :meth:`WarmPoolController.members` lists them), or makes a cold one."""

    def __init__(self, store: ObjectStore, members: Callable[[Obj], list[Obj]], *,
                 allowed_label_domains: Sequence[str]) -> None:
        self.store = store
        self._members = members
        self.allowed_label_domains = tuple(allowed_label_domains)

    def reconcile(self, ns: str, name: str) -> None:
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
                    "spec": {**blueprint(template), "operatingMode": "Running"}}
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


def blueprint(template: Obj) -> Obj:
    """The template's SandboxBlueprint (podTemplate, volumeClaimTemplates, service), with
    the extensions' secure default: no service-account token unless the template says so."""
    tspec = template.get("spec") or {}
    out = {k: copy.deepcopy(tspec[k]) for k in ("podTemplate", "volumeClaimTemplates", "service") if k in tspec}
    out["podTemplate"].setdefault("spec", {}).setdefault("automountServiceAccountToken", False)
    out["podTemplate"].setdefault("metadata", {})
    return out


class _ClaimError(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason, self.message = reason, message
