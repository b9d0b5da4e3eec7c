"""The emulator's HTTP face: :class:`KubeApi` answers the Kubernetes API paths the package
docstring lists -- the bearer-token check, routing, discovery (``/version``, ``/api``,
``/apis``, health, the OpenAPI skeleton), get, list and watch, every request counted (and
throttled) by the :class:`~.wire.Tally`.  Writes are :mod:`.writes`', a pod's
subresources :mod:`.subresources`'.  :class:`~.server.KubeEmulator` makes one per start,
on that run's store and kubelet, and hands it every request."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from aiohttp import web

from ..httpserver import json_response
from .kubelet import Kubelet
from .objects import ApiError, Obj, ObjectStore, Watcher, status_body
from .resources import BY_PATH, RESOURCES, Resource, api_group, group_list, openapi_doc, openapi_group_versions, \
    parse_bool, resource_list, version_info
from .subresources import PodSubresources
from .tables import table, wants_table
from .wire import Tally, no_route, not_allowed, present, selectors
from .writes import Writes

__all__ = ["KubeApi"]


class KubeApi:
    """The API's request handling (see the module docstring).  ``host`` is the server's
    ``127.0.0.1:PORT``; ``spawn`` runs what outlives a request; ``bookmark_interval_s`` is
    read by every watch (the emulator's attribute of that name sets it)."""

    def __init__(self, store: ObjectStore, kubelet: Kubelet, *, token: str, version: str, emulator_id: str,
                 host: str, runtime_classes: Mapping[str, str], tally: Tally,
                 spawn: Callable[[Awaitable[Any]], None], bookmark_interval_s: float) -> None:
        self.store = store
        self.token = token
        self.version = version
        self.id = emulator_id
        self.host = host
        self.tally = tally
        self.bookmark_interval_s = bookmark_interval_s
        self.writes = Writes(store, kubelet, runtime_classes=runtime_classes, spawn=spawn)
        self.subresources = PodSubresources(store, kubelet, tally=tally, delete_pod=self.writes.delete_pod)
        self.resources: tuple[Resource, ...] = RESOURCES   # what discovery lists and the routes serve
        self.by_path = dict(BY_PATH)

    def serve(self, resources: Sequence[Resource]) -> None:
        """Serve more resources (a CRD's, as :mod:`.agent_sandbox` installs them)."""
        self.resources += tuple(resources)
        self.by_path.update({(r.group, r.name): r for r in resources})

    # ---- routing -----------------------------------------------------------------------------
    async def handle(self, request: web.Request) -> web.StreamResponse:
        try:
            auth = request.headers.get("Authorization", "")
            if auth != f"Bearer {self.token}":
                raise ApiError(401, "Unauthorized", "Unauthorized")
            return await self._dispatch(request)
        except ApiError as exc:
            return json_response(exc.code, exc.body(), headers=exc.headers)
        except (asyncio.CancelledError, ConnectionError, web.HTTPException):
            raise
        except Exception as exc:  # a bug in the emulator answers as the apiserver's InternalError
            msg = f"Internal error occurred: {type(exc).__name__}: {exc}"
            return json_response(500, status_body(500, "InternalError", msg, {"causes": [{"message": str(exc)}]}))

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        tally = self.tally.record
        parts = [p for p in request.path.split("/") if p]
        q = request.query
        if not parts or parts[0] not in ("api", "apis"):
            tally("get", "/" + "/".join(parts))
            return self._nonresource(parts)
        if parts[0] == "api":
            group, version, rest = "", parts[1] if len(parts) > 1 else "", parts[2:]
            if len(parts) == 1:
                tally("get", "/api")
                return json_response(200, {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs":
                                           [{"clientCIDR": "0.0.0.0/0", "serverAddress": self.host}]})
        else:
            if len(parts) == 1:
                tally("get", "/apis")
                return json_response(200, group_list(self.resources))
            group, version, rest = parts[1], parts[2] if len(parts) > 2 else "", parts[3:]
        served = {r.group: r.version for r in self.resources}
        if group not in served or (version and version != served[group]):
            raise no_route()
        if not version:
            tally("get", "/apis/" + group)
            return json_response(200, api_group(group, served=self.resources))
        if not rest:
            tally("get", request.path)
            return json_response(200, resource_list(group, version, self.resources))
        namespace: str | None = None
        if rest[0] == "namespaces" and len(rest) >= 3 and (group, rest[2]) in self.by_path:
            namespace, rest = rest[1], rest[2:]
        res = self.by_path.get((group, rest[0]))
        if res is None or len(rest) > 3 or (namespace is not None and not res.namespaced) \
                or (namespace is None and res.namespaced and len(rest) > 1):
            raise no_route()
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        method = request.method
        if sub is not None:
            return await self.subresources.serve(request, res, namespace or "", name or "", sub)
        if name is None:
            if method == "GET":
                watching = parse_bool(q.get("watch"))
                tally("watch" if watching else "list", res.name)
                if watching:
                    return await self._watch(request, res, namespace)
                return self._list(request, res, namespace)
            if method == "POST":
                tally("create", res.name)
                return await self.writes.create(request, res, namespace)
            if method == "DELETE":
                tally("deletecollection", res.name)
                return await self.writes.delete_collection(request, res, namespace)
            raise not_allowed()
        if method == "GET":
            tally("get", res.name)
            if parse_bool(q.get("watch")):
                raise ApiError.bad_request("watch of a single object: use a list with fieldSelector=metadata.name")
            obj = present(self.store, res, self.store.get(res.key, namespace or "", name))
            if wants_table(request.headers.get("Accept", ""), res.name):
                rv = {"resourceVersion": obj["metadata"]["resourceVersion"]}
                return json_response(200, table(res.name, [obj], rv, q.get("includeObject", "Metadata")))
            return json_response(200, obj)
        if method == "DELETE":
            tally("delete", res.name)
            return await self.writes.delete(request, res, namespace or "", name)
        if method in ("PATCH", "PUT"):
            tally("patch" if method == "PATCH" else "update", res.name)
            return await self.writes.modify(request, res, namespace or "", name)
        raise not_allowed()

    # ---- discovery ---------------------------------------------------------------------------
    def _nonresource(self, parts: list[str]) -> web.StreamResponse:
        path = "/".join(parts)
        if path == "version":
            return json_response(200, version_info(self.version))
        if path in ("healthz", "livez", "readyz"):
            return web.Response(text="ok", content_type="text/plain")
        if path == "openapi/v3":
            return json_response(200, {"paths": {gv: {"serverRelativeURL": f"/openapi/v3/{gv}?hash={self.id}"}
                                                 for gv in openapi_group_versions()}})
        if path.startswith("openapi/v3/") and path[len("openapi/v3/"):] in openapi_group_versions():
            return json_response(200, openapi_doc(path[len("openapi/v3/"):], self.version))
        raise no_route()

    # ---- list and watch ---------------------------------------------------------------------
    def _list(self, request: web.Request, res: Resource, namespace: str | None) -> web.StreamResponse:
        q = request.query
        labels, fields = selectors(request, res)
        try:
            limit = int(q.get("limit") or 0)
        except ValueError:
            raise ApiError.bad_request(f"limit: Invalid value: {q.get('limit')!r}") from None
        items, meta = self.store.list(res.key, namespace, labels, fields, limit, q.get("continue", ""))
        if wants_table(request.headers.get("Accept", ""), res.name):
            return json_response(200, table(res.name, [present(self.store, res, o) for o in items], meta,
                                            q.get("includeObject", "Metadata")))
        return json_response(200, {"kind": f"{res.kind}List", "apiVersion": res.api_version, "metadata": meta,
                                   "items": [present(self.store, res, o, item=True) for o in items]})

    async def _watch(self, request: web.Request, res: Resource, namespace: str | None) -> web.StreamResponse:
        q = request.query
        labels, fields = selectors(request, res)
        rv = q.get("resourceVersion", "")
        initial = parse_bool(q.get("sendInitialEvents"))
        bookmarks = parse_bool(q.get("allowWatchBookmarks"))
        try:
            timeout = float(q.get("timeoutSeconds") or 1800)
        except ValueError:
            raise ApiError.bad_request(f"timeoutSeconds: Invalid value: {q.get('timeoutSeconds')!r}") from None
        since: int | None = None
        if rv not in ("", "0") and not initial:
            try:
                since = int(rv)
            except ValueError:
                raise ApiError.bad_request(f"resourceVersion: Invalid value: {rv!r}: must be an integer") from None
        resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json",
                                                       "Cache-Control": "no-cache, private"})
        resp.enable_chunked_encoding()
        watcher: Watcher | None = None
        error: Obj | None = None
        try:
            watcher = self.store.watch(res.key, namespace, labels, fields, since)
        except ApiError as exc:
            error = exc.body()
        await resp.prepare(request)

        as_table = wants_table(request.headers.get("Accept", ""), res.name)
        include = q.get("includeObject", "Metadata")

        async def send(kind: str, obj: Obj) -> None:
            if as_table and kind in ("ADDED", "MODIFIED", "DELETED"):
                obj = table(res.name, [obj], {"resourceVersion": obj["metadata"].get("resourceVersion", "")}, include)
            await resp.write(json.dumps({"type": kind, "object": obj}).encode() + b"\n")

        loop = asyncio.get_running_loop()
        try:
            if error is not None or watcher is None:
                await send("ERROR", error or {})
                return resp
            initial_left = watcher.queue.qsize() if initial else -1
            if initial_left == 0 and bookmarks:
                await send("BOOKMARK", self._bookmark(res, initial_end=True))
            deadline = loop.time() + timeout
            next_bookmark = loop.time() + self.bookmark_interval_s
            while True:
                now = loop.time()
                if now >= deadline:
                    break
                if request.transport is None or request.transport.is_closing():
                    break
                wait = min(deadline - now, 1.0, max(0.0, next_bookmark - now) if bookmarks else 1.0)
                try:
                    kind, obj = await asyncio.wait_for(watcher.queue.get(), timeout=wait)
                except asyncio.TimeoutError:
                    if bookmarks and loop.time() >= next_bookmark:
                        await send("BOOKMARK", self._bookmark(res))
                        next_bookmark = loop.time() + self.bookmark_interval_s
                    continue
                await send(kind, present(self.store, res, obj))
                if initial_left > 0:
                    initial_left -= 1
                    if initial_left == 0 and bookmarks:
                        await send("BOOKMARK", self._bookmark(res, initial_end=True))
            with contextlib.suppress(ConnectionError):
                await resp.write_eof()
        except (ConnectionError, RuntimeError):
            pass
        finally:
            if watcher is not None:
                self.store.unwatch(watcher)
        return resp

    def _bookmark(self, res: Resource, *, initial_end: bool = False) -> Obj:
        meta: Obj = {"resourceVersion": str(self.store.rv)}
        if initial_end:
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        return {"kind": res.kind, "apiVersion": res.api_version, "metadata": meta}
