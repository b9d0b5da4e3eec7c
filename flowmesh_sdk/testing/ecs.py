"""A TEST FIXTURE emulating the Alibaba Cloud ECS API (version 2014-05-26, RPC style) on
127.0.0.1, for the ``alibaba`` provider and for users' own offline tests.  It is not ECS:
it answers exactly the actions the provider (and the price refresh) makes, in ECS's JSON
shapes, and the real ``alibabacloud-ecs20140526`` client is pointed at it::

    with EcsEmulator() as ecs:
        provider = ecs.provider(ssh=True)    # AlibabaProvider(endpoint=ecs.url, test keys)
        ...

Wire facts (checked against the SDK, 2026-12-01): every action is ``POST /`` with its
parameters in the query string and an empty body; the action is in the ``x-acs-action``
header (signature V3, ``ACS3-HMAC-SHA256``, verified here) or, with the client's
``signature_algorithm="v2"``, in ``Action=`` of the query (``HMAC-SHA1``, verified too);
lists travel flattened (``Tag.N.Key``/``Tag.N.Value``, ``InstanceId.N``); errors are HTTP
4xx/5xx with JSON ``{"RequestId", "HostId", "Code", "Message"}``.

Actions: ``DescribeAvailableResource`` (stock per zone and market), ``DescribeInstanceTypes``
and ``DescribePrice`` (from :class:`~flowmesh_sdk.testing.price_apis.AlibabaEcsEmulator`),
``RunInstances`` (``Amount``/``MinAmount`` 1..100, ``ClientToken`` idempotent, at most 20
tags, ``UserData`` base64 at most 32 KB), ``DescribeInstances`` (``InstanceIds`` as a JSON
array of at most 100, ``Tag.N`` filters -- a key alone matches any value --, ``MaxResults``
at most 100, ``NextToken``), ``DescribeUserData`` and ``DeleteInstances`` (at most 100
``InstanceId.N``; a running instance needs ``Force=true``; an unknown id answers 404
``InvalidInstanceId.NotFound``).

Every created instance can be a real machine: :meth:`address` (the provider's
``SshMode(address_map=...)`` hook) boots it, once, from its user-data as a loopback sshd
host (:class:`~flowmesh_sdk.testing.cloudinit.CloudInitHosts`); deleting it stops that sshd.

Switchable per test: :meth:`sold_out` (RunInstances answers 403 ``OperationDenied.NoStock``;
``hide=True`` also takes the type out of DescribeAvailableResource), :meth:`set_vcpu_quota`
(``QuotaExceed.ElasticQuota``), :meth:`throttle` (the next N calls answer ``Throttling.User``
with HTTP 400, or any status such as 429), :meth:`deny` (403 ``Forbidden.RAM``) and
:meth:`delete_behind`.  Sources for the shapes: the ECS API reference pages of these
actions (help.aliyun.com/en/ecs/developer-reference/api-ecs-2014-05-26-<action>).
"""

from __future__ import annotations

import base64
import datetime as _dt
import hashlib
import hmac
import itertools
import json
import re
import threading
import urllib.parse
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .cloudinit import CloudInitHosts
from .price_apis import AlibabaEcsEmulator, AlibabaType, acs3_signature
from .price_apis.base import Answer

__all__ = ["DEFAULT_PRICES", "DEFAULT_TYPES", "EcsEmulator"]

DEFAULT_TYPES: tuple[AlibabaType, ...] = (
    AlibabaType("ecs.c7.large", 2, 4.0),
    AlibabaType("ecs.g7.large", 2, 8.0),
    AlibabaType("ecs.c7.xlarge", 4, 8.0),
    AlibabaType("ecs.c8a.2xlarge", 8, 16.0),
    AlibabaType("ecs.c8i.2xlarge", 8, 16.0),
    AlibabaType("ecs.gn7i-c8g1.2xlarge", 8, 30.0, gpus=1, gpu_spec="NVIDIA A10", gpu_memory_gb=24.0),
)
# TEST FIXTURE prices ($/h) the emulator's DescribePrice answers: made up for tests, not
# Alibaba's (the catalog holds no Alibaba price; docs/providers/alibaba.md)
DEFAULT_PRICES: dict[str, float] = {"ecs.c7.large": 0.071, "ecs.g7.large": 0.089, "ecs.c7.xlarge": 0.142,
                                    "ecs.c8a.2xlarge": 0.25, "ecs.c8i.2xlarge": 0.27,
                                    "ecs.gn7i-c8g1.2xlarge": 1.49}
_RUNNING_OK = ("Stopped", "Pending")


@dataclass
class _Throttle:
    action: str | None
    times: int | None
    status: int
    code: str


def _v2_signature(secret: str, method: str, params: Mapping[str, str]) -> str:
    enc = lambda s: urllib.parse.quote(s, safe="-_.~")  # noqa: E731
    canonical = "&".join(f"{enc(k)}={enc(v)}" for k, v in sorted(params.items()) if k != "Signature")
    to_sign = f"{method}&{enc('/')}&{enc(canonical)}"
    return base64.b64encode(hmac.new((secret + "&").encode(), to_sign.encode(), hashlib.sha1).digest()).decode()


def _listed(params: Mapping[str, str], prefix: str) -> list[str]:
    """``InstanceId.1``, ``InstanceId.2``, ... in order."""
    found = sorted(((int(m.group(1)), v) for k, v in params.items()
                    if (m := re.fullmatch(re.escape(prefix) + r"\.(\d+)", k))), key=lambda kv: kv[0])
    return [v for _, v in found]


def _tags(params: Mapping[str, str]) -> list[tuple[str, str | None]]:
    out = []
    for n in sorted({int(m.group(1)) for k in params if (m := re.fullmatch(r"Tag\.(\d+)\.Key", k))}):
        out.append((params[f"Tag.{n}.Key"], params.get(f"Tag.{n}.Value")))
    return out


class EcsEmulator(AlibabaEcsEmulator):
    """A TEST FIXTURE: the ECS API for the calls the ``alibaba`` provider makes (module doc)."""

    name = "ecs-emulator"

    def __init__(self, *, region: str = "cn-hangzhou", zones: Sequence[str] = ("cn-hangzhou-h", "cn-hangzhou-i"),
                 types: Sequence[AlibabaType] = DEFAULT_TYPES, prices: Mapping[str, float] | None = None,
                 images: Sequence[str] = ("debian_12_9_x64_20G_alibase_20250117.vhd",),
                 access_key_id: str = "test-akid", access_key_secret: str = "test-secret", page_size: int = 100,
                 first_host: int = 120, **sshd_kwargs: Any) -> None:
        price_map = dict(DEFAULT_PRICES if prices is None else prices)
        super().__init__(types=types, prices={(region, t): p for t, p in price_map.items()},
                         access_key_id=access_key_id, access_key_secret=access_key_secret)
        self.region = region
        self.zones = tuple(zones)
        self.images = set(images)
        self.page_size = page_size
        self.vswitch_ids = {z: f"vsw-{hashlib.sha1(z.encode()).hexdigest()[:17]}" for z in self.zones}
        self.security_group_id = "sg-" + hashlib.sha1(region.encode()).hexdigest()[:17]
        self.hosts = CloudInitHosts(first_host=first_host, **sshd_kwargs)
        self._state = threading.Lock()
        self._instances: dict[str, dict[str, Any]] = {}
        self._tokens: dict[str, list[str]] = {}
        self._ids = itertools.count(1)
        self._sold_out: list[tuple[str | None, str | None, bool]] = []
        self._vcpu_quota: int | None = None
        self._throttles: list[_Throttle] = []
        self._deny = False
        self.calls: list[str] = []

    # ---- switches --------------------------------------------------------------------
    def sold_out(self, zone: str | None = None, instance_type: str | None = None, *, hide: bool = False) -> None:
        """RunInstances in ``zone`` (any) of ``instance_type`` (any) answers NoStock;
        ``hide``: DescribeAvailableResource no longer lists it either."""
        with self._state:
            self._sold_out.append((zone, instance_type, hide))

    def restock(self) -> None:
        with self._state:
            self._sold_out.clear()

    def set_vcpu_quota(self, limit: int | None) -> None:
        """The account's pay-as-you-go vCPU quota in the region (None: unlimited)."""
        with self._state:
            self._vcpu_quota = limit

    def throttle(self, action: str | None = None, *, times: int | None = 1, status: int = 400,
                 code: str = "Throttling.User") -> None:
        """The next ``times`` calls of ``action`` (any) answer a throttling error."""
        with self._state:
            self._throttles.append(_Throttle(action, times, status, code))

    def deny(self, on: bool = True) -> None:
        """Every call answers 403 Forbidden.RAM (the RAM user lacks permission)."""
        with self._state:
            self._deny = on

    def clear(self) -> None:
        with self._state:
            self._sold_out.clear()
            self._vcpu_quota = None
            self._throttles.clear()
            self._deny = False

    def delete_behind(self, instance_id: str) -> None:
        with self._state:
            self._instances.pop(instance_id, None)
        self.hosts.halt(instance_id)

    # ---- views / hooks ---------------------------------------------------------------
    @property
    def instances(self) -> list[dict[str, Any]]:
        with self._state:
            return [json.loads(json.dumps(i)) for i in self._instances.values()]

    def count(self, action: str) -> int:
        with self._state:
            return sum(1 for a in self.calls if a == action)

    def address(self, instance: Any) -> tuple[str, int]:
        """``SshMode.address_map``: boot the instance (once) from its user-data."""
        iid = str(instance.id)
        vm = self.hosts.booted(iid)
        if vm is None:
            with self._state:
                inst = self._instances.get(iid)
                raw = inst["_UserData"] if inst else None
            if inst is None:
                raise RuntimeError(f"instance {iid} does not exist (deleted?)")
            vm = self.hosts.boot(iid, base64.b64decode(raw or "").decode())
        return vm.sshd.host, vm.sshd.port

    def provider(self, **kwargs: Any) -> Any:
        """An ``AlibabaProvider`` pointed at this emulator with its test keys, VSwitches and
        security group; ``ssh=True`` reaches the loopback hosts (``address_map``)."""
        from flowmesh_providers.alibaba import AlibabaProvider, SshMode
        ssh = kwargs.pop("ssh", None)
        if ssh is True:
            ssh = SshMode(address_map=self.address)
        kwargs.setdefault("vswitch_ids", dict(self.vswitch_ids))
        kwargs.setdefault("security_group_id", self.security_group_id)
        kwargs.setdefault("access_key_id", self.access_key_id)
        kwargs.setdefault("access_key_secret", self.access_key_secret)
        return AlibabaProvider(endpoint=self.url, ssh=ssh, **kwargs)

    async def price_rows(self) -> list[Any]:
        """Catalog rows for this emulator's types, fetched the way ``flowmesh catalog refresh
        --provider alibaba`` does (the real price adapter's DescribeInstanceTypes and
        DescribePrice against this emulator); the prices are this fixture's, not Alibaba's."""
        from flowmesh_providers.alibaba.prices import fetch_prices

        from ..catalog.records import CatalogRow
        shapes = [CatalogRow(provider="alibaba", region="unknown", instance_type=t.instance_type, cpus=t.cpus,
                             memory_gb=t.memory_gb, on_demand_per_hour=None) for t in self.types.values()]
        return await fetch_prices(endpoint=self.url, regions=[self.region], shapes=shapes,
                                  access_key_id=self.access_key_id, access_key_secret=self.access_key_secret)

    def stop(self) -> None:
        super().stop()
        self.hosts.close()

    # ---- HTTP ------------------------------------------------------------------------
    def _err(self, status: int, code: str, message: str) -> tuple[int, Any, dict[str, str]]:
        return self._error(status, code, message)

    def answer(self, method: str, path: str, query: Mapping[str, list[str]], headers: Mapping[str, str],
               body: bytes, *, raw_query: str) -> Answer:
        params = {k: v[0] for k, v in query.items()}
        action = headers.get("x-acs-action") or params.get("Action") or ""
        version = headers.get("x-acs-version") or params.get("Version")
        if method != "POST" or path != "/":
            return self._err(404, "InvalidAction.NotFound", f"{method} {path} is not an ECS action")
        if version != self.VERSION:
            return self._err(400, "InvalidVersion", f"Specified parameter Version {version!r} is not valid.")
        auth = headers.get("authorization", "")
        m = re.match(r"ACS3-HMAC-SHA256 Credential=([^,]+),SignedHeaders=([^,]+),Signature=([0-9a-f]+)$", auth)
        if m:
            key_id, ok = m.group(1), hmac.compare_digest(
                acs3_signature(self.access_key_secret, method, path, raw_query, headers, m.group(2).split(";")),
                m.group(3))
        elif "Signature" in params:
            key_id = params.get("AccessKeyId", "")
            ok = hmac.compare_digest(_v2_signature(self.access_key_secret, method, params), params["Signature"])
        else:
            return self._err(400, "MissingAuthorization", "the request is not signed")
        if key_id != self.access_key_id:
            return self._err(404, "InvalidAccessKeyId.NotFound", "Specified access key is not found.")
        if not ok:
            return self._err(400, "SignatureDoesNotMatch", "The request signature does not conform to Aliyun "
                                                           "standards.")
        with self._state:
            self.calls.append(action)
            if self._deny:
                return self._err(403, "Forbidden.RAM", f"User not authorized to operate on the specified "
                                                       f"resource, or this API ({action}) does not support RAM.")
            for t in self._throttles:
                if (t.action is None or t.action == action) and (t.times is None or t.times > 0):
                    if t.times is not None:
                        t.times -= 1
                    self._throttles = [x for x in self._throttles if x.times is None or x.times > 0]
                    return self._err(t.status, t.code, "Request was denied due to user flow control.")
        region = params.get("RegionId")
        if action not in ("DescribeInstanceTypes",) and region is not None and region != self.region:
            return self._err(400, "InvalidRegionId.NotFound", f"The specified RegionId {region!r} does not exist.")
        handler = {"DescribeAvailableResource": self._available, "RunInstances": self._run,
                   "DescribeInstances": self._describe, "DescribeUserData": self._user_data,
                   "DeleteInstances": self._delete}.get(action)
        if handler is not None:
            with self._state:
                return handler(params)
        if action == "DescribeInstanceTypes":
            return self._describe_instance_types(params)
        if action == "DescribePrice":
            return self._describe_price(params)
        return self._err(404, "InvalidAction.NotFound", f"Specified api {action!r} is not found.")

    def _ok(self, body: dict[str, Any]) -> tuple[int, Any, dict[str, str]]:
        return 200, {"RequestId": str(uuid.uuid4()).upper(), **body}, {}

    def _is_sold_out(self, zone: str, itype: str, *, hidden_only: bool) -> bool:
        return any((z is None or z == zone) and (t is None or t == itype) and (hide or not hidden_only)
                   for z, t, hide in self._sold_out)

    def _available(self, params: Mapping[str, str]) -> tuple[int, Any, dict[str, str]]:
        if params.get("DestinationResource") != "InstanceType":
            return self._err(400, "InvalidParameter", "this emulator answers DestinationResource=InstanceType only")
        zones = [params["ZoneId"]] if params.get("ZoneId") else list(self.zones)
        out = []
        for zone in zones:
            if zone not in self.zones:
                continue
            supported = []
            for name in self.types:
                sold = self._is_sold_out(zone, name, hidden_only=True)
                supported.append({"Value": name, "Status": "SoldOut" if sold else "Available",
                                  "StatusCategory": "WithoutStock" if sold else "WithStock"})
            out.append({"RegionId": self.region, "ZoneId": zone, "Status": "Available", "StatusCategory": "WithStock",
                        "AvailableResources": {"AvailableResource": [
                            {"Type": "InstanceType", "SupportedResources": {"SupportedResource": supported}}]}})
        return self._ok({"AvailableZones": {"AvailableZone": out}})

    def _run(self, params: Mapping[str, str]) -> tuple[int, Any, dict[str, str]]:
        for need in ("ZoneId", "InstanceType", "ImageId", "VSwitchId", "SecurityGroupId"):
            if not params.get(need):
                return self._err(400, "MissingParameter", f"The input parameter {need} that is mandatory for "
                                                          "processing this request is not supplied.")
        zone, itype = params["ZoneId"], params["InstanceType"]
        token = params.get("ClientToken")
        if token is not None and (len(token) > 64 or not token.isascii()):
            return self._err(400, "InvalidParameter", "ClientToken: at most 64 ASCII characters")
        try:
            amount = int(params.get("Amount", "1"))
            min_amount = int(params.get("MinAmount", str(amount)))
        except ValueError:
            return self._err(400, "InvalidParameter.Amount", "Amount and MinAmount must be integers")
        if not 1 <= min_amount <= amount <= 100:
            return self._err(400, "InvalidParameter.Amount", "Amount must be 1 to 100 and MinAmount at most Amount")
        tags = _tags(params)
        if len(tags) > 20:
            return self._err(400, "InvalidTagKey.Malformed", "at most 20 tags (Tag.N, N 1..20)")
        for k, v in tags:
            if not k or len(k) > 128 or k.startswith(("aliyun", "acs:")) or (v is not None and len(v) > 128):
                return self._err(400, "InvalidTagKey.Malformed", f"the tag {k!r} is not valid (keys 1..128 "
                                                                 "characters, values at most 128)")
        user_data = params.get("UserData")
        if user_data is not None and len(user_data) > 32 * 1024:
            return self._err(400, "InvalidUserData.SizeExceeded", "The specified parameter UserData exceeds the "
                                                                  "size (32 KB).")
        if token and token in self._tokens:
            return self._ok({"InstanceIdSets": {"InstanceIdSet": list(self._tokens[token])}})
        if zone not in self.zones:
            return self._err(400, "InvalidZoneId.NotFound", f"The specified zone {zone!r} does not exist.")
        t = self.types.get(itype)
        if t is None:
            return self._err(400, "InvalidInstanceType.ValueNotSupported",
                             f"The specified InstanceType {itype!r} does not exist or is not supported.")
        if params["ImageId"] not in self.images:
            return self._err(404, "InvalidImageId.NotFound", "The specified ImageId does not exist.")
        if params["VSwitchId"] != self.vswitch_ids.get(zone):
            return self._err(404, "InvalidVSwitchId.NotFound", "The VSwitchId provided does not exist in our "
                                                               "records (or is not in the zone).")
        if params["SecurityGroupId"] != self.security_group_id:
            return self._err(404, "InvalidSecurityGroupId.NotFound", "The specified SecurityGroupId does not exist.")
        if self._is_sold_out(zone, itype, hidden_only=False):
            return self._err(403, "OperationDenied.NoStock", "The resource is out of stock in the specified zone. "
                                                             "Please try other types, or choose other regions and "
                                                             "zones.")
        if self._vcpu_quota is not None:
            used = sum(int(i["Cpu"]) for i in self._instances.values())
            if used + t.cpus * amount > self._vcpu_quota:
                return self._err(403, "QuotaExceed.ElasticQuota",
                                 f"No additional quota is available for the specified ECS instance type: "
                                 f"{used} of {self._vcpu_quota} vCPUs in use in {self.region}.")
        now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%MZ")
        ids = []
        for _ in range(amount):
            n = next(self._ids)
            iid = "i-" + hashlib.sha1(f"{uuid.uuid4()}{n}".encode()).hexdigest()[:20]
            ids.append(iid)
            self._instances[iid] = {
                "InstanceId": iid, "InstanceName": params.get("InstanceName", iid), "RegionId": self.region,
                "ZoneId": zone, "InstanceType": itype, "Status": "Running", "Cpu": t.cpus,
                "Memory": int(t.memory_gb * 1024), "GPUAmount": t.gpus, "GPUSpec": t.gpu_spec,
                "InstanceChargeType": params.get("InstanceChargeType", "PostPaid"),
                "SpotStrategy": params.get("SpotStrategy", "NoSpot"), "CreationTime": now,
                "ImageId": params["ImageId"], "SecurityGroupIds": {"SecurityGroupId": [params["SecurityGroupId"]]},
                "VpcAttributes": {"VSwitchId": params["VSwitchId"], "VpcId": "vpc-emulated",
                                  "PrivateIpAddress": {"IpAddress": [f"172.16.{n // 250 % 250}.{n % 250 + 2}"]}},
                "PublicIpAddress": {"IpAddress": [f"47.96.{n // 250 % 250}.{n % 250 + 2}"]
                                    if int(params.get("InternetMaxBandwidthOut", "0") or 0) > 0 else []},
                "Tags": {"Tag": [{"TagKey": k, "TagValue": v or ""} for k, v in tags]},
                "_UserData": user_data or ""}
        if token:
            self._tokens[token] = ids
        return self._ok({"InstanceIdSets": {"InstanceIdSet": ids}, "TradePrice": 0.0})

    @staticmethod
    def _public(inst: Mapping[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in inst.items() if not k.startswith("_")}

    def _describe(self, params: Mapping[str, str]) -> tuple[int, Any, dict[str, str]]:
        rows = list(self._instances.values())
        if params.get("InstanceIds"):
            try:
                ids = json.loads(params["InstanceIds"])
            except ValueError:
                return self._err(400, "InvalidParameter", "InstanceIds must be a JSON array of ids")
            if not isinstance(ids, list) or len(ids) > 100:
                return self._err(400, "InvalidParameter", "InstanceIds: a JSON array of at most 100 ids")
            rows = [r for r in rows if r["InstanceId"] in ids]
        for k, v in _tags(params):
            rows = [r for r in rows if any(t["TagKey"] == k and (v is None or t["TagValue"] == v)
                                           for t in r["Tags"]["Tag"])]
        size = min(int(params.get("MaxResults") or 10), self.page_size, 100)
        start = int(params.get("NextToken") or 0)
        page = rows[start:start + size]
        out: dict[str, Any] = {"Instances": {"Instance": [self._public(r) for r in page]}, "TotalCount": len(rows),
                               "PageSize": size}
        if start + size < len(rows):
            out["NextToken"] = str(start + size)
        return self._ok(out)

    def _user_data(self, params: Mapping[str, str]) -> tuple[int, Any, dict[str, str]]:
        inst = self._instances.get(params.get("InstanceId", ""))
        if inst is None:
            return self._err(404, "InvalidInstanceId.NotFound", "The specified InstanceId does not exist.")
        return self._ok({"InstanceId": inst["InstanceId"], "RegionId": self.region, "UserData": inst["_UserData"]})

    def _delete(self, params: Mapping[str, str]) -> tuple[int, Any, dict[str, str]]:
        ids = _listed(params, "InstanceId")
        if not 1 <= len(ids) <= 100:
            return self._err(400, "InvalidParameter", "InstanceId.N: 1 to 100 instance ids")
        missing = [i for i in ids if i not in self._instances]
        if missing:
            return self._err(404, "InvalidInstanceId.NotFound", f"The specified InstanceId does not exist: "
                                                                f"{missing[0]}")
        force = params.get("Force", "false").lower() == "true"
        if not force and any(self._instances[i]["Status"] not in _RUNNING_OK for i in ids):
            return self._err(403, "IncorrectInstanceStatus", "The current status of the resource does not support "
                                                             "this operation (a running instance needs Force).")
        for iid in ids:
            self._instances.pop(iid, None)
            self.hosts.halt_soon(iid)
        return self._ok({})
