"""The ARM emulator's handlers of subscriptions, tenants, resource groups, deployments,
image versions, SKUs and operations (a VM's, NIC's and virtual network's are beside it)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from aiohttp import web

from ..httpserver import json_response
from .deployments import Deployments
from .identity import Directory
from .images import image_version, image_versions
from .state import ArmState
from .wire import arm_error, now_iso


class Resources:
    """The handlers (one per route kind, named as the kind) of everything but VMs and their
    network; ``url`` gives the emulator's base URL (a deployment's links name it)."""

    def __init__(self, state: ArmState, directory: Directory, deployments: Deployments,
                 url: Callable[[], str]) -> None:
        self.state = state
        self.directory = directory
        self.deployments = deployments
        self.url = url

    def op(self, request: web.Request, body: bytes, location: str, op_id: str) -> web.Response:
        op = self.state.ops.get(op_id)
        if op is None:
            return arm_error(404, "NotFound", f"operation {op_id} not found")
        if "operationresults" in request.path.lower():
            return web.Response(status=204 if op.status != "InProgress" else 202)
        out: dict[str, Any] = {"name": op.id, "status": op.status, "startTime": now_iso()}
        if op.status != "InProgress":
            out["endTime"] = now_iso()
        if op.error:
            out["error"] = op.error
        return json_response(200, out)

    def _subscription(self) -> dict[str, Any]:
        return {"id": f"/subscriptions/{self.state.subscription}", "subscriptionId": self.state.subscription,
                "tenantId": self.directory.tenant_id, "displayName": "FlowMesh emulator", "state": "Enabled",
                "authorizationSource": "RoleBased", "subscriptionPolicies": {
                    "locationPlacementId": "Public_2014-09-01", "quotaId": "PayAsYouGo_2014-09-01",
                    "spendingLimit": "Off"}}

    def subs(self, request: web.Request, body: bytes) -> web.Response:
        return json_response(200, {"value": [self._subscription()]})

    def sub(self, request: web.Request, body: bytes) -> web.Response:
        return json_response(200, self._subscription())

    def tenants(self, request: web.Request, body: bytes) -> web.Response:
        tenant = self.directory.tenant_id
        return json_response(200, {"value": [{"id": f"/tenants/{tenant}", "tenantId": tenant,
                                              "tenantCategory": "Home", "displayName": "FlowMesh emulator"}]})

    def deployment(self, request: web.Request, body: bytes, rg: str, name: str) -> web.Response:
        if (e := self.state.need_rg(rg)) is not None:
            return e
        return self.deployments.handle(request, body, rg, name, self.url())

    def deploymentop(self, request: web.Request, body: bytes, rg: str, name: str, op_id: str) -> web.Response:
        return self.deployments.status(op_id)

    def imagevers(self, request: web.Request, body: bytes, *where: str) -> web.Response:
        return image_versions(request, self.state.subscription, *where)

    def imagever(self, request: web.Request, body: bytes, *where: str) -> web.Response:
        return image_version(request, self.state.subscription, *where)

    def rgs(self, request: web.Request, body: bytes) -> web.Response:
        return json_response(200, {"value": list(self.state.groups.values())})

    def allvms(self, request: web.Request, body: bytes) -> web.Response:
        return json_response(200, {"value": list(self.state.vms.values())})

    def rg(self, request: web.Request, body: bytes, rg: str) -> web.Response:
        key = rg.lower()
        if request.method == "DELETE":
            group = self.state.groups.get(key)
            if group is None:
                return arm_error(404, "ResourceGroupNotFound", f"Resource group '{rg}' could not be found.")
            group["properties"]["provisioningState"] = "Deleting"

            def gone() -> None:   # a group takes what is in it
                for vm_key in [k for k in self.state.vms if k[0] == key]:
                    self.state.hosts.halt_soon(self.state.vms[vm_key]["properties"]["vmId"])
                    self.state.remove_vm(vm_key)
                for table in (self.state.nics, self.state.vnets):
                    for k in [k for k in table if k[0] == key]:
                        del table[k]
                self.deployments.drop_group(key)
                self.state.groups.pop(key, None)
            return self.state.lro(request, str(group["location"]), "delete", gone, 202, None)
        if request.method == "PUT":
            doc = json.loads(body or b"{}")
            created = key not in self.state.groups
            self.state.groups[key] = {"id": f"/subscriptions/{self.state.subscription}/resourceGroups/{rg}", "name": rg,
                                 "type": "Microsoft.Resources/resourceGroups", "location": doc.get("location"),
                                 "tags": doc.get("tags") or {}, "properties": {"provisioningState": "Succeeded"}}
            return json_response(201 if created else 200, self.state.groups[key])
        if key not in self.state.groups:
            return arm_error(404, "ResourceGroupNotFound", f"Resource group '{rg}' could not be found.")
        return json_response(200, self.state.groups[key])

    def skus(self, request: web.Request, body: bytes) -> web.Response:
        m = re.search(r"location eq '([^']+)'", request.query.get("$filter", ""))
        locs = [m.group(1)] if m else list(self.state.locations)
        items = []
        for loc in locs:
            if loc not in self.state.locations:
                continue
            for name, cpus, mem, gpus in self.state.sizes:
                caps = [{"name": "vCPUs", "value": str(cpus)}, {"name": "MemoryGB", "value": f"{mem:g}"},
                        {"name": "CpuArchitectureType", "value": "x64"}]
                if gpus:
                    caps.append({"name": "GPUs", "value": str(gpus)})
                items.append({"resourceType": "virtualMachines", "name": name, "tier": "Standard",
                              "size": name.split("_", 1)[1], "family": "standardFamily", "locations": [loc],
                              "locationInfo": [{"location": loc, "zones": ["1", "2", "3"]}], "capabilities": caps,
                              "restrictions": []})
        return json_response(200, {"value": items})
