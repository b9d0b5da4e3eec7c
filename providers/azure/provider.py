"""The ``azure`` provider: Azure virtual machines through the Azure management SDKs.

What each contract call does on Azure (every SDK call runs in the client's bounded executor,
``retry_total=0``; long-running operations polled with a deadline; see :mod:`.client`):

``offers(spec)``
    Shapes, not prices: ``resourceSkus.list`` with ``$filter=location eq 'L'`` per configured
    location (fetched once, cached), the ``virtualMachines`` SKUs of the searched families
    (``vm_sizes``, default :data:`DEFAULT_VM_SIZES`) without a location restriction for this
    subscription: vCPUs, ``MemoryGB``, ``GPUs`` (the GPU model from the size name: ``NC*T4``
    -> t4, ``A100`` -> a100, ``H100`` -> h100, ``A10`` -> a10), ``CpuArchitectureType``.
    ``price_per_hour=None``: the fleet prices each from the catalog's ``azure`` rows.
``launch(request)``
    Checks first; then the resource group (``resourceGroups.createOrUpdate``, once) and,
    unless ``subnet_id`` is configured, a VNet ``flowmesh-<location>`` with subnet
    ``flowmesh`` (created once per location, an LRO).  Then ``request.count`` VMs, each a
    ``virtualMachines.createOrUpdate`` LRO with a *deterministic* name
    (``fm-<hash of the request id>-<k>``), so a retried create is idempotent (a PUT of the
    same resource) and a retried launch finds the VMs of the first (listed by their
    ``flowmesh:request`` tag) and creates only the missing ones.  The NIC (and, with
    ``public_ip=True``, a public IP) is created by the VM itself through
    ``networkInterfaceConfigurations``; NIC, IP and OS disk carry ``deleteOption=Delete``,
    so deleting the VM deletes them.  Spot: ``priority=Spot``, ``evictionPolicy=Delete``,
    ``billingProfile.maxPrice=-1`` (at most the on-demand price).  All or nothing: when
    any VM of the request fails, the ones that were made are deleted and the first error
    is raised (a capacity error fails over, never a silent partial launch).
``describe(ids)``
    Ids are the VMs' ``vmId`` (a GUID unique to that VM, never reused; names can be).  One
    ``virtualMachines.list`` of the resource group, matched by ``vmId``.
``terminate(ids)``
    ``virtualMachines.delete`` LROs, all at once (ARM has no batch delete); an unknown or
    gone VM is not an error.
``list_tagged(tags)``
    ``virtualMachines.list`` of the resource group, filtered here by tags (the VM list has
    no tag filter; none: every VM carrying ``flowmesh:fleet``).
``runner(instance)``
    SSH mode (``ssh=SshMode()``, :mod:`flowmesh_sdk.remote.injection`): the launch's
    ``#cloud-config`` travels as ``osProfile.customData`` (cloud-init's Azure datasource
    reads it; ARM never returns it on a GET), the fleet's *public* key also in
    ``linuxConfiguration.ssh.publicKeys`` of ``admin_username``; the runner reaches the
    NIC's private IP (``networkInterfaces.get``; ``address="public"``: its public IP) and
    accepts exactly the injected host key, pinned in the trust record (customData cannot be
    read back, so a launch retried from another machine finds no key: that instance gets
    no runner, never a key learnt on first use).

What is exposed: ``customData`` holds the instance's private *host* key.  ARM does not
return it, but any process on the VM can read it from the metadata service
(169.254.169.254) and from ``/var/lib/waagent``; sandboxes have no network by default and
the runtime blocks the metadata address when they do.  The fleet's client private key never
leaves the coordinator.

Instances: ``state`` from ``provisioningState`` (Creating -> PENDING, Succeeded/Updating ->
RUNNING, Deleting -> STOPPING, Failed -> TERMINATED), or the ``PowerState/*`` status
when an instance view is present (stopped/deallocated -> STOPPED); ``region`` the
location; ``zone`` the VM's zone when it has one; tags as they are (:class:`PlainTags`,
names up to 512 characters, values up to 256).

Capabilities: spot and GPUs, ``max_batch`` 100 (VMs created in parallel by one call),
rates in :mod:`.client`, ``stop_start`` False.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from flowmesh_sdk import settings as _settings
from flowmesh_sdk.errors import FlowMeshError, NotFoundError, SpecError
from flowmesh_sdk.provider import TAG_FLEET, TAG_REQUEST, Capabilities, Instance, LaunchRequest, Provider, ProviderState
from flowmesh_sdk.redaction import redact_url
from flowmesh_sdk.remote.injection import KeyInjector, instance_runner
from flowmesh_sdk.remote.injection import SshMode as _SshMode
from flowmesh_sdk.remote.runner import Runner
from flowmesh_sdk.specs import InstanceSpec, Offer

from .client import RATES, AzureClient, deadline_polling
from .errors import PROVIDER
from .shapes import DEFAULT_VM_SIZES, VmSize, gpu_model, sizes_of
from .shapes import plain as _plain
from .vms import MAX_BATCH, MAX_TAGS, SUBNET, TAGS, check_request, vm_body, vm_name, vnet_body

log = logging.getLogger("flowmesh.providers.azure")

ENV_SUBSCRIPTION = "AZURE_SUBSCRIPTION_ID"
ENV_ENDPOINT = "FLOWMESH_AZURE_ENDPOINT"
DEFAULT_LOCATION = "eastus"
DEFAULT_IMAGE = {"publisher": "Canonical", "offer": "ubuntu-24_04-lts", "sku": "server", "version": "latest"}
_LOCATION = re.compile(r"^[a-z][a-z0-9]{2,40}$")
_GUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
_RG = re.compile(r"^[-\w._()]{1,90}$")
STATE_MAP = {"Creating": ProviderState.PENDING, "Succeeded": ProviderState.RUNNING,
             "Updating": ProviderState.RUNNING, "Migrating": ProviderState.RUNNING,
             "Deleting": ProviderState.STOPPING, "Failed": ProviderState.TERMINATED,
             "Canceled": ProviderState.TERMINATED}
POWER_MAP = {"running": ProviderState.RUNNING, "starting": ProviderState.PENDING,
             "stopping": ProviderState.STOPPING, "deallocating": ProviderState.STOPPING,
             "stopped": ProviderState.STOPPED, "deallocated": ProviderState.STOPPED}
RunnerFactory = Callable[[Instance], Runner]


class SshMode(_SshMode):
    """:class:`flowmesh_sdk.remote.injection.SshMode` for Azure (errors name ``azure.ssh.*``;
    ``imds_hop_limit`` does not apply)."""

    __slots__ = ()
    field_prefix = "azure.ssh"


class AzureProvider(Provider):
    """Azure virtual machines.  See the module docstring for what each call does.

    ``subscription_id`` (or ``AZURE_SUBSCRIPTION_ID``); ``locations``; ``resource_group``
    (created in the first location when missing); ``subnet_id`` an existing subnet's resource
    id (else a VNet per location is created once); ``image`` a marketplace image reference
    (``publisher``/``offer``/``sku``/``version``) or ``{"id": ...}``; ``admin_username``;
    ``credential`` an azure-identity credential (default ``DefaultAzureCredential``, never
    shown); ``base_url`` an ARM endpoint (the emulator; or ``FLOWMESH_AZURE_ENDPOINT``);
    ``allow_http`` only for a loopback emulator (see :mod:`.client`)."""

    name = "azure"
    capabilities = Capabilities(spot=True, gpus=True, stop_start=False, max_batch=MAX_BATCH, remote=True,
                                rates=RATES, tags=TAGS)

    def __init__(self, *, subscription_id: str | None = None, locations: str | Sequence[str] | None = None,
                 resource_group: str = "flowmesh", subnet_id: str | None = None,
                 image: Mapping[str, str] | None = None, admin_username: str = "azureuser",
                 credential: Any = None, base_url: str | None = None, allow_http: bool = False,
                 vm_sizes: Sequence[str] | None = None, max_workers: int = 8, operation_timeout_s: float = 900.0,
                 polling_interval_s: float = 5.0, public_ip: bool = False, ssh: _SshMode | bool | None = None,
                 runner_factory: RunnerFactory | None = None) -> None:
        subscription_id = subscription_id or _settings.value("providers.azure.subscription_id")
        if not subscription_id or not _GUID.match(str(subscription_id)):
            raise SpecError("azure.subscription_id", f"must be a subscription GUID (or set {ENV_SUBSCRIPTION}), "
                                                     f"got {subscription_id!r}")
        self.subscription_id = str(subscription_id)
        if locations is None:
            locations = [DEFAULT_LOCATION]
        elif isinstance(locations, str):
            locations = [locations]
        locs = list(dict.fromkeys(locations))
        bad = [x for x in locs if not isinstance(x, str) or not _LOCATION.match(x)]
        if bad or not locs:
            raise SpecError("azure.locations", f"must be Azure location names like 'eastus', got {bad or locs!r}")
        self.locations: tuple[str, ...] = tuple(locs)
        if not isinstance(resource_group, str) or not _RG.match(resource_group) or resource_group.endswith("."):
            raise SpecError("azure.resource_group", f"must be a resource group name, got {resource_group!r}")
        self.resource_group = resource_group
        self.subnet_id = subnet_id
        self.image = dict(image or DEFAULT_IMAGE)
        if not ("id" in self.image or {"publisher", "offer", "sku"} <= set(self.image)):
            raise SpecError("azure.image", "must name publisher, offer and sku (and version), or an image id")
        if not re.match(r"^[a-z_][a-z0-9_-]{0,63}$", admin_username) or admin_username in ("root", "admin"):
            raise SpecError("azure.admin_username", f"must be a Linux user name other than root/admin, "
                                                    f"got {admin_username!r}")
        self.admin_username = admin_username
        base_url = base_url if base_url is not None else _settings.value("providers.azure.base_url")
        if base_url is not None and not re.match(r"^https?://[^/\s]+", base_url):
            raise SpecError("azure.base_url", f"must be an http(s) URL, got {redact_url(str(base_url))!r}")
        if allow_http and not (base_url or "").startswith(("http://127.", "http://localhost")):
            raise SpecError("azure.allow_http", "only for an emulator on a loopback http:// base_url")
        self.base_url = base_url
        sizes = tuple(vm_sizes) if vm_sizes is not None else DEFAULT_VM_SIZES
        if not sizes or not all(isinstance(s, str) and s for s in sizes):
            raise SpecError("azure.vm_sizes", f"must be VM size names or prefixes like 'Standard_D', got {sizes!r}")
        self.vm_sizes = sizes
        if isinstance(max_workers, bool) or not isinstance(max_workers, int) or not 1 <= max_workers <= 256:
            raise SpecError("azure.max_workers", f"must be an integer in [1, 256], got {max_workers!r}")
        if not isinstance(operation_timeout_s, (int, float)) or not 0 < operation_timeout_s <= 7200:
            raise SpecError("azure.operation_timeout_s", f"must be in (0, 7200] s, got {operation_timeout_s!r}")
        self.operation_timeout_s = float(operation_timeout_s)
        self.public_ip = bool(public_ip)
        self.ssh = SshMode.coerce(ssh, "azure.ssh")
        if self.ssh is not None and runner_factory is not None:
            raise SpecError("azure.runner_factory", "cannot be combined with ssh=: SSH mode makes the runners")
        self.runner_factory = runner_factory
        self._keys = KeyInjector(PROVIDER, self.ssh) if self.ssh is not None else None
        self._client = AzureClient(subscription_id=self.subscription_id, base_url=base_url, credential=credential,
                                   max_workers=max_workers, allow_http=allow_http,
                                   polling_interval_s=polling_interval_s)
        self._sizes: dict[str, list[VmSize]] = {}
        self._size_lock = asyncio.Lock()
        self._net_lock = asyncio.Lock()
        self._rg_ready = False
        self._subnets: dict[str, str] = {}
        self._spec_of: dict[str, InstanceSpec] = {}
        self._price_of: dict[str, float] = {}
        self._names: dict[str, str] = {}              # vmId -> VM name
        self._ips: dict[str, tuple[str | None, str | None]] = {}

    def __repr__(self) -> str:
        return (f"AzureProvider(subscription_id={self.subscription_id!r}, locations={list(self.locations)!r}, "
                f"resource_group={self.resource_group!r}, base_url={redact_url(self.base_url)!r}"
                f"{', ssh' if self.ssh else ''})")

    # ---- shapes --------------------------------------------------------------------
    async def _location_sizes(self, location: str) -> list[VmSize]:
        async with self._size_lock:
            if location not in self._sizes:
                skus = await self._client.call(f"location {location}", "compute", lambda c: [
                    _plain(s) for s in c.resource_skus.list(filter=f"location eq '{location}'")])
                self._sizes[location] = sizes_of(skus, location, self.vm_sizes)
        return self._sizes[location]

    async def offers(self, spec: InstanceSpec) -> list[Offer]:
        groups = await asyncio.gather(*(self._location_sizes(x) for x in self.locations))
        out = []
        for group in groups:
            for size in group:
                offer = size.offer()
                if offer is not None and offer.fits(spec):
                    out.append(offer)
        return out

    def explain_misfit(self, spec: InstanceSpec) -> str:
        gpu = f", {spec.gpus} x {spec.gpu_name or 'any'} GPU" if spec.gpus else ""
        return (f"no Azure VM size of {', '.join(self.vm_sizes)} in {', '.join(self.locations)} has {spec.cpus} "
                f"vCPUs, {spec.memory_gb:g} GiB{gpu}, arch {spec.arch}; AzureProvider(vm_sizes=...) widens the search")

    # ---- instances -----------------------------------------------------------------
    def _to_instance(self, vm: Mapping[str, Any], *, spec: InstanceSpec | None = None,
                     price: float | None = None) -> Instance:
        props = vm.get("properties") or {}
        vm_id = str(props.get("vmId") or "")
        size = str((props.get("hardwareProfile") or {}).get("vmSize") or "")
        location = str(vm.get("location") or "")
        self._names[vm_id] = str(vm.get("name"))
        if spec is not None:
            self._spec_of[vm_id] = spec
        spec = self._spec_of.get(vm_id)
        if spec is None:
            vs = next((s for s in self._sizes.get(location, []) if s.name == size), None)
            offer = vs.offer() if vs else None
            spec = (InstanceSpec(cpus=offer.cpus, memory_gb=offer.memory_gb, gpus=offer.gpus, gpu_name=offer.gpu_name,
                                 arch=offer.arch) if offer else InstanceSpec())
            self._spec_of[vm_id] = spec
        if price is not None:
            self._price_of[vm_id] = price
        state = STATE_MAP.get(str(props.get("provisioningState") or ""), ProviderState.PENDING)
        for status in ((props.get("instanceView") or {}).get("statuses") or []):
            code = str(status.get("code") or "")
            if code.startswith("PowerState/") and state is ProviderState.RUNNING:
                state = POWER_MAP.get(code.split("/", 1)[1], state)
        created = str(props.get("timeCreated") or "")
        try:
            launched_at = _dt.datetime.fromisoformat(created.replace("Z", "+00:00")).timestamp()
        except ValueError:
            launched_at = time.time()
        zones = vm.get("zones") or []
        private, public = self._ips.get(vm_id, (None, None))
        return Instance(id=vm_id, provider=PROVIDER, region=location, instance_type=size, spec=spec, state=state,
                        tags=TAGS.decode(dict(vm.get("tags") or {})), launched_at=launched_at,
                        price_per_hour=self._price_of.get(vm_id, 0.0), address=private or public,
                        port=self.ssh.port if self.ssh is not None else None,
                        zone=f"{location}-{zones[0]}" if zones else None)

    async def _list(self) -> list[dict[str, Any]]:
        try:
            return await self._client.call(f"resource group {self.resource_group}", "compute", lambda c: [
                _plain(v) for v in c.virtual_machines.list(self.resource_group)])
        except NotFoundError as exc:
            if exc.code == "ResourceGroupNotFound":
                return []   # nothing launched here yet
            raise

    async def _nic_ips(self, vm: Mapping[str, Any]) -> None:
        """Record the VM's private (and public) IP from its NIC (needed for SSH only)."""
        vm_id = str((vm.get("properties") or {}).get("vmId"))
        nics = ((vm.get("properties") or {}).get("networkProfile") or {}).get("networkInterfaces") or []
        if not nics:
            return
        nic_name = str(nics[0].get("id", "")).rsplit("/", 1)[-1]
        nic = await self._client.call(f"nic {nic_name}", "network", lambda c: _plain(
            c.network_interfaces.get(self.resource_group, nic_name)))
        ipc = ((nic.get("properties") or {}).get("ipConfigurations") or [{}])[0].get("properties") or {}
        public = None
        if ipc.get("publicIPAddress"):
            public = (ipc["publicIPAddress"].get("properties") or {}).get("ipAddress")
        self._ips[vm_id] = (ipc.get("privateIPAddress"), public)

    # ---- launch --------------------------------------------------------------------
    async def _ensure_network(self, location: str) -> str:
        async with self._net_lock:
            if not self._rg_ready:
                await self._client.call(f"resource group {self.resource_group}", "resource", lambda c: c.resource_groups
                                        .create_or_update(self.resource_group, {"location": self.locations[0],
                                                                                "tags": {"flowmesh:managed": "true"}}))
                self._rg_ready = True
            if self.subnet_id:
                return self.subnet_id
            if location not in self._subnets:
                vnet = f"flowmesh-{location}"
                body = vnet_body(location)
                made = await self._client.call(f"vnet {vnet}", "network", lambda c: _plain(
                    c.virtual_networks.begin_create_or_update(
                        self.resource_group, vnet, body,
                        polling=deadline_polling(self._client.polling_interval_s, self.operation_timeout_s,
                                                 f"vnet {vnet}")).result()))
                subnets = (made.get("properties") or {}).get("subnets") or []
                self._subnets[location] = str(subnets[0]["id"]) if subnets else (
                    f"/subscriptions/{self.subscription_id}/resourceGroups/{self.resource_group}/providers/"
                    f"Microsoft.Network/virtualNetworks/{vnet}/subnets/{SUBNET}")
            return self._subnets[location]

    def _vm_body(self, name: str, request: LaunchRequest, tags: Mapping[str, str], subnet: str,
                 custom_data: str | None, fleet_public: str | None) -> dict[str, Any]:
        return vm_body(name, request, tags, subnet, image=self.image, admin_username=self.admin_username,
                       public_address=self.public_ip or (self.ssh is not None and self.ssh.address == "public"),
                       custom_data=custom_data, fleet_public=fleet_public)

    async def _create(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self._client.call(f"vm {name}", "compute", lambda c: _plain(
            c.virtual_machines.begin_create_or_update(
                self.resource_group, name, body,
                polling=deadline_polling(self._client.polling_interval_s, self.operation_timeout_s,
                                         f"vm {name}")).result()))

    async def launch(self, request: LaunchRequest) -> list[Instance]:
        tags = check_request(request, self.locations)
        offer = request.offer
        sizes = await self._location_sizes(offer.region)
        if not any(s.name == offer.instance_type for s in sizes):
            raise SpecError("launch.offer.instance_type",
                            f"{offer.instance_type!r} is not a VM size searched in {offer.region}")
        names = [vm_name(request.request_id, k) for k in range(request.count)]
        earlier = {str(v.get("name")): v for v in await self._list()
                   if TAGS.decode(dict(v.get("tags") or {})).get(TAG_REQUEST) == request.request_id}
        missing = [n for n in names if n not in earlier]
        if not missing:
            log.info("azure launch %s: %d VMs already exist for this request id", request.request_id, len(earlier))
            found = [self._to_instance(v, spec=request.spec, price=offer.price_per_hour) for v in earlier.values()]
            if self._keys is not None:
                await self._keys.recover([i.id for i in found], None)   # customData cannot be read back
                for v in earlier.values():
                    await self._nic_ips(v)
            return found
        subnet = await self._ensure_network(offer.region)
        custom, host_key, fleet_public = None, None, None
        if self._keys is not None:
            custom, host_key = await self._keys.user_data(request.request_id)
            fleet_public = (await self._keys.fleet()).public.line
        results = await asyncio.gather(*(self._create(n, self._vm_body(n, request, tags, subnet, custom, fleet_public))
                                         for n in missing), return_exceptions=True)
        made = {n: r for n, r in zip(missing, results) if not isinstance(r, BaseException)}
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            # all or nothing: delete every VM of the request (made, failed half-made, or earlier)
            await asyncio.gather(*(self._delete(n) for n in names), return_exceptions=True)
            first = next((e for e in errors if isinstance(e, FlowMeshError)), errors[0])
            raise first
        vms = list(earlier.values()) + list(made.values())
        out = [self._to_instance(v, spec=request.spec, price=offer.price_per_hour) for v in vms]
        if self.ssh is not None:
            await asyncio.gather(*(self._nic_ips(v) for v in vms))
            out = [self._to_instance(v) for v in vms]
        if host_key is not None and self._keys is not None:
            await self._keys.pin([i.id for i in out if i.id not in {self._vm_id(v) for v in earlier.values()}],
                                 host_key)
        log.info("azure launch %s: %d x %s in %s%s", request.request_id, len(out), offer.instance_type, offer.region,
                 " (spot)" if offer.spot else "")
        return out

    @staticmethod
    def _vm_id(vm: Mapping[str, Any]) -> str:
        return str((vm.get("properties") or {}).get("vmId") or "")

    # ---- describe / list / terminate ---------------------------------------------------
    async def describe(self, ids: Sequence[str]) -> list[Instance]:
        wanted = [i for i in dict.fromkeys(ids) if isinstance(i, str) and _GUID.match(i)]
        if not wanted:
            return []
        by_id = {self._vm_id(v): v for v in await self._list()}
        return [self._to_instance(by_id[i]) for i in wanted if i in by_id]

    async def list_tagged(self, tags: Mapping[str, str]) -> list[Instance]:
        wanted = {str(k): str(v) for k, v in tags.items()}
        out = []
        for vm in await self._list():
            have = TAGS.decode(dict(vm.get("tags") or {}))
            if (all(have.get(k) == v for k, v in wanted.items()) if wanted else TAG_FLEET in have):
                out.append(self._to_instance(vm))
        return out

    async def _delete(self, name: str) -> None:
        try:
            await self._client.call(f"vm {name}", "compute", lambda c: c.virtual_machines.begin_delete(
                self.resource_group, name,
                polling=deadline_polling(self._client.polling_interval_s, self.operation_timeout_s,
                                         f"delete vm {name}")).result())
        except NotFoundError as exc:
            if exc.code in ("SubscriptionNotFound", "InvalidSubscriptionId"):
                raise
            log.debug("azure terminate %s: already gone", name)

    async def terminate(self, ids: Sequence[str]) -> None:
        wanted = [i for i in dict.fromkeys(ids) if isinstance(i, str) and _GUID.match(i)]
        if any(i not in self._names for i in wanted):
            await self.describe(wanted)   # locates them (names)
        targets = [(i, self._names[i]) for i in wanted if i in self._names]
        results = await asyncio.gather(*(self._delete(n) for _, n in targets), return_exceptions=True)
        if self._keys is not None:
            await self._keys.forget([i for i, _ in targets])
        for r in results:
            if isinstance(r, BaseException):
                raise r

    # ---- the rest ------------------------------------------------------------------
    def runner(self, instance: Instance) -> Runner:
        return instance_runner(instance, self._keys, self._ips, self.runner_factory, provider=PROVIDER,
                               hint="pass AzureProvider(ssh=SshMode()) to inject keys at launch "
                                    "(docs/providers/azure.md), or runner_factory=...")

    async def close(self) -> None:
        if self._keys is not None:
            await self._keys.close()
        await self._client.close()


# The names this module had before shapes.py and vms.py took them stay importable here.
__all__ = ["AzureProvider", "DEFAULT_VM_SIZES", "MAX_BATCH", "MAX_TAGS", "POWER_MAP", "STATE_MAP", "SshMode", "TAGS",
           "VmSize", "gpu_model", "vm_name"]
