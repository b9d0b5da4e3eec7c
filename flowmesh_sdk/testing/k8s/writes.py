"""The API's writes (:class:`Writes`, owned by :class:`.api.KubeApi`): create (names,
labels, namespaces, ``dryRun=All``, the RuntimeClass and quota admission, pod defaults),
PATCH (merge patch) and PUT, DELETE with preconditions and deletecollection; a bound,
running pod's graceful deletion, and a namespace's (marked Terminating, its objects
removed, then it)."""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web

from ..httpserver import json_response
from .admission import default_pod, merge_patch, validate_labels, validate_pod, validate_quota, validate_secret
from .kubelet import Kubelet
from .objects import TERMINAL, ApiError, Obj, ObjectStore, generate_name, name_errors, now_rfc3339, quota_admit
from .resources import RESOURCES, Resource
from .wire import not_allowed, present, read_body, selectors

__all__ = ["Writes", "namespace_object"]


def namespace_object(name: str) -> Obj:
    return {"kind": "Namespace", "apiVersion": "v1",
            "metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name}},
            "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}


class Writes:
    """Create, modify and delete requests on the store; pods go to and from the kubelet.
    ``spawn`` runs what outlives a request (a graceful deletion, a namespace's end)."""

    def __init__(self, store: ObjectStore, kubelet: Kubelet, *, runtime_classes: Mapping[str, str],
                 spawn: Callable[[Awaitable[Any]], None]) -> None:
        self.store = store
        self.kubelet = kubelet
        self.runtime_classes = runtime_classes
        self._spawn = spawn
        # by resource key: what a CRD's schema does on create (defaults, required fields), raising ApiError
        self.admit: dict[str, Callable[[Obj], None]] = {}

    # ---- create -------------------------------------------------------------------------------
    def _require_namespace(self, namespace: str, resource: str, name: str) -> None:
        ns = self.store.peek("namespaces", "", namespace)
        if ns is None:
            raise ApiError.not_found("namespaces", namespace)
        if (ns.get("status") or {}).get("phase") == "Terminating":
            raise ApiError.forbidden(resource, name, f"unable to create new content in namespace {namespace} "
                                                     "because it is being terminated")

    async def create(self, request: web.Request, res: Resource, namespace: str | None) -> web.StreamResponse:
        if "create" not in res.verbs:
            raise not_allowed()
        body = await read_body(request)
        meta = body.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise ApiError.bad_request("metadata must be an object")
        if namespace is not None:
            if meta.get("namespace") not in (None, "", namespace):
                raise ApiError.bad_request("the namespace of the provided object does not match the namespace "
                                           "sent on the request")
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        if meta.get("resourceVersion"):
            raise ApiError.bad_request("resourceVersion should not be set on objects to be created")
        dry = q_dry = request.query.get("dryRun", "")
        if q_dry not in ("", "All"):
            raise ApiError.bad_request(f'Invalid dry run value: "{q_dry}"; supported values: "All"')
        shown = str(meta.get("name") or meta.get("generateName") or "")
        if res.name == "pods":
            self._admit_runtime_class(body, shown)
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = generate_name(str(meta["generateName"]))
        name = str(meta.get("name") or "")
        if not name:
            raise ApiError.invalid(res.kind, "", [("metadata.name", "Required value: name or generateName is "
                                                                    "required")], res.group)
        problems = name_errors(name, label=res.name == "namespaces")
        if problems:
            raise ApiError.invalid(res.kind, name, [("metadata.name", f'Invalid value: "{name}": {p}')
                                                    for p in problems], res.group)
        validate_labels(res.kind, res.group, name, meta)
        if namespace is not None:
            self._require_namespace(namespace, res.key, name)
        body["kind"], body["apiVersion"] = res.kind, res.api_version
        if res.name == "pods":
            default_pod(body)
            validate_pod(body)
            quotas = self.store.items("resourcequotas", namespace)
            quota_admit(body, quotas, self.store.items("pods", namespace))
        elif res.name == "namespaces":
            body = {**namespace_object(name), "metadata": {**meta, "labels": {
                **(meta.get("labels") or {}), "kubernetes.io/metadata.name": name}}}
        elif res.name == "resourcequotas":
            validate_quota(body)
            body.pop("status", None)
        elif res.name == "secrets":
            validate_secret(body)
        elif res.name == "networkpolicies":
            spec = body.setdefault("spec", {})
            spec.setdefault("podSelector", {})
            if not spec.get("policyTypes"):
                spec["policyTypes"] = ["Ingress"] + (["Egress"] if "egress" in spec else [])
        if res.key in self.admit:
            self.admit[res.key](body)
        if dry:
            if self.store.peek(res.key, namespace or "", name) is not None:
                raise ApiError.already_exists(res.name, name, res.group)
            meta.setdefault("creationTimestamp", now_rfc3339())
            return json_response(201, present(self.store, res, body))
        created = self.store.create(res.key, body)
        if res.name == "pods":
            self.kubelet.admit(created)
        return json_response(201, present(self.store, res, created))

    def create_pod(self, body: Obj) -> Obj:
        """A pod a controller makes (:mod:`.agent_sandbox`'s): the admission and defaults of a
        create through the API (RuntimeClass, quota), then the kubelet; raises ApiError."""
        meta = body["metadata"]
        self._admit_runtime_class(body, str(meta["name"]))
        body["kind"], body["apiVersion"] = "Pod", "v1"
        default_pod(body)
        validate_pod(body)
        namespace = str(meta["namespace"])
        quota_admit(body, self.store.items("resourcequotas", namespace), self.store.items("pods", namespace))
        created = self.store.create("pods", body)
        self.kubelet.admit(created)
        return created

    def _admit_runtime_class(self, pod: Obj, shown: str) -> None:
        handler = (pod.get("spec") or {}).get("runtimeClassName")
        if handler and handler not in self.runtime_classes:
            raise ApiError.forbidden("pods", shown, f'pod rejected: RuntimeClass "{handler}" not found')

    # ---- modify -------------------------------------------------------------------------------
    async def modify(self, request: web.Request, res: Resource, namespace: str, name: str) -> web.StreamResponse:
        """PATCH (JSON merge patch; a strategic merge patch is applied as one) or PUT.  Pods
        take changes to labels and annotations only."""
        if "patch" not in res.verbs:
            raise not_allowed()
        body = await read_body(request)
        current = self.store.get(res.key, namespace, name)
        if request.method == "PATCH":
            ctype = request.content_type
            if ctype not in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
                raise ApiError(415, "UnsupportedMediaType", f"the body of the request was in an unknown format - "
                                                            f"accepted media types include: "
                                                            f"application/merge-patch+json, "
                                                            f"application/strategic-merge-patch+json "
                                                            f"(the k8s emulator's; got {ctype})")
            wanted = merge_patch(copy.deepcopy(current), body)
        else:
            wanted = body
            rv = (body.get("metadata") or {}).get("resourceVersion")
            if rv and rv != current["metadata"]["resourceVersion"]:
                raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {res.key} "{name}": the object '
                                                f'has been modified; please apply your changes to the latest '
                                                f'version and try again', {"name": name, "kind": res.name})
        wmeta = wanted.get("metadata") or {}
        validate_labels(res.kind, res.group, name, wmeta)
        if res.name == "secrets":
            wanted.setdefault("metadata", {}).setdefault("name", name)
            validate_secret(wanted)
            if wanted["type"] != current.get("type", "Opaque"):
                raise ApiError.invalid("Secret", name, [("type", f'Invalid value: "{wanted["type"]}": field is '
                                                                 "immutable")])
        if res.name == "pods":
            changed = [k for k in ("spec",) if k in wanted and wanted[k] != current.get(k)]
            if changed:
                raise ApiError.invalid("Pod", name, [("spec", "Forbidden: pod updates may not change fields other "
                                                              "than labels and annotations in the k8s emulator")])

        def mutate(obj: Obj) -> None:
            for k in ("labels", "annotations"):
                if wmeta.get(k):
                    obj["metadata"][k] = dict(wmeta[k])
                else:
                    obj["metadata"].pop(k, None)
            if res.name != "pods" and "spec" in wanted:
                obj["spec"] = wanted["spec"]
            if res.name == "secrets":
                obj["data"], obj["type"] = wanted["data"], wanted["type"]
        out = self.store.update(res.key, namespace, name, mutate)
        assert out is not None
        return json_response(200, present(self.store, res, out))

    # ---- deletes ------------------------------------------------------------------------------
    async def _delete_options(self, request: web.Request) -> Obj:
        opts = await read_body(request)
        if "gracePeriodSeconds" in request.query:
            try:
                opts["gracePeriodSeconds"] = int(request.query["gracePeriodSeconds"])
            except ValueError:
                raise ApiError.bad_request("gracePeriodSeconds must be an integer") from None
        return opts

    async def delete(self, request: web.Request, res: Resource, namespace: str, name: str) -> web.StreamResponse:
        if "delete" not in res.verbs:
            raise not_allowed()
        opts = await self._delete_options(request)
        current = self.store.get(res.key, namespace, name)
        pre = opts.get("preconditions") or {}
        for k in ("uid", "resourceVersion"):
            if pre.get(k) and pre[k] != current["metadata"].get(k):
                raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {res.key} "{name}": '
                                                f'Precondition failed: {k}: {pre[k]}, {k} in object meta: '
                                                f'{current["metadata"].get(k)}', {"name": name, "kind": res.name})
        if res.name == "pods":
            return json_response(200, present(self.store, res, await self.delete_pod(current, opts)))
        if res.name == "namespaces":
            return json_response(200, present(self.store, res, self._delete_namespace(current)))
        gone = self.store.delete(res.key, namespace, name)
        return json_response(200, present(self.store, res, gone or current))

    async def delete_collection(self, request: web.Request, res: Resource,
                                namespace: str | None) -> web.StreamResponse:
        if "deletecollection" not in res.verbs:
            raise not_allowed()
        opts = await self._delete_options(request)
        labels, fields = selectors(request, res)
        items, _ = self.store.list(res.key, namespace, labels, fields)
        out = []
        for obj in items:
            if res.name == "pods":
                out.append(await self.delete_pod(obj, opts))
            else:
                out.append(self.store.delete(res.key, obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
                           or obj)
        return json_response(200, {"kind": f"{res.kind}List", "apiVersion": res.api_version,
                                   "metadata": {"resourceVersion": str(self.store.rv)},
                                   "items": [present(self.store, res, o, item=True) for o in out]})

    async def delete_pod(self, pod: Obj, opts: Obj) -> Obj:
        """Graceful deletion of a bound, running pod: marked (deletionTimestamp) and answered
        at once, its container removed, then the object.  A pod that is not bound or has
        ended, or a grace period of 0, goes before the answer."""
        meta = pod["metadata"]
        grace = opts.get("gracePeriodSeconds")
        if grace is None:
            grace = (pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
        grace = max(0, int(grace))
        bound = bool((pod.get("spec") or {}).get("nodeName"))
        ended = (pod.get("status") or {}).get("phase") in TERMINAL
        if grace == 0 or not bound or ended:
            return await self._remove_pod(pod)
        if meta.get("deletionTimestamp"):
            return pod

        def mark(p: Obj) -> None:
            p["metadata"]["deletionTimestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + grace))
            p["metadata"]["deletionGracePeriodSeconds"] = grace
        marked = self.store.update("pods", meta["namespace"], meta["name"], mark, uid=meta["uid"])
        self._spawn(self._remove_pod(marked or pod))
        return marked or pod

    async def _remove_pod(self, pod: Obj) -> Obj:
        meta = pod["metadata"]
        await self.kubelet.remove(pod)
        gone = self.store.delete("pods", meta["namespace"], meta["name"], uid=meta["uid"])
        self.kubelet.schedule()
        return gone or pod

    def _delete_namespace(self, ns: Obj) -> Obj:
        name = ns["metadata"]["name"]
        if name in ("default", "kube-system", "kube-public"):
            raise ApiError.forbidden("namespaces", name, "this namespace may not be deleted")
        if ns.get("status", {}).get("phase") == "Terminating":
            return ns

        def mark(obj: Obj) -> None:
            obj["metadata"]["deletionTimestamp"] = now_rfc3339()
            obj["status"] = {"phase": "Terminating"}
        marked = self.store.update("namespaces", "", name, mark) or ns

        async def finalize() -> None:
            await asyncio.gather(*(self._remove_pod(copy.deepcopy(p)) for p in self.store.items("pods", name)))
            for r in RESOURCES:
                if r.namespaced and r.name != "pods":
                    for obj in list(self.store.items(r.key, name)):
                        self.store.delete(r.key, name, obj["metadata"]["name"])
            self.store.delete("namespaces", "", name)
        self._spawn(finalize())
        return marked
