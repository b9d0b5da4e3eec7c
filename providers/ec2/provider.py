"""The ``ec2`` provider: Amazon EC2 through boto3.

What each contract call does on EC2 (every boto3 call runs in the client's bounded
executor, never on the event loop; see :mod:`.client`):

``offers(spec)``
    Shapes, not prices: the instance types of the searched families
    (``instance_types``, default :data:`DEFAULT_INSTANCE_TYPES`: the current general
    purpose, compute, memory and GPU families, as ``DescribeInstanceTypes`` wildcard
    filters) in every configured region, described by ``DescribeInstanceTypes``
    (paginated, fetched once per region and cached): vCPUs, memory, GPUs (count, name),
    arch (``arm64`` when the type supports it, else ``x86_64``).  One on-demand offer per
    type that fits, ``price_per_hour=None``: the fleet prices each from the catalog
    (``flowmesh_sdk.catalog``, the one source of prices; ``flowmesh catalog refresh
    --provider ec2`` updates it), adds the spot variant where the catalog has a spot
    price and the pool allows spot, and leaves out, saying so, a type the catalog has no
    price for.  No zone (the catalog's EC2 prices are region level).  Smallest first
    (vCPUs, memory, name).
``launch(request)``
    Checks first, spending nothing: the offer is an ``ec2`` offer in a configured region,
    an AMI is configured for that region, the instance type exists there
    (``DescribeInstanceTypes``), the AMI exists and matches the offer's architecture
    (``DescribeImages``, cached).  Then idempotency: ``DescribeInstances`` filtered on
    ``tag:flowmesh:request=<request_id>``; instances found are returned as they are.
    Then ONE ``RunInstances``: ``MinCount=MaxCount=count`` (all or nothing: a shortage
    is a ``CapacityError`` the caller fails over on, never a silent partial launch;
    ``partial_ok=True`` asks for ``MinCount=1``), ``ClientToken`` derived from the
    request id (EC2's own idempotency, which closes the window where the tag filter does
    not yet see a launch that went through), the tags (plus ``flowmesh:request`` and a
    ``Name``) on the instance AND its volumes, the root volume sized to
    ``spec.disk_gb`` (gp3, deleted on termination), spot market options for a spot
    offer, the zone for a zoned offer.
``describe(ids)``
    ``DescribeInstances`` filtered on ``instance-id`` (so an unknown id is simply absent,
    never an ``InvalidInstanceID.NotFound`` error), in chunks of 200 ids, per region.
    Ids whose region the provider has not seen are looked for in every configured region.
    Malformed ids are omitted without a call.
``terminate(ids)``
    ``TerminateInstances`` in chunks of 1000 per region; ids of unknown region are
    located first with ``describe``; ids EC2 says do not exist are dropped from the chunk
    and the rest sent again (not a retry: the same call without the gone ids).
``list_tagged(tags)``
    ``DescribeInstances`` with one ``tag:KEY`` filter per tag (none: ``tag-key`` =
    ``flowmesh:fleet``) and ``instance-state-name`` in pending, running, stopping,
    stopped; paginated; every configured region.
``runner(instance)``
    In SSH mode (``ssh=SshMode(...)``): an :class:`~flowmesh_sdk.remote.ssh.SshRunner` to
    the instance's private (or public) IP, logging in with the fleet's client key and
    pinned to exactly the host key injected at launch.  Otherwise ``runner_factory(instance)``
    when one was given, else a ``ProviderError`` (code ``NoRunner``).

SSH mode (docs/ssh.md): each launch request generates one ed25519 host key pair and sends
``#cloud-config`` user-data (:mod:`flowmesh_sdk.remote.cloudinit`) that installs it as the
instance's only host key and authorizes the fleet's client key
(:class:`~flowmesh_sdk.remote.keys.FleetKey`, kept in ``$FLOWMESH_HOME/keys``).  The public
host key is pinned per instance id in the trust record (``ec2:<instance-id>`` in
``$FLOWMESH_HOME/keys/known_hosts``), so another process on this machine reaches the same
instances; a launch retried with the same request id recovers the keys of instances it
did not launch itself from their user-data (DescribeInstanceAttribute).  No key is ever
learnt on first use for EC2: an instance without a known injected key gets no runner.
Launches in SSH mode also ask for IMDSv2 with a PUT response hop limit of 1
(``MetadataOptions``), so containers on the instance cannot read the user-data (which
holds the private host key) from the metadata service.  A user-supplied ``user_data`` is
refused in SSH mode (``SpecError`` on ``ec2.user_data``): merging a second cloud-config
could override the injected keys, so other setup belongs in the AMI or the bootstrap steps.

Instances: ``id`` EC2's instance id (unique, never reused); ``state`` from the EC2 state
name (pending -> PENDING, running -> RUNNING, stopping -> STOPPING, stopped -> STOPPED,
shutting-down/terminated -> TERMINATED); ``address`` the private IP, else the public one;
``zone`` the instance's ``Placement.AvailabilityZone``; ``port`` sshd's port in SSH mode
(else None); ``launched_at`` EC2's LaunchTime; ``price_per_hour`` the launch offer's
price (as the fleet priced it) for instances this provider object launched, else 0.0
(the provider keeps no prices; the fleet's spend ledger has what it launched them at);
``spec`` the launch request's spec when this provider launched it, else built from the
instance type.  Tags are EC2 tags as they are (:class:`~flowmesh_sdk.tags.PlainTags`,
keys up to 128 characters, values up to 256, at most 50 per resource, no ``aws:``
prefix), declared as ``Capabilities.tags``.

Capabilities: spot and GPUs, ``max_batch`` 1000, and the published EC2 API buckets as
``rates`` (table in :mod:`.client`).  ``stop_start`` is declared False: EC2 can stop and
start instances, but the provider contract has no stop/start call yet, and a capability
the driver cannot act on would mislead the core.

A note on ``describe`` chunks: DescribeInstances documents no limit on the number of
values in one filter; 200 (the limit other EC2 Describe calls document) is the
conservative choice, and one id filter per call keeps each request small.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as _dt
import hashlib
import logging
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from flowmesh_sdk import settings as _settings
from flowmesh_sdk.errors import NotFoundError, ProviderError, SpecError
from flowmesh_sdk.provider import (TAG_FLEET, TAG_POOL, TAG_REQUEST, Capabilities, Instance, LaunchRequest,
                                   Provider, ProviderState)
from flowmesh_sdk.redaction import redact_url
from flowmesh_sdk.remote.injection import KeyInjector, instance_runner
from flowmesh_sdk.remote.injection import SshMode as _SshMode
from flowmesh_sdk.remote.keys import PublicKey
from flowmesh_sdk.remote.runner import Runner
from flowmesh_sdk.specs import InstanceSpec, Offer
from flowmesh_sdk.tags import PlainTags

from .client import DESCRIBE_PAGE, ID_FILTER_CHUNK, MAX_LAUNCH_BATCH, RATES, TERMINATE_CHUNK, Ec2Client
from .errors import PROVIDER, missing_instance_ids

log = logging.getLogger("flowmesh.providers.ec2")

DEFAULT_REGION = "us-east-1"
ENV_ENDPOINT = "FLOWMESH_EC2_ENDPOINT_URL"
ENV_AMI = "FLOWMESH_EC2_AMI"
LIVE_STATES = ("pending", "running", "stopping", "stopped")
STATE_MAP = {
    "pending": ProviderState.PENDING,
    "running": ProviderState.RUNNING,
    "stopping": ProviderState.STOPPING,
    "stopped": ProviderState.STOPPED,
    "shutting-down": ProviderState.TERMINATED,
    "terminated": ProviderState.TERMINATED,
}
TYPE_FILTER_CHUNK = 100            # instance-type filter values per DescribeInstanceTypes call
MAX_TAGS = 50                      # EC2: 50 user tags per resource
TAGS = PlainTags(max_key=128, max_value=256)   # EC2 tag limits (keys 128, values 256 characters)
# The families offers() describes by default (DescribeInstanceTypes ``instance-type``
# filter values, wildcards allowed): current general purpose, compute and memory families
# (Intel, AMD, Graviton) and the GPU families.  Shapes only; which of them can be launched
# at what price is the catalog's business.  ``Ec2Provider(instance_types=...)`` replaces
# the list (``("*",)``: every type the region has, several hundred).
DEFAULT_INSTANCE_TYPES: tuple[str, ...] = (
    "c5.*", "c6a.*", "c6i.*", "c7a.*", "c7i.*", "c7g.*",
    "m5.*", "m6a.*", "m6i.*", "m7a.*", "m7i.*", "m7g.*",
    "r5.*", "r6a.*", "r6i.*", "r7i.*", "r7g.*",
    "g4ad.*", "g4dn.*", "g5.*", "g5g.*", "g6.*", "g6e.*", "gr6.*", "g7.*", "g7e.*",
    "p3dn.*", "p4d.*", "p4de.*", "p5.*", "p5en.*", "p6-b200.*", "p6-b300.*",
)
_TYPE_PATTERN = re.compile(r"^[a-z0-9*?][a-z0-9.*?-]{0,63}$")
_INSTANCE_ID = re.compile(r"^i-[0-9a-f]{8}(?:[0-9a-f]{9})?$")
_REGION = re.compile(r"^[a-z]{2}(?:-[a-z]+)+-\d+$")

RunnerFactory = Callable[[Instance], Runner]
PUBLIC_IP_WAIT_S = 120.0           # SSH mode, address="public": how long launch waits for public IPs


class SshMode(_SshMode):
    """:class:`flowmesh_sdk.remote.injection.SshMode` for EC2 (errors name ``ec2.ssh.*``).

    ``address="public"`` makes launch wait, up to 120 s, until EC2 has assigned public IPs;
    ``imds_hop_limit`` is the IMDSv2 PUT response hop limit (1: processes in containers
    cannot reach the metadata service, so cannot read the user-data; raise it only if
    containers must use the instance role).  ``address_map``: a test hook
    (``flowmesh_sdk.testing.cloudinit``)."""

    __slots__ = ()
    field_prefix = "ec2.ssh"


def trust_id(instance_id: str) -> str:
    """How an EC2 instance's injected host key is named in the trust record."""
    return f"ec2:{instance_id}"


@dataclass(frozen=True, slots=True)
class TypeInfo:
    """What ``DescribeInstanceTypes`` says of one instance type."""

    name: str
    cpus: int
    memory_gb: float
    gpus: int
    gpu_name: str | None
    arch: str | None               # "x86_64" | "arm64" | None (neither: not offered)

    @classmethod
    def parse(cls, item: Mapping[str, Any]) -> TypeInfo:
        archs = (item.get("ProcessorInfo") or {}).get("SupportedArchitectures") or []
        arch = "arm64" if "arm64" in archs else "x86_64" if "x86_64" in archs else None
        gpus_info = (item.get("GpuInfo") or {}).get("Gpus") or []
        gpus = sum(int(g.get("Count") or 0) for g in gpus_info)
        gpu_name = next((str(g["Name"]).lower() for g in gpus_info if g.get("Name")), None)
        return cls(name=item["InstanceType"], cpus=int((item.get("VCpuInfo") or {}).get("DefaultVCpus") or 0),
                   memory_gb=round(int((item.get("MemoryInfo") or {}).get("SizeInMiB") or 0) / 1024, 3),
                   gpus=gpus, gpu_name=gpu_name if gpus else None, arch=arch)

    def spec(self, gpu_name: str | None = None) -> InstanceSpec | None:
        try:
            gpus = min(self.gpus, 16)
            return InstanceSpec(cpus=max(1, min(self.cpus, 1024)), memory_gb=self.memory_gb,
                                gpus=gpus, gpu_name=(gpu_name or self.gpu_name) if gpus else None,
                                arch=self.arch or "x86_64")
        except SpecError:
            return None


@dataclass(frozen=True, slots=True)
class ImageInfo:
    image_id: str
    arch: str | None
    root_device: str | None


def _default_regions() -> list[str]:
    return [os.environ.get("AWS_DEFAULT_REGION") or os.environ.get("AWS_REGION") or DEFAULT_REGION]


def _chunks(items: Sequence[str], size: int) -> Iterable[list[str]]:
    for i in range(0, len(items), size):
        yield list(items[i:i + size])


def client_token(request_id: str) -> str:
    """EC2's ClientToken: up to 64 ASCII characters; longer or non-ASCII ids are hashed."""
    if 0 < len(request_id) <= 64 and request_id.isascii() and request_id.isprintable():
        return request_id
    return "fm-" + hashlib.sha256(request_id.encode()).hexdigest()[:61]


class Ec2Provider(Provider):
    """Amazon EC2.  See the module docstring for what each call does.

    ``image_id`` is an AMI id, or a mapping region -> AMI id (AMI ids are regional);
    ``resolve:ssm:PARAMETER`` values are passed to EC2 as they are (not checked first).
    ``session_kwargs`` go to ``boto3.session.Session`` (``profile_name``, or explicit keys
    as a test fixture does); they are never logged or shown.  ``instance_types`` are the
    instance types (names or ``DescribeInstanceTypes`` wildcards such as ``"c7i.*"``)
    that :meth:`offers` reports, default :data:`DEFAULT_INSTANCE_TYPES`.  The provider
    holds no prices: the fleet prices its offers from the catalog."""

    name = "ec2"
    capabilities = Capabilities(spot=True, gpus=True, stop_start=False, max_batch=MAX_LAUNCH_BATCH,
                                remote=True, rates=RATES, tags=TAGS)

    def __init__(self, *, regions: str | Sequence[str] | None = None, endpoint_url: str | None = None,
                 image_id: str | Mapping[str, str] | None = None, subnet_id: str | None = None,
                 security_group_ids: str | Sequence[str] = (), key_name: str | None = None,
                 user_data: str | None = None, iam_instance_profile: str | None = None,
                 max_workers: int = 8, runner_factory: RunnerFactory | None = None,
                 session_kwargs: Mapping[str, Any] | None = None, partial_ok: bool = False,
                 instance_types: Sequence[str] | None = None, ssh: SshMode | bool | None = None) -> None:
        if regions is None:
            regions = _default_regions()
        elif isinstance(regions, str):
            regions = [regions]
        regs: list[str] = []
        for r in regions:
            if not isinstance(r, str) or not _REGION.match(r):
                raise SpecError("ec2.regions", f"must be AWS region names like 'us-east-1', got {r!r}")
            if r not in regs:
                regs.append(r)
        if not regs:
            raise SpecError("ec2.regions", "must name at least one region")
        self.regions: tuple[str, ...] = tuple(regs)

        endpoint_url = endpoint_url if endpoint_url is not None else _settings.value("providers.ec2.endpoint_url")
        if endpoint_url is not None and not re.match(r"^https?://[^/\s]+", str(endpoint_url)):
            raise SpecError("ec2.endpoint_url", f"must be an http(s) URL, got {redact_url(str(endpoint_url))!r}")
        self.endpoint_url = endpoint_url

        if image_id is None:
            image_id = _settings.value("providers.ec2.image_id")
        if isinstance(image_id, Mapping):
            images = {}
            for reg, ami in image_id.items():
                if not isinstance(ami, str) or not ami.strip():
                    raise SpecError(f"ec2.image_id[{reg!r}]", f"must be an AMI id, got {ami!r}")
                images[str(reg)] = ami.strip()
            self._image_ids: dict[str, str] | str | None = images
        elif image_id is not None:
            if not isinstance(image_id, str) or not image_id.strip():
                raise SpecError("ec2.image_id", f"must be an AMI id like 'ami-0abc...', got {image_id!r}")
            self._image_ids = image_id.strip()
        else:
            self._image_ids = None

        if isinstance(security_group_ids, str):
            security_group_ids = (security_group_ids,)
        self.subnet_id = subnet_id
        self.security_group_ids = tuple(security_group_ids)
        self.key_name = key_name
        self._user_data = user_data
        self.iam_instance_profile = iam_instance_profile
        if isinstance(max_workers, bool) or not isinstance(max_workers, int) or not 1 <= max_workers <= 256:
            raise SpecError("ec2.max_workers", f"must be an integer in [1, 256], got {max_workers!r}")
        if runner_factory is not None and not callable(runner_factory):
            raise SpecError("ec2.runner_factory", "must be a callable Instance -> Runner")
        self.runner_factory = runner_factory
        ssh = SshMode.coerce(ssh, "ec2.ssh")
        if ssh is not None and user_data is not None:
            raise SpecError("ec2.user_data", "cannot be combined with ssh=: in SSH mode the provider writes "
                                             "the user-data itself (the instance's host key and the fleet's "
                                             "client key); put other setup in the AMI or the bootstrap steps")
        if ssh is not None and runner_factory is not None:
            raise SpecError("ec2.runner_factory", "cannot be combined with ssh=: SSH mode makes the runners")
        self.ssh = ssh
        self._keys = KeyInjector(PROVIDER, ssh) if ssh is not None else None   # SSH mode's keys and runners
        self._ips: dict[str, tuple[str | None, str | None]] = {}    # instance id -> (private, public)
        self.partial_ok = bool(partial_ok)
        if instance_types is None:
            instance_types = DEFAULT_INSTANCE_TYPES
        elif isinstance(instance_types, str):
            instance_types = (instance_types,)
        patterns = tuple(dict.fromkeys(instance_types))
        bad = [t for t in patterns if not isinstance(t, str) or not _TYPE_PATTERN.match(t)]
        if bad or not patterns:
            raise SpecError("ec2.instance_types", "must be EC2 instance types or DescribeInstanceTypes "
                                                  f"wildcards like 'c7i.*' or 'm6i.2xlarge', got {bad or patterns!r}")
        self.instance_types: tuple[str, ...] = patterns
        self._client = Ec2Client(endpoint_url=self.endpoint_url, max_workers=max_workers,
                                 session_kwargs=session_kwargs)

        self._types: dict[str, dict[str, TypeInfo | None]] = {}     # region -> name -> info (None: none)
        self._type_locks: dict[str, asyncio.Lock] = {}
        self._shapes: dict[str, list[TypeInfo]] = {}                # region -> the searched families' types
        self._price_of: dict[str, float] = {}                       # instance id -> its launch offer's price
        self._images: dict[tuple[str, str], ImageInfo] = {}
        self._region_of: dict[str, str] = {}                        # instance id -> region
        self._spec_of: dict[str, InstanceSpec] = {}                 # instance id -> spec it was launched for

    def __repr__(self) -> str:
        return (f"Ec2Provider(regions={list(self.regions)!r}, endpoint_url={redact_url(self.endpoint_url)!r}, "
                f"image_id={self._image_ids!r}{', ssh' if self.ssh else ''})")

    # ---- instance types and prices ---------------------------------------------------
    def image_for(self, region: str) -> str:
        """The AMI to launch in ``region``; SpecError naming ``ec2.image_id`` when none is set."""
        ids = self._image_ids
        ami = ids.get(region) if isinstance(ids, dict) else ids
        if not ami:
            raise SpecError("ec2.image_id",
                            f"no AMI configured for region {region}: pass Ec2Provider(image_id='ami-...') "
                            f"(or a mapping region -> AMI id), or set {ENV_AMI}")
        return ami

    async def _ensure_types(self, region: str, names: Iterable[str]) -> dict[str, TypeInfo | None]:
        """Type info for ``names`` in ``region`` (fetched once, cached; None: no such type)."""
        known = self._types.setdefault(region, {})
        lock = self._type_locks.setdefault(region, asyncio.Lock())
        async with lock:
            missing = sorted({n for n in names if n not in known})
            for chunk in _chunks(missing, TYPE_FILTER_CHUNK):
                pages = await self._client.pages(region, "describe_instance_types",
                                                 Filters=[{"Name": "instance-type", "Values": chunk}])
                for page in pages:
                    for item in page.get("InstanceTypes") or []:
                        info = TypeInfo.parse(item)
                        known[info.name] = info
                for name in chunk:
                    known.setdefault(name, None)
        return known

    async def _region_shapes(self, region: str) -> list[TypeInfo]:
        """The types of :attr:`instance_types` in ``region`` (one paginated
        ``DescribeInstanceTypes`` per 100 patterns, once per region; cached)."""
        lock = self._type_locks.setdefault(region, asyncio.Lock())
        async with lock:
            if region not in self._shapes:
                found: dict[str, TypeInfo] = {}
                for chunk in _chunks(list(self.instance_types), TYPE_FILTER_CHUNK):
                    pages = await self._client.pages(region, "describe_instance_types",
                                                     Filters=[{"Name": "instance-type", "Values": chunk}])
                    for page in pages:
                        for item in page.get("InstanceTypes") or []:
                            info = TypeInfo.parse(item)
                            found[info.name] = info
                self._types.setdefault(region, {}).update(found)
                self._shapes[region] = sorted(found.values(), key=lambda i: (i.cpus, i.memory_gb, i.name))
        return self._shapes[region]

    async def _region_offers(self, region: str, spec: InstanceSpec) -> list[Offer]:
        out = []
        for info in await self._region_shapes(region):
            if info.arch is None or info.cpus < 1 or info.memory_gb <= 0:
                continue
            offer = Offer(provider=PROVIDER, region=region, instance_type=info.name, cpus=info.cpus,
                          memory_gb=info.memory_gb, price_per_hour=None, gpus=info.gpus,
                          gpu_name=info.gpu_name if info.gpus else None, zone=None, spot=False, arch=info.arch,
                          source="EC2 DescribeInstanceTypes")
            if offer.fits(spec):
                out.append(offer)
        return out

    async def offers(self, spec: InstanceSpec) -> list[Offer]:
        per_region = await asyncio.gather(*(self._region_offers(r, spec) for r in self.regions))
        return [o for group in per_region for o in group]

    def explain_misfit(self, spec: InstanceSpec) -> str:
        gpu = f", {spec.gpus} x {spec.gpu_name or 'any'} GPU" if spec.gpus else ""
        searched = ", ".join(self.instance_types[:8]) + (", ..." if len(self.instance_types) > 8 else "")
        known = {r: len(v) for r, v in self._shapes.items() if r in self.regions}
        seen = ", ".join(f"{n} in {r}" for r, n in known.items()) or "none described yet"
        return (f"no EC2 instance type of the families searched ({searched}; types found: {seen}) in "
                f"{', '.join(self.regions)} has {spec.cpus} vCPUs, {spec.memory_gb:g} GiB{gpu}, arch {spec.arch}; "
                "Ec2Provider(instance_types=...) widens the search")

    # ---- instances -----------------------------------------------------------------
    def _to_instance(self, region: str, item: Mapping[str, Any], *, spec: InstanceSpec | None = None,
                     price: float | None = None, extra_tags: Mapping[str, str] | None = None) -> Instance:
        iid = str(item["InstanceId"])
        itype = str(item.get("InstanceType") or "")
        tags = dict(extra_tags or {})
        tags.update({str(t["Key"]): str(t.get("Value", "")) for t in item.get("Tags") or [] if "Key" in t})
        launched = item.get("LaunchTime")
        launched_at = launched.timestamp() if isinstance(launched, _dt.datetime) else time.time()
        if spec is None:
            spec = self._spec_of.get(iid)
        if spec is None:
            info = self._types.get(region, {}).get(itype)
            spec = (info.spec() if info else None) or InstanceSpec()
        self._region_of[iid] = region
        self._spec_of.setdefault(iid, spec)
        if price is not None:
            self._price_of[iid] = price
        state = STATE_MAP.get(str((item.get("State") or {}).get("Name") or ""), ProviderState.PENDING)
        self._ips[iid] = (item.get("PrivateIpAddress") or None, item.get("PublicIpAddress") or None)
        zone = (item.get("Placement") or {}).get("AvailabilityZone") or None
        return Instance(id=iid, provider=PROVIDER, region=region, instance_type=itype, spec=spec, state=state,
                        tags=TAGS.decode(tags), launched_at=launched_at,
                        price_per_hour=self._price_of.get(iid, 0.0),
                        address=item.get("PrivateIpAddress") or item.get("PublicIpAddress") or None,
                        port=self.ssh.port if self.ssh is not None else None, zone=str(zone) if zone else None)

    async def _describe_raw(self, region: str, filters: list[dict[str, Any]]) -> list[dict[str, Any]]:
        pages = await self._client.pages(region, "describe_instances", Filters=filters,
                                         MaxResults=DESCRIBE_PAGE)
        return [inst for page in pages for res in page.get("Reservations") or []
                for inst in res.get("Instances") or []]

    async def _instances(self, region: str, raw: list[dict[str, Any]]) -> list[Instance]:
        unknown = {str(i.get("InstanceType")) for i in raw
                   if str(i.get("InstanceId")) not in self._spec_of and i.get("InstanceType")}
        if unknown:
            await self._ensure_types(region, unknown)
        return [self._to_instance(region, i) for i in raw]

    # ---- launch --------------------------------------------------------------------
    def _check_request(self, request: LaunchRequest) -> tuple[str, str, dict[str, str]]:
        offer = request.offer
        if offer.provider != PROVIDER:
            raise SpecError("launch.offer", f"an offer of provider {offer.provider!r} was given to ec2")
        if offer.region not in self.regions:
            raise SpecError("launch.offer.region",
                            f"{offer.region!r} is not one of this provider's regions {list(self.regions)} "
                            "(an instance launched there could not be listed again)")
        if request.count > self.capabilities.max_batch:
            raise SpecError("launch.count", f"at most {self.capabilities.max_batch} per launch call, "
                                            f"got {request.count}")
        ami = self.image_for(offer.region)
        tags = {str(k): str(v) for k, v in request.tags.items()}
        tags[TAG_REQUEST] = request.request_id
        tags.setdefault("Name", f"flowmesh-{tags.get(TAG_POOL) or 'instance'}")
        tags = TAGS.encode_launch(tags, limit=MAX_TAGS, cloud="EC2", per="resource")
        for k, v in tags.items():
            if not k or len(k) > 128 or k.lower().startswith("aws:") or len(v) > 256:
                raise SpecError(f"launch.tags[{k!r}]", "EC2 tag keys are 1-128 characters not starting with "
                                                       "'aws:', values at most 256 characters")
        return offer.region, ami, tags

    async def _image(self, region: str, ami: str) -> ImageInfo | None:
        if ami.startswith("resolve:ssm:"):
            return None  # EC2 resolves it at launch; nothing to check here
        key = (region, ami)
        if key not in self._images:
            resp = await self._client.call(region, "describe_images", ImageIds=[ami])
            images = resp.get("Images") or []
            if not images:
                raise SpecError("ec2.image_id", f"AMI {ami} does not exist in {region} (or is not visible "
                                                "to this account)")
            img = images[0]
            self._images[key] = ImageInfo(ami, img.get("Architecture"), img.get("RootDeviceName"))
        return self._images[key]

    async def launch(self, request: LaunchRequest) -> list[Instance]:
        region, ami, tags = self._check_request(request)
        offer = request.offer
        infos = await self._ensure_types(region, [offer.instance_type])
        if infos.get(offer.instance_type) is None:
            raise SpecError("launch.offer.instance_type",
                            f"{offer.instance_type!r} is not an EC2 instance type offered in {region}")
        image = await self._image(region, ami)
        if image is not None and image.arch and image.arch != offer.arch:
            raise SpecError("ec2.image_id", f"AMI {ami} is built for {image.arch}, but {offer.instance_type} "
                                            f"is {offer.arch}; configure an {offer.arch} AMI for {region}")

        # Idempotent by request id: the instances of an earlier call with this id, if any.
        earlier = await self._describe_raw(region, [{"Name": f"tag:{TAG_REQUEST}",
                                                     "Values": [request.request_id]}])
        if earlier:
            log.info("ec2 launch %s: %d instances already exist for this request id", request.request_id,
                     len(earlier))
            for item in earlier:
                self._spec_of.setdefault(str(item["InstanceId"]), request.spec)
            found = [self._to_instance(region, i, spec=request.spec, price=offer.price_per_hour) for i in earlier]
            if self.ssh is not None:
                await self._recover_host_keys(region, [i.id for i in found])
                found = await self._with_public_ips(region, found)
            return found

        tag_list = [{"Key": k, "Value": v} for k, v in tags.items()]
        params: dict[str, Any] = {
            "ImageId": ami,
            "InstanceType": offer.instance_type,
            "MinCount": 1 if self.partial_ok else request.count,
            "MaxCount": request.count,
            "ClientToken": client_token(request.request_id),
            "TagSpecifications": [{"ResourceType": "instance", "Tags": tag_list},
                                  {"ResourceType": "volume", "Tags": tag_list}],
        }
        if image is not None and image.root_device:
            params["BlockDeviceMappings"] = [{"DeviceName": image.root_device,
                                              "Ebs": {"VolumeSize": request.spec.disk_gb, "VolumeType": "gp3",
                                                      "DeleteOnTermination": True}}]
        host_key: PublicKey | None = None
        if self.ssh is not None and self._keys is not None:
            params["UserData"], host_key = await self._keys.user_data(request.request_id)
            params["MetadataOptions"] = {"HttpTokens": "required", "HttpEndpoint": "enabled",
                                         "HttpPutResponseHopLimit": self.ssh.imds_hop_limit}
        elif self._user_data is not None:
            params["UserData"] = self._user_data   # botocore base64-encodes it
        if self.subnet_id:
            params["SubnetId"] = self.subnet_id
        if self.security_group_ids:
            params["SecurityGroupIds"] = list(self.security_group_ids)
        if self.key_name:
            params["KeyName"] = self.key_name
        if self.iam_instance_profile:
            prof = self.iam_instance_profile
            params["IamInstanceProfile"] = {"Arn": prof} if prof.startswith("arn:") else {"Name": prof}
        if offer.spot:
            params["InstanceMarketOptions"] = {
                "MarketType": "spot",
                "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}}
        if offer.zone:
            params["Placement"] = {"AvailabilityZone": offer.zone}

        resp = await self._client.call(region, "run_instances", **params)
        out = []
        for item in resp.get("Instances") or []:
            self._spec_of[str(item["InstanceId"])] = request.spec
            out.append(self._to_instance(region, item, spec=request.spec, price=offer.price_per_hour,
                                         extra_tags=tags))
        if host_key is not None and out and self._keys is not None:
            await self._keys.pin([i.id for i in out], host_key)
            out = await self._with_public_ips(region, out)
        log.info("ec2 launch %s: %d x %s in %s%s", request.request_id, len(out), offer.instance_type, region,
                 " (spot)" if offer.spot else "")
        return out

    # ---- describe / list / terminate ---------------------------------------------------
    def _by_region(self, ids: Iterable[str]) -> tuple[dict[str, list[str]], list[str]]:
        known: dict[str, list[str]] = {}
        unknown: list[str] = []
        seen: set[str] = set()
        for iid in ids:
            if not isinstance(iid, str) or iid in seen or not _INSTANCE_ID.match(iid):
                continue  # malformed ids name no instance
            seen.add(iid)
            region = self._region_of.get(iid)
            if region in self.regions:
                known.setdefault(region, []).append(iid)
            else:
                unknown.append(iid)
        return known, unknown

    async def _describe_ids(self, region: str, ids: list[str]) -> list[Instance]:
        out: list[Instance] = []
        for chunk in _chunks(ids, ID_FILTER_CHUNK):
            raw = await self._describe_raw(region, [{"Name": "instance-id", "Values": chunk}])
            out += await self._instances(region, raw)
        return out

    async def describe(self, ids: Sequence[str]) -> list[Instance]:
        known, unknown = self._by_region(ids)
        jobs = [self._describe_ids(r, group) for r, group in known.items()]
        if unknown:
            jobs += [self._describe_ids(r, unknown) for r in self.regions]
        found: dict[str, Instance] = {}
        for group in await asyncio.gather(*jobs):
            for inst in group:
                found.setdefault(inst.id, inst)
        return [found[i] for i in dict.fromkeys(ids) if i in found]

    async def list_tagged(self, tags: Mapping[str, str]) -> list[Instance]:
        if tags:
            wanted = TAGS.encode({str(k): str(v) for k, v in tags.items()})
            filters = [{"Name": f"tag:{k}", "Values": [v]} for k, v in wanted.items()]
        else:
            filters = [{"Name": "tag-key", "Values": [TAG_FLEET]}]
        filters.append({"Name": "instance-state-name", "Values": list(LIVE_STATES)})

        async def one(region: str) -> list[Instance]:
            return await self._instances(region, await self._describe_raw(region, filters))
        groups = await asyncio.gather(*(one(r) for r in self.regions))
        return [i for g in groups for i in g]

    async def _terminate_region(self, region: str, ids: list[str]) -> None:
        for chunk in _chunks(ids, TERMINATE_CHUNK):
            while chunk:
                try:
                    await self._client.call(region, "terminate_instances", InstanceIds=chunk)
                    break
                except NotFoundError as exc:
                    gone = missing_instance_ids(str(exc)) & set(chunk)
                    if not gone:
                        raise
                    log.debug("ec2 terminate in %s: %d ids already gone", region, len(gone))
                    chunk = [i for i in chunk if i not in gone]

    async def terminate(self, ids: Sequence[str]) -> None:
        known, unknown = self._by_region(ids)
        if unknown:
            for inst in await self.describe(unknown):   # locate them (records their region)
                known.setdefault(inst.region, []).append(inst.id)
        await asyncio.gather(*(self._terminate_region(r, group) for r, group in known.items()))
        if self._keys is not None:
            await self._keys.forget([i for group in known.values() for i in group])

    # ---- the rest ------------------------------------------------------------------
    def runner(self, instance: Instance) -> Runner:
        return instance_runner(instance, self._keys, self._ips, self.runner_factory, provider=PROVIDER,
                               hint="pass Ec2Provider(ssh=SshMode()) to inject keys at launch (docs/ssh.md), or runner_factory=... to supply runners")

    async def close(self) -> None:
        if self._keys is not None:
            await self._keys.close()
        await self._client.close()

    # ---- SSH mode (flowmesh_sdk.remote.injection) --------------------------------------
    async def _recover_host_keys(self, region: str, ids: list[str]) -> None:
        """Host keys of instances an earlier call launched: from the trust record, else from
        the user-data EC2 holds for them (DescribeInstanceAttribute)."""
        assert self._keys is not None

        async def fetch(iid: str) -> bytes:
            resp = await self._client.call(region, "describe_instance_attribute", InstanceId=iid,
                                           Attribute="userData")
            raw = ((resp.get("UserData") or {}).get("Value")) or ""
            try:
                return base64.b64decode(raw)
            except ValueError:
                return b""
        await self._keys.recover(ids, fetch)

    async def _with_public_ips(self, region: str, instances: list[Instance]) -> list[Instance]:
        """With ``address="public"``: wait (describe, backing off 1 s to 5 s, at most
        ``PUBLIC_IP_WAIT_S``) until EC2 has given every instance a public IP."""
        if self.ssh is None or self.ssh.address != "public" or self.ssh.address_map is not None:
            return instances
        deadline = time.monotonic() + PUBLIC_IP_WAIT_S
        delay = 1.0
        while True:
            missing = [i.id for i in instances if not self._ips.get(i.id, (None, None))[1]]
            if not missing:
                return instances
            if time.monotonic() + delay > deadline:
                raise ProviderError(f"{len(missing)} instances have no public IP after "
                                    f"{PUBLIC_IP_WAIT_S:g} s "
                                    f"({', '.join(missing[:5])}): is the subnet assigning public IPs? "
                                    "Use SshMode(address='private') from inside the VPC", provider=PROVIDER,
                                    code="NoPublicIp")
            await asyncio.sleep(delay)
            delay = min(5.0, delay * 2)
            await self._describe_ids(region, missing)   # refreshes self._ips


__all__ = ["DEFAULT_INSTANCE_TYPES", "Ec2Provider", "ImageInfo", "SshMode", "TypeInfo", "client_token",
           "trust_id"]
