""":class:`AlibabaEcsEmulator` -- a TEST FIXTURE emulating Alibaba Cloud ECS (API version
2014-05-26, RPC style) ``DescribeInstanceTypes`` and ``DescribePrice`` as the official
Python SDK (``alibabacloud-ecs20140526``) sends them: ``POST /?<params>`` with
``x-acs-action``, ``x-acs-version`` and an ``ACS3-HMAC-SHA256`` signature, which is
verified.  ``DescribePrice`` answers ``{RequestId, PriceInfo: {Price: {OriginalPrice,
DiscountPrice, TradePrice, Currency}, Rules: {Rule: []}}}``.  Sources: ECS API
reference, DescribePrice (help.aliyun.com/en/ecs/developer-reference/api-ecs-2014-05-26-describeprice)
and the SDK's request model (``DescribePriceRequest``); signature: "Request syntax and
signature method V3", Alibaba Cloud API docs.

A TEST FIXTURE: see :mod:`flowmesh_sdk.testing.price_apis`."""

from __future__ import annotations

import hashlib
import hmac
import re
import urllib.parse
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .base import Answer, _Emulator

__all__ = ["AlibabaEcsEmulator", "AlibabaType", "acs3_signature"]


def _acs_encode(text: str) -> str:
    return urllib.parse.quote(text, safe="-_.~")


def acs3_signature(secret: str, method: str, path: str, raw_query: str, headers: Mapping[str, str],
                   signed: Sequence[str]) -> str:
    """The ``ACS3-HMAC-SHA256`` signature of a request (Alibaba Cloud signature V3)."""
    pairs = urllib.parse.parse_qsl(raw_query, keep_blank_values=True)
    canonical_query = "&".join(f"{_acs_encode(k)}={_acs_encode(v)}" for k, v in sorted(pairs))
    canonical_headers = "".join(f"{h}:{headers.get(h, '').strip()}\n" for h in signed)
    canonical = "\n".join([method, path or "/", canonical_query, canonical_headers, ";".join(signed),
                           headers.get("x-acs-content-sha256", "")])
    to_sign = "ACS3-HMAC-SHA256\n" + hashlib.sha256(canonical.encode()).hexdigest()
    return hmac.new(secret.encode(), to_sign.encode(), hashlib.sha256).hexdigest()


@dataclass(frozen=True, slots=True)
class AlibabaType:
    """An ECS instance type as ``DescribeInstanceTypes`` reports it."""

    instance_type: str
    cpus: int
    memory_gb: float
    gpus: int = 0
    gpu_spec: str = ""
    gpu_memory_gb: float = 0.0
    arch: str = "X86"


class AlibabaEcsEmulator(_Emulator):
    """A TEST FIXTURE emulating ECS ``DescribeInstanceTypes`` and ``DescribePrice`` (see module doc).

    ``prices`` maps ``(region, instance_type)`` to the pay-as-you-go $/h; a type with no
    price answers ``InvalidInstanceType.NotFound`` for that region, as ECS does for a type
    not sold there."""

    name = "alibaba-ecs"
    VERSION = "2014-05-26"

    def __init__(self, types: Sequence[AlibabaType] = (), prices: Mapping[tuple[str, str], float] | None = None,
                 access_key_id: str = "test-akid", access_key_secret: str = "test-secret",
                 currency: str = "USD") -> None:
        super().__init__()
        self.types = {t.instance_type: t for t in types}
        self.prices = dict(prices or {})
        self.access_key_id = access_key_id
        self.access_key_secret = access_key_secret
        self.currency = currency

    def _error(self, status: int, code: str, message: str) -> Answer:
        return status, {"RequestId": str(uuid.uuid4()).upper(), "HostId": "ecs.aliyuncs.com", "Code": code,
                        "Message": message, "Recommend": "https://api.aliyun.com/troubleshoot"}, {}

    def answer(self, method: str, path: str, query: Mapping[str, list[str]], headers: Mapping[str, str],
               body: bytes, *, raw_query: str) -> Answer:
        params = {k: v[0] for k, v in query.items()}
        if body and headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
            params.update({k: v[0] for k, v in urllib.parse.parse_qs(body.decode()).items()})
        action = headers.get("x-acs-action") or params.get("Action")
        version = headers.get("x-acs-version") or params.get("Version")
        if version != self.VERSION:
            return self._error(400, "InvalidVersion", f"Specified parameter Version {version!r} is not valid.")
        auth = headers.get("authorization", "")
        m = re.match(r"ACS3-HMAC-SHA256 Credential=([^,]+),SignedHeaders=([^,]+),Signature=([0-9a-f]+)$", auth)
        if not m:
            return self._error(400, "MissingAuthorization", "the request is not signed (ACS3-HMAC-SHA256)")
        if m.group(1) != self.access_key_id:
            return self._error(404, "InvalidAccessKeyId.NotFound", "Specified access key is not found.")
        signed = m.group(2).split(";")
        expected = acs3_signature(self.access_key_secret, method, path, raw_query, headers, signed)
        if not hmac.compare_digest(expected, m.group(3)):
            return self._error(400, "IncompleteSignature", "The request signature does not conform to Aliyun "
                                                           "standards.")
        if action == "DescribeInstanceTypes":
            return self._describe_instance_types(params)
        if action == "DescribePrice":
            return self._describe_price(params)
        return self._error(404, "InvalidAction.NotFound", f"Specified api {action!r} is not found.")

    def _describe_instance_types(self, params: Mapping[str, str]) -> Answer:
        wanted = [v for k, v in sorted(params.items()) if re.fullmatch(r"InstanceTypes\.\d+", k)]
        if len(wanted) > 10:
            return self._error(400, "InvalidParameter", "InstanceTypes.N accepts at most 10 types")
        names = wanted or sorted(self.types)
        size = int(params.get("MaxResults", 100))
        start = int(params.get("NextToken") or 0)
        chosen = [self.types[n] for n in names if n in self.types][start:start + size]
        items = [{"InstanceTypeId": t.instance_type, "CpuCoreCount": t.cpus, "MemorySize": t.memory_gb,
                  "GPUAmount": t.gpus, "GPUSpec": t.gpu_spec, "GPUMemorySize": t.gpu_memory_gb,
                  "CpuArchitecture": t.arch, "InstanceTypeFamily": t.instance_type.rsplit(".", 1)[0]}
                 for t in chosen]
        out: dict[str, Any] = {"RequestId": str(uuid.uuid4()).upper(), "InstanceTypes": {"InstanceType": items}}
        if start + size < len([n for n in names if n in self.types]):
            out["NextToken"] = str(start + size)
        return 200, out, {}

    def _describe_price(self, params: Mapping[str, str]) -> Answer:
        region = params.get("RegionId")
        if not region:
            return self._error(400, "MissingRegionId", "RegionId is mandatory for this action.")
        if params.get("ResourceType", "instance") != "instance":
            return self._error(400, "InvalidResourceType.NotSupported", "this emulator prices instances only")
        itype = params.get("InstanceType")
        if not itype:
            return self._error(400, "MissingParameter", "InstanceType is mandatory when ResourceType is instance.")
        if params.get("PriceUnit", "Hour") != "Hour":
            return self._error(400, "InvalidPriceUnit", "this emulator prices by the hour only")
        price = self.prices.get((region, itype))
        if price is None:
            return self._error(404, "InvalidInstanceType.NotFound", "The specified InstanceType does not exist.")
        spot = params.get("SpotStrategy", "NoSpot")
        if spot != "NoSpot":
            if not params.get("ZoneId"):
                return self._error(400, "MissingParameter", "ZoneId is mandatory for a spot price.")
            price = round(price * 0.3, 6)
        return 200, {"RequestId": str(uuid.uuid4()).upper(), "PriceInfo": {
            "Price": {"OriginalPrice": price, "DiscountPrice": 0.0, "TradePrice": price, "Currency": self.currency,
                      "DetailInfos": {"DetailInfo": [{"Resource": "instanceType", "OriginalPrice": price,
                                                      "DiscountPrice": 0.0, "TradePrice": price}]}},
            "Rules": {"Rule": []}}}, {}
