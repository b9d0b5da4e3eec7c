"""The agent-sandbox API as the emulator serves it (:mod:`.agent_sandbox`): its groups and
resources, the labels and annotations of the published API, the CRDs' schema defaults and
required fields (admission), and the object helpers its controllers share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .objects import ApiError, Obj, now_rfc3339
from .resources import Resource

__all__ = ["ADMISSION", "ASSIGNED", "CLAIMS", "CLAIM_UID", "CORE_GROUP", "CREATED_BY", "EXT_GROUP", "LAUNCH_TYPE",
           "NAME_HASH", "POD_NAME", "POOLS", "PROPAGATED", "RESOURCES", "SANDBOXES", "TEMPLATES", "TEMPLATE_HASH",
           "TEMPLATE_REF", "TEMPLATE_REF_HASH", "VERSION", "WARM_POOL", "name_hash"]

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
