"""The Compute Engine emulator's zone operations: made, rendered, got, listed and waited on."""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from typing import Any

from aiohttp import web

from ..httpserver import json_response
from .state import GceState
from .wire import API, Op, error


class Operations:
    """``zoneOperations``: get, list (by ``operationGroupId``) and wait; and the operations
    the mutations make (:meth:`new_op`, rendered by :meth:`op_json`)."""

    def __init__(self, state: GceState) -> None:
        self.state = state

    def new_op(self, zone: str, kind: str, target: str, apply: Any) -> Op:
        delay = self.state.op_delay.get(kind, 0.0)
        now = time.monotonic()
        op = Op(name=f"operation-{int(time.time() * 1000)}-{uuid.uuid4().hex[:12]}", id=str(next(self.state.ids)),
                 zone=zone, kind=kind, target=target, created=now,
                 done_at=None if delay is None else now + delay, apply=apply)
        self.state.ops[op.name] = op
        return op

    def op_json(self, op: Op) -> dict[str, Any]:
        done = op.applied
        body: dict[str, Any] = {
            "kind": "compute#operation", "id": op.id, "name": op.name, "operationType": op.kind,
            "zone": f"{API}/projects/{self.state.project}/zones/{op.zone}", "targetLink": op.target,
            "status": "DONE" if done else "RUNNING", "progress": 100 if done else 0,
            "insertTime": op.inserted, "startTime": op.inserted,
            "selfLink": f"{API}/projects/{self.state.project}/zones/{op.zone}/operations/{op.name}"}
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

    def find_op(self, request: web.Request) -> Op | web.Response:
        op = self.state.ops.get(request.match_info["op"])
        if op is None or op.zone != request.match_info["zone"]:
            return error(404, "notFound", f"The resource 'projects/{self.state.project}/zones/"
                                           f"{request.match_info['zone']}/operations/{request.match_info['op']}' "
                                           "was not found")
        return op

    async def operation(self, request: web.Request) -> web.StreamResponse:
        if (err := self.state.gate(request, "operation")) is not None:
            return err
        with self.state.lock:
            op = self.find_op(request)
            return op if isinstance(op, web.Response) else json_response(200, self.op_json(op))

    async def operations(self, request: web.Request) -> web.StreamResponse:
        """``zoneOperations.list``: the zone's operations, oldest first; ``filter`` takes
        ``operationGroupId=ID`` (what gcloud asks after a bulk insert), paged."""
        if (err := self.state.gate(request, "operationsList")) is not None:
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
        with self.state.lock:
            ops = [self.op_json(op) for op in self.state.ops.values()
                   if op.zone == zone and (match is None or (op.group is not None and match(op.group)))]
        return self.state.paged(request, "compute#operationList", ops,
                           id=f"projects/{self.state.project}/zones/{zone}/operations",
                           selfLink=f"{API}/projects/{self.state.project}/zones/{zone}/operations")

    async def wait(self, request: web.Request) -> web.StreamResponse:
        if (err := self.state.gate(request, "wait")) is not None:
            return err
        end = time.monotonic() + self.state.wait_hold_s
        while True:
            with self.state.lock:
                self.state.tick()
                op = self.find_op(request)
                if isinstance(op, web.Response):
                    return op
                if op.applied or time.monotonic() >= end:
                    return json_response(200, self.op_json(op))
            await asyncio.sleep(0.02)
