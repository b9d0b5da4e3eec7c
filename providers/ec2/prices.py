"""EC2 prices for the catalog: the live refresh from the AWS Price List Query API
(:func:`fetch_prices`).  The provider itself holds no prices (it reports shapes); the
shipped EC2 snapshot is the catalog's, ``providers/ec2/catalog.csv``.

Live refresh (``flowmesh catalog refresh --provider ec2``): :func:`fetch_prices` asks the
AWS Price List Query API (``pricing`` client, ``GetProducts``, boto3) for the EC2
products of each region with the same filters as the snapshot's generator
(``operatingSystem=Linux``, ``tenancy=Shared``, ``preInstalledSw=NA``,
``capacitystatus=Used``, product family "Compute Instance*"), 100 products a page, and
reads each product's on-demand ``pricePerUnit.USD``.  Source: AWS Price List Service API
Reference, GetProducts, and "Using the AWS Price List Query API" (AWS Billing docs).
The Price List API carries no spot prices, so refreshed rows have none.  The Query API
is served from us-east-1 (also eu-central-1 and ap-south-1); ``endpoint`` overrides the
URL, as the tests do with a local emulator (``flowmesh_sdk.testing.price_apis``).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import re
from collections.abc import Sequence
from typing import Any

from flowmesh_sdk.catalog.records import CatalogRow, infer_arch
from flowmesh_sdk.errors import AuthError, ProviderError, ThrottledError

PRICING_REGION = "us-east-1"           # where the Price List Query API is served
DEFAULT_REGIONS = ("us-east-1",)
PRODUCT_FILTERS = {"operatingSystem": "Linux", "tenancy": "Shared", "preInstalledSw": "NA",
                   "capacitystatus": "Used"}
_MEMORY = re.compile(r"^\s*([0-9.,]+)\s*(GiB|GB|MiB)\s*$", re.I)
_THROTTLE_CODES = {"ThrottlingException", "Throttling", "TooManyRequestsException", "RequestLimitExceeded"}
_AUTH_CODES = {"UnrecognizedClientException", "InvalidSignatureException", "AccessDeniedException",
               "MissingAuthenticationTokenException", "ExpiredTokenException", "InvalidClientTokenId"}


def _gib(text: str) -> float | None:
    m = _MEMORY.match(text or "")
    if not m:
        return None
    value = float(m.group(1).replace(",", ""))
    return value / 1024 if m.group(2).lower() == "mib" else value


def parse_product(doc: dict[str, Any], region: str, shapes: dict[str, CatalogRow], fetched_at: str
                  ) -> CatalogRow | None:
    """A catalog row from one price-list product document, or ``None`` when it is not a
    priced Linux compute instance."""
    product = doc.get("product") or {}
    if not str(product.get("productFamily", "")).startswith("Compute Instance"):
        return None
    attrs = product.get("attributes") or {}
    itype = attrs.get("instanceType")
    try:
        cpus = float(attrs.get("vcpu", ""))
    except ValueError:
        return None
    memory = _gib(attrs.get("memory", ""))
    if not itype or memory is None or cpus <= 0:
        return None
    price = None
    for term in ((doc.get("terms") or {}).get("OnDemand") or {}).values():
        for dim in (term.get("priceDimensions") or {}).values():
            usd = (dim.get("pricePerUnit") or {}).get("USD")
            if usd is not None and dim.get("unit") in ("Hrs", "Hours", "hours"):
                price = float(usd)
    if price is None or price <= 0:
        return None
    shape = shapes.get(itype)
    gpus = int(attrs.get("gpu") or 0) if str(attrs.get("gpu") or "0").isdigit() else 0
    gpu_mem = _gib(attrs.get("gpuMemory", "")) if gpus else None
    return CatalogRow(provider="ec2", region=region, instance_type=itype, cpus=cpus, memory_gb=memory,
                      on_demand_per_hour=price, spot_per_hour=None, gpus=gpus,
                      gpu_name=shape.gpu_name if shape is not None and gpus else None,
                      gpu_memory_gb=gpu_mem if gpu_mem else (shape.gpu_memory_gb if shape is not None and gpus
                                                             else None),
                      arch=shape.arch if shape is not None else infer_arch("ec2", itype),
                      source=f"AWS Price List Query API GetProducts (AmazonEC2, {region}, sku "
                             f"{product.get('sku', '?')})", fetched_at=fetched_at)


def _get_products(client: Any, region: str, exceptions: Any) -> list[dict[str, Any]]:
    filters = [{"Type": "TERM_MATCH", "Field": "regionCode", "Value": region}]
    filters += [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in PRODUCT_FILTERS.items()]
    docs: list[dict[str, Any]] = []
    token: str | None = None
    for _ in range(2000):               # pages; a longer listing is a loop, not a catalog
        kwargs: dict[str, Any] = {"ServiceCode": "AmazonEC2", "Filters": filters, "FormatVersion": "aws_v1",
                                  "MaxResults": 100}
        if token:
            kwargs["NextToken"] = token
        try:
            page = client.get_products(**kwargs)
        except exceptions.ClientError as exc:
            code = str((exc.response.get("Error") or {}).get("Code") or "")
            msg = f"Price List GetProducts ({region}): {code}: {(exc.response.get('Error') or {}).get('Message', '')}"
            if code in _THROTTLE_CODES:
                raise ThrottledError(msg, provider="ec2", code=code) from exc
            if code in _AUTH_CODES:
                raise AuthError(msg, provider="ec2", code=code) from exc
            raise ProviderError(msg, provider="ec2", code=code) from exc
        docs.extend(json.loads(item) for item in page.get("PriceList") or [])
        token = page.get("NextToken")
        if not token:
            return docs
    raise ProviderError(f"Price List GetProducts ({region}): more than 2000 pages", provider="ec2")


def _fetch_blocking(endpoint: str | None, regions: Sequence[str], shapes: Sequence[CatalogRow],
                    session_kwargs: dict[str, Any] | None) -> list[CatalogRow]:
    try:
        import boto3.session
        import botocore.config
        import botocore.exceptions
    except ImportError as exc:  # pragma: no cover - the dev extra installs boto3
        raise ProviderError("the ec2 price refresh needs boto3: pip install 'flowmesh-sdk[ec2]'",
                            provider="ec2", code="MissingDependency") from exc
    from .errors import endpoint_unreachable, missing_credentials

    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    session = boto3.session.Session(**(session_kwargs or {}))
    config = botocore.config.Config(retries={"mode": "standard", "total_max_attempts": 1},
                                    connect_timeout=10, read_timeout=60)
    client = session.client("pricing", region_name=PRICING_REGION, endpoint_url=endpoint, config=config)
    by_type = {r.instance_type: r for r in shapes}
    rows: list[CatalogRow] = []
    for region in regions:
        try:
            docs = _get_products(client, region, botocore.exceptions)
        except (botocore.exceptions.NoCredentialsError, botocore.exceptions.PartialCredentialsError) as exc:
            raise missing_credentials(exc, region=region) from exc
        except (botocore.exceptions.EndpointConnectionError, botocore.exceptions.ConnectTimeoutError,
                botocore.exceptions.ReadTimeoutError) as exc:
            raise endpoint_unreachable(exc, region=region, endpoint=endpoint) from exc
        seen: dict[str, CatalogRow] = {}
        for doc in docs:
            row = parse_product(doc, region, by_type, stamp)
            if row is None:
                continue
            best = seen.get(row.instance_type)     # the cheapest row per type (parse_product always prices one)
            if best is None or (row.on_demand_per_hour or 0) < (best.on_demand_per_hour or 0):
                seen[row.instance_type] = row
        rows.extend(seen[k] for k in sorted(seen))
    return rows


async def fetch_prices(*, endpoint: str | None = None, regions: Sequence[str] = (), shapes: Sequence[CatalogRow] = (),
                       session_kwargs: dict[str, Any] | None = None) -> list[CatalogRow]:
    """Live on-demand EC2 prices for ``regions`` (default us-east-1) from the Price List
    Query API, as catalog rows.  boto3 runs in a worker thread (it blocks)."""
    return await asyncio.to_thread(_fetch_blocking, endpoint, tuple(regions) or DEFAULT_REGIONS,
                                   tuple(shapes), session_kwargs)


__all__ = ["DEFAULT_REGIONS", "PRODUCT_FILTERS", "fetch_prices", "parse_product"]
