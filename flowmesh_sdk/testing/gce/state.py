"""The Compute Engine emulator's state and the helpers every handler shares: the call gate
(project, zone, deny and fault switches), paging, and completing due operations."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Sequence
from typing import Any

from aiohttp import web

from ..cloudinit import CloudInitHosts
from ..httpserver import json_response
from .wire import DEFAULT_MACHINE_TYPES, Fault, Op, error, now_iso


class GceState:
    """The emulator's state: its settings, resources, switches and call log, behind one lock
    (:class:`~flowmesh_sdk.testing.gce.GceEmulator` owns one and hands it to its handler parts)."""

    def __init__(self, *, project: str = "flowmesh-test", zones: Sequence[str] = ("us-central1-a", "us-central1-b"),
                 machine_types: Sequence[tuple[str, int, int, str | None, int]] = DEFAULT_MACHINE_TYPES,
                 page_size: int = 500, wait_hold_s: float = 0.5, first_host: int = 60,
                 **sshd_kwargs: Any) -> None:
        self.project = project
        self.zones = tuple(zones)
        self.machine_types = tuple(machine_types)
        self.page_size = page_size
        self.wait_hold_s = wait_hold_s
        self.hosts = CloudInitHosts(first_host=first_host, **sshd_kwargs)
        self.lock = threading.Lock()
        self.instances: dict[str, dict[str, Any]] = {}     # id -> instance resource
        self.ops: dict[str, Op] = {}
        self.request_ops: dict[str, str] = {}              # requestId -> op name
        self.ids = itertools.count(4_200_000_000_000_000_001)
        self.exhausted: list[tuple[str | None, str | None]] = []
        self.cpu_quota: dict[str, int] = {}
        self.faults: list[Fault] = []
        self.op_delay: dict[str, float | None] = {}
        self.deny = 0
        self.calls: list[tuple[str, str]] = []              # (method name, path)

    def gate(self, request: web.Request, method: str) -> web.Response | None:
        """Records the call; answers a project/zone/deny/fault error, or None to go on."""
        project = request.match_info["project"]
        zone = request.match_info.get("zone")
        with self.lock:
            self.calls.append((method, request.path))
            self.tick()
            if self.deny:
                return error(self.deny, "forbidden",
                             f"Required 'compute.instances.{method}' permission for 'projects/{project}'")
            for f in self.faults:
                if f.method == method and (f.times is None or f.times > 0):
                    if f.times is not None:
                        f.times -= 1
                    self.faults = [x for x in self.faults if x.times is None or x.times > 0]
                    return error(f.status, f.reason, f.message)
        if project != self.project:
            return error(404, "notFound", f"The resource 'projects/{project}' was not found")
        if zone is not None and zone not in self.zones:
            return error(404, "notFound", f"The resource 'projects/{project}/zones/{zone}' was not found")
        return None

    def paged(self, request: web.Request, kind: str, items: list[Any], **fields: str) -> web.Response:
        """A list response: one page of ``items`` (``maxResults``/``pageToken``), ``kind``,
        ``fields``, and ``nextPageToken`` when more follow."""
        page, nxt = self.page(request, items)
        body: dict[str, Any] = {"kind": kind, "items": page, **fields}
        if nxt:
            body["nextPageToken"] = nxt
        return json_response(200, body)

    def page(self, request: web.Request, items: list[Any]) -> tuple[list[Any], str | None]:
        start = int(request.query.get("pageToken") or 0)
        size = min(int(request.query.get("maxResults") or self.page_size), self.page_size)
        nxt = start + size
        return items[start:nxt], (str(nxt) if nxt < len(items) else None)

    @staticmethod
    def public(inst: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in inst.items() if not k.startswith("_")}

    def by_name(self, zone: str, name: str) -> dict[str, Any] | None:
        return next((i for i in self.instances.values() if i["_zone"] == zone and i["name"] == name), None)

    def tick(self) -> None:
        """Complete every due operation (under the lock)."""
        now = time.monotonic()
        for op in list(self.ops.values()):   # applying one may add operations (a bulk's inserts)
            if not op.applied and op.done(now):
                op.applied = True
                op.ended = now_iso()
                op.errors, op.http_status = op.apply() if op.apply else ([], 0)
