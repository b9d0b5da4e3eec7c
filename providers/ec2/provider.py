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
import logging
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from flowmesh_sdk.errors import NotFoundError, ProviderError, SpecError
from flowmesh_sdk.provider import TAG_FLEET, TAG_REQUEST, Capabilities, Instance, LaunchRequest, Provider, ProviderState
from flowmesh_sdk.redaction import redact_url
from flowmesh_sdk.remote.injection import KeyInjector, instance_runner
from flowmesh_sdk.remote.injection import SshMode as _SshMode
from flowmesh_sdk.remote.keys import PublicKey
from flowmesh_sdk.remote.runner import Runner
from flowmesh_sdk.specs import InstanceSpec, Offer

from .client import DESCRIBE_PAGE, ID_FILTER_CHUNK, MAX_LAUNCH_BATCH, RATES, TERMINATE_CHUNK, Ec2Client
from .errors import PROVIDER, missing_instance_ids
from .launch import MAX_TAGS, TAGS, check_request, client_token, run_instances_params
from .options import (DEFAULT_INSTANCE_TYPES, DEFAULT_REGION, ENV_AMI, ENV_ENDPOINT, Ec2Options, RunnerFactory,
                      SshMode, trust_id)
from .shapes import TYPE_FILTER_CHUNK, ImageInfo, Shapes, TypeInfo
from .shapes import chunks as _chunks

log = logging.getLogger("flowmesh.providers.ec2")

LIVE_STATES = ("pending", "running", "stopping", "stopped")
STATE_MAP = {
    "pending": ProviderState.PENDING,
    "running": ProviderState.RUNNING,
    "stopping": ProviderState.STOPPING,
    "stopped": ProviderState.STOPPED,
    "shutting-down": ProviderState.TERMINATED,
    "terminated": ProviderState.TERMINATED,
}
_INSTANCE_ID = re.compile(r"^i-[0-9a-f]{8}(?:[0-9a-f]{9})?$")
PUBLIC_IP_WAIT_S = 120.0           # SSH mode, address="public": how long launch waits for public IPs


class Ec2Provider(Provider):
    """Amazon EC2.  See the module docstring for what each call does.

    ``image_id`` is an AMI id, or a mapping region -> AMI id (AMI ids are regional);
    ``resolve:ssm:PARAMETER`` values are passed to EC2 as they are (not checked first).
    ``session_kwargs`` go to ``boto3.session.Session`` (``profile_name``, or explicit keys
    as a test fixture does); they are never logged or shown.  ``instance_types`` are the
    instance types (names or ``DescribeInstanceTypes`` wildcards such as ``"c7i.*"``)
    that :meth:`offers` reports, default :data:`DEFAULT_INSTANCE_TYPES`.  The provider
    holds no prices: the fleet prices its offers from the catalog.  The options are
    checked into :attr:`options` (an :class:`~.options.Ec2Options`)."""

    name = "ec2"
    capabilities = Capabilities(spot=True, gpus=True, stop_start=False, max_batch=MAX_LAUNCH_BATCH,
                                remote=True, rates=RATES, tags=TAGS)

    def __init__(self, *, regions: str | Sequence[str] | None = None, endpoint_url: str | None = None,
                 image_id: str | Mapping[str, str] | None = None, subnet_id: str | None = None,
                 security_group_ids: str | Sequence[str] = (), key_name: str | None = None,
                 user_data: str | None = None, iam_instance_profile: str | None = None,
                 max_workers: int = 8, runner_factory: RunnerFactory | None = None,
                 session_kwargs: Mapping[str, Any] | None = None, partial_ok: bool = False,
                 instance_types: Sequence[str] | None = None, ssh: _SshMode | bool | None = None) -> None:
        self.options = opts = Ec2Options.build(
            regions=regions, endpoint_url=endpoint_url, image_id=image_id, subnet_id=subnet_id,
            security_group_ids=security_group_ids, key_name=key_name, user_data=user_data,
            iam_instance_profile=iam_instance_profile, max_workers=max_workers, runner_factory=runner_factory,
            session_kwargs=session_kwargs, partial_ok=partial_ok, instance_types=instance_types, ssh=ssh)
        self.runner_factory = opts.runner_factory
        self._keys = KeyInjector(PROVIDER, opts.ssh) if opts.ssh is not None else None   # SSH mode's keys, runners
        self._ips: dict[str, tuple[str | None, str | None]] = {}    # instance id -> (private, public)
        self._client = Ec2Client(endpoint_url=opts.endpoint_url, max_workers=opts.max_workers,
                                 session_kwargs=opts.session_kwargs)
        self._shapes = Shapes(self._client, opts.instance_types)    # instance types and AMIs described
        self._price_of: dict[str, float] = {}                       # instance id -> its launch offer's price
        self._region_of: dict[str, str] = {}                        # instance id -> region
        self._spec_of: dict[str, InstanceSpec] = {}                 # instance id -> spec it was launched for

    # The checked options, as the attributes they always were (read-only: see self.options).
    @property
    def regions(self) -> tuple[str, ...]:
        return self.options.regions

    @property
    def endpoint_url(self) -> str | None:
        return self.options.endpoint_url

    @property
    def subnet_id(self) -> str | None:
        return self.options.subnet_id

    @property
    def security_group_ids(self) -> tuple[str, ...]:
        return self.options.security_group_ids

    @property
    def key_name(self) -> str | None:
        return self.options.key_name

    @property
    def iam_instance_profile(self) -> str | None:
        return self.options.iam_instance_profile

    @property
    def partial_ok(self) -> bool:
        return self.options.partial_ok

    @property
    def instance_types(self) -> tuple[str, ...]:
        return self.options.instance_types

    @property
    def ssh(self) -> _SshMode | None:
        return self.options.ssh

    def __repr__(self) -> str:
        return (f"Ec2Provider(regions={list(self.regions)!r}, endpoint_url={redact_url(self.endpoint_url)!r}, "
                f"image_id={self.options.image_ids!r}{', ssh' if self.ssh else ''})")

    # ---- instance types ----------------------------------------------------------------
    def image_for(self, region: str) -> str:
        """The AMI to launch in ``region``; SpecError naming ``ec2.image_id`` when none is set."""
        return self.options.image_for(region)

    async def offers(self, spec: InstanceSpec) -> list[Offer]:
        per_region = await asyncio.gather(*(self._shapes.region_offers(r, spec) for r in self.regions))
        return [o for group in per_region for o in group]

    def explain_misfit(self, spec: InstanceSpec) -> str:
        return self._shapes.explain_misfit(spec, self.regions)

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
            info = self._shapes.info(region, itype)
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
            await self._shapes.ensure(region, unknown)
        return [self._to_instance(region, i) for i in raw]

    # ---- launch --------------------------------------------------------------------
    async def launch(self, request: LaunchRequest) -> list[Instance]:
        region, ami, tags = check_request(self.options, request, self.capabilities.max_batch)
        offer = request.offer
        infos = await self._shapes.ensure(region, [offer.instance_type])
        if infos.get(offer.instance_type) is None:
            raise SpecError("launch.offer.instance_type",
                            f"{offer.instance_type!r} is not an EC2 instance type offered in {region}")
        image = await self._shapes.image(region, ami)
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

        host_key: PublicKey | None = None
        injected: str | None = None
        if self._keys is not None:
            injected, host_key = await self._keys.user_data(request.request_id)
        params = run_instances_params(self.options, request, ami=ami, tags=tags, image=image,
                                      injected_user_data=injected)
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
                               hint="pass Ec2Provider(ssh=SshMode()) to inject keys at launch (docs/ssh.md), "
                                    "or runner_factory=... to supply runners")

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


# The names this module had before options.py, shapes.py and launch.py took them stay importable here.
__all__ = ["DEFAULT_INSTANCE_TYPES", "DEFAULT_REGION", "ENV_AMI", "ENV_ENDPOINT", "LIVE_STATES", "MAX_TAGS",
           "PUBLIC_IP_WAIT_S", "STATE_MAP", "TAGS", "TYPE_FILTER_CHUNK", "Ec2Options", "Ec2Provider", "ImageInfo",
           "RunnerFactory", "SshMode", "TypeInfo", "client_token", "trust_id"]
