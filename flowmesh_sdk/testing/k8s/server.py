"""The emulator's HTTP face: :class:`KubeEmulator`, an :class:`~flowmesh_sdk.testing.httpserver.HttpServer`
answering the Kubernetes API paths the package docstring lists."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import json
import os
import secrets
import shutil
import ssl
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from aiohttp import web

from .. import hygiene
from ..httpserver import HttpServer, json_response
from ..sshd import LoopbackSshd
from .admission import default_pod, merge_patch, validate_labels, validate_pod, validate_quota
from .exec import negotiate, serve_exec
from .kubelet import DEFAULT_NODES, Kubelet, Node, node_object, set_condition
from .objects import TERMINAL, ApiError, FieldSelector, LabelSelector, Obj, ObjectStore, Watcher, common_fields, \
    generate_name, name_errors, now_rfc3339, pod_fields, quota_admit, quota_used, status_body
from .resources import BY_PATH, RESOURCES, Resource, api_group, event_fields, group_list, openapi_doc, \
    openapi_group_versions, parse_bool, resource_list, version_info
from .tables import table, wants_table

__all__ = ["KubeEmulator"]

_TOO_MANY = "Too many requests, please try again later."   # the apiserver's max-in-flight / APF answer


class KubeEmulator(HttpServer):
    """A TEST FIXTURE emulating a Kubernetes API server whose pods are podman containers
    (the package docstring says what it serves and how)."""

    name = "k8s-emulator"

    def __init__(self, *, nodes: Sequence[Node] = DEFAULT_NODES, token: str = "fm-test-token", version: str = "1.32",
                 runtime_classes: Mapping[str, str] | None = None, pull_backoff_s: float = 10.0,
                 restart_backoff_s: float = 10.0, bookmark_interval_s: float = 5.0, history: int = 10000,
                 tls: bool = True, port: int = 0) -> None:
        super().__init__(port=port)
        if not nodes:
            raise ValueError("a cluster needs at least one node")
        self.nodes = tuple(nodes)
        self.token = token
        self.version = version
        self.runtime_classes = dict(runtime_classes or {})
        self.bookmark_interval_s = bookmark_interval_s
        self.id = secrets.token_hex(6)
        self._history = history
        self.store = ObjectStore(history)
        self._pull_backoff_s = pull_backoff_s
        self._restart_backoff_s = restart_backoff_s
        self._tmp: Path | None = None
        self._kubelet: Kubelet | None = None
        self._counts: Counter[tuple[str, str]] = Counter()
        self._throttle = 0
        self._retry_after = 1
        self._throttle_plain = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self.tls = tls
        self.ssl_context: ssl.SSLContext | None = None

    # ---- lifecycle ---------------------------------------------------------------------
    @property
    def store_root(self) -> Path:
        """The emulator's container store (``storage.conf``/``containers.conf`` inside);
        give it to :func:`~flowmesh_sdk.testing.hygiene.podman` to look at its containers."""
        if self._tmp is None:
            raise RuntimeError(f"{self.name} is not running")
        return self._tmp / "containers"

    @property
    def url(self) -> str:
        """``https://127.0.0.1:PORT`` (``http://`` with ``tls=False``)."""
        return f"{'https' if self.tls else 'http'}://{self.host}"

    @property
    def ca_cert(self) -> Path:
        """The server's self-signed certificate (PEM): the CA a client verifies it with."""
        if self._tmp is None or not self.tls:
            raise RuntimeError(f"{self.name} is not running with TLS")
        return self._tmp / "tls" / "server.crt"

    def _make_cert(self) -> ssl.SSLContext:
        """A self-signed certificate for 127.0.0.1 and localhost (the ``openssl`` CLI)."""
        assert self._tmp is not None
        tls = self._tmp / "tls"
        tls.mkdir(mode=0o700)
        openssl = shutil.which("openssl")
        if openssl is None:
            raise RuntimeError("the k8s emulator's TLS needs the openssl command: apt-get install -y openssl")
        proc = subprocess.run([openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                               "-nodes", "-sha256", "-days", "7", "-subj", "/CN=flowmesh-k8s-emulator",
                               "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
                               "-keyout", str(tls / "server.key"), "-out", str(tls / "server.crt")],
                              capture_output=True, text=True, timeout=60)
        if proc.returncode != 0:
            raise RuntimeError(f"openssl req failed: {proc.stderr.strip()[-500:]}")
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(tls / "server.crt", tls / "server.key")
        return ctx

    @property
    def kubelet(self) -> Kubelet:
        if self._kubelet is None:
            raise RuntimeError(f"{self.name} is not running")
        return self._kubelet

    def start(self) -> KubeEmulator:
        if self.running:
            return self
        self.store = ObjectStore(self._history)   # a start after a stop is a new cluster
        self._counts.clear()
        self._tmp = Path(tempfile.mkdtemp(prefix="fm-k8s-"))
        root = self._tmp / "containers"
        LoopbackSshd._write_container_confs(root)
        hygiene.STORES.add(root)
        try:
            if self.tls:
                self.ssl_context = self._make_cert()
            super().start()
        except BaseException:
            self._wipe()
            raise
        return self

    async def on_start(self) -> None:
        self._kubelet = Kubelet(self.store, self.nodes, root=self.store_root, emulator_id=self.id,
                                version=self.version, runtime_classes=self.runtime_classes,
                                pull_backoff_s=self._pull_backoff_s, restart_backoff_s=self._restart_backoff_s)
        for ns in ("default", "kube-system", "kube-public", "kube-node-lease"):
            self.store.create("namespaces", self._namespace_object(ns))
        for node in self.nodes:
            self.store.create("nodes", node_object(node, self.version))
        for name, handler in sorted(self.runtime_classes.items()):
            self.store.create("runtimeclasses.node.k8s.io", {"kind": "RuntimeClass", "apiVersion": "node.k8s.io/v1",
                                                             "metadata": {"name": name}, "handler": handler})

    async def on_stop(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        if self._kubelet is not None:
            await self._kubelet.shutdown()

    def stop(self) -> None:
        """Stop serving, end every container of the store and every process working in it
        (podman commands, conmons, their cleanups), then delete the store; raises (keeping
        the store for the session's leak check) if something of it would not end."""
        if self._kubelet is not None and self._loop.loop is not None:
            with contextlib.suppress(Exception):   # first, while the loop runs: no pod task starts podman again
                self.call(self._kubelet.shutdown(), timeout=60)
        super().stop()
        self._wipe()

    def _wipe(self, timeout_s: float = 30.0) -> None:
        """``LoopbackSshd._end_host``'s way: what still works in the store is killed, its
        containers removed, and nothing of it may be left alive before it is deleted."""
        tmp = self._tmp
        if tmp is None:
            return
        root = tmp / "containers"
        mark = f"={tmp}/"   # CONTAINERS_STORAGE_CONF/CONTAINERS_CONF: every podman of the store, and its conmons
        procs = hygiene.processes()
        mine = hygiene.tagged(procs, mark)
        conmons = {p for p in mine if procs[p].comm == "conmon"} | hygiene.conmons_of(procs, root)
        commands = hygiene.with_descendants(procs, mine - conmons) - hygiene.with_descendants(procs, conmons)
        hygiene.kill(commands)
        hygiene.wait_gone(commands, timeout_s)
        if (root / "graph").is_dir() and shutil.which("podman"):
            for _ in range(3):   # a runtime still letting go of a mount ("device or resource busy"): again
                res = hygiene.podman(root, "rm", "-af", "-t", "0")
                left = hygiene.containers(root)
                if not left:
                    break
                time.sleep(1)
            if left:
                raise RuntimeError(f"{self.name}: podman rm -af in {root} failed ({res.stderr.strip()}); "
                                   f"containers left: {', '.join(map(str, left))}")
        deadline = time.monotonic() + timeout_s
        while True:
            procs = hygiene.processes()
            alive = hygiene.with_descendants(procs, hygiene.tagged(procs, mark) | hygiene.conmons_of(procs, root))
            if not alive or time.monotonic() >= deadline:
                break
            hygiene.wait_gone(alive, deadline - time.monotonic())
        if alive:
            raise RuntimeError(f"{self.name}: still running after its containers were removed: "
                               + "; ".join(str(procs[p]) for p in sorted(alive) if p in procs))
        hygiene.unmount_under(tmp)
        shutil.rmtree(tmp, ignore_errors=True)
        hygiene.STORES.discard(root)
        self._tmp = None
        self._kubelet = None

    # ---- helpers for tests ---------------------------------------------------------------
    def kubeconfig(self, path: str | os.PathLike[str], context: str = "emu", namespace: str = "default") -> Path:
        """Write a kubeconfig (server :attr:`url` with the emulator's certificate as its CA,
        a token user) that kubectl and ``kubernetes.config.load_kube_config`` read; returns
        its path.  (kubectl sends a kubeconfig's credentials over TLS only: clientcmd drops
        them for an ``http://`` server, hence TLS by default.)"""
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        cluster: Obj = {"server": self.url}
        if self.tls:
            cluster["certificate-authority-data"] = base64.b64encode(self.ca_cert.read_bytes()).decode()
        config = {"apiVersion": "v1", "kind": "Config", "preferences": {},
                  "clusters": [{"name": context, "cluster": cluster}],
                  "users": [{"name": context, "user": {"token": self.token}}],
                  "contexts": [{"name": context, "context": {"cluster": context, "user": context,
                                                             "namespace": namespace}}],
                  "current-context": context}
        out.write_text(json.dumps(config, indent=2) + "\n")
        os.chmod(out, 0o600)
        return out

    def api_client(self) -> Any:
        """A ``kubernetes.client.ApiClient`` for this emulator (the official client)."""
        from kubernetes import client

        cfg = client.Configuration()
        cfg.host = self.url
        cfg.api_key = {"authorization": self.token}
        cfg.api_key_prefix = {"authorization": "Bearer"}
        if self.tls:
            cfg.ssl_ca_cert = str(self.ca_cert)
        return client.ApiClient(cfg)

    def pods(self, namespace: str | None = None) -> list[Obj]:
        """Every pod (copies), or a namespace's."""
        return self.call(self._copy_items("pods", namespace))

    def pod(self, namespace: str, name: str) -> Obj:
        async def get() -> Obj:
            return self.store.get("pods", namespace, name)
        return self.call(get())

    async def _copy_items(self, resource: str, namespace: str | None) -> list[Obj]:
        return [copy.deepcopy(o) for o in self.store.items(resource, namespace)]

    def container_name(self, namespace: str, name: str) -> str:
        """The podman container (name) that runs a pod."""
        return self.kubelet.container_name(self.pod(namespace, name))

    @property
    def pulls(self) -> list[str]:
        """Every image pull the kubelet started, in order."""
        return list(self.kubelet.pulls)

    # ---- switches --------------------------------------------------------------------------
    def throttle(self, n: int, retry_after: int = 1, *, plain: bool = False) -> None:
        """The next ``n`` authenticated requests answer 429 with ``Retry-After``, a Status
        (reason TooManyRequests) or, ``plain``, the text the apiserver's max-in-flight and
        priority-and-fairness filters write."""
        self._throttle, self._retry_after, self._throttle_plain = n, retry_after, plain

    def count(self, verb: str, resource: str) -> int:
        """Requests served for ``verb`` on ``resource`` (``get``, ``list``, ``watch``,
        ``create``, ``update``, ``patch``, ``delete``, ``deletecollection``; ``exec`` and
        ``attach`` on ``pods``; subresources as ``pods/log``, ``pods/status``,
        ``pods/eviction``).  Every authenticated request counts, a throttled one too."""
        return self._counts[(verb, resource)]

    def counts(self) -> dict[tuple[str, str], int]:
        return dict(self._counts)

    def reset_counts(self) -> None:
        self._counts.clear()

    @property
    def pull_backoff_s(self) -> float:
        return self.kubelet.pull_backoff_s if self._kubelet else self._pull_backoff_s

    @pull_backoff_s.setter
    def pull_backoff_s(self, value: float) -> None:
        self._pull_backoff_s = value
        if self._kubelet is not None:
            self._kubelet.pull_backoff_s = value

    @property
    def restart_backoff_s(self) -> float:
        return self.kubelet.restart_backoff_s if self._kubelet else self._restart_backoff_s

    @restart_backoff_s.setter
    def restart_backoff_s(self, value: float) -> None:
        self._restart_backoff_s = value
        if self._kubelet is not None:
            self._kubelet.restart_backoff_s = value

    def fail_pulls(self, on: bool = True, message: str = "dial tcp: connect: connection refused") -> None:
        """Every pull an image not in the store needs fails with ``message`` (the nodes cannot
        reach the registry, which the coordinator still can): ErrImagePull, then ImagePullBackOff."""
        async def go() -> None:
            self.kubelet.refuse_pulls = (f"pinging container registry: {message}") if on else None
        self.call(go())

    def evict(self, namespace: str, name: str, reason: str = "Evicted",
              message: str = "The node was low on resource: memory. Threshold quantity: 100Mi, available: 0. ") -> Obj:
        """The kubelet evicts a pod (module docstring of ``kubelet``); returns the pod."""
        return self.call(self.kubelet.evict(namespace, name, reason, message), timeout=60)

    def lose_node(self, name: str) -> None:
        """The node stops reporting: Ready Unknown, its pods' containers killed, the pods
        marked Failed with reason NodeLost."""
        self.call(self.kubelet.lose_node(name), timeout=60)

    def restore_node(self, name: str) -> None:
        async def go() -> None:
            self.kubelet.restore_node(name)
        self.call(go())

    def compact(self) -> int:
        """Forget the watch history (an etcd compaction); returns the resourceVersion from
        which watches can still start."""
        async def go() -> int:
            return self.store.compact()
        return self.call(go())

    # ---- objects ----------------------------------------------------------------------------
    def _namespace_object(self, name: str) -> Obj:
        return {"kind": "Namespace", "apiVersion": "v1",
                "metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name}},
                "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}

    def _present(self, res: Resource, obj: Obj, *, item: bool = False) -> Obj:
        """An object as it goes out: kind/apiVersion (not on list items), computed status."""
        out = copy.deepcopy(obj)
        if res.name == "resourcequotas":
            hard = (out.get("spec") or {}).get("hard") or {}
            pods = self.store.items("pods", out["metadata"].get("namespace"))
            out["status"] = {"hard": dict(hard), "used": quota_used(out, pods)}
        if item:
            out.pop("kind", None)
            out.pop("apiVersion", None)
        else:
            out = {"kind": res.kind, "apiVersion": res.api_version, **out}
        return out

    # ---- routing -----------------------------------------------------------------------------
    def routes(self, app: web.Application) -> None:
        app.router.add_route("*", "/{tail:.*}", self.handle)

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

    def _tally(self, verb: str, resource: str) -> None:
        self._counts[(verb, resource)] += 1
        if self._throttle > 0:
            self._throttle -= 1
            headers = {"Retry-After": str(self._retry_after)}
            if self._throttle_plain:
                raise web.HTTPTooManyRequests(text=_TOO_MANY + "\n", headers=headers)
            raise ApiError(429, "TooManyRequests", _TOO_MANY, {"retryAfterSeconds": self._retry_after}, headers)

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        parts = [p for p in request.path.split("/") if p]
        q = request.query
        if not parts or parts[0] not in ("api", "apis"):
            self._tally("get", "/" + "/".join(parts))
            return self._nonresource(parts)
        if parts[0] == "api":
            group, version, rest = "", parts[1] if len(parts) > 1 else "", parts[2:]
            if len(parts) == 1:
                self._tally("get", "/api")
                return json_response(200, {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs":
                                           [{"clientCIDR": "0.0.0.0/0", "serverAddress": self.host}]})
        else:
            if len(parts) == 1:
                self._tally("get", "/apis")
                return json_response(200, group_list())
            group, version, rest = parts[1], parts[2] if len(parts) > 2 else "", parts[3:]
        served = {r.group: r.version for r in RESOURCES}
        if group not in served or (version and version != served[group]):
            raise self._no_route()
        if not version:
            self._tally("get", "/apis/" + group)
            return json_response(200, api_group(group))
        if not rest:
            self._tally("get", request.path)
            return json_response(200, resource_list(group, version))
        namespace: str | None = None
        if rest[0] == "namespaces" and len(rest) >= 3 and (group, rest[2]) in BY_PATH:
            namespace, rest = rest[1], rest[2:]
        res = BY_PATH.get((group, rest[0]))
        if res is None or len(rest) > 3 or (namespace is not None and not res.namespaced) \
                or (namespace is None and res.namespaced and len(rest) > 1):
            raise self._no_route()
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        method = request.method
        if sub is not None:
            return await self._subresource(request, res, namespace or "", name or "", sub)
        if name is None:
            if method == "GET":
                watching = parse_bool(q.get("watch"))
                self._tally("watch" if watching else "list", res.name)
                if watching:
                    return await self._watch(request, res, namespace)
                return self._list(request, res, namespace)
            if method == "POST":
                self._tally("create", res.name)
                return await self._create(request, res, namespace)
            if method == "DELETE":
                self._tally("deletecollection", res.name)
                return await self._delete_collection(request, res, namespace)
            raise self._not_allowed()
        if method == "GET":
            self._tally("get", res.name)
            if parse_bool(q.get("watch")):
                raise ApiError.bad_request("watch of a single object: use a list with fieldSelector=metadata.name")
            obj = self._present(res, self.store.get(res.key, namespace or "", name))
            if wants_table(request.headers.get("Accept", ""), res.name):
                rv = {"resourceVersion": obj["metadata"]["resourceVersion"]}
                return json_response(200, table(res.name, [obj], rv, q.get("includeObject", "Metadata")))
            return json_response(200, obj)
        if method == "DELETE":
            self._tally("delete", res.name)
            return await self._delete(request, res, namespace or "", name)
        if method in ("PATCH", "PUT"):
            self._tally("patch" if method == "PATCH" else "update", res.name)
            return await self._modify(request, res, namespace or "", name)
        raise self._not_allowed()

    @staticmethod
    def _no_route() -> ApiError:
        return ApiError(404, "NotFound", "the server could not find the requested resource", {})

    @staticmethod
    def _not_allowed() -> ApiError:
        return ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource",
                        {})

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
        raise self._no_route()

    # ---- list and watch ---------------------------------------------------------------------
    def _selectors(self, request: web.Request, res: Resource) -> tuple[LabelSelector, FieldSelector]:
        q = request.query
        fields = pod_fields if res.name == "pods" else (event_fields if res.name == "events" else common_fields)
        labels = LabelSelector(q.get("labelSelector", ""))
        sel = FieldSelector(q.get("fieldSelector", ""), fields)
        sample: Obj = {"metadata": {"name": "", "namespace": ""}, "spec": {}, "status": {}}
        sel.check(sample)
        return labels, sel

    def _list(self, request: web.Request, res: Resource, namespace: str | None) -> web.StreamResponse:
        q = request.query
        labels, fields = self._selectors(request, res)
        try:
            limit = int(q.get("limit") or 0)
        except ValueError:
            raise ApiError.bad_request(f"limit: Invalid value: {q.get('limit')!r}") from None
        items, meta = self.store.list(res.key, namespace, labels, fields, limit, q.get("continue", ""))
        if wants_table(request.headers.get("Accept", ""), res.name):
            return json_response(200, table(res.name, [self._present(res, o) for o in items], meta,
                                            q.get("includeObject", "Metadata")))
        return json_response(200, {"kind": f"{res.kind}List", "apiVersion": res.api_version, "metadata": meta,
                                   "items": [self._present(res, o, item=True) for o in items]})

    async def _watch(self, request: web.Request, res: Resource, namespace: str | None) -> web.StreamResponse:
        q = request.query
        labels, fields = self._selectors(request, res)
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
                await send(kind, self._present(res, obj))
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

    # ---- writes -------------------------------------------------------------------------------
    async def _body(self, request: web.Request) -> Obj:
        raw = await request.read()
        if not raw:
            return {}
        try:
            body = json.loads(raw)
        except ValueError as exc:
            raise ApiError.bad_request(f"the object provided is unrecognized (must be of type JSON): {exc}") from None
        if not isinstance(body, dict):
            raise ApiError.bad_request("the object provided is not a JSON object")
        return body

    def _require_namespace(self, namespace: str, resource: str, name: str) -> None:
        ns = self.store.peek("namespaces", "", namespace)
        if ns is None:
            raise ApiError.not_found("namespaces", namespace)
        if (ns.get("status") or {}).get("phase") == "Terminating":
            raise ApiError.forbidden(resource, name, f"unable to create new content in namespace {namespace} "
                                                     "because it is being terminated")

    async def _create(self, request: web.Request, res: Resource, namespace: str | None) -> web.StreamResponse:
        if "create" not in res.verbs:
            raise self._not_allowed()
        body = await self._body(request)
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
            body = {**self._namespace_object(name), "metadata": {**meta, "labels": {
                **(meta.get("labels") or {}), "kubernetes.io/metadata.name": name}}}
        elif res.name == "resourcequotas":
            validate_quota(body)
            body.pop("status", None)
        elif res.name == "networkpolicies":
            spec = body.setdefault("spec", {})
            spec.setdefault("podSelector", {})
            if not spec.get("policyTypes"):
                spec["policyTypes"] = ["Ingress"] + (["Egress"] if "egress" in spec else [])
        if dry:
            if self.store.peek(res.key, namespace or "", name) is not None:
                raise ApiError.already_exists(res.name, name, res.group)
            meta.setdefault("creationTimestamp", now_rfc3339())
            return json_response(201, self._present(res, body))
        created = self.store.create(res.key, body)
        if res.name == "pods":
            self.kubelet.admit(created)
        return json_response(201, self._present(res, created))

    def _admit_runtime_class(self, pod: Obj, shown: str) -> None:
        handler = (pod.get("spec") or {}).get("runtimeClassName")
        if handler and handler not in self.runtime_classes:
            raise ApiError.forbidden("pods", shown, f'pod rejected: RuntimeClass "{handler}" not found')

    async def _modify(self, request: web.Request, res: Resource, namespace: str, name: str) -> web.StreamResponse:
        """PATCH (JSON merge patch; a strategic merge patch is applied as one) or PUT.  Pods
        take changes to labels and annotations only."""
        if "patch" not in res.verbs:
            raise self._not_allowed()
        body = await self._body(request)
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
        out = self.store.update(res.key, namespace, name, mutate)
        assert out is not None
        return json_response(200, self._present(res, out))

    # ---- deletes ------------------------------------------------------------------------------
    async def _delete_options(self, request: web.Request) -> Obj:
        opts = await self._body(request)
        if "gracePeriodSeconds" in request.query:
            try:
                opts["gracePeriodSeconds"] = int(request.query["gracePeriodSeconds"])
            except ValueError:
                raise ApiError.bad_request("gracePeriodSeconds must be an integer") from None
        return opts

    async def _delete(self, request: web.Request, res: Resource, namespace: str, name: str) -> web.StreamResponse:
        if "delete" not in res.verbs:
            raise self._not_allowed()
        opts = await self._delete_options(request)
        current = self.store.get(res.key, namespace, name)
        pre = opts.get("preconditions") or {}
        for k in ("uid", "resourceVersion"):
            if pre.get(k) and pre[k] != current["metadata"].get(k):
                raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {res.key} "{name}": '
                                                f'Precondition failed: {k}: {pre[k]}, {k} in object meta: '
                                                f'{current["metadata"].get(k)}', {"name": name, "kind": res.name})
        if res.name == "pods":
            return json_response(200, self._present(res, await self._delete_pod(current, opts)))
        if res.name == "namespaces":
            return json_response(200, self._present(res, self._delete_namespace(current)))
        gone = self.store.delete(res.key, namespace, name)
        return json_response(200, self._present(res, gone or current))

    async def _delete_collection(self, request: web.Request, res: Resource,
                                 namespace: str | None) -> web.StreamResponse:
        if "deletecollection" not in res.verbs:
            raise self._not_allowed()
        opts = await self._delete_options(request)
        labels, fields = self._selectors(request, res)
        items, _ = self.store.list(res.key, namespace, labels, fields)
        out = []
        for obj in items:
            if res.name == "pods":
                out.append(await self._delete_pod(obj, opts))
            else:
                out.append(self.store.delete(res.key, obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
                           or obj)
        return json_response(200, {"kind": f"{res.kind}List", "apiVersion": res.api_version,
                                   "metadata": {"resourceVersion": str(self.store.rv)},
                                   "items": [self._present(res, o, item=True) for o in out]})

    async def _delete_pod(self, pod: Obj, opts: Obj) -> Obj:
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

    def _spawn(self, coro: Any) -> None:
        task: asyncio.Task[Any] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---- pod subresources ---------------------------------------------------------------------
    async def _subresource(self, request: web.Request, res: Resource, namespace: str, name: str,
                           sub: str) -> web.StreamResponse:
        if res.name != "pods" or sub not in ("status", "log", "exec", "eviction", "attach"):
            raise self._no_route()
        method = request.method
        if sub == "status":
            self._tally("get", "pods/status")
            if method != "GET":
                raise self._not_allowed()
            return json_response(200, self._present(res, self.store.get("pods", namespace, name)))
        if sub == "eviction":
            self._tally("create", "pods/eviction")
            if method != "POST":
                raise self._not_allowed()
            return await self._eviction(request, namespace, name)
        if sub == "log":
            self._tally("get", "pods/log")
            if method != "GET":
                raise self._not_allowed()
            return await self._log(request, namespace, name)
        self._tally(sub, "pods")
        if method not in ("GET", "POST"):
            raise self._not_allowed()
        if sub == "attach":
            raise ApiError.bad_request("pods/attach is not served by the k8s emulator; use pods/exec")
        return await self._exec(request, namespace, name)

    async def _eviction(self, request: web.Request, namespace: str, name: str) -> web.StreamResponse:
        body = await self._body(request)
        pod = self.store.get("pods", namespace, name)
        bmeta = body.get("metadata") or {}
        if bmeta.get("name") not in (None, name):
            raise ApiError.bad_request(f"name in URL does not match name in Eviction object")
        opts = dict(body.get("deleteOptions") or {})
        if (pod.get("status") or {}).get("phase") not in TERMINAL:
            meta = pod["metadata"]

            def disrupt(p: Obj) -> None:
                set_condition(p, "DisruptionTarget", "True", "EvictionByEvictionAPI", "Eviction API: evicting")
            pod = self.store.update("pods", namespace, name, disrupt, uid=meta["uid"]) or pod
        await self._delete_pod(pod, opts)
        return json_response(201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                                   "code": 201})

    def _running_container(self, pod: Obj, container: str | None, *, action: str) -> str:
        """The podman container of a pod that can be exec'd into (ApiError 400 otherwise)."""
        meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
        names = [c.get("name") for c in spec.get("containers") or []]
        if container and container not in names:
            raise ApiError.bad_request(f"container {container} is not valid for pod {meta['name']}")
        if status.get("phase") in TERMINAL:
            raise ApiError.bad_request(f"cannot {action} into a container in a completed pod; current phase is "
                                       f"{status['phase']}")
        if not spec.get("nodeName"):
            raise ApiError.bad_request(f"pod {meta['name']} does not have a host assigned")
        if not self.kubelet.container_id(pod):
            raise ApiError.bad_request(f'unable to upgrade connection: container not found ("{names[0]}")')
        return self.kubelet.container_name(pod)

    async def _exec(self, request: web.Request, namespace: str, name: str) -> web.StreamResponse:
        q = request.query
        pod = self.store.get("pods", namespace, name)
        argv = q.getall("command", [])
        if not argv:
            raise ApiError.bad_request("you must specify at least one command for the container")
        stdin, stdout, stderr, tty = (parse_bool(q.get(k)) for k in ("stdin", "stdout", "stderr", "tty"))
        if not (stdin or stdout or stderr):
            raise ApiError.bad_request("you must specify at least 1 of stdin, stdout, stderr")
        container = self._running_container(pod, q.get("container"), action="exec")
        if request.headers.get("Upgrade", "").lower() != "websocket":
            raise ApiError.bad_request("Upgrade request required (the k8s emulator serves exec over WebSocket: "
                                       "v5.channel.k8s.io or v4.channel.k8s.io; no SPDY)")
        protocol = negotiate(request)
        if protocol is None:
            raise ApiError.bad_request("no supported WebSocket subprotocol offered: v5.channel.k8s.io, "
                                       "v4.channel.k8s.io or channel.k8s.io")
        return await serve_exec(request, protocol, container=container, argv=argv, env=self.kubelet.env,
                                stdin=stdin, stdout=stdout, stderr=stderr and not tty, tty=tty,
                                track=self.kubelet.track, untrack=self.kubelet.untrack)

    async def _log(self, request: web.Request, namespace: str, name: str) -> web.StreamResponse:
        q = request.query
        pod = self.store.get("pods", namespace, name)
        spec, status = pod.get("spec") or {}, pod.get("status") or {}
        cname = q.get("container") or spec["containers"][0]["name"]
        if cname != spec["containers"][0]["name"]:
            raise ApiError.bad_request(f"container {cname} is not valid for pod {name}")
        if parse_bool(q.get("previous")):
            raise ApiError.bad_request(f'previous terminated container "{cname}" in pod "{name}" not found')
        rows = status.get("containerStatuses") or []
        state = (rows[0].get("state") or {}) if rows else {"waiting": {"reason": "ContainerCreating"}}
        crashed = (state.get("waiting") or {}).get("reason") == "CrashLoopBackOff"   # the last one's logs
        if ("waiting" in state and not crashed) or not rows or not rows[0].get("containerID"):
            reason = (state.get("waiting") or {}).get("reason", "ContainerCreating")
            if reason in ("ErrImagePull", "ImagePullBackOff"):
                reason = "trying and failing to pull image"
            raise ApiError.bad_request(f'container "{cname}" in pod "{name}" is waiting to start: {reason}')
        args = ["logs"]
        follow = parse_bool(q.get("follow"))
        if follow:
            args.append("--follow")
        if q.get("tailLines"):
            args += ["--tail", str(int(q["tailLines"]))]
        if q.get("sinceSeconds"):
            args += ["--since", f"{int(q['sinceSeconds'])}s"]
        if parse_bool(q.get("timestamps")):
            args.append("--timestamps")
        limit = int(q["limitBytes"]) if q.get("limitBytes") else None
        args.append(self.kubelet.container_name(pod))
        proc = await asyncio.create_subprocess_exec("podman", *args, env=self.kubelet.env,
                                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                                    stderr=subprocess.STDOUT)
        self.kubelet.track(proc)
        resp = web.StreamResponse(status=200, headers={"Content-Type": "text/plain"})
        resp.enable_chunked_encoding()
        sent = 0
        try:
            assert proc.stdout is not None
            await resp.prepare(request)
            while True:
                data = await proc.stdout.read(65536)
                if not data:
                    break
                if limit is not None:
                    data = data[:max(0, limit - sent)]
                if data:
                    await resp.write(data)
                    sent += len(data)
                if limit is not None and sent >= limit:
                    break
            await resp.write_eof()
        except (ConnectionError, RuntimeError):
            pass
        finally:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
            await proc.wait()
            self.kubelet.untrack(proc)
        return resp
