"""The ``gce`` provider: Google Compute Engine through google-cloud-compute (REST).

What each contract call does on Compute Engine (every library call runs in the client's
bounded executor with ``retry=None``; see :mod:`.client`):

``offers(spec)``
    Shapes, not prices: ``machineTypes.list`` per configured zone (fetched once, cached),
    filtered to the searched families (``machine_types``, default
    :data:`DEFAULT_MACHINE_TYPES`).  vCPUs ``guestCpus``, memory ``memoryMb``, GPUs from the
    type's ``accelerators`` (A2/A3/G2 bundle theirs; the name ``nvidia-tesla-a100`` becomes
    ``a100``).  One offer per type and zone that fits, ``price_per_hour=None`` (the fleet
    prices it from the catalog's ``gce`` rows, region level), ``region`` the zone's region.
``launch(request)``
    Checks first (the offer is a ``gce`` offer in a configured zone, the count within
    ``max_batch``, the labels encodable).  Idempotency: ``instances.list`` in the zone with
    the filter ``labels.flowmesh_3arequest = "<request id>"``; instances found are returned.
    Then ONE ``instances.bulkInsert``: ``count = minCount = request.count`` (all or
    nothing), ``namePattern`` ``fm-<hash of the request id>-####``, a ``requestId`` (a UUID
    derived from the request id: Compute Engine's own idempotency for a retried call), the
    SDK's tags as labels (:class:`~flowmesh_sdk.tags.LabelTags`), a boot disk of
    ``spec.disk_gb`` from ``image`` (auto-deleted), the machine type's accelerators as
    ``guestAccelerators`` (with ``onHostMaintenance=TERMINATE``, which GPUs require), spot
    as ``scheduling.provisioningModel=SPOT`` with ``instanceTerminationAction=DELETE``.
    bulkInsert's operation names no instances, so after waiting on it (own
    ``zoneOperations.wait``, ``operation_timeout_s``) the instances are found by their
    request label.
``describe(ids)``
    Ids are Compute Engine's numeric instance ids (unique, never reused; names can be).
    ``instances.list`` per known zone with ``(id = N) OR ...`` (chunks of 50), unknown ones
    through ``instances.aggregatedList`` with the same filter; non-numeric ids are omitted
    without a call.
``terminate(ids)``
    ``instances.delete`` per instance (Compute Engine has no batch delete), all at once
    through the executor, each with a ``requestId``; then their operations are waited on
    (``operation_timeout_s``).  A 404 (already gone) is not an error.
``list_tagged(tags)``
    ``instances.aggregatedList`` (every zone of the project) with one
    ``labels.KEY = "VALUE"`` clause per tag, encoded (none: ``labels.flowmesh_3afleet:*``).
``runner(instance)``
    SSH mode (``ssh=SshMode()``, :mod:`flowmesh_sdk.remote.injection`): the launch's
    ``#cloud-config`` goes in the ``user-data`` metadata value (read by cloud-init's GCE
    datasource), the fleet's *public* key also in ``ssh-keys`` (for the guest agent); the
    runner reaches ``networkInterfaces[0].networkIP`` (``address="public"``: the first
    access config's ``natIP``) and accepts exactly the injected host key.  Otherwise
    ``runner_factory`` or a ``ProviderError`` (``NoRunner``).

What the metadata exposes (issue 15, item 6): ``user-data`` holds the instance's private
*host* key.  Anyone with ``compute.instances.get`` on the project can read it, and any
process on the VM that reaches the metadata server (169.254.169.254,
``metadata.google.internal``; it has no hop limit) can too.  Sandboxes have no network by
default, and with network on the runtime blocks the metadata address; the fleet's client
private key never leaves the coordinator.  docs/providers/gce.md says the same.

Instances: ``id`` the numeric id as a string; ``state`` from ``status`` (PROVISIONING,
STAGING -> PENDING; RUNNING; STOPPING, SUSPENDING -> STOPPING; TERMINATED (Compute
Engine's word for a stopped VM), STOPPED, SUSPENDED -> STOPPED; a deleted VM is not listed
at all); ``zone`` the zone; ``port`` sshd's in SSH mode; ``address`` the internal IP;
tags decoded from the labels.

Capabilities: spot and GPUs, ``max_batch`` 1000 (bulkInsert), ``tags`` LabelTags, rates in
:mod:`.client`.  ``stop_start`` False (no stop/start call in the contract yet).
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import hashlib
import logging
import re
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from flowmesh_sdk import settings as _settings
from flowmesh_sdk.errors import NotFoundError, SpecError
from flowmesh_sdk.provider import (TAG_FLEET, TAG_REQUEST, Capabilities, Instance, LaunchRequest, Provider,
                                   ProviderState)
from flowmesh_sdk.redaction import redact_url
from flowmesh_sdk.remote.injection import KeyInjector, instance_runner
from flowmesh_sdk.remote.injection import SshMode as _SshMode
from flowmesh_sdk.remote.runner import Runner
from flowmesh_sdk.specs import InstanceSpec, Offer
from flowmesh_sdk.tags import LabelTags

from .client import MAX_LAUNCH_BATCH, RATES, GceClient
from .errors import PROVIDER
from .shapes import DEFAULT_MACHINE_TYPES, MachineType, gpu_name, machine_types_of, region_of

log = logging.getLogger("flowmesh.providers.gce")

ENV_PROJECT = "FLOWMESH_GCE_PROJECT"
ENV_ENDPOINT = "FLOWMESH_GCE_ENDPOINT"
DEFAULT_ZONE = "us-central1-a"
DEFAULT_IMAGE = "projects/debian-cloud/global/images/family/debian-12"
TAGS = LabelTags()
REQUEST_LABEL = next(iter(TAGS.encode({TAG_REQUEST: "x"})))   # flowmesh_3arequest
FLEET_LABEL = next(iter(TAGS.encode({TAG_FLEET: "x"})))
MAX_LABELS = 64                    # Compute Engine: at most 64 labels per resource
ID_CHUNK = 50                      # ids per (id = N) OR ... filter
STATE_MAP = {
    "PROVISIONING": ProviderState.PENDING, "STAGING": ProviderState.PENDING, "PENDING": ProviderState.PENDING,
    "REPAIRING": ProviderState.PENDING,
    "RUNNING": ProviderState.RUNNING,
    "STOPPING": ProviderState.STOPPING, "SUSPENDING": ProviderState.STOPPING,
    "PENDING_STOP": ProviderState.STOPPING,
    "TERMINATED": ProviderState.STOPPED, "STOPPED": ProviderState.STOPPED, "SUSPENDED": ProviderState.STOPPED,
    "DEPROVISIONING": ProviderState.TERMINATED,
}
_ZONE = re.compile(r"^[a-z]+-[a-z]+\d+-[a-z]$")
_PROJECT = re.compile(r"^[a-z][a-z0-9-]{4,28}[a-z0-9]$|^[a-z][a-z0-9.:-]{0,62}$")
_NUMERIC = re.compile(r"^\d{1,20}$")
RunnerFactory = Callable[[Instance], Runner]


class SshMode(_SshMode):
    """:class:`flowmesh_sdk.remote.injection.SshMode` for Compute Engine (errors name
    ``gce.ssh.*``; ``imds_hop_limit`` does not apply: the metadata server has none)."""

    __slots__ = ()
    field_prefix = "gce.ssh"


def gce_request_id(request_id: str, what: str = "launch") -> str:
    """Compute Engine's ``requestId`` (a UUID) for one SDK request id."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"flowmesh:{what}:{request_id}"))


def name_prefix(request_id: str) -> str:
    return "fm-" + hashlib.sha256(request_id.encode()).hexdigest()[:12]


def _label_filter(labels: Mapping[str, str]) -> str:
    return " AND ".join(f'(labels.{k} = "{v}")' for k, v in sorted(labels.items()))


class GceProvider(Provider):
    """Google Compute Engine.  See the module docstring for what each call does.

    ``project`` (or ``FLOWMESH_GCE_PROJECT`` / ``GOOGLE_CLOUD_PROJECT``); ``zones`` where
    offers are searched and instances launched; ``endpoint`` an API endpoint (the emulator:
    ``http://127.0.0.1:PORT``; or ``FLOWMESH_GCE_ENDPOINT``); ``credentials`` a
    google-auth credentials object (default: Application Default Credentials; never
    shown); ``image`` the boot image; ``network``/``subnetwork``; ``service_account``
    (email, none by default: instances get no credentials of their own);
    ``operation_timeout_s`` how long launch and terminate wait for their operations."""

    name = "gce"
    capabilities = Capabilities(spot=True, gpus=True, stop_start=False, max_batch=MAX_LAUNCH_BATCH, remote=True,
                                rates=RATES, tags=TAGS)

    def __init__(self, *, project: str | None = None, zones: str | Sequence[str] | None = None,
                 endpoint: str | None = None, credentials: Any = None, image: str = DEFAULT_IMAGE,
                 network: str = "global/networks/default", subnetwork: str | None = None,
                 service_account: str | None = None, machine_types: Sequence[str] | None = None,
                 max_workers: int = 8, operation_timeout_s: float = 300.0,
                 ssh: _SshMode | bool | None = None, runner_factory: RunnerFactory | None = None,
                 external_ip: bool = False) -> None:
        project = project or _settings.value("providers.gce.project")
        if not project or not isinstance(project, str) or not _PROJECT.match(project):
            raise SpecError("gce.project", f"must be a Google Cloud project id like 'my-project-123' (or set "
                                           f"{ENV_PROJECT}), got {project!r}")
        self.project = project
        if zones is None:
            zones = [DEFAULT_ZONE]
        elif isinstance(zones, str):
            zones = [zones]
        zs = list(dict.fromkeys(zones))
        bad = [z for z in zs if not isinstance(z, str) or not _ZONE.match(z)]
        if bad or not zs:
            raise SpecError("gce.zones", f"must be zone names like 'us-central1-a', got {bad or zs!r}")
        self.zones: tuple[str, ...] = tuple(zs)
        endpoint = endpoint if endpoint is not None else _settings.value("providers.gce.endpoint")
        if endpoint is not None and not re.match(r"^https?://[^/\s]+", str(endpoint)):
            raise SpecError("gce.endpoint", f"must be an http(s) URL, got {redact_url(str(endpoint))!r}")
        self.endpoint = endpoint
        if not isinstance(image, str) or not image.strip():
            raise SpecError("gce.image", f"must be an image URL like {DEFAULT_IMAGE!r}, got {image!r}")
        self.image = image
        self.network, self.subnetwork, self.service_account = network, subnetwork, service_account
        self.external_ip = bool(external_ip)
        if isinstance(max_workers, bool) or not isinstance(max_workers, int) or not 1 <= max_workers <= 256:
            raise SpecError("gce.max_workers", f"must be an integer in [1, 256], got {max_workers!r}")
        if not isinstance(operation_timeout_s, (int, float)) or not 0 < operation_timeout_s <= 3600:
            raise SpecError("gce.operation_timeout_s", f"must be in (0, 3600] seconds, got {operation_timeout_s!r}")
        self.operation_timeout_s = float(operation_timeout_s)
        types = tuple(machine_types) if machine_types is not None else DEFAULT_MACHINE_TYPES
        if not types or not all(isinstance(t, str) and re.match(r"^[a-z0-9-]{1,63}$", t) for t in types):
            raise SpecError("gce.machine_types", "must be machine type names or name prefixes like "
                                                 f"'n2-standard-', got {types!r}")
        self.machine_types = types
        self.ssh = SshMode.coerce(ssh, "gce.ssh")
        if self.ssh is not None and runner_factory is not None:
            raise SpecError("gce.runner_factory", "cannot be combined with ssh=: SSH mode makes the runners")
        if runner_factory is not None and not callable(runner_factory):
            raise SpecError("gce.runner_factory", "must be a callable Instance -> Runner")
        self.runner_factory = runner_factory
        self._keys = KeyInjector(PROVIDER, self.ssh) if self.ssh is not None else None
        self._client = GceClient(project=project, endpoint=endpoint, credentials=credentials,
                                 max_workers=max_workers)
        self._types: dict[str, list[MachineType]] = {}
        self._type_lock = asyncio.Lock()
        self._where: dict[str, tuple[str, str]] = {}                # id -> (zone, name)
        self._spec_of: dict[str, InstanceSpec] = {}
        self._price_of: dict[str, float] = {}
        self._ips: dict[str, tuple[str | None, str | None]] = {}    # id -> (internal, external)

    def __repr__(self) -> str:
        return (f"GceProvider(project={self.project!r}, zones={list(self.zones)!r}, "
                f"endpoint={redact_url(self.endpoint)!r}"
                f"{', ssh' if self.ssh else ''})")

    # ---- shapes --------------------------------------------------------------------
    async def _zone_types(self, zone: str) -> list[MachineType]:
        async with self._type_lock:
            if zone not in self._types:
                items = await self._client.call(f"zone {zone}", "machine_types", "list", project=self.project,
                                                zone=zone)
                self._types[zone] = machine_types_of(items, zone, self.machine_types)
        return self._types[zone]

    async def offers(self, spec: InstanceSpec) -> list[Offer]:
        groups = await asyncio.gather(*(self._zone_types(z) for z in self.zones))
        out = []
        for group in groups:
            for mt in group:
                offer = mt.offer()
                if offer is not None and offer.fits(spec):
                    out.append(offer)
        return out

    def explain_misfit(self, spec: InstanceSpec) -> str:
        gpu = f", {spec.gpus} x {spec.gpu_name or 'any'} GPU" if spec.gpus else ""
        return (f"no Compute Engine machine type of {', '.join(self.machine_types[:6])}... in "
                f"{', '.join(self.zones)} has {spec.cpus} vCPUs, {spec.memory_gb:g} GiB{gpu}, arch {spec.arch}; "
                "GceProvider(machine_types=...) widens the search")

    # ---- instances -----------------------------------------------------------------
    def _type_of(self, zone: str, name: str) -> MachineType | None:
        return next((t for t in self._types.get(zone, []) if t.name == name), None)

    def _to_instance(self, item: Any, *, spec: InstanceSpec | None = None, price: float | None = None) -> Instance:
        iid = str(item.id)
        zone = str(item.zone).rsplit("/", 1)[-1]
        mtype = str(item.machine_type).rsplit("/", 1)[-1]
        self._where[iid] = (zone, str(item.name))
        if spec is not None:
            self._spec_of[iid] = spec
        spec = self._spec_of.get(iid)
        if spec is None:
            mt = self._type_of(zone, mtype)
            offer = mt.offer() if mt else None
            spec = (InstanceSpec(cpus=offer.cpus, memory_gb=offer.memory_gb, gpus=offer.gpus,
                                 gpu_name=offer.gpu_name, arch=offer.arch) if offer else InstanceSpec())
            self._spec_of[iid] = spec
        if price is not None:
            self._price_of[iid] = price
        nic = item.network_interfaces[0] if item.network_interfaces else None
        internal = (nic.network_i_p or None) if nic else None
        external = None
        if nic and nic.access_configs:
            external = nic.access_configs[0].nat_i_p or None
        self._ips[iid] = (internal, external)
        created = str(item.creation_timestamp or "")
        try:
            launched_at = _dt.datetime.fromisoformat(created).timestamp()
        except ValueError:
            launched_at = time.time()
        return Instance(id=iid, provider=PROVIDER, region=region_of(zone), instance_type=mtype, spec=spec,
                        state=STATE_MAP.get(str(item.status), ProviderState.PENDING),
                        tags=TAGS.decode(dict(item.labels)), launched_at=launched_at,
                        price_per_hour=self._price_of.get(iid, 0.0), address=internal or external,
                        port=self.ssh.port if self.ssh is not None else None, zone=zone)

    async def _list_zone(self, zone: str, filter_: str) -> list[Any]:
        return await self._client.call(f"zone {zone}", "instances", "list", project=self.project, zone=zone,
                                       filter=filter_)

    async def _aggregated(self, filter_: str) -> list[Any]:
        pairs = await self._client.call(f"project {self.project}", "instances", "aggregated_list",
                                        project=self.project, filter=filter_)
        return [i for _, scoped in pairs for i in scoped.instances]

    # ---- launch --------------------------------------------------------------------
    def _check(self, request: LaunchRequest) -> dict[str, str]:
        offer = request.offer
        if offer.provider != PROVIDER:
            raise SpecError("launch.offer", f"an offer of provider {offer.provider!r} was given to gce")
        if offer.zone not in self.zones:
            raise SpecError("launch.offer.zone", f"{offer.zone!r} is not one of this provider's zones "
                                                 f"{list(self.zones)}")
        if request.count > self.capabilities.max_batch:
            raise SpecError("launch.count", f"at most {self.capabilities.max_batch} per launch call, "
                                            f"got {request.count}")
        return TAGS.encode_launch({**request.tags, TAG_REQUEST: request.request_id}, limit=MAX_LABELS,
                                  cloud="Compute Engine")

    async def launch(self, request: LaunchRequest) -> list[Instance]:
        labels = self._check(request)
        offer = request.offer
        zone = str(offer.zone)
        mt = next((t for t in await self._zone_types(zone) if t.name == offer.instance_type), None)
        if mt is None:
            raise SpecError("launch.offer.instance_type",
                            f"{offer.instance_type!r} is not a machine type searched in {zone}")
        request_filter = _label_filter({REQUEST_LABEL: labels[REQUEST_LABEL]})
        earlier = await self._list_zone(zone, request_filter)
        if earlier:
            log.info("gce launch %s: %d instances already exist for this request id", request.request_id,
                     len(earlier))
            found = [self._to_instance(i, spec=request.spec, price=offer.price_per_hour) for i in earlier]
            if self._keys is not None:
                by_id = {str(i.id): i for i in earlier}
                await self._keys.recover([i.id for i in found], lambda iid: self._user_data(by_id.get(iid)))
            return found

        compute_v1 = _compute()
        items = []
        host_key = None
        if self._keys is not None:
            text, host_key = await self._keys.user_data(request.request_id)
            fleet = await self._keys.fleet()
            items = [compute_v1.Items(key="user-data", value=text),
                     compute_v1.Items(key="ssh-keys", value=f"{self._keys.mode.user}:{fleet.public.line}")]
        nic = compute_v1.NetworkInterface(network=self.network)
        if self.subnetwork:
            nic.subnetwork = self.subnetwork
        if self.external_ip or (self.ssh is not None and self.ssh.address == "public"):
            nic.access_configs = [compute_v1.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")]
        scheduling = compute_v1.Scheduling()
        if offer.spot:
            scheduling.provisioning_model = "SPOT"
            scheduling.instance_termination_action = "DELETE"
        if mt.gpus:
            scheduling.on_host_maintenance = "TERMINATE"
        props = compute_v1.InstanceProperties(
            machine_type=mt.name, labels=labels, metadata=compute_v1.Metadata(items=items),
            disks=[compute_v1.AttachedDisk(boot=True, auto_delete=True,
                                           initialize_params=compute_v1.AttachedDiskInitializeParams(
                                               source_image=self.image, disk_size_gb=request.spec.disk_gb))],
            network_interfaces=[nic], scheduling=scheduling)
        if mt.gpus and mt.gpu_type:
            props.guest_accelerators = [compute_v1.AcceleratorConfig(accelerator_type=mt.gpu_type,
                                                                     accelerator_count=mt.gpus)]
        if self.service_account:
            props.service_accounts = [compute_v1.ServiceAccount(
                email=self.service_account, scopes=["https://www.googleapis.com/auth/cloud-platform"])]
        body = compute_v1.BulkInsertInstanceResource(count=request.count, min_count=request.count,
                                                     name_pattern=f"{name_prefix(request.request_id)}-####",
                                                     instance_properties=props)
        op = await self._client.call(f"zone {zone}", "instances", "bulk_insert_unary", project=self.project,
                                     zone=zone, request_id=gce_request_id(request.request_id),
                                     bulk_insert_instance_resource_resource=body)
        await self._client.wait(zone, op, deadline_s=self.operation_timeout_s)
        made = await self._list_zone(zone, request_filter)
        out = [self._to_instance(i, spec=request.spec, price=offer.price_per_hour) for i in made]
        if host_key is not None and self._keys is not None:
            await self._keys.pin([i.id for i in out], host_key)
        log.info("gce launch %s: %d x %s in %s%s", request.request_id, len(out), mt.name, zone,
                 " (spot)" if offer.spot else "")
        return out

    @staticmethod
    async def _user_data(item: Any) -> str | None:
        if item is None:
            return None
        return next((m.value for m in item.metadata.items if m.key == "user-data"), None)

    # ---- describe / list / terminate ---------------------------------------------------
    async def describe(self, ids: Sequence[str]) -> list[Instance]:
        wanted = [i for i in dict.fromkeys(ids) if isinstance(i, str) and _NUMERIC.match(i)]
        by_zone: dict[str, list[str]] = {}
        unknown: list[str] = []
        for iid in wanted:
            where = self._where.get(iid)
            if where is not None:
                by_zone.setdefault(where[0], []).append(iid)
            else:
                unknown.append(iid)
        jobs = [self._list_zone(z, _id_filter(chunk)) for z, group in by_zone.items() for chunk in _chunks(group)]
        jobs += [self._aggregated(_id_filter(chunk)) for chunk in _chunks(unknown)]
        found: dict[str, Instance] = {}
        for group in await asyncio.gather(*jobs):
            for item in group:
                inst = self._to_instance(item)
                found.setdefault(inst.id, inst)
        return [found[i] for i in wanted if i in found]

    async def list_tagged(self, tags: Mapping[str, str]) -> list[Instance]:
        if tags:
            filter_ = _label_filter(TAGS.encode({str(k): str(v) for k, v in tags.items()}))
        else:
            filter_ = f"labels.{FLEET_LABEL}:*"
        return [self._to_instance(i) for i in await self._aggregated(filter_)]

    async def _delete(self, iid: str, zone: str, name: str) -> None:
        try:
            op = await self._client.call(f"zone {zone}", "instances", "delete_unary", project=self.project, zone=zone,
                                         instance=name, request_id=gce_request_id(iid, "delete"))
            await self._client.wait(zone, op, deadline_s=self.operation_timeout_s)
        except NotFoundError as exc:
            if exc.code == "projectNotFound":
                raise
            log.debug("gce terminate %s: already gone", iid)

    async def terminate(self, ids: Sequence[str]) -> None:
        wanted = [i for i in dict.fromkeys(ids) if isinstance(i, str) and _NUMERIC.match(i)]
        unknown = [i for i in wanted if i not in self._where]
        if unknown:
            await self.describe(unknown)   # locates them (zone, name)
        targets = [(i, *self._where[i]) for i in wanted if i in self._where]
        results = await asyncio.gather(*(self._delete(i, z, n) for i, z, n in targets), return_exceptions=True)
        if self._keys is not None:
            await self._keys.forget([i for i, _, _ in targets])
        for r in results:
            if isinstance(r, BaseException):
                raise r

    # ---- the rest ------------------------------------------------------------------
    def runner(self, instance: Instance) -> Runner:
        return instance_runner(instance, self._keys, self._ips, self.runner_factory, provider=PROVIDER,
                               hint="pass GceProvider(ssh=SshMode()) to inject keys at launch "
                                    "(docs/providers/gce.md), or runner_factory=...")

    async def close(self) -> None:
        if self._keys is not None:
            await self._keys.close()
        await self._client.close()


def _compute() -> Any:
    from .client import _import
    return _import()


def _chunks(items: Sequence[str], size: int = ID_CHUNK) -> Iterable[list[str]]:
    for i in range(0, len(items), size):
        yield list(items[i:i + size])


def _id_filter(ids: Sequence[str]) -> str:
    return " OR ".join(f"(id = {i})" for i in ids)


# The names this module had before shapes.py took them stay importable here.
__all__ = ["DEFAULT_MACHINE_TYPES", "GceProvider", "MachineType", "SshMode", "gce_request_id", "gpu_name",
           "region_of"]
