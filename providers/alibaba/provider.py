"""The ``alibaba`` provider: Alibaba Cloud ECS through ``alibabacloud-ecs20140526``.

What each contract call does on ECS (every call is the SDK's native ``*_async`` method,
retries off; see :mod:`.client`):

``offers(spec)``
    ``DescribeAvailableResource`` (``DestinationResource=InstanceType``,
    ``InstanceChargeType=PostPaid``) per configured region and zone -- what is in stock
    right now (``Status=Available``, ``StatusCategory`` ``WithStock`` or
    ``ClosedWithStock``) -- for pay-as-you-go (``SpotStrategy=NoSpot``) and, with
    ``spot=True``, for spot (``SpotAsPriceGo``).  The stocked types of the searched families
    (``instance_types``, default :data:`DEFAULT_INSTANCE_TYPES`) are described once with
    ``DescribeInstanceTypes`` (10 per call, cached) for their vCPUs, memory and GPUs.  One
    offer per (zone, type, market) that fits, ``price_per_hour=None``: the fleet prices it
    from the catalog (``flowmesh catalog refresh --provider alibaba`` fills the catalog from
    ``DescribePrice``; the shipped snapshot has shapes without prices).
``launch(request)``
    Checks first (an ``alibaba`` offer in a configured zone with a VSwitch, count <= 100,
    at most 20 tags).  Idempotency: ``DescribeInstances`` by the tag ``flowmesh:request``;
    instances found are returned (their SSH host keys recovered).  Then ONE
    ``RunInstances``: ``Amount = MinAmount = count`` (all or nothing), ``ClientToken`` (the
    request id when it is at most 64 ASCII characters, else a hash of it: ECS's own
    idempotency for a retried call), ``InstanceChargeType=PostPaid``, ``SpotStrategy``
    ``SpotAsPriceGo`` for a spot offer (else ``NoSpot``), the SDK's tags as ``Tag.N``,
    ``ZoneId``, ``VSwitchId`` and ``SecurityGroupId`` from configuration, ``ImageId``,
    a system disk of ``spec.disk_gb``, ``HttpTokens=required`` (metadata in hardened mode),
    no public bandwidth unless ``public_ip=True``, and in SSH mode the ``#cloud-config`` as
    base64 ``UserData``.  The returned ``InstanceIdSets`` are described once.
``describe(ids)``
    ``DescribeInstances`` with ``InstanceIds`` as a JSON-array string (100 per call) in the
    regions the ids are known in (else every configured region); unknown ids are left out.
``terminate(ids)``
    The ids still listed are deleted with ``DeleteInstances`` (``Force=true``, 100
    ``InstanceId.N`` per call); an id already gone is not an error.
``list_tagged(tags)``
    ``DescribeInstances`` with one ``Tag.N`` per SDK tag (none: the key ``flowmesh:fleet``
    alone, which matches any value), paged by ``NextToken`` (``MaxResults`` 100), in every
    configured region.  ECS notes that a tag filter serves at most 1,000 matching resources
    (ListTagResources beyond): docs/providers/alibaba.md.
``runner(instance)``
    SSH mode (``ssh=SshMode()``, :mod:`flowmesh_sdk.remote.injection`): the runner reaches
    the instance's private IP (``address="public"``: its public IP) and accepts exactly the
    host key injected through user-data; a relaunch recovers keys from
    ``DescribeUserData``.  Otherwise ``runner_factory`` or a ``ProviderError``.

VSwitch and security group: taken from configuration (``vswitch_ids`` maps each zone to
its VSwitch; ``security_group_id`` one group of the VPC).  The driver creates neither:
docs/providers/alibaba.md says how to make them once per zone, and the rules sshd needs.

Capabilities: spot and GPUs, ``max_batch`` 100, ``tags`` PlainTags(128, 128), rates in
:mod:`.client`; ``stop_start`` False.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as _dt
import hashlib
import json
import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from flowmesh_sdk import settings as _settings
from flowmesh_sdk.errors import NotFoundError, ProviderError, SpecError
from flowmesh_sdk.provider import (TAG_FLEET, TAG_REQUEST, Capabilities, Instance, LaunchRequest, Provider,
                                   ProviderState)
from flowmesh_sdk.redaction import redact_url
from flowmesh_sdk.remote.injection import KeyInjector, instance_runner
from flowmesh_sdk.remote.injection import SshMode as _SshMode
from flowmesh_sdk.remote.runner import Runner
from flowmesh_sdk.specs import InstanceSpec, Offer
from flowmesh_sdk.tags import PlainTags

from .client import (DELETE_CHUNK, DESCRIBE_CHUNK, MAX_LAUNCH_BATCH, MAX_TAGS, RATES, TYPES_CHUNK, Credentials,
                     EcsClient, sdk)
from .errors import PROVIDER
from .shapes import (DEFAULT_INSTANCE_TYPES, IN_STOCK, InstanceType, gpu_short, in_stock, instance_type_of,
                     region_of_zone)

log = logging.getLogger("flowmesh.providers.alibaba")

ENV_ENDPOINT = "FLOWMESH_ALIBABA_ENDPOINT"
DEFAULT_REGION = "cn-hangzhou"
DEFAULT_IMAGE = "debian_12_9_x64_20G_alibase_20250117.vhd"
TAGS = PlainTags(max_key=128, max_value=128)
STATE_MAP = {"Pending": ProviderState.PENDING, "Starting": ProviderState.PENDING,
             "Running": ProviderState.RUNNING, "Stopping": ProviderState.STOPPING,
             "Stopped": ProviderState.STOPPED}
_REGION = re.compile(r"^[a-z]{2,}-[a-z0-9-]+$")
_INSTANCE_ID = re.compile(r"^i-[a-z0-9]{8,32}$")
RunnerFactory = Callable[[Instance], Runner]


class SshMode(_SshMode):
    """:class:`flowmesh_sdk.remote.injection.SshMode` for ECS (errors name ``alibaba.ssh.*``)."""

    __slots__ = ()
    field_prefix = "alibaba.ssh"


def client_token(request_id: str) -> str:
    """ECS ``ClientToken`` (at most 64 ASCII characters) for one SDK request id."""
    if request_id.isascii() and 0 < len(request_id) <= 64 and request_id.isprintable():
        return request_id
    return "fm-" + hashlib.sha256(request_id.encode()).hexdigest()[:48]


class AlibabaProvider(Provider):
    """Alibaba Cloud ECS.  See the module docstring for what each call does.

    ``regions``/``zones``: where offers are searched and instances launched (zones default
    to the keys of ``vswitch_ids``); ``vswitch_ids`` zone -> VSwitch id;
    ``security_group_id``; ``image_id``; ``endpoint`` an API endpoint
    (``http://127.0.0.1:PORT`` for the emulator, or ``FLOWMESH_ALIBABA_ENDPOINT``);
    ``access_key_id``/``access_key_secret``/``security_token`` explicit keys (default:
    Alibaba's variables and profile files; ``ram_role=True`` on an ECS coordinator);
    ``spot`` whether spot offers are searched too; ``public_ip`` gives instances public
    bandwidth (``InternetMaxBandwidthOut``)."""

    name = "alibaba"
    capabilities = Capabilities(spot=True, gpus=True, stop_start=False, max_batch=MAX_LAUNCH_BATCH, remote=True,
                                rates=RATES, tags=TAGS)

    def __init__(self, *, regions: str | Sequence[str] | None = None, vswitch_ids: Mapping[str, str] | None = None,
                 security_group_id: str | None = None, zones: Sequence[str] | None = None,
                 image_id: str = DEFAULT_IMAGE, endpoint: str | None = None, access_key_id: str | None = None,
                 access_key_secret: str | None = None, security_token: str | None = None,
                 ram_role: bool | str = False, instance_types: Sequence[str] | None = None, spot: bool = True,
                 public_ip: bool = False, ssh: _SshMode | bool | None = None,
                 runner_factory: RunnerFactory | None = None) -> None:
        vsw = dict(vswitch_ids or {})
        if not all(isinstance(k, str) and isinstance(v, str) and v.startswith("vsw-") for k, v in vsw.items()):
            raise SpecError("alibaba.vswitch_ids", f"must map zone ids to VSwitch ids ('vsw-...'), got {vsw!r}")
        self.vswitch_ids = vsw
        zs = list(dict.fromkeys(zones if zones is not None else vsw))
        if regions is None:
            regions = sorted({region_of_zone(z) for z in zs}) or [DEFAULT_REGION]
        elif isinstance(regions, str):
            regions = [regions]
        rs = list(dict.fromkeys(regions))
        bad = [r for r in rs if not isinstance(r, str) or not _REGION.match(r)]
        if bad or not rs:
            raise SpecError("alibaba.regions", f"must be region ids like 'cn-hangzhou', got {bad or rs!r}")
        self.regions: tuple[str, ...] = tuple(rs)
        badz = [z for z in zs if region_of_zone(z) not in self.regions]
        if badz:
            raise SpecError("alibaba.zones", f"zones {badz} are not in the regions {list(self.regions)}")
        self.zones: tuple[str, ...] = tuple(zs)
        if security_group_id is not None and not str(security_group_id).startswith("sg-"):
            raise SpecError("alibaba.security_group_id", f"must be a security group id ('sg-...'), got "
                                                         f"{security_group_id!r}")
        self.security_group_id = security_group_id
        if not isinstance(image_id, str) or not image_id.strip():
            raise SpecError("alibaba.image_id", f"must be an ECS image id, got {image_id!r}")
        self.image_id = image_id
        endpoint = endpoint if endpoint is not None else _settings.value("providers.alibaba.endpoint")
        if endpoint is not None and not re.match(r"^(https?://)?[^/\s]+$", str(endpoint).rstrip("/")):
            raise SpecError("alibaba.endpoint",
                            f"must be host[:port] or an http(s) URL, got {redact_url(str(endpoint))!r}")
        self.endpoint = endpoint
        types = tuple(instance_types) if instance_types is not None else DEFAULT_INSTANCE_TYPES
        if not types or not all(isinstance(t, str) and t.startswith("ecs.") for t in types):
            raise SpecError("alibaba.instance_types", f"must be ECS type names or prefixes like 'ecs.c8a.', got "
                                                      f"{types!r}")
        self.instance_types = types
        self.spot, self.public_ip = bool(spot), bool(public_ip)
        self.ssh = SshMode.coerce(ssh, "alibaba.ssh")
        if self.ssh is not None and runner_factory is not None:
            raise SpecError("alibaba.runner_factory", "cannot be combined with ssh=: SSH mode makes the runners")
        if runner_factory is not None and not callable(runner_factory):
            raise SpecError("alibaba.runner_factory", "must be a callable Instance -> Runner")
        self.runner_factory = runner_factory
        self._keys = KeyInjector(PROVIDER, self.ssh) if self.ssh is not None else None
        creds = Credentials(access_key_id=access_key_id, access_key_secret=access_key_secret,
                            security_token=security_token, ram_role=ram_role)
        self._client = EcsClient(credentials=creds, endpoint=endpoint)
        self._types: dict[str, dict[str, InstanceType]] = {}      # region -> name -> type
        self._type_lock = asyncio.Lock()
        self._region_of: dict[str, str] = {}
        self._spec_of: dict[str, InstanceSpec] = {}
        self._price_of: dict[str, float] = {}
        self._ips: dict[str, tuple[str | None, str | None]] = {}

    def __repr__(self) -> str:
        return (f"AlibabaProvider(regions={list(self.regions)!r}, zones={list(self.zones)!r}, "
                f"endpoint={redact_url(self.endpoint)!r}{', ssh' if self.ssh else ''})")

    # ---- shapes --------------------------------------------------------------------
    async def _stock(self, region: str, spot: bool) -> list[tuple[str, str]]:
        """(zone, type) pairs in stock in ``region`` for the market."""
        _c, models, _o, _r = sdk()
        body = await self._client.call(region, "describe_available_resource", models.DescribeAvailableResourceRequest(
            region_id=region, destination_resource="InstanceType", instance_charge_type="PostPaid",
            spot_strategy="SpotAsPriceGo" if spot else "NoSpot"))
        return in_stock(body, self.zones, self.instance_types)

    async def _describe_types(self, region: str, names: Iterable[str]) -> dict[str, InstanceType]:
        async with self._type_lock:
            known = self._types.setdefault(region, {})
            missing = sorted(set(names) - set(known))
            _c, models, _o, _r = sdk()
            for i in range(0, len(missing), TYPES_CHUNK):
                body = await self._client.call(region, "describe_instance_types", models.DescribeInstanceTypesRequest(
                    instance_types=missing[i:i + TYPES_CHUNK], max_results=100))
                for t in (body.instance_types.instance_type or []) if body.instance_types else []:
                    known[str(t.instance_type_id)] = instance_type_of(t)
            return known

    async def offers(self, spec: InstanceSpec) -> list[Offer]:
        markets = [False, True] if self.spot else [False]
        jobs = [(r, m) for r in self.regions for m in markets]
        stocks = await asyncio.gather(*(self._stock(r, m) for r, m in jobs))
        out = []
        for (region, spot), pairs in zip(jobs, stocks):
            types = await self._describe_types(region, {t for _, t in pairs})
            for zone, name in pairs:
                it = types.get(name)
                offer = it.offer(region, zone, spot) if it else None
                if offer is not None and offer.fits(spec):
                    out.append(offer)
        return out

    def explain_misfit(self, spec: InstanceSpec) -> str:
        gpu = f", {spec.gpus} x {spec.gpu_name or 'any'} GPU" if spec.gpus else ""
        return (f"no ECS type of {', '.join(self.instance_types[:6])}... in stock in "
                f"{', '.join(self.zones or self.regions)} has {spec.cpus} vCPUs, {spec.memory_gb:g} GiB{gpu}, "
                f"arch {spec.arch}; AlibabaProvider(instance_types=...) widens the search")

    # ---- instances -----------------------------------------------------------------
    def _to_instance(self, item: Any, *, spec: InstanceSpec | None = None, price: float | None = None) -> Instance:
        iid = str(item.instance_id)
        region = str(item.region_id or region_of_zone(str(item.zone_id)))
        self._region_of[iid] = region
        if spec is not None:
            self._spec_of[iid] = spec
        spec = self._spec_of.get(iid)
        if spec is None:
            it = self._types.get(region, {}).get(str(item.instance_type))
            cpus = int(item.cpu or (it.cpus if it else 1)) or 1
            mem = float(item.memory or 0) / 1024 or (it.memory_gb if it else 1.0)
            gpus = int(item.gpuamount or 0)
            spec = InstanceSpec(cpus=cpus, memory_gb=mem, gpus=min(gpus, 16),
                                gpu_name=gpu_short(item.gpuspec) if gpus else None,
                                arch=it.arch if it else "x86_64")
            self._spec_of[iid] = spec
        if price is not None:
            self._price_of[iid] = price
        private = None
        if item.vpc_attributes and item.vpc_attributes.private_ip_address:
            ips = item.vpc_attributes.private_ip_address.ip_address or []
            private = ips[0] if ips else None
        public = None
        if item.public_ip_address:
            ips = item.public_ip_address.ip_address or []
            public = ips[0] if ips else None
        self._ips[iid] = (private, public)
        tags = {}
        if item.tags:
            tags = {str(t.tag_key): str(t.tag_value or "") for t in item.tags.tag or []}
        created = str(item.creation_time or "")
        try:
            launched_at = _dt.datetime.strptime(created, "%Y-%m-%dT%H:%MZ").replace(
                tzinfo=_dt.timezone.utc).timestamp()
        except ValueError:
            launched_at = time.time()
        return Instance(id=iid, provider=PROVIDER, region=region, instance_type=str(item.instance_type), spec=spec,
                        state=STATE_MAP.get(str(item.status), ProviderState.PENDING), tags=TAGS.decode(tags),
                        launched_at=launched_at, price_per_hour=self._price_of.get(iid, 0.0),
                        address=private or public, port=self.ssh.port if self.ssh is not None else None,
                        zone=str(item.zone_id) if item.zone_id else None)

    async def _describe_pages(self, region: str, **params: Any) -> list[Any]:
        _c, models, _o, _r = sdk()
        out: list[Any] = []
        token: str | None = None
        for _ in range(10_000):   # a page cap, not a poll: NextToken ends it
            body = await self._client.call(region, "describe_instances", models.DescribeInstancesRequest(
                region_id=region, max_results=DESCRIBE_CHUNK, next_token=token, **params))
            out.extend((body.instances.instance or []) if body.instances else [])
            token = body.next_token or None
            if not token:
                break
        return out

    async def _by_tags(self, region: str, tags: Mapping[str, str], *, keys_only: bool = False) -> list[Any]:
        _c, models, _o, _r = sdk()
        filt = [models.DescribeInstancesRequestTag(key=k) if keys_only else
                models.DescribeInstancesRequestTag(key=k, value=v) for k, v in tags.items()]
        return await self._describe_pages(region, tag=filt)

    # ---- launch --------------------------------------------------------------------
    def _check(self, request: LaunchRequest) -> dict[str, str]:
        offer = request.offer
        if offer.provider != PROVIDER:
            raise SpecError("launch.offer", f"an offer of provider {offer.provider!r} was given to alibaba")
        if offer.region not in self.regions:
            raise SpecError("launch.offer.region", f"{offer.region!r} is not one of {list(self.regions)}")
        if not offer.zone or offer.zone not in self.vswitch_ids:
            raise SpecError("alibaba.vswitch_ids", f"no VSwitch configured for zone {offer.zone!r} "
                                                   f"(configured: {sorted(self.vswitch_ids)})")
        if not self.security_group_id:
            raise SpecError("alibaba.security_group_id", "a security group id ('sg-...') is needed to launch")
        if request.count > MAX_LAUNCH_BATCH:
            raise SpecError("launch.count", f"at most {MAX_LAUNCH_BATCH} per RunInstances call, got {request.count}")
        return TAGS.encode_launch({**request.tags, TAG_REQUEST: request.request_id}, limit=MAX_TAGS,
                                  cloud="ECS")

    async def launch(self, request: LaunchRequest) -> list[Instance]:
        tags = self._check(request)
        offer = request.offer
        region, zone = offer.region, str(offer.zone)
        earlier = await self._by_tags(region, {TAG_REQUEST: tags[TAG_REQUEST]})
        if earlier:
            log.info("alibaba launch %s: %d instances already exist for this request id", request.request_id,
                     len(earlier))
            found = [self._to_instance(i, spec=request.spec, price=offer.price_per_hour) for i in earlier]
            if self._keys is not None:
                await self._keys.recover([i.id for i in found], lambda iid: self._user_data(region, iid))
            return found
        _c, models, _o, _r = sdk()
        host_key = None
        user_data = None
        if self._keys is not None:
            text, host_key = await self._keys.user_data(request.request_id)
            user_data = base64.b64encode(text.encode()).decode()
        req = models.RunInstancesRequest(
            region_id=region, zone_id=zone, instance_type=offer.instance_type, image_id=self.image_id,
            v_switch_id=self.vswitch_ids[zone], security_group_id=self.security_group_id, amount=request.count,
            min_amount=request.count, client_token=client_token(request.request_id),
            instance_charge_type="PostPaid", spot_strategy="SpotAsPriceGo" if offer.spot else "NoSpot",
            tag=[models.RunInstancesRequestTag(key=k, value=v) for k, v in tags.items()],
            system_disk=models.RunInstancesRequestSystemDisk(size=str(max(20, request.spec.disk_gb))),
            http_tokens="required", internet_max_bandwidth_out=5 if self.public_ip else 0,
            instance_name=f"flowmesh-{hashlib.sha256(request.request_id.encode()).hexdigest()[:10]}",
            user_data=user_data)
        body = await self._client.call(region, "run_instances", req)
        ids = list((body.instance_id_sets.instance_id_set or []) if body.instance_id_sets else [])
        if len(ids) != request.count:
            raise ProviderError(f"RunInstances in {region} answered {len(ids)} instance ids for Amount="
                                f"{request.count}", provider=PROVIDER, code="ShortLaunch")
        by_id = {str(i.instance_id): i for i in await self._describe_region(region, ids)}
        out = []
        for iid in ids:
            item = by_id.get(iid)
            if item is None:   # eventual consistency: a just-made instance may not be listed yet
                self._region_of[iid] = region
                self._spec_of[iid] = request.spec
                out.append(Instance(id=iid, provider=PROVIDER, region=region, instance_type=offer.instance_type,
                                    spec=request.spec, state=ProviderState.PENDING, tags=dict(tags),
                                    launched_at=time.time(), price_per_hour=offer.price_per_hour or 0.0,
                                    port=self.ssh.port if self.ssh else None, zone=zone))
            else:
                out.append(self._to_instance(item, spec=request.spec, price=offer.price_per_hour))
        if host_key is not None and self._keys is not None:
            await self._keys.pin(ids, host_key)
        log.info("alibaba launch %s: %d x %s in %s%s", request.request_id, len(out), offer.instance_type, zone,
                 " (spot)" if offer.spot else "")
        return out

    async def _user_data(self, region: str, iid: str) -> str | None:
        _c, models, _o, _r = sdk()
        body = await self._client.call(region, "describe_user_data",
                                       models.DescribeUserDataRequest(region_id=region, instance_id=iid))
        raw = body.user_data or ""
        try:
            return base64.b64decode(raw).decode()
        except ValueError:
            return None

    # ---- describe / list / terminate ---------------------------------------------------
    async def _describe_region(self, region: str, ids: Sequence[str]) -> list[Any]:
        out: list[Any] = []
        for i in range(0, len(ids), DESCRIBE_CHUNK):
            out.extend(await self._describe_pages(region, instance_ids=json.dumps(list(ids[i:i + DESCRIBE_CHUNK]))))
        return out

    async def describe(self, ids: Sequence[str]) -> list[Instance]:
        wanted = [i for i in dict.fromkeys(ids) if isinstance(i, str) and _INSTANCE_ID.match(i)]
        by_region: dict[str, list[str]] = {}
        for iid in wanted:
            regions = [self._region_of[iid]] if iid in self._region_of else list(self.regions)
            for r in regions:
                by_region.setdefault(r, []).append(iid)
        groups = await asyncio.gather(*(self._describe_region(r, g) for r, g in by_region.items()))
        found: dict[str, Instance] = {}
        for group in groups:
            for item in group:
                inst = self._to_instance(item)
                found.setdefault(inst.id, inst)
        return [found[i] for i in wanted if i in found]

    async def list_tagged(self, tags: Mapping[str, str]) -> list[Instance]:
        if tags:
            enc = TAGS.encode({str(k): str(v) for k, v in tags.items()})
            jobs = [self._by_tags(r, enc) for r in self.regions]
        else:
            jobs = [self._by_tags(r, {TAG_FLEET: ""}, keys_only=True) for r in self.regions]
        out = []
        for group in await asyncio.gather(*jobs):
            for item in group:
                inst = self._to_instance(item)
                if all(inst.tags.get(k) == v for k, v in tags.items()) and TAG_FLEET in inst.tags:
                    out.append(inst)
        return out

    async def terminate(self, ids: Sequence[str]) -> None:
        present = await self.describe(ids)
        by_region: dict[str, list[str]] = {}
        for inst in present:
            by_region.setdefault(inst.region, []).append(inst.id)
        _c, models, _o, _r = sdk()

        async def delete(region: str, chunk: list[str]) -> None:
            try:
                await self._client.call(region, "delete_instances", models.DeleteInstancesRequest(
                    region_id=region, instance_id=chunk, force=True))
            except NotFoundError:
                log.debug("alibaba terminate: %s already gone", chunk)
        await asyncio.gather(*(delete(r, g[i:i + DELETE_CHUNK]) for r, g in by_region.items()
                               for i in range(0, len(g), DELETE_CHUNK)))
        if self._keys is not None:
            await self._keys.forget([i.id for i in present])

    # ---- the rest ------------------------------------------------------------------
    def runner(self, instance: Instance) -> Runner:
        return instance_runner(instance, self._keys, self._ips, self.runner_factory, provider=PROVIDER,
                               hint="pass AlibabaProvider(ssh=SshMode()) to inject keys at launch "
                                    "(docs/providers/alibaba.md), or runner_factory=...")

    async def close(self) -> None:
        if self._keys is not None:
            await self._keys.close()
        await self._client.close()


# The names this module had before shapes.py took them stay importable here.
__all__ = ["AlibabaProvider", "DEFAULT_INSTANCE_TYPES", "IN_STOCK", "InstanceType", "SshMode", "client_token",
           "gpu_short", "region_of_zone"]
