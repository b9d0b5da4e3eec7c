"""The ARM emulator's network handlers: virtual networks and network interfaces."""

from __future__ import annotations

import json
import re
from typing import Any

from aiohttp import web

from ..httpserver import json_response
from .state import ArmState
from .wire import arm_error, resource_not_found


class Network:
    """``Microsoft.Network``: ``virtualNetworks`` and ``networkInterfaces`` (a handler per
    route kind, named as the kind)."""

    def __init__(self, state: ArmState) -> None:
        self.state = state

    def vnets(self, request: web.Request, body: bytes, rg: str) -> web.Response:
        if (e := self.state.need_rg(rg)) is not None:
            return e
        return json_response(200, {"value": [v for (g, _), v in self.state.vnets.items() if g == rg.lower()]})

    def vnet(self, request: web.Request, body: bytes, rg: str, name: str) -> web.Response:
        if (e := self.state.need_rg(rg)) is not None:
            return e
        key = (rg.lower(), name.lower())
        if request.method == "PUT":
            doc = json.loads(body or b"{}")
            vid = (f"/subscriptions/{self.state.subscription}/resourceGroups/{rg}/providers/Microsoft.Network/"
                   f"virtualNetworks/{name}")
            subnets = [{"id": f"{vid}/subnets/{s['name']}", "name": s["name"],
                        "properties": {**(s.get("properties") or {}), "provisioningState": "Succeeded"}}
                       for s in (doc.get("properties") or {}).get("subnets") or []]
            self.state.vnets[key] = {"id": vid, "name": name, "type": "Microsoft.Network/virtualNetworks",
                                "location": doc.get("location"), "tags": doc.get("tags") or {},
                                "properties": {**(doc.get("properties") or {}), "subnets": subnets,
                                               "provisioningState": "Succeeded"}}
            return self.state.lro(request, str(doc.get("location")), "vnet", lambda: None, 201, self.state.vnets[key])
        if key not in self.state.vnets:
            return resource_not_found("Microsoft.Network/virtualNetworks", name, rg)
        return json_response(200, self.state.vnets[key])

    def nics(self, request: web.Request, body: bytes, rg: str) -> web.Response:
        if (e := self.state.need_rg(rg)) is not None:
            return e
        return json_response(200, {"value": [v for (g, _), v in self.state.nics.items() if g == rg.lower()]})

    def new_nic(self, rg: str, name: str, location: str, ipconf: dict[str, Any], vm_id: str | None,
                 extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """A NIC with its first IP configuration given an address (and a public one when asked)."""
        n = next(self.state.ip)
        base = f"/subscriptions/{self.state.subscription}/resourceGroups/{rg}/providers"
        conf_props = ipconf.get("properties") or {}
        ip_props: dict[str, Any] = {"privateIPAddress": f"10.20.{n // 250}.{n % 250 + 4}",
                                    "privateIPAllocationMethod": "Dynamic", "primary": True,
                                    "provisioningState": "Succeeded", "subnet": conf_props.get("subnet")}
        if conf_props.get("publicIPAddressConfiguration"):
            ip_props["publicIPAddress"] = {"id": f"{base}/Microsoft.Network/publicIPAddresses/{name}-ip",
                                           "properties": {"ipAddress": f"20.0.{n // 250}.{n % 250 + 1}"}}
        nic: dict[str, Any] = {
            "id": f"{base}/Microsoft.Network/networkInterfaces/{name}", "name": name,
            "type": "Microsoft.Network/networkInterfaces", "location": location,
            "properties": {**(extra or {}), "provisioningState": "Succeeded",
                           "macAddress": f"00-0D-3A-{n >> 16 & 255:02X}-{n >> 8 & 255:02X}-{n & 255:02X}",
                           "ipConfigurations": [{"name": ipconf.get("name", "ipconfig1"),
                                                 "id": f"{base}/Microsoft.Network/networkInterfaces/{name}/"
                                                       f"ipConfigurations/{ipconf.get('name', 'ipconfig1')}",
                                                 "properties": ip_props}]}}
        if vm_id is not None:
            nic["properties"]["virtualMachine"] = {"id": vm_id}
        self.state.nics[(rg.lower(), name.lower())] = nic
        return nic

    def nic(self, request: web.Request, body: bytes, rg: str, name: str) -> web.Response:
        if request.method == "PUT":
            if (e := self.state.need_rg(rg)) is not None:
                return e
            doc = json.loads(body or b"{}")
            props = dict(doc.get("properties") or {})
            confs = props.pop("ipConfigurations", None) or []
            if not confs:
                return arm_error(400, "InvalidRequestFormat", "properties.ipConfigurations: a network interface "
                                                              "needs at least one IP configuration")
            subnet = ((confs[0].get("properties") or {}).get("subnet") or {}).get("id", "")
            m = re.match(r"^/subscriptions/[^/]+/resourceGroups/([^/]+)/providers/Microsoft\.Network/"
                         r"virtualNetworks/([^/]+)/subnets/([^/]+)$", subnet, re.I)
            vnet = self.state.vnets.get((m.group(1).lower(), m.group(2).lower())) if m else None
            subnet_name = m.group(3).lower() if m else ""
            if vnet is None or not any(sn["name"].lower() == subnet_name for sn in vnet["properties"]["subnets"]):
                return arm_error(400, "InvalidResourceReference", f"Resource {subnet} referenced by resource "
                                 f"{name} was not found. Please make sure that the referenced resource exists.")
            existing = self.state.nics.get((rg.lower(), name.lower()))
            vm_ref = ((existing or {}).get("properties") or {}).get("virtualMachine")
            nic = self.new_nic(rg, name, str(doc.get("location")), confs[0], vm_ref["id"] if vm_ref else None, props)
            nic["tags"] = doc.get("tags") or {}
            return self.state.lro(request, str(doc.get("location")), "nic", lambda: None, 200 if existing else 201, nic)
        found = self.state.nics.get((rg.lower(), name.lower()))
        if found is None:
            return resource_not_found("Microsoft.Network/networkInterfaces", name, rg)
        return json_response(200, found)
