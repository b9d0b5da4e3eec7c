"""The emulator: :class:`KubeEmulator`, an :class:`~flowmesh_sdk.testing.httpserver.HttpServer`
serving the Kubernetes API the package docstring lists.  It owns the cluster's lifecycle
(the object store, the container store, the self-signed certificate, the kubelet and its
end), the kubeconfig and client it hands out, and the test switches (throttle, counts,
evict, lose_node, fail_pulls, the back-offs, compact); every request goes to the
:class:`~.api.KubeApi` it makes at each start."""

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
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from aiohttp import web

from .. import hygiene
from ..httpserver import HttpServer, json_response, self_signed_tls
from ..sshd import LoopbackSshd
from . import agent_sandbox
from .api import KubeApi
from .kubelet import DEFAULT_NODES, Kubelet, Node, node_object
from .objects import Obj, ObjectStore, status_body
from .wire import Tally
from .writes import namespace_object

__all__ = ["KubeEmulator"]


class KubeEmulator(HttpServer):
    """A TEST FIXTURE emulating a Kubernetes API server whose pods are podman containers
    (the package docstring says what it serves and how)."""

    name = "k8s-emulator"

    def __init__(self, *, nodes: Sequence[Node] = DEFAULT_NODES, token: str = "fm-test-token", version: str = "1.32",
                 runtime_classes: Mapping[str, str] | None = None, pull_backoff_s: float = 10.0,
                 restart_backoff_s: float = 10.0, bookmark_interval_s: float = 5.0, history: int = 10000,
                 tls: bool = True, port: int = 0, agent_sandbox: bool = False,
                 agent_sandbox_label_domains: Sequence[str] = ("sandbox.users.io",)) -> None:
        """``agent_sandbox``: serve kubernetes-sigs/agent-sandbox's CRDs and run their
        controllers (:mod:`.agent_sandbox`); ``agent_sandbox_label_domains``: the label domains
        a SandboxClaim's ``additionalPodMetadata`` may use (the controller's allow-list)."""
        super().__init__(port=port)
        self.agent_sandbox = agent_sandbox
        self.agent_sandbox_label_domains = tuple(agent_sandbox_label_domains)
        if not nodes:
            raise ValueError("a cluster needs at least one node")
        self.nodes = tuple(nodes)
        self.token = token
        self.version = version
        self.runtime_classes = dict(runtime_classes or {})
        self._bookmark_interval_s = bookmark_interval_s
        self.id = secrets.token_hex(6)
        self._history = history
        self.store = ObjectStore(history)
        self._pull_backoff_s = pull_backoff_s
        self._restart_backoff_s = restart_backoff_s
        self._tmp: Path | None = None
        self._kubelet: Kubelet | None = None
        self._api: KubeApi | None = None
        self._tally = Tally()   # request counts and the throttle (they outlive a restart; counts are cleared)
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

    @property
    def kubelet(self) -> Kubelet:
        if self._kubelet is None:
            raise RuntimeError(f"{self.name} is not running")
        return self._kubelet

    def start(self) -> KubeEmulator:
        if self.running:
            return self
        self.store = ObjectStore(self._history)   # a start after a stop is a new cluster
        self._tally.counts.clear()
        self._tmp = Path(tempfile.mkdtemp(prefix="fm-k8s-"))
        root = self._tmp / "containers"
        LoopbackSshd._write_container_confs(root)
        hygiene.STORES.add(root)
        try:
            if self.tls:
                self.ssl_context = self_signed_tls(self._tmp / "tls", "flowmesh-k8s-emulator")
            super().start()
        except BaseException:
            self._wipe()
            raise
        return self

    async def on_start(self) -> None:
        self._kubelet = Kubelet(self.store, self.nodes, root=self.store_root, emulator_id=self.id,
                                version=self.version, runtime_classes=self.runtime_classes,
                                pull_backoff_s=self._pull_backoff_s, restart_backoff_s=self._restart_backoff_s)
        self._api = KubeApi(self.store, self._kubelet, token=self.token, version=self.version, emulator_id=self.id,
                            host=self.host, runtime_classes=self.runtime_classes, tally=self._tally,
                            spawn=self._spawn, bookmark_interval_s=self._bookmark_interval_s)
        if self.agent_sandbox:
            agent_sandbox.install(self._api, self.store, spawn=self._spawn,
                                  allowed_label_domains=self.agent_sandbox_label_domains)
        for ns in ("default", "kube-system", "kube-public", "kube-node-lease"):
            self.store.create("namespaces", namespace_object(ns))
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
        self._api = None

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
        self._tally.throttle(n, retry_after, plain=plain)

    def count(self, verb: str, resource: str) -> int:
        """Requests served for ``verb`` on ``resource`` (``get``, ``list``, ``watch``,
        ``create``, ``update``, ``patch``, ``delete``, ``deletecollection``; ``exec`` and
        ``attach`` on ``pods``; subresources as ``pods/log``, ``pods/status``,
        ``pods/eviction``).  Every authenticated request counts, a throttled one too."""
        return self._tally.counts[(verb, resource)]

    def counts(self) -> dict[tuple[str, str], int]:
        return dict(self._tally.counts)

    def reset_counts(self) -> None:
        self._tally.counts.clear()

    @property
    def pull_backoff_s(self) -> float:
        return self.kubelet.pull_backoff_s if self._kubelet else self._pull_backoff_s

    @pull_backoff_s.setter
    def pull_backoff_s(self, value: float) -> None:
        self._pull_backoff_s = value
        if self._kubelet is not None:
            self._kubelet.pull_backoff_s = value

    @property
    def bookmark_interval_s(self) -> float:
        """How often a watch with ``allowWatchBookmarks`` gets a BOOKMARK (settable while running)."""
        return self._api.bookmark_interval_s if self._api else self._bookmark_interval_s

    @bookmark_interval_s.setter
    def bookmark_interval_s(self, value: float) -> None:
        self._bookmark_interval_s = value
        if self._api is not None:
            self._api.bookmark_interval_s = value

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

    def kill_container(self, namespace: str, name: str) -> None:
        """A pod's container is killed from outside the kubelet (the node's OOM killer, a
        crash): with ``restartPolicy: Never`` the kubelet sees it end (``podman wait``) and
        reports the pod Failed, its container terminated with exit code 137 (reason Error)."""
        container = self.container_name(namespace, name)   # from this thread: it asks the server's loop

        async def go() -> None:
            await self.kubelet.core.podman("kill", container, kill_on_cancel=False)
        self.call(go(), timeout=60)

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

    def _spawn(self, coro: Any) -> None:
        task: asyncio.Task[Any] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---- requests: the API's -------------------------------------------------------------------
    def routes(self, app: web.Application) -> None:
        app.router.add_route("*", "/{tail:.*}", self.handle)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        api = self._api
        if api is None:   # listening, but on_start has not made the cluster yet (or it is gone)
            return json_response(503, status_body(503, "ServiceUnavailable", "the k8s emulator is not ready"))
        return await api.handle(request)
