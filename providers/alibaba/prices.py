"""Live Alibaba Cloud ECS prices through the official SDK (``alibabacloud-ecs20140526``).

For each region, the catalog's Alibaba instance types are described with
``DescribeInstanceTypes`` (``InstanceTypes.N``, at most 10 per call: vCPUs
``CpuCoreCount``, memory ``MemorySize`` GiB, ``GPUAmount``, ``GPUSpec``,
``CpuArchitecture``) and priced with ``DescribePrice`` (``ResourceType=instance``,
``PriceUnit=Hour``: the pay-as-you-go price, ``PriceInfo.Price.TradePrice``).  Sources:
ECS API reference, DescribePrice and DescribeInstanceTypes
(help.aliyun.com/en/ecs/developer-reference/api-ecs-2014-05-26-describeprice), and the
SDK's request models.  A type ``DescribePrice`` answers ``InvalidInstanceType.NotFound``
for is not sold in that region and gets no row.

Spot prices are per zone (the API requires ``ZoneId`` with ``SpotStrategy``), so this
refresh fetches pay-as-you-go prices only.  Prices must come back in USD (an
international-site account); an account billed in CNY is refused rather than mixed into
a USD catalog.

Credentials: ``ALIBABA_CLOUD_ACCESS_KEY_ID`` and ``ALIBABA_CLOUD_ACCESS_KEY_SECRET`` (the
SDK's own variable names); they are handed to the SDK and never logged.  The SDK is an
optional extra: ``pip install 'flowmesh-sdk[alibaba]'``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import urllib.parse
from collections.abc import Sequence
from typing import Any

from flowmesh_sdk import settings as _settings
from flowmesh_sdk.catalog.records import CatalogRow
from flowmesh_sdk.errors import (AuthError, FlowMeshError, ProviderError, ProviderUnavailableError, SpecError,
                                 ThrottledError)

PROVIDER = "alibaba"
DEFAULT_REGIONS = ("cn-hangzhou",)
KEY_ID = "ALIBABA_CLOUD_ACCESS_KEY_ID"
KEY_SECRET = "ALIBABA_CLOUD_ACCESS_KEY_SECRET"
CONCURRENCY = 8
_INSTALL = "the alibaba price refresh needs the ECS SDK: pip install 'flowmesh-sdk[alibaba]'"


def _sdk() -> tuple[Any, Any, Any]:
    try:
        from alibabacloud_ecs20140526 import models
        from alibabacloud_ecs20140526.client import Client
        from alibabacloud_tea_openapi import models as open_api_models
    except ImportError as exc:
        raise ProviderError(_INSTALL, provider=PROVIDER, code="MissingDependency") from exc
    return Client, models, open_api_models


def _map(exc: Exception, what: str) -> FlowMeshError:
    code = str(getattr(exc, "code", "") or "")
    message = str(getattr(exc, "message", "") or "").split(" request id:")[0]
    text = f"{what}: {code or type(exc).__name__}" + (f": {message}" if message else "")
    if code.startswith("Throttling") or code == "ServiceUnavailable":
        return ThrottledError(text, provider=PROVIDER, code=code)
    if code.startswith(("InvalidAccessKeyId", "SignatureDoesNotMatch", "IncompleteSignature", "Forbidden",
                        "MissingAuthorization", "InvalidSecurityToken")):
        return AuthError(text, provider=PROVIDER, code=code)
    if not code:
        return ProviderUnavailableError(f"{what}: {type(exc).__name__}", provider=PROVIDER, code="Unreachable")
    return ProviderError(text, provider=PROVIDER, code=code)


def _client(region: str, endpoint: str | None, keys: tuple[str | None, str | None] = (None, None)) -> Any:
    Client, _models, open_api_models = _sdk()
    key_id = keys[0] or _settings.value("providers.alibaba.access_key_id")
    secret = keys[1] or _settings.value("providers.alibaba.access_key_secret")
    if not key_id or not secret:
        raise AuthError(f"Alibaba Cloud credentials missing: set {KEY_ID} and {KEY_SECRET}", provider=PROVIDER,
                        code="NoCredentials")
    if endpoint:
        parts = urllib.parse.urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
        host, protocol = parts.netloc, parts.scheme or "https"
    else:
        host, protocol = f"ecs.{region}.aliyuncs.com", "https"
    config = open_api_models.Config(access_key_id=key_id, access_key_secret=secret, endpoint=host,
                                    protocol=protocol, region_id=region, read_timeout=60_000, connect_timeout=10_000)
    return Client(config)


async def _describe_types(client: Any, models: Any, names: Sequence[str], region: str) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for i in range(0, len(names), 10):
        chunk = list(names[i:i + 10])
        try:
            resp = await client.describe_instance_types_async(
                models.DescribeInstanceTypesRequest(instance_types=chunk, max_results=100))
        except Exception as exc:  # the SDK raises Tea exceptions; map them
            raise _map(exc, f"DescribeInstanceTypes ({region})") from exc
        for item in resp.body.instance_types.instance_type or []:
            found[item.instance_type_id] = item
    return found


async def _price(client: Any, models: Any, region: str, itype: str, sem: asyncio.Semaphore) -> float | None:
    async with sem:
        try:
            resp = await client.describe_price_async(models.DescribePriceRequest(
                region_id=region, resource_type="instance", instance_type=itype, price_unit="Hour"))
        except Exception as exc:
            if str(getattr(exc, "code", "")) == "InvalidInstanceType.NotFound":
                return None
            raise _map(exc, f"DescribePrice ({region}, {itype})") from exc
    price = resp.body.price_info.price
    if price.currency and price.currency != "USD":
        raise SpecError("currency", f"DescribePrice answered in {price.currency}; the catalog holds USD "
                                    "(use an international-site account)")
    value = price.trade_price if price.trade_price is not None else price.original_price
    return float(value) if value is not None else None


async def fetch_prices(*, endpoint: str | None = None, regions: Sequence[str] = (),
                       shapes: Sequence[CatalogRow] = (), access_key_id: str | None = None,
                       access_key_secret: str | None = None) -> list[CatalogRow]:
    """Live pay-as-you-go $/h of the catalog's Alibaba ECS types in ``regions`` (keys: the
    arguments, else the two variables; never logged)."""
    _Client, models, _open = _sdk()
    names = sorted({r.instance_type for r in shapes})
    if not names:
        raise SpecError("shapes", "no Alibaba ECS instance types in the catalog to price")
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    rows: list[CatalogRow] = []
    sem = asyncio.Semaphore(CONCURRENCY)
    for region in tuple(regions) or DEFAULT_REGIONS:
        client = _client(region, endpoint, (access_key_id, access_key_secret))
        described = await _describe_types(client, models, names, region)
        prices = await asyncio.gather(*(_price(client, models, region, n, sem) for n in names))
        for name, price in zip(names, prices):
            item = described.get(name)
            if item is None or price is None:
                continue
            gpus = int(item.gpuamount or 0)
            rows.append(CatalogRow(
                provider=PROVIDER, region=region, instance_type=name, cpus=float(item.cpu_core_count),
                memory_gb=float(item.memory_size), on_demand_per_hour=price, spot_per_hour=None, gpus=gpus,
                gpu_name=(item.gpuspec or None) if gpus else None,
                gpu_memory_gb=(float(item.gpumemory_size) * gpus if gpus and item.gpumemory_size else None),
                arch="arm64" if str(item.cpu_architecture or "").upper() == "ARM" else "x86_64",
                source=f"Alibaba ECS DescribePrice + DescribeInstanceTypes (2014-05-26, {region})",
                fetched_at=stamp))
    return rows


__all__ = ["DEFAULT_REGIONS", "KEY_ID", "KEY_SECRET", "fetch_prices"]
