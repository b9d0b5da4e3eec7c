"""One watch per namespace: every FlowMesh pod's state, pushed, never polled.

:class:`PodWatch` lists the namespace's pods that carry ``flowmesh.io/fleet`` once, then
watches from that list's ``resourceVersion`` with bookmarks (``allowWatchBookmarks``), in a
daemon thread (the official client's calls block).  Every ADDED/MODIFIED/DELETED event
replaces what it knows of that pod; a BOOKMARK moves the resourceVersion on; a watch that
ends (``timeoutSeconds``, a dropped connection) is resumed from the last resourceVersion;
``410 Gone`` (the version is too old) relists.  Deleted pods are kept a while as
tombstones, so a describe right after a delete still says TERMINATED.

Waiters on the event loop (:meth:`PodWatch.wait`) are woken by the thread through
``call_soon_threadsafe``: a launch waits for its pod to be scheduled, a runner for it to
run, without one API call of their own.  ``on_change`` is called on the loop for every
event (the provider ends the channels of a pod that failed).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from flowmesh_sdk import timers

from .config import Target

log = logging.getLogger("flowmesh.providers.k8s")
SELECTOR = "flowmesh.io/fleet"
WATCH_TIMEOUT_S = 300          # the server ends a watch after this; it is resumed at once
TOMBSTONE_S = 600.0
Pod = Mapping[str, Any]
Predicate = Callable[[Pod | None], bool]


class PodWatch:
    def __init__(self, target: Target, api: Any, loop: asyncio.AbstractEventLoop, *,
                 on_change: Callable[[str, Pod | None], None] | None = None) -> None:
        self.target = target
        self._api = api                      # a kubernetes.client.CoreV1Api
        self._loop = loop
        self._on_change = on_change
        self._lock = threading.Lock()
        self._pods: dict[str, Pod] = {}      # name -> latest object
        self._gone: dict[str, tuple[float, Pod]] = {}
        self._waiters: dict[str, list[tuple[Predicate, asyncio.Future[Pod | None]]]] = {}
        self._stop = threading.Event()
        self._resp: Any = None
        self._synced = asyncio.Event()
        self._error: BaseException | None = None
        self.relists = 0
        self.watches = 0
        self._thread = threading.Thread(target=self._run, name=f"flowmesh-k8s-watch-{target.key}", daemon=True)
        self._thread.start()

    # ---- reading ---------------------------------------------------------------------
    def get(self, name: str) -> Pod | None:
        with self._lock:
            pod = self._pods.get(name)
            if pod is None and name in self._gone:
                return self._gone[name][1]
            return pod

    def by_uid(self, uid: str) -> tuple[str, Pod] | None:
        with self._lock:
            for name, pod in list(self._pods.items()) + [(n, p) for n, (_, p) in self._gone.items()]:
                if (pod.get("metadata") or {}).get("uid") == uid:
                    return name, pod
        return None

    def live(self) -> list[Pod]:
        with self._lock:
            return list(self._pods.values())

    async def synced(self, timeout_s: float) -> None:
        """Return once the first list is in (raise what stopped it, if anything did)."""
        async with timers.timeout(timeout_s):
            await self._synced.wait()
        if self._error is not None and not self._pods:
            raise self._error

    async def wait(self, name: str, predicate: Predicate, timeout_s: float) -> Pod | None:
        """The pod (None once deleted) as soon as ``predicate`` holds for it; raises
        ``TimeoutError`` past ``timeout_s``."""
        now, deleted = self.get(name), self._deleted(name)
        if self._synced.is_set() and (now is not None or deleted) and predicate(None if deleted else now):
            return None if deleted else now   # (a pod not seen yet is neither: its ADDED will come)
        fut: asyncio.Future[Pod | None] = self._loop.create_future()
        self._waiters.setdefault(name, []).append((predicate, fut))
        try:
            async with timers.timeout(timeout_s):
                return await fut
        finally:
            waiting = self._waiters.get(name)
            if waiting is not None:
                waiting[:] = [(p, f) for p, f in waiting if f is not fut]
                if not waiting:
                    del self._waiters[name]

    def deleted(self, name: str) -> bool:
        """Whether the watch saw the pod deleted (and not made again)."""
        return self._deleted(name)

    def _deleted(self, name: str) -> bool:
        with self._lock:
            return name not in self._pods and name in self._gone

    # ---- the thread ------------------------------------------------------------------
    def _run(self) -> None:
        from kubernetes.watch.watch import iter_resp_lines   # the k8s extra

        rv: str | None = None
        delay = 0.5
        while not self._stop.is_set():
            try:
                if rv is None:
                    rv = self._list()
                    delay = 0.5
                self.watches += 1
                self._resp = self._api.list_namespaced_pod(
                    self.target.namespace, label_selector=SELECTOR, watch=True, resource_version=rv,
                    allow_watch_bookmarks=True, timeout_seconds=WATCH_TIMEOUT_S, _preload_content=False)
                for line in iter_resp_lines(self._resp):
                    if self._stop.is_set():
                        return
                    event = json.loads(line)
                    kind, obj = event.get("type"), event.get("object") or {}
                    if kind == "ERROR":
                        if int(obj.get("code") or 0) == 410:
                            rv = None   # too old: relist
                        break
                    rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                    if kind != "BOOKMARK":
                        self._apply(kind, obj)
            except Exception as exc:  # noqa: BLE001 - a watch that fails is resumed, its error kept
                if self._stop.is_set():
                    return
                self._error = exc
                self._loop_call(self._synced.set)
                log.debug("watch of %s: %s; resuming in %.1f s", self.target.key, exc, delay)
                time.sleep(delay)
                delay = min(10.0, delay * 2)
                rv = None
            finally:
                resp, self._resp = self._resp, None
                if resp is not None:
                    with contextlib.suppress(Exception):
                        resp.release_conn()

    def _list(self) -> str:
        resp = self._api.list_namespaced_pod(self.target.namespace, label_selector=SELECTOR, _preload_content=False)
        body = json.loads(resp.data)
        self.relists += 1
        pods = {p["metadata"]["name"]: p for p in body.get("items") or ()}
        with self._lock:
            gone = set(self._pods) - set(pods)
            self._pods = pods
            now = time.monotonic()
            for name in gone:
                self._gone[name] = (now, {"metadata": {"name": name}})
        self._error = None
        for name in set(pods) | gone:
            self._loop_call(self._notify, name)
        self._loop_call(self._synced.set)
        return str((body.get("metadata") or {}).get("resourceVersion") or "")

    def _apply(self, kind: str, obj: dict[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name"))
        now = time.monotonic()
        with self._lock:
            if kind == "DELETED":
                self._pods.pop(name, None)
                self._gone[name] = (now, obj)
            else:
                self._pods[name] = obj
                self._gone.pop(name, None)
            for old in [n for n, (t, _) in self._gone.items() if now - t > TOMBSTONE_S]:
                del self._gone[old]
        self._loop_call(self._notify, name)

    def _loop_call(self, fn: Callable[..., None], *args: Any) -> None:
        with contextlib.suppress(RuntimeError):   # the loop closed: nobody waits any more
            self._loop.call_soon_threadsafe(fn, *args)

    def _notify(self, name: str) -> None:
        pod = None if self._deleted(name) else self.get(name)
        for predicate, fut in list(self._waiters.get(name, ())):
            if not fut.done():
                try:
                    if predicate(pod):
                        fut.set_result(pod)
                except Exception as exc:  # noqa: BLE001 - a predicate's error is the waiter's
                    fut.set_exception(exc)
        if self._on_change is not None:
            self._on_change(name, pod)

    def stop(self) -> None:
        self._stop.set()
        resp = self._resp
        if resp is not None:
            with contextlib.suppress(Exception):
                resp.close()
        self._thread.join(5)
