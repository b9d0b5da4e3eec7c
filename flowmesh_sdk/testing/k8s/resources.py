"""What the emulator serves, as discovery tells it: the resources (``/api/v1``,
``/apis/G/V``), the API groups, ``/version`` and the skeleton ``/openapi/v3`` documents
(client-go's ``queryParamVerifierV3`` reads a PATCH operation's
``x-kubernetes-group-version-kind`` and its ``fieldValidation`` parameter to decide that
the server validates; no schemas are served)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .scheduler import git_version
from .objects import Obj, common_fields

__all__ = ["BY_PATH", "POD_SUBRESOURCES", "RESOURCES", "Resource", "api_group", "event_fields", "group_list",
           "openapi_doc", "openapi_group_versions", "parse_bool", "resource_list", "version_info"]


@dataclass(frozen=True)
class Resource:
    """A resource the emulator serves (what discovery says of it)."""

    name: str
    kind: str
    group: str
    namespaced: bool
    verbs: tuple[str, ...]
    short: tuple[str, ...] = ()
    version: str = "v1"

    @property
    def key(self) -> str:
        return f"{self.name}.{self.group}" if self.group else self.name

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def discovery(self) -> Obj:
        out: Obj = {"name": self.name, "singularName": self.kind.lower(), "namespaced": self.namespaced,
                    "kind": self.kind, "verbs": list(self.verbs)}
        if self.short:
            out["shortNames"] = list(self.short)
        return out


_RW = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
RESOURCES = (
    Resource("pods", "Pod", "", True, _RW, ("po",)),
    Resource("nodes", "Node", "", False, ("get", "list", "watch"), ("no",)),
    Resource("namespaces", "Namespace", "", False, ("create", "delete", "get", "list", "patch", "update", "watch"),
             ("ns",)),
    Resource("resourcequotas", "ResourceQuota", "", True, _RW, ("quota",)),
    Resource("events", "Event", "", True, _RW, ("ev",)),
    Resource("secrets", "Secret", "", True, _RW),
    Resource("networkpolicies", "NetworkPolicy", "networking.k8s.io", True, _RW, ("netpol",)),
    Resource("runtimeclasses", "RuntimeClass", "node.k8s.io", False, ("get", "list", "watch")),
)
BY_PATH = {(r.group, r.name): r for r in RESOURCES}
POD_SUBRESOURCES = (
    {"name": "pods/exec", "singularName": "", "namespaced": True, "kind": "PodExecOptions", "verbs": ["create", "get"]},
    {"name": "pods/log", "singularName": "", "namespaced": True, "kind": "Pod", "verbs": ["get"]},
    {"name": "pods/status", "singularName": "", "namespaced": True, "kind": "Pod", "verbs": ["get"]},
    {"name": "pods/eviction", "singularName": "", "namespaced": True, "group": "policy", "version": "v1",
     "kind": "Eviction", "verbs": ["create"]},
)


def parse_bool(value: str | None) -> bool:
    """strconv.ParseBool, as the apiserver reads a boolean query parameter."""
    return (value or "").strip() in ("1", "t", "T", "true", "TRUE", "True")


def version_info(version: str) -> Obj:
    """``/version`` (``version.Info``) of a release ``1.32`` or ``1.32.4``."""
    parts = version.split(".")
    return {"major": parts[0], "minor": parts[1] if len(parts) > 1 else "0", "gitVersion": git_version(version),
            "gitCommit": "0" * 40, "gitTreeState": "clean", "buildDate": "2024-12-11T00:00:00Z",
            "goVersion": "go1.23.4", "compiler": "gc", "platform": "linux/amd64"}


def openapi_group_versions() -> list[str]:
    """The ``/openapi/v3`` paths: ``api/v1``, ``apis/G/V``."""
    return sorted({f"apis/{r.group}/{r.version}" if r.group else f"api/{r.version}" for r in RESOURCES})


def openapi_doc(gv: str, version: str) -> Obj:
    """A skeleton OpenAPI v3 document: the PATCH operations with their
    ``x-kubernetes-group-version-kind`` and the ``fieldValidation`` parameter, which is
    what kubectl looks for to validate on the server (``queryParamVerifierV3``) instead of
    against schemas (none are served)."""
    paths: Obj = {}
    for r in RESOURCES:
        if (f"apis/{r.group}/{r.version}" if r.group else f"api/{r.version}") != gv or "patch" not in r.verbs:
            continue
        base = f"/{gv}/namespaces/{{namespace}}/{r.name}/{{name}}" if r.namespaced else f"/{gv}/{r.name}/{{name}}"
        paths[base] = {"patch": {
            "operationId": f"patch{r.kind}", "x-kubernetes-action": "patch",
            "x-kubernetes-group-version-kind": {"group": r.group, "version": r.version, "kind": r.kind},
            "parameters": [{"name": "fieldValidation", "in": "query", "schema": {"type": "string",
                                                                                 "uniqueItems": True}}]}}
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": git_version(version)},
            "paths": paths, "components": {}}


def group_list(served: Sequence[Resource] = RESOURCES) -> Obj:
    groups = sorted({r.group for r in served if r.group})
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [api_group(g, kind=False, served=served)
                                                                   for g in groups]}


def api_group(group: str, *, kind: bool = True, served: Sequence[Resource] = RESOURCES) -> Obj:
    version = next(r.version for r in served if r.group == group)
    gv = {"groupVersion": f"{group}/{version}", "version": version}
    out: Obj = {"name": group, "versions": [gv], "preferredVersion": gv}
    return {"kind": "APIGroup", "apiVersion": "v1", **out} if kind else out


def resource_list(group: str, version: str, served: Sequence[Resource] = RESOURCES) -> Obj:
    resources = [r.discovery() for r in served if r.group == group]
    if not group:
        resources += [dict(s) for s in POD_SUBRESOURCES]
    return {"kind": "APIResourceList", "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version, "resources": resources}


def event_fields(obj: Obj) -> dict[str, str]:
    """The event fields a field selector can name (``kubectl describe`` asks for
    ``involvedObject.*``)."""
    out = common_fields(obj)
    involved = obj.get("involvedObject") or {}
    for k in ("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath"):
        out[f"involvedObject.{k}"] = str(involved.get(k, ""))
    for k in ("reason", "type", "reportingComponent"):
        out[k] = str(obj.get(k, ""))
    out["source"] = str((obj.get("source") or {}).get("component", ""))
    return out
