"""The ARM emulator's virtual machines: listed, got (with their instance view), created
(a long-running operation that can fail on capacity or quota) and deleted."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from aiohttp import web

from ..httpserver import json_response
from .network import Network
from .state import ArmState
from .wire import arm_error, now_iso, resource_not_found


class Vms:
    """``Microsoft.Compute/virtualMachines`` (a VM may make its NIC, hence ``network``)."""

    def __init__(self, state: ArmState, network: Network) -> None:
        self.state = state
        self.network = network

    def vms(self, request: web.Request, body: bytes, rg: str) -> web.Response:
        if (e := self.state.need_rg(rg)) is not None:
            return e
        return json_response(200, {"value": [v for (g, _), v in self.state.vms.items() if g == rg.lower()]})

    def vm(self, request: web.Request, body: bytes, rg: str, name: str) -> web.Response:
        key = (rg.lower(), name.lower())
        if request.method == "GET":
            if (e := self.state.need_rg(rg)) is not None:
                return e
            vm = self.state.vms.get(key)
            if vm is None:
                return resource_not_found("Microsoft.Compute/virtualMachines", name, rg)
            if "instanceview" in request.query.get("$expand", "").lower():
                state = vm["properties"]["provisioningState"]
                vm = {**vm, "properties": {**vm["properties"], "instanceView": {"statuses": [
                    {"code": f"ProvisioningState/{state.lower()}", "level": "Info", "displayStatus": state},
                    {"code": "PowerState/running" if state == "Succeeded" else "PowerState/starting",
                     "level": "Info", "displayStatus": "VM running" if state == "Succeeded" else "VM starting"}]}}}
            return json_response(200, vm)
        if request.method == "DELETE":
            vm = self.state.vms.get(key)
            if vm is None:
                return web.Response(status=204)
            vm["properties"]["provisioningState"] = "Deleting"
            vm_id = vm["properties"]["vmId"]

            def gone() -> None:
                self.state.remove_vm(key)
                self.state.hosts.halt_soon(vm_id)
                return None
            return self.state.lro(request, str(vm["location"]), "delete", gone, 202, None)
        if (e := self.state.need_rg(rg)) is not None:
            return e
        doc = json.loads(body or b"{}")
        props = dict(doc.get("properties") or {})
        size = str((props.get("hardwareProfile") or {}).get("vmSize"))
        loc = str(doc.get("location"))
        spec = next((s for s in self.state.sizes if s[0] == size), None)
        if loc not in self.state.locations or spec is None or any(
                (s is None or s == size) and how == "SkuNotAvailable" for s, how in self.state.exhausted):
            return arm_error(409, "SkuNotAvailable", f"The requested VM size '{size}' is currently not available in "
                                                     f"location '{loc}'. Please try another size or deploy to a "
                                                     "different location or different zone.")
        for k, v in (doc.get("tags") or {}).items():
            if re.search(r"[<>%&\\?/]", k) or len(k) > 512 or len(str(v)) > 256:
                return arm_error(400, "InvalidTagNameCharacters", f"The tag name '{k}' has invalid characters")
        existing = self.state.vms.get(key)
        vm_id = existing["properties"]["vmId"] if existing else str(uuid.uuid4())
        os_profile = dict(props.get("osProfile") or {})
        custom = os_profile.pop("customData", None)            # ARM never returns it
        if custom is not None:
            self.state.custom[vm_id] = custom
        network = props.get("networkProfile") or {}
        confs, refs = network.get("networkInterfaceConfigurations") or [], network.get("networkInterfaces") or []
        nic_conf: dict[str, Any] = confs[0] if confs else {}
        if confs:      # the VM makes its NIC (the provider's way)
            nic_name = str(nic_conf.get("name") or f"{name}-nic")
            delete_option = (nic_conf.get("properties") or {}).get("deleteOption") or "Detach"
        elif refs:     # an existing NIC (az vm create's template makes it first)
            nic_name = str(refs[0].get("id", "")).rsplit("/", 1)[-1]
            delete_option = (refs[0].get("properties") or {}).get("deleteOption") or "Detach"
            if (key[0], nic_name.lower()) not in self.state.nics:
                return arm_error(400, "InvalidResourceReference", f"Resource {refs[0].get('id')} referenced by "
                                 f"resource {name} was not found. Please make sure that the referenced resource "
                                 "exists.")
        else:
            return arm_error(400, "InvalidParameter", "Required parameter 'networkProfile' is missing (null): a "
                                                      "VM needs networkInterfaces or networkInterfaceConfigurations")
        base = f"/subscriptions/{self.state.subscription}/resourceGroups/{rg}/providers"
        vm = {"id": f"{base}/Microsoft.Compute/virtualMachines/{name}", "name": name,
              "type": "Microsoft.Compute/virtualMachines", "location": loc, "tags": doc.get("tags") or {},
              "properties": {**props, "osProfile": os_profile, "vmId": vm_id, "provisioningState": "Creating",
                             "timeCreated": existing["properties"]["timeCreated"] if existing else now_iso(),
                             "networkProfile": {**(props.get("networkProfile") or {}), "networkInterfaces": [
                                 {"id": f"{base}/Microsoft.Network/networkInterfaces/{nic_name}",
                                  "properties": {"primary": True, "deleteOption": delete_option}}]}}}
        self.state.vms[key] = vm
        cpus = spec[1]

        def create() -> dict[str, str] | None:
            if any((s is None or s == size) and how != "SkuNotAvailable" for s, how in self.state.exhausted):
                how = next(h for s, h in self.state.exhausted if (s is None or s == size) and h != "SkuNotAvailable")
                vm["properties"]["provisioningState"] = "Failed"
                return {"code": how, "message": "Allocation failed. We do not have sufficient capacity for the "
                                                f"requested VM size '{size}' in this region."}
            limit = self.state.core_quota.get(loc)
            if limit is not None:
                used = sum(next((s[1] for s in self.state.sizes
                                 if s[0] == v["properties"]["hardwareProfile"]["vmSize"]), 0)
                           for k, v in self.state.vms.items() if v["location"] == loc and k != key
                           and v["properties"]["provisioningState"] == "Succeeded")
                if used + cpus > limit:
                    vm["properties"]["provisioningState"] = "Failed"
                    return {"code": "OperationNotAllowed",
                            "message": f"Operation could not be completed as it results in exceeding approved "
                                       f"standardDSv5Family Cores quota. Location: {loc}, Current Limit: {limit}, "
                                       f"Current Usage: {used}, Additional Required: {cpus}."}
            attached = self.state.nics.get((key[0], nic_name.lower())) if not confs else None
            if attached is not None:
                attached["properties"]["virtualMachine"] = {"id": vm["id"]}
            else:
                ipconf = dict(((nic_conf.get("properties") or {}).get("ipConfigurations") or [{}])[0])
                self.network.new_nic(rg, nic_name, loc, ipconf, str(vm["id"]))
            vm["properties"]["provisioningState"] = "Succeeded"
            return None
        return self.state.lro(request, loc, "vm", create, 200 if existing else 201, vm)
