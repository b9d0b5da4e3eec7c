"""The ARM emulator (see the package docstring): its switches, views, lifecycle and request
dispatch.  It owns one :class:`~.state.ArmState` and the handler parts made over it
(:class:`~.resources.Resources`, :class:`~.network.Network`, :class:`~.vms.Vms`), and
dispatches each call, by its route kind, to one of their methods."""

from __future__ import annotations

import base64
import json
import re
import shutil
import ssl
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from ..cloudinit import CloudInitHosts
from ..httpserver import HttpServer, json_response, self_signed_tls
from .credential import StaticTokenCredential
from .deployments import Deployments
from .identity import Directory
from .metadata import ALIAS_DOC_PATH, METADATA_PATH, alias_doc, cloud_metadata
from .network import Network
from .resources import Resources
from .state import DEFAULT_SIZES, SUBSCRIPTION, ArmState
from .vms import Vms
from .wire import ROUTES, arm_error

__all__ = ["AzureEmulator", "DEFAULT_SIZES", "SUBSCRIPTION"]


Handler = Callable[..., web.Response]


class AzureEmulator(HttpServer):
    """A TEST FIXTURE: ARM for the calls the ``azure`` provider makes."""

    name = "azure-emulator"

    def __init__(self, *, subscription: str = SUBSCRIPTION, locations: Sequence[str] = ("eastus",),
                 sizes: Sequence[tuple[str, int, float, int]] = DEFAULT_SIZES, token: str | None = None,
                 first_host: int = 120, port: int = 0, tls: bool = False, **sshd_kwargs: Any) -> None:
        super().__init__(port=port)
        self.tls = tls
        self._tls_dir: Path | None = None
        self.state = ArmState(lambda: self.url, subscription=subscription, locations=locations, sizes=sizes,
                              token=token, first_host=first_host, **sshd_kwargs)
        self.directory = Directory(self.state.token)
        self.deployments = Deployments(subscription, self._send)
        self._session: aiohttp.ClientSession | None = None
        self.resources = Resources(self.state, self.directory, self.deployments, lambda: self.url)
        self.network = Network(self.state)
        self.compute = Vms(self.state, self.network)
        r, n, v = self.resources, self.network, self.compute
        self._handlers: dict[str, Handler] = {   # route kind (wire.ROUTES) -> its handler
            "subs": r.subs, "sub": r.sub, "tenants": r.tenants, "imagevers": r.imagevers, "imagever": r.imagever,
            "deployment": r.deployment, "deploymentop": r.deploymentop, "rgs": r.rgs, "allvms": r.allvms,
            "rg": r.rg, "skus": r.skus, "op": r.op, "vms": v.vms, "vm": v.vm,
            "vnets": n.vnets, "vnet": n.vnet, "nics": n.nics, "nic": n.nic}

    # ---- settings (the state's) ----------------------------------------------------------
    @property
    def subscription(self) -> str:
        return self.state.subscription

    @property
    def locations(self) -> tuple[str, ...]:
        return self.state.locations

    @property
    def sizes(self) -> tuple[tuple[str, int, float, int], ...]:
        return self.state.sizes

    @property
    def token(self) -> str:
        """The bearer token every ARM call must carry (:meth:`credential` presents it)."""
        return self.state.token

    @property
    def hosts(self) -> CloudInitHosts:
        return self.state.hosts

    @property
    def calls(self) -> list[tuple[str, str]]:
        """Every routed call, as ``(kind, method)``."""
        return self.state.calls

    async def _send(self, method: str, path: str, body: Any) -> tuple[int, dict[str, str], Any]:
        """A call to this emulator's own endpoint (a deployment's resource PUTs and polls)."""
        assert self._session is not None
        url = path if path.startswith("http") else self.url + path
        async with self._session.request(method, url, json=body,
                                         headers={"Authorization": f"Bearer {self.token}"}) as resp:
            text = await resp.text()
            return resp.status, dict(resp.headers), json.loads(text) if text else None

    # ---- switches --------------------------------------------------------------------
    def exhaust(self, size: str | None = None, *, how: str = "AllocationFailed") -> None:
        """VM creations (of ``size``, any for None) fail: ``AllocationFailed`` /
        ``ZonalAllocationFailed`` in the operation, or ``SkuNotAvailable`` at the PUT."""
        with self.state.lock:
            self.state.exhausted.append((size, how))

    def restore(self) -> None:
        with self.state.lock:
            self.state.exhausted.clear()

    def set_core_quota(self, location: str, limit: int | None) -> None:
        with self.state.lock:
            if limit is None:
                self.state.core_quota.pop(location, None)
            else:
                self.state.core_quota[location] = limit

    def fail(self, kind: str, method: str, status: int, code: str, *, times: int | None = 1) -> None:
        """Answer the next ``times`` calls of ``kind`` (rg, skus, vm, vms, vnet, nic, op) with
        ``method`` (GET, PUT, DELETE) with an ARM error."""
        with self.state.lock:
            self.state.faults.append([kind, method, status, code, times])

    def slow_operations(self, seconds: float | None, kinds: Sequence[str] = ("vm", "delete")) -> None:
        with self.state.lock:
            for k in kinds:
                self.state.op_delay[k] = seconds

    def finish_operations(self) -> None:
        with self.state.lock:
            now = time.monotonic()
            for op in self.state.ops.values():
                if op.status == "InProgress":
                    op.done_at = now
            self.state.tick()

    def deny(self, on: bool = True) -> None:
        with self.state.lock:
            self.state.deny = on

    def clear(self) -> None:
        with self.state.lock:
            self.state.exhausted.clear()
            self.state.core_quota.clear()
            self.state.faults.clear()
            self.state.op_delay.clear()
            self.state.deny = False

    def delete_behind(self, vm_id: str) -> None:
        with self.state.lock:
            for key, vm in list(self.state.vms.items()):
                if vm["properties"]["vmId"] == vm_id:
                    self.state.remove_vm(key)
        self.hosts.halt(vm_id)

    # ---- views -----------------------------------------------------------------------
    @property
    def vms(self) -> list[dict[str, Any]]:
        with self.state.lock:
            return [json.loads(json.dumps(v)) for v in self.state.vms.values()]

    def custom_data(self, vm_id: str) -> str | None:
        with self.state.lock:
            return self.state.custom.get(vm_id)

    def count(self, kind: str, method: str) -> int:
        with self.state.lock:
            return sum(1 for c in self.calls if c == (kind, method))

    def address(self, instance: Any) -> tuple[str, int]:
        """``SshMode.address_map``: boot the VM (once) from its customData."""
        vm_id = str(instance.id)
        vm = self.hosts.booted(vm_id)
        if vm is None:
            with self.state.lock:
                found = next((v for v in self.state.vms.values() if v["properties"]["vmId"] == vm_id), None)
                custom = self.state.custom.get(vm_id, "")
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
        with self.state.lock:
            self.state.calls.append((kind, request.method))
            self.state.tick()
            auth = request.headers.get("Authorization", "")
            if auth != f"Bearer {self.token}":
                return arm_error(401, "InvalidAuthenticationToken", "The access token is invalid.")
            if self.state.deny:
                return arm_error(403, "AuthorizationFailed",
                                 f"The client does not have authorization to perform action over scope '{path}'.")
            for f in self.state.faults:
                if f[0] == kind and f[1] == request.method and (f[4] is None or f[4] > 0):
                    if f[4] is not None:
                        f[4] -= 1
                    headers = {"Retry-After": "1"} if f[2] == 429 else None
                    return arm_error(f[2], f[3], f"injected: {f[3]}", headers)
            if kind not in ("subs", "tenants") and m.group(1) != self.subscription:
                return arm_error(404, "SubscriptionNotFound", f"The subscription '{m.group(1)}' could not be found.")
            args = m.groups()[1:]
            return self._handlers[kind](request, body, *args)
