"""The Compute Engine emulator's server: its state, switches and handlers (the package
docstring says what it serves)."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import re
import secrets
import threading
import time
import uuid
import zlib
from collections.abc import Sequence
from typing import Any

from aiohttp import web

from ..cloudinit import CloudInitHosts
from ..httpserver import HttpServer, json_response
from .batch import serve_batch
from .wire import (API, DEFAULT_MACHINE_TYPES, LABEL_KEY, LABEL_VALUE, NAME, Fault, Op, bulk_request, error,
                   error_body_of, matches, now_iso, parse_filter)

__all__ = ["DEFAULT_MACHINE_TYPES", "GceEmulator"]

def _fingerprint() -> str:
    """A resource fingerprint as Compute Engine gives one: 8 bytes, base64."""
    return base64.b64encode(secrets.token_bytes(8)).decode()


def _attached(disks: list[dict[str, Any]], project: str, zone: str, instance: str) -> list[dict[str, Any]]:
    """The disks as a VM reports them: attached disks with a ``source`` (Compute Engine made
    each from its ``initializeParams``, which it does not echo back)."""
    out = []
    for index, d in enumerate(disks):
        params = d.get("initializeParams") or {}
        name = params.get("diskName") or (instance if index == 0 else f"{instance}-{index}")
        out.append({"kind": "compute#attachedDisk", "type": d.get("type", "PERSISTENT"),
                    "mode": d.get("mode", "READ_WRITE"), "index": index, "boot": bool(d.get("boot", False)),
                    "autoDelete": bool(d.get("autoDelete", False)), "interface": d.get("interface", "SCSI"),
                    "deviceName": d.get("deviceName") or f"persistent-disk-{index}",
                    "diskSizeGb": str(params.get("diskSizeGb") or 10),
                    "source": f"{API}/projects/{project}/zones/{zone}/disks/{name}"})
    return out


class GceEmulator(HttpServer):
    """A TEST FIXTURE: Compute Engine's REST API for the calls the ``gce`` provider makes."""

    name = "gce-emulator"

    def __init__(self, *, project: str = "flowmesh-test", zones: Sequence[str] = ("us-central1-a", "us-central1-b"),
                 machine_types: Sequence[tuple[str, int, int, str | None, int]] = DEFAULT_MACHINE_TYPES,
                 page_size: int = 500, wait_hold_s: float = 0.5, first_host: int = 60, port: int = 0,
                 **sshd_kwargs: Any) -> None:
        super().__init__(port=port)
        self.project = project
        self.zones = tuple(zones)
        self.machine_types = tuple(machine_types)
        self.page_size = page_size
        self.wait_hold_s = wait_hold_s
        self.hosts = CloudInitHosts(first_host=first_host, **sshd_kwargs)
        self._lock = threading.Lock()
        self._instances: dict[str, dict[str, Any]] = {}     # id -> instance resource
        self._ops: dict[str, Op] = {}
        self._request_ops: dict[str, str] = {}              # requestId -> op name
        self._ids = itertools.count(4_200_000_000_000_000_001)
        self._exhausted: list[tuple[str | None, str | None]] = []
        self._cpu_quota: dict[str, int] = {}
        self._faults: list[Fault] = []
        self._op_delay: dict[str, float | None] = {}
        self._deny = 0
        self.calls: list[tuple[str, str]] = []              # (method name, path)

    # ---- switches --------------------------------------------------------------------
    def exhaust(self, zone: str | None = None, machine_type: str | None = None) -> None:
        """bulkInsert operations in ``zone`` (any) for ``machine_type`` (any) end in
        ``ZONE_RESOURCE_POOL_EXHAUSTED`` until :meth:`restore`."""
        with self._lock:
            self._exhausted.append((zone, machine_type))

    def restore(self) -> None:
        with self._lock:
            self._exhausted.clear()

    def set_cpu_quota(self, region: str, limit: int | None) -> None:
        """The project's ``CPUS`` quota in ``region`` (None: unlimited)."""
        with self._lock:
            if limit is None:
                self._cpu_quota.pop(region, None)
            else:
                self._cpu_quota[region] = limit

    def fail(self, method: str, status: int, reason: str, message: str | None = None, *,
             times: int | None = 1) -> None:
        """Answer the next ``times`` calls of ``method`` (bulkInsert, list, aggregatedList,
        get, delete, machineTypes, wait, operation) with an HTTP error."""
        with self._lock:
            self._faults.append(Fault(method, status, reason, message or f"injected: {reason}", times))

    def slow_operations(self, seconds: float | None, kinds: Sequence[str] = ("bulkInsert", "delete")) -> None:
        """Operations of ``kinds`` are done ``seconds`` after they start (None: never; 0: at once)."""
        with self._lock:
            for k in kinds:
                self._op_delay[k] = seconds

    def finish_operations(self) -> None:
        """Every pending operation is done now (a slow one, or one set never to finish)."""
        with self._lock:
            now = time.monotonic()
            for op in self._ops.values():
                if not op.applied:
                    op.done_at = now
            self._tick()

    def deny(self, on: bool = True) -> None:
        """Every call answers 403 (the credential lacks permission)."""
        with self._lock:
            self._deny = 403 if on else 0

    def clear(self) -> None:
        """Every switch back to normal."""
        with self._lock:
            self._exhausted.clear()
            self._cpu_quota.clear()
            self._faults.clear()
            self._op_delay.clear()
            self._deny = 0

    def delete_behind(self, instance_id: str) -> None:
        """Delete an instance behind the SDK's back (preempted, or a user's console click)."""
        with self._lock:
            self._instances.pop(str(instance_id), None)
        self.hosts.halt(str(instance_id))

    # ---- views -----------------------------------------------------------------------
    @property
    def instances(self) -> list[dict[str, Any]]:
        with self._lock:
            return [json.loads(json.dumps(i)) for i in self._instances.values()]

    def count(self, method: str) -> int:
        with self._lock:
            return sum(1 for m, _ in self.calls if m == method)

    def address(self, instance: Any) -> tuple[str, int]:
        """``SshMode.address_map``: boot the instance (once) from its ``user-data`` and
        ``ssh-keys`` metadata, and return its sshd's address."""
        iid = str(instance.id)
        vm = self.hosts.booted(iid)
        if vm is None:
            with self._lock:
                inst = self._instances.get(iid)
                items = {m["key"]: m["value"] for m in (inst or {}).get("metadata", {}).get("items", [])}
            if inst is None:
                raise RuntimeError(f"instance {iid} does not exist (deleted?)")
            extra = tuple(line.split(":", 1)[1] for line in items.get("ssh-keys", "").splitlines() if ":" in line)
            vm = self.hosts.boot(iid, items.get("user-data", ""), extra_authorized=extra)
        return vm.sshd.host, vm.sshd.port

    def provider(self, **kwargs: Any) -> Any:
        """A ``GceProvider`` pointed at this emulator (anonymous credentials); with
        ``ssh=True`` its runners reach the loopback hosts (``address_map``)."""
        from google.auth.credentials import AnonymousCredentials

        from flowmesh_providers.gce import GceProvider, SshMode
        ssh = kwargs.pop("ssh", None)
        if ssh is True:
            ssh = SshMode(address_map=self.address)
        kwargs.setdefault("zones", list(self.zones))
        return GceProvider(project=kwargs.pop("project", self.project), endpoint=self.url,
                           credentials=AnonymousCredentials(), ssh=ssh, **kwargs)

    def stop(self) -> None:
        super().stop()
        self.hosts.close()

    # ---- HTTP ------------------------------------------------------------------------
    def routes(self, app: web.Application) -> None:
        base = "/compute/v1/projects/{project}"
        r = app.router
        r.add_get(base, self._project)
        r.add_get(base + "/zones", self._zones)
        r.add_get(base + "/zones/{zone}", self._zone_get)
        r.add_get(base + "/zones/{zone}/machineTypes", self._machine_types)
        r.add_get(base + "/zones/{zone}/machineTypes/{name}", self._machine_type_get)
        r.add_get(base + "/aggregated/machineTypes", self._machine_types_aggregated)
        r.add_post(base + "/zones/{zone}/instances/bulkInsert", self._bulk_insert)
        r.add_post(base + "/zones/{zone}/instances", self._insert)
        r.add_get(base + "/global/images/family/{family}", self._image_from_family)
        r.add_get(base + "/global/images/{image}", self._image_get)
        r.add_get(base + "/zones/{zone}/instances", self._list)
        r.add_get(base + "/zones/{zone}/instances/{name}", self._get)
        r.add_delete(base + "/zones/{zone}/instances/{name}", self._delete)
        r.add_get(base + "/aggregated/instances", self._aggregated)
        r.add_get(base + "/zones/{zone}/operations", self._operations)
        r.add_get(base + "/zones/{zone}/operations/{op}", self._operation)
        r.add_post(base + "/zones/{zone}/operations/{op}/wait", self._wait)
        r.add_post("/batch/compute/v1", self._batch)
        r.add_route("*", "/{tail:.*}", self._not_served)   # last: Google's JSON error body, never plain text

    async def _batch(self, request: web.Request) -> web.StreamResponse:
        """The batch endpoint: each part served by this emulator (:func:`.batch.serve_batch`)."""
        with self._lock:
            self.calls.append(("batch", request.path))
        return await serve_batch(self.url, request)

    def error_body(self, status: int, message: str) -> dict[str, Any]:
        return error_body_of(status, "backendError", message)

    async def _not_served(self, request: web.Request) -> web.StreamResponse:
        with self._lock:
            self.calls.append(("notServed", request.path))
        return error(404, "notFound", f"The emulator does not serve {request.method} {request.path} (a TEST "
                                       "FIXTURE of the calls the gce provider makes; docs/providers/gce.md)")

    def _gate(self, request: web.Request, method: str) -> web.Response | None:
        """Records the call; answers a project/zone/deny/fault error, or None to go on."""
        project = request.match_info["project"]
        zone = request.match_info.get("zone")
        with self._lock:
            self.calls.append((method, request.path))
            self._tick()
            if self._deny:
                return error(self._deny, "forbidden",
                              f"Required 'compute.instances.{method}' permission for 'projects/{project}'")
            for f in self._faults:
                if f.method == method and (f.times is None or f.times > 0):
                    if f.times is not None:
                        f.times -= 1
                    self._faults = [x for x in self._faults if x.times is None or x.times > 0]
                    return error(f.status, f.reason, f.message)
        if project != self.project:
            return error(404, "notFound", f"The resource 'projects/{project}' was not found")
        if zone is not None and zone not in self.zones:
            return error(404, "notFound", f"The resource 'projects/{project}/zones/{zone}' was not found")
        return None

    def _paged(self, request: web.Request, kind: str, items: list[Any], **fields: str) -> web.Response:
        """A list response: one page of ``items`` (``maxResults``/``pageToken``), ``kind``,
        ``fields``, and ``nextPageToken`` when more follow."""
        page, nxt = self._page(request, items)
        body: dict[str, Any] = {"kind": kind, "items": page, **fields}
        if nxt:
            body["nextPageToken"] = nxt
        return json_response(200, body)

    def _page(self, request: web.Request, items: list[Any]) -> tuple[list[Any], str | None]:
        start = int(request.query.get("pageToken") or 0)
        size = min(int(request.query.get("maxResults") or self.page_size), self.page_size)
        nxt = start + size
        return items[start:nxt], (str(nxt) if nxt < len(items) else None)

    def _filtered(self, request: web.Request, zone: str | None) -> list[dict[str, Any]] | web.Response:
        try:
            tokens = parse_filter(request.query.get("filter", ""))
        except ValueError as exc:
            return error(400, "invalid", str(exc))
        with self._lock:
            return [json.loads(json.dumps(i)) for i in self._instances.values()
                    if (zone is None or i["_zone"] == zone) and matches(tokens, i)]

    @staticmethod
    def _public(inst: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in inst.items() if not k.startswith("_")}

    def _machine_type(self, zone: str, n: int) -> dict[str, Any]:
        name, cpus, mem, acc, count = self.machine_types[n]
        return {"kind": "compute#machineType", "id": str(1000 + n), "name": name, "guestCpus": cpus,
                "memoryMb": mem, "zone": zone, "isSharedCpu": False,
                "description": f"{cpus} vCPUs, {mem / 1024:g} GB RAM",
                "selfLink": f"{API}/projects/{self.project}/zones/{zone}/machineTypes/{name}",
                **({"accelerators": [{"guestAcceleratorType": acc, "guestAcceleratorCount": count}]}
                   if acc else {})}

    def _zone(self, zone: str) -> dict[str, Any]:
        region = zone.rsplit("-", 1)[0]
        return {"kind": "compute#zone", "id": str(2000 + self.zones.index(zone)), "name": zone, "status": "UP",
                "description": zone, "region": f"{API}/projects/{self.project}/regions/{region}",
                "selfLink": f"{API}/projects/{self.project}/zones/{zone}", "availableCpuPlatforms": []}

    async def _zones(self, request: web.Request) -> web.StreamResponse:
        """``zones.list``: the emulator's zones, paged."""
        if (err := self._gate(request, "zonesList")) is not None:
            return err
        return self._paged(request, "compute#zoneList", [self._zone(z) for z in self.zones],
                           selfLink=f"{API}/projects/{self.project}/zones")

    async def _zone_get(self, request: web.Request) -> web.StreamResponse:
        if (err := self._gate(request, "zonesGet")) is not None:
            return err
        return json_response(200, self._zone(request.match_info["zone"]))

    async def _machine_type_get(self, request: web.Request) -> web.StreamResponse:
        if (err := self._gate(request, "machineTypesGet")) is not None:
            return err
        zone, name = request.match_info["zone"], request.match_info["name"]
        n = next((i for i, m in enumerate(self.machine_types) if m[0] == name), None)
        if n is None:
            return error(404, "notFound", f"The resource 'projects/{self.project}/zones/{zone}/machineTypes/"
                                           f"{name}' was not found")
        return json_response(200, self._machine_type(zone, n))

    async def _machine_types_aggregated(self, request: web.Request) -> web.StreamResponse:
        """``machineTypes.aggregatedList``: every zone's machine types (one page)."""
        if (err := self._gate(request, "machineTypesAggregated")) is not None:
            return err
        items = {f"zones/{z}": {"machineTypes": [self._machine_type(z, n) for n in range(len(self.machine_types))]}
                 for z in self.zones}
        return json_response(200, {"kind": "compute#machineTypeAggregatedList", "items": items,
                                   "id": f"projects/{self.project}/aggregated/machineTypes",
                                   "selfLink": f"{API}/projects/{self.project}/aggregated/machineTypes"})

    async def _machine_types(self, request: web.Request) -> web.StreamResponse:
        if (err := self._gate(request, "machineTypes")) is not None:
            return err
        zone = request.match_info["zone"]
        return self._paged(request, "compute#machineTypeList",
                           [self._machine_type(zone, n) for n in range(len(self.machine_types))])

    async def _list(self, request: web.Request) -> web.StreamResponse:
        if (err := self._gate(request, "list")) is not None:
            return err
        found = self._filtered(request, request.match_info["zone"])
        if isinstance(found, web.Response):
            return found
        return self._paged(request, "compute#instanceList", [self._public(i) for i in found])

    async def _aggregated(self, request: web.Request) -> web.StreamResponse:
        if (err := self._gate(request, "aggregatedList")) is not None:
            return err
        found = self._filtered(request, None)
        if isinstance(found, web.Response):
            return found
        page, nxt = self._page(request, found)
        items: dict[str, Any] = {f"zones/{z}": {"warning": {"code": "NO_RESULTS_ON_PAGE",
                                                            "message": "There are no results for scope"}}
                                 for z in self.zones}
        for inst in page:
            scope = items.setdefault(f"zones/{inst['_zone']}", {})
            scope.pop("warning", None)
            scope.setdefault("instances", []).append(self._public(inst))
        body: dict[str, Any] = {"kind": "compute#instanceAggregatedList", "items": items,
                                "id": f"projects/{self.project}/aggregated/instances"}
        if nxt:
            body["nextPageToken"] = nxt
        return json_response(200, body)

    def _by_name(self, zone: str, name: str) -> dict[str, Any] | None:
        return next((i for i in self._instances.values() if i["_zone"] == zone and i["name"] == name), None)

    async def _get(self, request: web.Request) -> web.StreamResponse:
        if (err := self._gate(request, "get")) is not None:
            return err
        zone, name = request.match_info["zone"], request.match_info["name"]
        with self._lock:
            inst = self._by_name(zone, name)
            if inst is None:
                return error(404, "notFound", f"The resource 'projects/{self.project}/zones/{zone}/instances/"
                                               f"{name}' was not found")
            return json_response(200, self._public(inst))

    # ---- operations ------------------------------------------------------------------
    def _new_op(self, zone: str, kind: str, target: str, apply: Any) -> Op:
        delay = self._op_delay.get(kind, 0.0)
        now = time.monotonic()
        op = Op(name=f"operation-{int(time.time() * 1000)}-{uuid.uuid4().hex[:12]}", id=str(next(self._ids)),
                 zone=zone, kind=kind, target=target, created=now,
                 done_at=None if delay is None else now + delay, apply=apply)
        self._ops[op.name] = op
        return op

    def _tick(self) -> None:
        """Complete every due operation (under the lock)."""
        now = time.monotonic()
        for op in list(self._ops.values()):   # applying one may add operations (a bulk's inserts)
            if not op.applied and op.done(now):
                op.applied = True
                op.ended = now_iso()
                op.errors, op.http_status = op.apply() if op.apply else ([], 0)

    def _op_json(self, op: Op) -> dict[str, Any]:
        done = op.applied
        body: dict[str, Any] = {
            "kind": "compute#operation", "id": op.id, "name": op.name, "operationType": op.kind,
            "zone": f"{API}/projects/{self.project}/zones/{op.zone}", "targetLink": op.target,
            "status": "DONE" if done else "RUNNING", "progress": 100 if done else 0,
            "insertTime": op.inserted, "startTime": op.inserted,
            "selfLink": f"{API}/projects/{self.project}/zones/{op.zone}/operations/{op.name}"}
        if op.group is not None:
            body["operationGroupId"] = op.group
        if op.target_id is not None:
            body["targetId"] = op.target_id
        if done and op.ended:
            body["endTime"] = op.ended
        if done and op.errors:
            body["error"] = {"errors": op.errors}
            body["httpErrorStatusCode"] = op.http_status
            body["httpErrorMessage"] = "SERVICE UNAVAILABLE" if op.http_status == 503 else "FORBIDDEN"
        return body

    def _find_op(self, request: web.Request) -> Op | web.Response:
        op = self._ops.get(request.match_info["op"])
        if op is None or op.zone != request.match_info["zone"]:
            return error(404, "notFound", f"The resource 'projects/{self.project}/zones/"
                                           f"{request.match_info['zone']}/operations/{request.match_info['op']}' "
                                           "was not found")
        return op

    async def _operation(self, request: web.Request) -> web.StreamResponse:
        if (err := self._gate(request, "operation")) is not None:
            return err
        with self._lock:
            op = self._find_op(request)
            return op if isinstance(op, web.Response) else json_response(200, self._op_json(op))

    async def _operations(self, request: web.Request) -> web.StreamResponse:
        """``zoneOperations.list``: the zone's operations, oldest first; ``filter`` takes
        ``operationGroupId=ID`` (what gcloud asks after a bulk insert), paged."""
        if (err := self._gate(request, "operationsList")) is not None:
            return err
        zone = request.match_info["zone"]
        want = request.query.get("filter", "").strip()
        match: Any = None
        if want:
            m = re.fullmatch(r"\(?\s*operationGroupId\s*(=|eq)\s*\"?(.*?)\"?\s*\)?", want)
            if m is None:
                return error(400, "invalid", f"Invalid value for field 'filter': '{want}'. The emulator filters "
                                              "operations by operationGroupId only (= VALUE, or eq REGEX).")
            value = m.group(2)
            # `eq` takes a regular expression matched against the whole value (the syntax gcloud sends)
            match = (lambda g: g == value) if m.group(1) == "=" else (lambda g: re.fullmatch(value, g) is not None)
        with self._lock:
            ops = [self._op_json(op) for op in self._ops.values()
                   if op.zone == zone and (match is None or (op.group is not None and match(op.group)))]
        return self._paged(request, "compute#operationList", ops,
                           id=f"projects/{self.project}/zones/{zone}/operations",
                           selfLink=f"{API}/projects/{self.project}/zones/{zone}/operations")

    async def _wait(self, request: web.Request) -> web.StreamResponse:
        if (err := self._gate(request, "wait")) is not None:
            return err
        end = time.monotonic() + self.wait_hold_s
        while True:
            with self._lock:
                self._tick()
                op = self._find_op(request)
                if isinstance(op, web.Response):
                    return op
                if op.applied or time.monotonic() >= end:
                    return json_response(200, self._op_json(op))
            await asyncio.sleep(0.02)

    # ---- mutations -------------------------------------------------------------------
    async def _body(self, request: web.Request, method: str) -> Any:
        """A mutation's JSON body once the call passed :meth:`_gate`, or the answer to give."""
        if (err := self._gate(request, method)) is not None:
            return err
        try:
            return await request.json()
        except ValueError:
            return error(400, "parseError", "Invalid JSON payload received.")

    async def _bulk_insert(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request, "bulkInsert")
        if isinstance(body, web.Response):
            return body
        zone = request.match_info["zone"]
        parsed = bulk_request(body)
        if isinstance(parsed, str):
            return error(400, "invalid", parsed)
        count, min_count, pattern, names, props = parsed
        mtype = str(props["machineType"]).rsplit("/", 1)[-1]
        labels = dict(props.get("labels") or {})
        for k, v in labels.items():
            if not LABEL_KEY.match(k) or not LABEL_VALUE.match(str(v)):
                return error(400, "invalid", f"Invalid value for field 'resource.instanceProperties.labels': "
                                              f"'{k}={v}'. Label keys and values may contain only lowercase "
                                              "letters, digits, '_' and '-', and keys must start with a letter")
        mt = next((m for m in self.machine_types if m[0] == mtype), None)
        if mt is None:
            return error(400, "invalid", f"Invalid value for field 'resource.instanceProperties.machineType': "
                                          f"'{mtype}'. Machine type with name '{mtype}' does not exist in zone '{zone}'.")
        request_id = request.query.get("requestId")
        with self._lock:
            if request_id and request_id in self._request_ops:
                return json_response(200, self._op_json(self._ops[self._request_ops[request_id]]))

            def apply() -> tuple[list[dict[str, str]], int]:
                return self._create(zone, mt, count, pattern, props, names, group=op.group)
            op = self._new_op(zone, "bulkInsert", f"{API}/projects/{self.project}/zones/{zone}/instances", apply)
            op.group = str(uuid.uuid4())
            if request_id:
                self._request_ops[request_id] = op.name
            self._tick()
            return json_response(200, self._op_json(op))

    async def _insert(self, request: web.Request) -> web.StreamResponse:
        """``instances.insert``: one instance, its body an Instance resource (what ``gcloud
        compute instances create`` sends); an operation of kind ``insert`` for it."""
        body = await self._body(request, "insert")
        if isinstance(body, web.Response):
            return body
        zone = request.match_info["zone"]
        name = body.get("name") if isinstance(body, dict) else None
        if not isinstance(name, str) or not NAME.fullmatch(name):
            return error(400, "invalid", f"Invalid value for field 'resource.name': '{name or ''}'. Must be a match "
                                          "of regex '(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?|[1-9][0-9]{0,19})'")
        mtype = str(body.get("machineType") or "").rsplit("/", 1)[-1]
        mt = next((m for m in self.machine_types if m[0] == mtype), None)
        if mt is None:
            return error(400, "invalid", f"Invalid value for field 'resource.machineType': '{mtype}'. Machine type "
                                          f"with name '{mtype}' does not exist in zone '{zone}'.")
        props = {k: body[k] for k in ("labels", "metadata", "networkInterfaces", "disks", "scheduling",
                                      "guestAccelerators", "serviceAccounts", "canIpForward", "deletionProtection")
                 if k in body}
        request_id = request.query.get("requestId")
        with self._lock:
            if request_id and request_id in self._request_ops:
                return json_response(200, self._op_json(self._ops[self._request_ops[request_id]]))
            if self._by_name(zone, name) is not None:
                return error(409, "alreadyExists", f"The resource 'projects/{self.project}/zones/{zone}/instances/"
                                                    f"{name}' already exists")

            def apply() -> tuple[list[dict[str, str]], int]:
                errors, status = self._create(zone, mt, 1, None, props, [name], inserts=False)
                if not errors and (made := self._by_name(zone, name)) is not None:
                    op.target_id = made["id"]
                return errors, status
            op = self._new_op(zone, "insert", f"{API}/projects/{self.project}/zones/{zone}/instances/{name}", apply)
            if request_id:
                self._request_ops[request_id] = op.name
            self._tick()
            return json_response(200, self._op_json(op))

    def _image(self, project: str, name: str, family: str) -> dict[str, Any]:
        """An image record of this emulator (a fixture's, not one of Google's): every family
        resolves to one image named ``<family>-v20261201``."""
        return {"kind": "compute#image", "id": str(zlib.crc32(f"{project}/{name}".encode())), "name": name,
                "family": family, "status": "READY", "diskSizeGb": "10", "architecture": "X86_64",
                "selfLink": f"{API}/projects/{project}/global/images/{name}"}

    async def _project(self, request: web.Request) -> web.StreamResponse:
        """``projects.get`` (gcloud asks it on create): the project, its common metadata and
        its CPUS quota per region where one is set (:meth:`set_cpu_quota`)."""
        if (err := self._gate(request, "projectsGet")) is not None:
            return err
        with self._lock:
            quotas = [{"metric": "CPUS", "limit": float(limit), "region": region,
                       "usage": float(sum(int(i["_cpus"]) for i in self._instances.values()
                                          if i["_zone"].startswith(region + "-")))}
                      for region, limit in sorted(self._cpu_quota.items())]
        return json_response(200, {
            "kind": "compute#project", "id": str(zlib.crc32(self.project.encode())), "name": self.project,
            "commonInstanceMetadata": {"kind": "compute#metadata", "fingerprint": "Zm0tZW11", "items": []},
            "quotas": quotas, "selfLink": f"{API}/projects/{self.project}"})

    async def _image_from_family(self, request: web.Request) -> web.StreamResponse:
        """``images.getFromFamily`` of any project (public images live in others: debian-cloud)."""
        with self._lock:
            self.calls.append(("imagesGetFromFamily", request.path))
        family = request.match_info["family"]
        return json_response(200, self._image(request.match_info["project"], f"{family}-v20261201", family))

    async def _image_get(self, request: web.Request) -> web.StreamResponse:
        with self._lock:
            self.calls.append(("imagesGet", request.path))
        name = request.match_info["image"]
        return json_response(200, self._image(request.match_info["project"], name, name.rsplit("-v", 1)[0]))

    def _create(self, zone: str, mt: tuple[str, int, int, str | None, int], count: int, pattern: str | None,
                props: dict[str, Any], named: list[str] | None = None,
                group: str | None = None, inserts: bool = True) -> tuple[list[dict[str, str]], int]:
        """What a bulkInsert operation does when it runs (under the lock): the instances, and
        (``inserts``) per instance a done ``insert`` operation in the bulk's group (what
        gcloud counts); an ``instances.insert`` is its own operation."""
        name, cpus, mem, acc, acc_count = mt
        region = zone.rsplit("-", 1)[0]
        if any((z is None or z == zone) and (t is None or t == name) for z, t in self._exhausted):
            return [{"code": "ZONE_RESOURCE_POOL_EXHAUSTED",
                     "message": f"The zone 'projects/{self.project}/zones/{zone}' does not have enough resources "
                                "available to fulfill the request.  Try a different zone, or try again later."}], 503
        limit = self._cpu_quota.get(region)
        if limit is not None:
            used = sum(int(i["_cpus"]) for i in self._instances.values() if i["_zone"].startswith(region + "-"))
            if used + cpus * count > limit:
                return [{"code": "QUOTA_EXCEEDED",
                         "message": f"Quota 'CPUS' exceeded.  Limit: {float(limit)} in region {region}."}], 403
        taken = {i["name"] for i in self._instances.values() if i["_zone"] == zone}
        names = [n for n in named or () if n not in taken]   # named ones that exist already are skipped
        if pattern is not None:
            hashes = pattern.count("#")
            prefix, suffix = pattern.split("#" * hashes, 1) if "#" * hashes in pattern else (pattern, "")
            for n in itertools.count(1):
                if len(names) >= count:
                    break
                candidate = f"{prefix}{n:0{hashes}d}{suffix}"
                if candidate not in taken and candidate not in names:
                    names.append(candidate)
        for iname in names:
            iid = str(next(self._ids))
            nic = dict((props.get("networkInterfaces") or [{}])[0])
            nic.update({"name": "nic0", "networkIP": f"10.128.{(int(iid) >> 8) % 250}.{int(iid) % 250 + 2}"})
            if nic.get("accessConfigs"):
                nic["accessConfigs"] = [{**nic["accessConfigs"][0], "natIP": f"34.0.{int(iid) % 250}.{int(iid) % 199 + 1}",
                                         "kind": "compute#accessConfig"}]
            self._instances[iid] = {
                "kind": "compute#instance", "id": iid, "name": iname, "status": "RUNNING",
                "zone": f"{API}/projects/{self.project}/zones/{zone}",
                "machineType": f"{API}/projects/{self.project}/zones/{zone}/machineTypes/{name}",
                "creationTimestamp": now_iso(), "labels": dict(props.get("labels") or {}),
                "metadata": {"kind": "compute#metadata", "fingerprint": uuid.uuid4().hex[:12],
                             "items": list((props.get("metadata") or {}).get("items") or [])},
                "networkInterfaces": [nic], "disks": _attached(props.get("disks") or [], self.project, zone, iname),
                "scheduling": props.get("scheduling") or {},
                "guestAccelerators": props.get("guestAccelerators") or [],
                "serviceAccounts": list(props.get("serviceAccounts") or []),
                "canIpForward": bool(props.get("canIpForward", False)),
                "deletionProtection": bool(props.get("deletionProtection", False)),
                "cpuPlatform": "Intel Cascade Lake", "startRestricted": False,
                "fingerprint": _fingerprint(), "labelFingerprint": _fingerprint(),
                "selfLink": f"{API}/projects/{self.project}/zones/{zone}/instances/{iname}",
                "_zone": zone, "_cpus": cpus, "_disks": props.get("disks") or []}
            if inserts:
                insert = self._new_op(zone, "insert", self._instances[iid]["selfLink"], None)
                insert.applied, insert.ended, insert.group, insert.target_id = True, now_iso(), group, iid
        return [], 0

    async def _delete(self, request: web.Request) -> web.StreamResponse:
        if (err := self._gate(request, "delete")) is not None:
            return err
        zone, name = request.match_info["zone"], request.match_info["name"]
        request_id = request.query.get("requestId")
        with self._lock:
            if request_id and request_id in self._request_ops:
                return json_response(200, self._op_json(self._ops[self._request_ops[request_id]]))
            inst = self._by_name(zone, name)
            if inst is None:
                return error(404, "notFound", f"The resource 'projects/{self.project}/zones/{zone}/instances/"
                                               f"{name}' was not found")
            iid = inst["id"]
            inst["status"] = "STOPPING"

            def apply() -> tuple[list[dict[str, str]], int]:
                self._instances.pop(iid, None)
                self.hosts.halt_soon(iid)
                return [], 0
            op = self._new_op(zone, "delete", inst["selfLink"], apply)
            op.target_id = iid
            if request_id:
                self._request_ops[request_id] = op.name
            self._tick()
            return json_response(200, self._op_json(op))
