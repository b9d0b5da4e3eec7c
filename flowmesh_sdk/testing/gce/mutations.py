"""The Compute Engine emulator's mutations: ``instances.bulkInsert``, ``instances.insert``
and ``instances.delete``, each an operation that applies when it is done."""

from __future__ import annotations

import base64
import itertools
import secrets
import uuid
from typing import Any

from aiohttp import web

from ..httpserver import json_response
from .operations import Operations
from .state import GceState
from .wire import API, LABEL_KEY, LABEL_VALUE, NAME, bulk_request, error, now_iso


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


class Mutations:
    """The mutation handlers: what creates and deletes instances, each through an
    operation of ``ops``."""

    def __init__(self, state: GceState, ops: Operations) -> None:
        self.state = state
        self.ops = ops

    async def _body(self, request: web.Request, method: str) -> Any:
        """A mutation's JSON body once the call passed :meth:`GceState.gate`, or the answer to give."""
        if (err := self.state.gate(request, method)) is not None:
            return err
        try:
            return await request.json()
        except ValueError:
            return error(400, "parseError", "Invalid JSON payload received.")

    async def bulk_insert(self, request: web.Request) -> web.StreamResponse:
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
        mt = next((m for m in self.state.machine_types if m[0] == mtype), None)
        if mt is None:
            return error(400, "invalid", f"Invalid value for field 'resource.instanceProperties.machineType': "
                                          f"'{mtype}'. Machine type with name '{mtype}' does not exist in zone "
                                          f"'{zone}'.")
        request_id = request.query.get("requestId")
        with self.state.lock:
            if request_id and request_id in self.state.request_ops:
                return json_response(200, self.ops.op_json(self.state.ops[self.state.request_ops[request_id]]))

            def apply() -> tuple[list[dict[str, str]], int]:
                return self._create(zone, mt, count, pattern, props, names, group=op.group)
            op = self.ops.new_op(zone, "bulkInsert", f"{API}/projects/{self.state.project}/zones/{zone}/instances",
                                 apply)
            op.group = str(uuid.uuid4())
            if request_id:
                self.state.request_ops[request_id] = op.name
            self.state.tick()
            return json_response(200, self.ops.op_json(op))

    async def insert(self, request: web.Request) -> web.StreamResponse:
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
        mt = next((m for m in self.state.machine_types if m[0] == mtype), None)
        if mt is None:
            return error(400, "invalid", f"Invalid value for field 'resource.machineType': '{mtype}'. Machine type "
                                          f"with name '{mtype}' does not exist in zone '{zone}'.")
        props = {k: body[k] for k in ("labels", "metadata", "networkInterfaces", "disks", "scheduling",
                                      "guestAccelerators", "serviceAccounts", "canIpForward", "deletionProtection")
                 if k in body}
        request_id = request.query.get("requestId")
        with self.state.lock:
            if request_id and request_id in self.state.request_ops:
                return json_response(200, self.ops.op_json(self.state.ops[self.state.request_ops[request_id]]))
            if self.state.by_name(zone, name) is not None:
                return error(409, "alreadyExists", f"The resource 'projects/{self.state.project}/zones/{zone}/"
                                                    f"instances/{name}' already exists")

            def apply() -> tuple[list[dict[str, str]], int]:
                errors, status = self._create(zone, mt, 1, None, props, [name], inserts=False)
                if not errors and (made := self.state.by_name(zone, name)) is not None:
                    op.target_id = made["id"]
                return errors, status
            op = self.ops.new_op(zone, "insert",
                                 f"{API}/projects/{self.state.project}/zones/{zone}/instances/{name}", apply)
            if request_id:
                self.state.request_ops[request_id] = op.name
            self.state.tick()
            return json_response(200, self.ops.op_json(op))

    def _create(self, zone: str, mt: tuple[str, int, int, str | None, int], count: int, pattern: str | None,
                props: dict[str, Any], named: list[str] | None = None,
                group: str | None = None, inserts: bool = True) -> tuple[list[dict[str, str]], int]:
        """What a bulkInsert operation does when it runs (under the lock): the instances, and
        (``inserts``) per instance a done ``insert`` operation in the bulk's group (what
        gcloud counts); an ``instances.insert`` is its own operation."""
        name, cpus, mem, acc, acc_count = mt
        region = zone.rsplit("-", 1)[0]
        if any((z is None or z == zone) and (t is None or t == name) for z, t in self.state.exhausted):
            return [{"code": "ZONE_RESOURCE_POOL_EXHAUSTED",
                     "message": f"The zone 'projects/{self.state.project}/zones/{zone}' does not have enough resources "
                                "available to fulfill the request.  Try a different zone, or try again later."}], 503
        limit = self.state.cpu_quota.get(region)
        if limit is not None:
            used = sum(int(i["_cpus"]) for i in self.state.instances.values() if i["_zone"].startswith(region + "-"))
            if used + cpus * count > limit:
                return [{"code": "QUOTA_EXCEEDED",
                         "message": f"Quota 'CPUS' exceeded.  Limit: {float(limit)} in region {region}."}], 403
        taken = {i["name"] for i in self.state.instances.values() if i["_zone"] == zone}
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
            iid = str(next(self.state.ids))
            nic = dict((props.get("networkInterfaces") or [{}])[0])
            nic.update({"name": "nic0", "networkIP": f"10.128.{(int(iid) >> 8) % 250}.{int(iid) % 250 + 2}"})
            if nic.get("accessConfigs"):
                nat = f"34.0.{int(iid) % 250}.{int(iid) % 199 + 1}"
                nic["accessConfigs"] = [{**nic["accessConfigs"][0], "natIP": nat, "kind": "compute#accessConfig"}]
            self.state.instances[iid] = {
                "kind": "compute#instance", "id": iid, "name": iname, "status": "RUNNING",
                "zone": f"{API}/projects/{self.state.project}/zones/{zone}",
                "machineType": f"{API}/projects/{self.state.project}/zones/{zone}/machineTypes/{name}",
                "creationTimestamp": now_iso(), "labels": dict(props.get("labels") or {}),
                "metadata": {"kind": "compute#metadata", "fingerprint": uuid.uuid4().hex[:12],
                             "items": list((props.get("metadata") or {}).get("items") or [])},
                "networkInterfaces": [nic],
                "disks": _attached(props.get("disks") or [], self.state.project, zone, iname),
                "scheduling": props.get("scheduling") or {},
                "guestAccelerators": props.get("guestAccelerators") or [],
                "serviceAccounts": list(props.get("serviceAccounts") or []),
                "canIpForward": bool(props.get("canIpForward", False)),
                "deletionProtection": bool(props.get("deletionProtection", False)),
                "cpuPlatform": "Intel Cascade Lake", "startRestricted": False,
                "fingerprint": _fingerprint(), "labelFingerprint": _fingerprint(),
                "selfLink": f"{API}/projects/{self.state.project}/zones/{zone}/instances/{iname}",
                "_zone": zone, "_cpus": cpus, "_disks": props.get("disks") or []}
            if inserts:
                insert = self.ops.new_op(zone, "insert", self.state.instances[iid]["selfLink"], None)
                insert.applied, insert.ended, insert.group, insert.target_id = True, now_iso(), group, iid
        return [], 0

    async def delete(self, request: web.Request) -> web.StreamResponse:
        if (err := self.state.gate(request, "delete")) is not None:
            return err
        zone, name = request.match_info["zone"], request.match_info["name"]
        request_id = request.query.get("requestId")
        with self.state.lock:
            if request_id and request_id in self.state.request_ops:
                return json_response(200, self.ops.op_json(self.state.ops[self.state.request_ops[request_id]]))
            inst = self.state.by_name(zone, name)
            if inst is None:
                return error(404, "notFound", f"The resource 'projects/{self.state.project}/zones/{zone}/instances/"
                                               f"{name}' was not found")
            iid = inst["id"]
            inst["status"] = "STOPPING"

            def apply() -> tuple[list[dict[str, str]], int]:
                self.state.instances.pop(iid, None)
                self.state.hosts.halt_soon(iid)
                return [], 0
            op = self.ops.new_op(zone, "delete", inst["selfLink"], apply)
            op.target_id = iid
            if request_id:
                self.state.request_ops[request_id] = op.name
            self.state.tick()
            return json_response(200, self.ops.op_json(op))
