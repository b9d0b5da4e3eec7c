"""A pod's subresources (:class:`PodSubresources`, owned by :class:`.api.KubeApi`):
``pods/status`` (read), ``pods/eviction`` (a ``DisruptionTarget`` condition, then the
pod deleted as a DELETE would), ``pods/exec`` (WebSocket, :mod:`.exec`),
``pods/portforward`` (WebSocket: :mod:`.portforward`, and kubectl's SPDY tunnelled in it,
:mod:`.portforward_spdy`) and ``pods/log`` (``podman logs`` of
the container); ``pods/attach`` is refused."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
from collections.abc import Awaitable, Callable

from aiohttp import web

from ..httpserver import json_response
from .exec import negotiate, serve_exec
from .portforward import SPDY_TUNNEL, connect_in_netns, negotiate_portforward, parse_ports, serve_portforward
from .portforward_spdy import serve_spdy_portforward
from .kubelet import Kubelet
from .objects import TERMINAL, ApiError, Obj, ObjectStore
from .podstatus import set_condition
from .resources import Resource, parse_bool
from .wire import Tally, no_route, not_allowed, present, read_body

__all__ = ["PodSubresources"]


class PodSubresources:
    """``pods/NAME/SUB`` requests; ``delete_pod`` is the DELETE an eviction ends in."""

    def __init__(self, store: ObjectStore, kubelet: Kubelet, *, tally: Tally,
                 delete_pod: Callable[[Obj, Obj], Awaitable[Obj]]) -> None:
        self.store = store
        self.kubelet = kubelet
        self.tally = tally
        self._delete_pod = delete_pod

    async def serve(self, request: web.Request, res: Resource, namespace: str, name: str,
                    sub: str) -> web.StreamResponse:
        if res.name != "pods" or sub not in ("status", "log", "exec", "eviction", "attach", "portforward"):
            raise no_route()
        method = request.method
        if sub == "status":
            self.tally.record("get", "pods/status")
            if method != "GET":
                raise not_allowed()
            return json_response(200, present(self.store, res, self.store.get("pods", namespace, name)))
        if sub == "eviction":
            self.tally.record("create", "pods/eviction")
            if method != "POST":
                raise not_allowed()
            return await self._eviction(request, namespace, name)
        if sub == "log":
            self.tally.record("get", "pods/log")
            if method != "GET":
                raise not_allowed()
            return await self._log(request, namespace, name)
        self.tally.record(sub, "pods")
        if method not in ("GET", "POST"):
            raise not_allowed()
        if sub == "attach":
            raise ApiError.bad_request("pods/attach is not served by the k8s emulator; use pods/exec")
        if sub == "portforward":
            return await self._portforward(request, namespace, name)
        return await self._exec(request, namespace, name)

    async def _portforward(self, request: web.Request, namespace: str, name: str) -> web.StreamResponse:
        pod = self.store.get("pods", namespace, name)
        status = pod.get("status") or {}
        if not (pod.get("spec") or {}).get("nodeName"):
            raise ApiError.bad_request(f"pod {name} does not have a host assigned")
        cid = self.kubelet.container_id(pod)
        if status.get("phase") != "Running" or not cid:
            raise ApiError.bad_request(f"unable to forward port because pod is not running. Current status="
                                       f"{status.get('phase') or 'Pending'}")
        if request.headers.get("Upgrade", "").lower() != "websocket":
            raise ApiError.bad_request("Upgrade request required (the k8s emulator serves port-forward over "
                                       "WebSocket: v4.channel.k8s.io, or SPDY/3.1+portforward.k8s.io as kubectl "
                                       "tunnels it; no SPDY upgrade)")
        protocol = negotiate_portforward(request)
        if protocol is None:
            raise ApiError.bad_request("requested protocol(s) are not supported by the k8s emulator's "
                                       "port-forward: it serves v4.channel.k8s.io and SPDY/3.1+portforward.k8s.io "
                                       "(no v4.base64.channel.k8s.io)")
        ports: list[int] = []
        if protocol != SPDY_TUNNEL:   # kubectl's SPDY streams carry their port in a header, not in the query
            try:
                ports = parse_ports(request.query.getall("ports", []))
            except ValueError as exc:
                raise ApiError.bad_request(str(exc)) from None
        rc, out, err = await self.kubelet.podman("inspect", "--format", "{{.State.Pid}}", cid)
        pid = out.strip()
        if rc != 0 or not pid.isdigit() or pid == "0":
            raise ApiError.bad_request(f"unable to upgrade connection: no network namespace for pod {name}: "
                                       f"{(err or out).strip()}")

        async def connect(port: int) -> socket.socket:
            return await asyncio.to_thread(connect_in_netns, int(pid), port, cid)

        def error_prefix(port: int) -> str:
            return f"error forwarding port {port} to pod {cid}, uid "

        if protocol == SPDY_TUNNEL:
            return await serve_spdy_portforward(request, connect=connect, error_prefix=error_prefix)
        return await serve_portforward(request, protocol, ports=ports, connect=connect, error_prefix=error_prefix)

    async def _eviction(self, request: web.Request, namespace: str, name: str) -> web.StreamResponse:
        body = await read_body(request)
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
