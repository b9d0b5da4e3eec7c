"""The ARM emulator (see the package docstring): its switches, views and the handlers of
the resources the ``azure`` provider uses."""

from __future__ import annotations

import base64
import itertools
import json
import re
import shutil
import ssl
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from ..cloudinit import CloudInitHosts
from ..httpserver import HttpServer, json_response, self_signed_tls
from .credential import StaticTokenCredential
from .deployments import Deployments
from .identity import Directory
from .images import image_version, image_versions
from .metadata import ALIAS_DOC_PATH, METADATA_PATH, alias_doc, cloud_metadata
from .wire import ROUTES, Op, arm_error, now_iso, resource_not_found

__all__ = ["AzureEmulator", "DEFAULT_SIZES", "SUBSCRIPTION"]

SUBSCRIPTION = "00000000-0000-4000-8000-00000000f10e"
# (name, vCPUs, memory GB, GPUs)
DEFAULT_SIZES: tuple[tuple[str, int, float, int], ...] = (
    ("Standard_D2s_v5", 2, 8.0, 0),
    ("Standard_D4s_v5", 4, 16.0, 0),
    ("Standard_D8s_v5", 8, 32.0, 0),
    ("Standard_F2s_v2", 2, 4.0, 0),
    ("Standard_NC4as_T4_v3", 4, 28.0, 1),
)


class AzureEmulator(HttpServer):
    """A TEST FIXTURE: ARM for the calls the ``azure`` provider makes."""

    name = "azure-emulator"

    def __init__(self, *, subscription: str = SUBSCRIPTION, locations: Sequence[str] = ("eastus",),
                 sizes: Sequence[tuple[str, int, float, int]] = DEFAULT_SIZES, token: str | None = None,
                 first_host: int = 120, port: int = 0, tls: bool = False, **sshd_kwargs: Any) -> None:
        super().__init__(port=port)
        self.tls = tls
        self._tls_dir: Path | None = None
        self.subscription = subscription
        self.locations = tuple(locations)
        self.sizes = tuple(sizes)
        self.token = token or f"emulator-{uuid.uuid4().hex}"
        self.directory = Directory(self.token)
        self.deployments = Deployments(subscription, self._send)
        self._session: aiohttp.ClientSession | None = None
        self.hosts = CloudInitHosts(first_host=first_host, **sshd_kwargs)
        self._lock = threading.Lock()
        self._groups: dict[str, dict[str, Any]] = {}
        self._vms: dict[tuple[str, str], dict[str, Any]] = {}        # (rg, name lower) -> VM
        self._custom: dict[str, str] = {}                             # vmId -> customData (never returned)
        self._nics: dict[tuple[str, str], dict[str, Any]] = {}
        self._vnets: dict[tuple[str, str], dict[str, Any]] = {}
        self._ops: dict[str, Op] = {}
        self._ip = itertools.count(4)
        self._exhausted: list[tuple[str | None, str]] = []            # (size or None, how)
        self._core_quota: dict[str, int] = {}
        self._faults: list[list[Any]] = []                            # [kind, method, status, code, times]
        self._op_delay: dict[str, float | None] = {}
        self._deny = False
        self.calls: list[tuple[str, str]] = []                        # (kind, method)

    # ---- switches --------------------------------------------------------------------
    def exhaust(self, size: str | None = None, *, how: str = "AllocationFailed") -> None:
        """VM creations (of ``size``, any for None) fail: ``AllocationFailed`` /
        ``ZonalAllocationFailed`` in the operation, or ``SkuNotAvailable`` at the PUT."""
        with self._lock:
            self._exhausted.append((size, how))

    def restore(self) -> None:
        with self._lock:
            self._exhausted.clear()

    def set_core_quota(self, location: str, limit: int | None) -> None:
        with self._lock:
            if limit is None:
                self._core_quota.pop(location, None)
            else:
                self._core_quota[location] = limit

    def fail(self, kind: str, method: str, status: int, code: str, *, times: int | None = 1) -> None:
        """Answer the next ``times`` calls of ``kind`` (rg, skus, vm, vms, vnet, nic, op) with
        ``method`` (GET, PUT, DELETE) with an ARM error."""
        with self._lock:
            self._faults.append([kind, method, status, code, times])

    def slow_operations(self, seconds: float | None, kinds: Sequence[str] = ("vm", "delete")) -> None:
        with self._lock:
            for k in kinds:
                self._op_delay[k] = seconds

    def finish_operations(self) -> None:
        with self._lock:
            now = time.monotonic()
            for op in self._ops.values():
                if op.status == "InProgress":
                    op.done_at = now
            self._tick()

    def deny(self, on: bool = True) -> None:
        with self._lock:
            self._deny = on

    def clear(self) -> None:
        with self._lock:
            self._exhausted.clear()
            self._core_quota.clear()
            self._faults.clear()
            self._op_delay.clear()
            self._deny = False

    def delete_behind(self, vm_id: str) -> None:
        with self._lock:
            for key, vm in list(self._vms.items()):
                if vm["properties"]["vmId"] == vm_id:
                    self._remove_vm(key)
        self.hosts.halt(vm_id)

    # ---- views -----------------------------------------------------------------------
    @property
    def vms(self) -> list[dict[str, Any]]:
        with self._lock:
            return [json.loads(json.dumps(v)) for v in self._vms.values()]

    def custom_data(self, vm_id: str) -> str | None:
        with self._lock:
            return self._custom.get(vm_id)

    def count(self, kind: str, method: str) -> int:
        with self._lock:
            return sum(1 for c in self.calls if c == (kind, method))

    def address(self, instance: Any) -> tuple[str, int]:
        """``SshMode.address_map``: boot the VM (once) from its customData."""
        vm_id = str(instance.id)
        vm = self.hosts.booted(vm_id)
        if vm is None:
            with self._lock:
                found = next((v for v in self._vms.values() if v["properties"]["vmId"] == vm_id), None)
                custom = self._custom.get(vm_id, "")
            if found is None:
                raise RuntimeError(f"VM {vm_id} does not exist (deleted?)")
            keys = ((found["properties"].get("osProfile") or {}).get("linuxConfiguration") or {}).get("ssh") or {}
            extra = tuple(k["keyData"] for k in keys.get("publicKeys") or [])
            vm = self.hosts.boot(vm_id, base64.b64decode(custom).decode() if custom else "", extra_authorized=extra)
        return vm.sshd.host, vm.sshd.port

    def credential(self) -> StaticTokenCredential:
        return StaticTokenCredential(self.token)

    def provider(self, **kwargs: Any) -> Any:
        """An ``AzureProvider`` pointed at this emulator (polling interval 0, HTTP allowed
        for this loopback endpoint only)."""
        from flowmesh_providers.azure import AzureProvider, SshMode
        ssh = kwargs.pop("ssh", None)
        if ssh is True:
            ssh = SshMode(address_map=self.address)
        kwargs.setdefault("locations", list(self.locations))
        kwargs.setdefault("polling_interval_s", 0.0)
        return AzureProvider(subscription_id=kwargs.pop("subscription_id", self.subscription), base_url=self.url,
                             credential=kwargs.pop("credential", self.credential()), allow_http=not self.tls, ssh=ssh,
                             **kwargs)

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` (``https://`` with ``tls=True``)."""
        return f"{'https' if self.tls else 'http'}://{self.host}"

    @property
    def ca_cert(self) -> Path:
        """With ``tls=True``: the server's self-signed certificate (PEM), the CA a client
        verifies it with (``REQUESTS_CA_BUNDLE`` for az)."""
        if self._tls_dir is None:
            raise RuntimeError(f"{self.name} is not running with TLS")
        return self._tls_dir / "server.crt"

    def start(self) -> AzureEmulator:
        if self.tls and self._tls_dir is None:
            self._tls_dir = Path(tempfile.mkdtemp(prefix="fm-azure-tls-")) / "tls"
            self.ssl_context = self_signed_tls(self._tls_dir, "flowmesh-azure-emulator")
        super().start()
        return self

    async def on_start(self) -> None:
        ssl_ctx: ssl.SSLContext | bool = False
        if self.tls:
            ssl_ctx = ssl.create_default_context(cafile=str(self.ca_cert))
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ssl_ctx))

    async def on_stop(self) -> None:
        await self.deployments.close()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _send(self, method: str, path: str, body: Any) -> tuple[int, dict[str, str], Any]:
        """A call to this emulator's own endpoint (a deployment's resource PUTs and polls)."""
        assert self._session is not None
        url = path if path.startswith("http") else self.url + path
        async with self._session.request(method, url, json=body,
                                         headers={"Authorization": f"Bearer {self.token}"}) as resp:
            text = await resp.text()
            return resp.status, dict(resp.headers), json.loads(text) if text else None

    def stop(self) -> None:
        super().stop()
        self.hosts.close()
        if self._tls_dir is not None:
            shutil.rmtree(self._tls_dir.parent, ignore_errors=True)
            self._tls_dir = None
            self.ssl_context = None

    # ---- HTTP ------------------------------------------------------------------------
    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = re.sub("/+", "/", request.path).rstrip("/")   # az joins its ARM URL and a path with "//"
        if self.directory.serves(path):
            return await self.directory.handle(request, self.url)
        if request.method == "GET" and path.lower() == METADATA_PATH:   # unauthenticated, as ARM's
            return json_response(200, cloud_metadata(self.url))
        if request.method == "GET" and path.lower() == ALIAS_DOC_PATH:
            return json_response(200, alias_doc())
        for kind, rx in ROUTES:
            m = rx.match(path)
            if m:
                break
        else:
            return arm_error(404, "InvalidResourceType", f"no route for {request.method} {path}")
        if "api-version" not in request.query:
            return arm_error(400, "MissingApiVersionParameter",
                             "The api-version query parameter (?api-version=) is required for all requests.")
        body = await request.read()
        with self._lock:
            self.calls.append((kind, request.method))
            self._tick()
            auth = request.headers.get("Authorization", "")
            if auth != f"Bearer {self.token}":
                return arm_error(401, "InvalidAuthenticationToken", "The access token is invalid.")
            if self._deny:
                return arm_error(403, "AuthorizationFailed",
                                 f"The client does not have authorization to perform action over scope '{path}'.")
            for f in self._faults:
                if f[0] == kind and f[1] == request.method and (f[4] is None or f[4] > 0):
                    if f[4] is not None:
                        f[4] -= 1
                    headers = {"Retry-After": "1"} if f[2] == 429 else None
                    return arm_error(f[2], f[3], f"injected: {f[3]}", headers)
            if kind not in ("subs", "tenants") and m.group(1) != self.subscription:
                return arm_error(404, "SubscriptionNotFound", f"The subscription '{m.group(1)}' could not be found.")
            args = m.groups()[1:]
            return getattr(self, f"_h_{kind}")(request, body, *args)

    def _tick(self) -> None:
        now = time.monotonic()
        for op in self._ops.values():
            if op.due(now):
                try:
                    op.error = op.apply()
                except Exception as exc:  # a bug in the emulator fails the operation, visibly
                    op.error = {"code": "InternalServerError", "message": f"emulator error: {exc!r}"}
                op.status = "Failed" if op.error else "Succeeded"

    def _lro(self, request: web.Request, location: str, kind: str, apply: Any, status: int,
             body: Any) -> web.Response:
        delay = self._op_delay.get(kind, 0.0)
        op = Op(uuid.uuid4().hex, location, None if delay is None else time.monotonic() + delay, apply)
        self._ops[op.id] = op
        namespace = "Microsoft.Network" if kind in ("vnet", "nic") else "Microsoft.Compute"   # the operation's owner
        base = f"{self.url}/subscriptions/{self.subscription}/providers/{namespace}/locations/{location}"
        api = request.query["api-version"]
        headers = {"Azure-AsyncOperation": f"{base}/operations/{op.id}?api-version={api}"}
        if request.method == "DELETE":
            headers["Location"] = f"{base}/operationResults/{op.id}?api-version={api}"
        return json_response(status, body, headers) if body is not None else web.Response(status=status,
                                                                                        headers=headers)

    def _h_op(self, request: web.Request, body: bytes, location: str, op_id: str) -> web.Response:
        op = self._ops.get(op_id)
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
        return {"id": f"/subscriptions/{self.subscription}", "subscriptionId": self.subscription,
                "tenantId": self.directory.tenant_id, "displayName": "FlowMesh emulator", "state": "Enabled",
                "authorizationSource": "RoleBased", "subscriptionPolicies": {
                    "locationPlacementId": "Public_2014-09-01", "quotaId": "PayAsYouGo_2014-09-01",
                    "spendingLimit": "Off"}}

    def _h_subs(self, request: web.Request, body: bytes) -> web.Response:
        return json_response(200, {"value": [self._subscription()]})

    def _h_sub(self, request: web.Request, body: bytes) -> web.Response:
        return json_response(200, self._subscription())

    def _h_tenants(self, request: web.Request, body: bytes) -> web.Response:
        tenant = self.directory.tenant_id
        return json_response(200, {"value": [{"id": f"/tenants/{tenant}", "tenantId": tenant,
                                              "tenantCategory": "Home", "displayName": "FlowMesh emulator"}]})

    def _h_deployment(self, request: web.Request, body: bytes, rg: str, name: str) -> web.Response:
        if (e := self._need_rg(rg)) is not None:
            return e
        return self.deployments.handle(request, body, rg, name, self.url)

    def _h_deploymentop(self, request: web.Request, body: bytes, rg: str, name: str, op_id: str) -> web.Response:
        return self.deployments.status(op_id)

    def _h_imagevers(self, request: web.Request, body: bytes, *where: str) -> web.Response:
        return image_versions(request, self.subscription, *where)

    def _h_imagever(self, request: web.Request, body: bytes, *where: str) -> web.Response:
        return image_version(request, self.subscription, *where)

    def _h_rgs(self, request: web.Request, body: bytes) -> web.Response:
        return json_response(200, {"value": list(self._groups.values())})

    def _h_allvms(self, request: web.Request, body: bytes) -> web.Response:
        return json_response(200, {"value": list(self._vms.values())})

    def _h_rg(self, request: web.Request, body: bytes, rg: str) -> web.Response:
        key = rg.lower()
        if request.method == "DELETE":
            group = self._groups.get(key)
            if group is None:
                return arm_error(404, "ResourceGroupNotFound", f"Resource group '{rg}' could not be found.")
            group["properties"]["provisioningState"] = "Deleting"

            def gone() -> None:   # a group takes what is in it
                for vm_key in [k for k in self._vms if k[0] == key]:
                    self.hosts.halt_soon(self._vms[vm_key]["properties"]["vmId"])
                    self._remove_vm(vm_key)
                for table in (self._nics, self._vnets):
                    for k in [k for k in table if k[0] == key]:
                        del table[k]
                self.deployments.drop_group(key)
                self._groups.pop(key, None)
            return self._lro(request, str(group["location"]), "delete", gone, 202, None)
        if request.method == "PUT":
            doc = json.loads(body or b"{}")
            created = key not in self._groups
            self._groups[key] = {"id": f"/subscriptions/{self.subscription}/resourceGroups/{rg}", "name": rg,
                                 "type": "Microsoft.Resources/resourceGroups", "location": doc.get("location"),
                                 "tags": doc.get("tags") or {}, "properties": {"provisioningState": "Succeeded"}}
            return json_response(201 if created else 200, self._groups[key])
        if key not in self._groups:
            return arm_error(404, "ResourceGroupNotFound", f"Resource group '{rg}' could not be found.")
        return json_response(200, self._groups[key])

    def _h_skus(self, request: web.Request, body: bytes) -> web.Response:
        m = re.search(r"location eq '([^']+)'", request.query.get("$filter", ""))
        locs = [m.group(1)] if m else list(self.locations)
        items = []
        for loc in locs:
            if loc not in self.locations:
                continue
            for name, cpus, mem, gpus in self.sizes:
                caps = [{"name": "vCPUs", "value": str(cpus)}, {"name": "MemoryGB", "value": f"{mem:g}"},
                        {"name": "CpuArchitectureType", "value": "x64"}]
                if gpus:
                    caps.append({"name": "GPUs", "value": str(gpus)})
                items.append({"resourceType": "virtualMachines", "name": name, "tier": "Standard",
                              "size": name.split("_", 1)[1], "family": "standardFamily", "locations": [loc],
                              "locationInfo": [{"location": loc, "zones": ["1", "2", "3"]}], "capabilities": caps,
                              "restrictions": []})
        return json_response(200, {"value": items})

    def _need_rg(self, rg: str) -> web.Response | None:
        if rg.lower() not in self._groups:
            return arm_error(404, "ResourceGroupNotFound", f"Resource group '{rg}' could not be found.")
        return None

    def _h_vnets(self, request: web.Request, body: bytes, rg: str) -> web.Response:
        if (e := self._need_rg(rg)) is not None:
            return e
        return json_response(200, {"value": [v for (g, _), v in self._vnets.items() if g == rg.lower()]})

    def _h_vnet(self, request: web.Request, body: bytes, rg: str, name: str) -> web.Response:
        if (e := self._need_rg(rg)) is not None:
            return e
        key = (rg.lower(), name.lower())
        if request.method == "PUT":
            doc = json.loads(body or b"{}")
            vid = f"/subscriptions/{self.subscription}/resourceGroups/{rg}/providers/Microsoft.Network/virtualNetworks/{name}"
            subnets = [{"id": f"{vid}/subnets/{s['name']}", "name": s["name"],
                        "properties": {**(s.get("properties") or {}), "provisioningState": "Succeeded"}}
                       for s in (doc.get("properties") or {}).get("subnets") or []]
            self._vnets[key] = {"id": vid, "name": name, "type": "Microsoft.Network/virtualNetworks",
                                "location": doc.get("location"), "tags": doc.get("tags") or {},
                                "properties": {**(doc.get("properties") or {}), "subnets": subnets,
                                               "provisioningState": "Succeeded"}}
            return self._lro(request, str(doc.get("location")), "vnet", lambda: None, 201, self._vnets[key])
        if key not in self._vnets:
            return resource_not_found("Microsoft.Network/virtualNetworks", name, rg)
        return json_response(200, self._vnets[key])

    def _h_nics(self, request: web.Request, body: bytes, rg: str) -> web.Response:
        if (e := self._need_rg(rg)) is not None:
            return e
        return json_response(200, {"value": [v for (g, _), v in self._nics.items() if g == rg.lower()]})

    def _new_nic(self, rg: str, name: str, location: str, ipconf: dict[str, Any], vm_id: str | None,
                 extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """A NIC with its first IP configuration given an address (and a public one when asked)."""
        n = next(self._ip)
        base = f"/subscriptions/{self.subscription}/resourceGroups/{rg}/providers"
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
        self._nics[(rg.lower(), name.lower())] = nic
        return nic

    def _h_nic(self, request: web.Request, body: bytes, rg: str, name: str) -> web.Response:
        if request.method == "PUT":
            if (e := self._need_rg(rg)) is not None:
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
            vnet = self._vnets.get((m.group(1).lower(), m.group(2).lower())) if m else None
            subnet_name = m.group(3).lower() if m else ""
            if vnet is None or not any(sn["name"].lower() == subnet_name for sn in vnet["properties"]["subnets"]):
                return arm_error(400, "InvalidResourceReference", f"Resource {subnet} referenced by resource "
                                 f"{name} was not found. Please make sure that the referenced resource exists.")
            existing = self._nics.get((rg.lower(), name.lower()))
            vm_ref = ((existing or {}).get("properties") or {}).get("virtualMachine")
            nic = self._new_nic(rg, name, str(doc.get("location")), confs[0], vm_ref["id"] if vm_ref else None, props)
            nic["tags"] = doc.get("tags") or {}
            return self._lro(request, str(doc.get("location")), "nic", lambda: None, 200 if existing else 201, nic)
        found = self._nics.get((rg.lower(), name.lower()))
        if found is None:
            return resource_not_found("Microsoft.Network/networkInterfaces", name, rg)
        return json_response(200, found)

    def _h_vms(self, request: web.Request, body: bytes, rg: str) -> web.Response:
        if (e := self._need_rg(rg)) is not None:
            return e
        return json_response(200, {"value": [v for (g, _), v in self._vms.items() if g == rg.lower()]})

    def _remove_vm(self, key: tuple[str, str]) -> None:
        vm = self._vms.pop(key, None)
        if vm is None:
            return
        for ref in vm["properties"].get("networkProfile", {}).get("networkInterfaces") or []:
            nic_key = (key[0], ref["id"].rsplit("/", 1)[-1].lower())
            if str((ref.get("properties") or {}).get("deleteOption") or "Detach").lower() == "delete":
                self._nics.pop(nic_key, None)
            elif nic_key in self._nics:
                self._nics[nic_key]["properties"].pop("virtualMachine", None)
        self._custom.pop(vm["properties"]["vmId"], None)

    def _h_vm(self, request: web.Request, body: bytes, rg: str, name: str) -> web.Response:
        key = (rg.lower(), name.lower())
        if request.method == "GET":
            if (e := self._need_rg(rg)) is not None:
                return e
            vm = self._vms.get(key)
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
            vm = self._vms.get(key)
            if vm is None:
                return web.Response(status=204)
            vm["properties"]["provisioningState"] = "Deleting"
            vm_id = vm["properties"]["vmId"]

            def gone() -> None:
                self._remove_vm(key)
                self.hosts.halt_soon(vm_id)
                return None
            return self._lro(request, str(vm["location"]), "delete", gone, 202, None)
        if (e := self._need_rg(rg)) is not None:
            return e
        doc = json.loads(body or b"{}")
        props = dict(doc.get("properties") or {})
        size = str((props.get("hardwareProfile") or {}).get("vmSize"))
        loc = str(doc.get("location"))
        spec = next((s for s in self.sizes if s[0] == size), None)
        if loc not in self.locations or spec is None or any(
                (s is None or s == size) and how == "SkuNotAvailable" for s, how in self._exhausted):
            return arm_error(409, "SkuNotAvailable", f"The requested VM size '{size}' is currently not available in "
                                                     f"location '{loc}'. Please try another size or deploy to a "
                                                     "different location or different zone.")
        for k, v in (doc.get("tags") or {}).items():
            if re.search(r"[<>%&\\?/]", k) or len(k) > 512 or len(str(v)) > 256:
                return arm_error(400, "InvalidTagNameCharacters", f"The tag name '{k}' has invalid characters")
        existing = self._vms.get(key)
        vm_id = existing["properties"]["vmId"] if existing else str(uuid.uuid4())
        os_profile = dict(props.get("osProfile") or {})
        custom = os_profile.pop("customData", None)            # ARM never returns it
        if custom is not None:
            self._custom[vm_id] = custom
        network = props.get("networkProfile") or {}
        confs, refs = network.get("networkInterfaceConfigurations") or [], network.get("networkInterfaces") or []
        nic_conf: dict[str, Any] = confs[0] if confs else {}
        if confs:      # the VM makes its NIC (the provider's way)
            nic_name = str(nic_conf.get("name") or f"{name}-nic")
            delete_option = (nic_conf.get("properties") or {}).get("deleteOption") or "Detach"
        elif refs:     # an existing NIC (az vm create's template makes it first)
            nic_name = str(refs[0].get("id", "")).rsplit("/", 1)[-1]
            delete_option = (refs[0].get("properties") or {}).get("deleteOption") or "Detach"
            if (key[0], nic_name.lower()) not in self._nics:
                return arm_error(400, "InvalidResourceReference", f"Resource {refs[0].get('id')} referenced by "
                                 f"resource {name} was not found. Please make sure that the referenced resource "
                                 "exists.")
        else:
            return arm_error(400, "InvalidParameter", "Required parameter 'networkProfile' is missing (null): a "
                                                      "VM needs networkInterfaces or networkInterfaceConfigurations")
        base = f"/subscriptions/{self.subscription}/resourceGroups/{rg}/providers"
        vm = {"id": f"{base}/Microsoft.Compute/virtualMachines/{name}", "name": name,
              "type": "Microsoft.Compute/virtualMachines", "location": loc, "tags": doc.get("tags") or {},
              "properties": {**props, "osProfile": os_profile, "vmId": vm_id, "provisioningState": "Creating",
                             "timeCreated": existing["properties"]["timeCreated"] if existing else now_iso(),
                             "networkProfile": {**(props.get("networkProfile") or {}), "networkInterfaces": [
                                 {"id": f"{base}/Microsoft.Network/networkInterfaces/{nic_name}",
                                  "properties": {"primary": True, "deleteOption": delete_option}}]}}}
        self._vms[key] = vm
        cpus = spec[1]

        def create() -> dict[str, str] | None:
            if any((s is None or s == size) and how != "SkuNotAvailable" for s, how in self._exhausted):
                how = next(h for s, h in self._exhausted if (s is None or s == size) and h != "SkuNotAvailable")
                vm["properties"]["provisioningState"] = "Failed"
                return {"code": how, "message": "Allocation failed. We do not have sufficient capacity for the "
                                                f"requested VM size '{size}' in this region."}
            limit = self._core_quota.get(loc)
            if limit is not None:
                used = sum(next((s[1] for s in self.sizes if s[0] == v["properties"]["hardwareProfile"]["vmSize"]), 0)
                           for k, v in self._vms.items() if v["location"] == loc and k != key
                           and v["properties"]["provisioningState"] == "Succeeded")
                if used + cpus > limit:
                    vm["properties"]["provisioningState"] = "Failed"
                    return {"code": "OperationNotAllowed",
                            "message": f"Operation could not be completed as it results in exceeding approved "
                                       f"standardDSv5Family Cores quota. Location: {loc}, Current Limit: {limit}, "
                                       f"Current Usage: {used}, Additional Required: {cpus}."}
            attached = self._nics.get((key[0], nic_name.lower())) if not confs else None
            if attached is not None:
                attached["properties"]["virtualMachine"] = {"id": vm["id"]}
            else:
                ipconf = dict(((nic_conf.get("properties") or {}).get("ipConfigurations") or [{}])[0])
                self._new_nic(rg, nic_name, loc, ipconf, str(vm["id"]))
            vm["properties"]["provisioningState"] = "Succeeded"
            return None
        return self._lro(request, loc, "vm", create, 200 if existing else 201, vm)
