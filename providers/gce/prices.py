"""Live Compute Engine prices from the Cloud Billing Catalog API.

``GET https://cloudbilling.googleapis.com/v1/services/6F81-5844-456A/skus?key=KEY&currencyCode=USD
&pageSize=5000&pageToken=...`` (6F81-5844-456A is Compute Engine), following
``nextPageToken`` until it is empty.  Source: "Get Google Cloud pricing information",
https://cloud.google.com/billing/v1/how-tos/catalog-api (read 2026-11-30): an API key is
required; pages hold up to 5,000 SKUs; a price is ``units + nanos / 1e9`` in
``pricingInfo[].pricingExpression.tieredRates[].unitPrice``.

Compute Engine bills a VM by its parts, so the catalog prices *components* -- per vCPU
hour ("N2 Instance Core running in Americas"), per GiB hour ("N2 Instance Ram running in
Americas", unit ``GiBy.h``) and per GPU hour ("Nvidia Tesla A100 GPU running in
Americas") -- with ``usageType`` ``OnDemand`` or ``Preemptible`` (the spot price; its
description starts "Spot Preemptible").  A machine type's price is
``vCPUs x core + GiB x ram (+ GPUs x gpu)`` of its family in its region
(``serviceRegions``), the way Google's pricing pages and the snapshot's source
(``Cyclenerd/google-cloud-pricing-cost-calculator``) compose it.  Shapes (vCPUs, memory,
GPUs) come from the catalog's GCE rows; types whose parts this module cannot price
(``-lssd`` types with bundled local SSD, the fractional-GPU ``g4`` types, families not in
:data:`FAMILIES`) are kept without a price, never guessed.

The key comes from ``FLOWMESH_GCE_API_KEY`` or ``GOOGLE_API_KEY`` and never appears in
errors or logs.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence
from dataclasses import replace

import httpx

from flowmesh_sdk import settings as _settings
from flowmesh_sdk.catalog.http import MAX_PAGES, TIMEOUT_S, request_json
from flowmesh_sdk.catalog.records import CatalogRow
from flowmesh_sdk.errors import AuthError, ProviderError

PROVIDER = "gce"
ENDPOINT = "https://cloudbilling.googleapis.com"
SERVICE_ID = "6F81-5844-456A"
DEFAULT_REGIONS = ("us-central1", "us-east1")
KEY_VARS = ("FLOWMESH_GCE_API_KEY", "GOOGLE_API_KEY")

# machine-type prefix -> how the family is named in SKU descriptions
FAMILIES = {"n2": "N2 Instance", "n2d": "N2D AMD Instance", "c2": "Compute optimized", "c2d": "C2D AMD Instance",
            "c3": "C3 Instance", "e2": "E2 Instance", "a2": "A2 Instance", "a3": "A3 Instance", "g2": "G2 Instance",
            "n1": "N1 Predefined Instance"}
# catalog gpu_name -> how the GPU is named in SKU descriptions
GPUS = {"a100": "A100", "a100-80gb": "A100 80GB", "h100-80gb": "H100 80GB", "l4": "L4"}
_PART = re.compile(r"^(?:Spot Preemptible )?(?P<fam>.+?) (?P<kind>Core|Ram) running in (?P<geo>.+)$")
_GPU = re.compile(r"^(?:Spot Preemptible )?Nvidia (?:Tesla )?(?P<gpu>.+?) GPU running in (?P<geo>.+)$")


def _price(sku: dict) -> tuple[float, str] | None:
    for info in sku.get("pricingInfo") or []:
        expr = info.get("pricingExpression") or {}
        rates = expr.get("tieredRates") or []
        if not rates:
            continue
        unit = rates[-1].get("unitPrice") or {}
        if unit.get("currencyCode", "USD") != "USD":
            return None
        value = int(unit.get("units") or 0) + int(unit.get("nanos") or 0) / 1e9
        return value, str(expr.get("usageUnit") or "")
    return None


def components(skus: Sequence[dict]) -> dict[tuple[str, str, str, str], float]:
    """``(region, market, family or GPU name, 'core' | 'ram' | 'gpu') -> USD per unit-hour``."""
    out: dict[tuple[str, str, str, str], float] = {}
    for sku in skus:
        cat = sku.get("category") or {}
        usage = cat.get("usageType")
        if usage not in ("OnDemand", "Preemptible") or cat.get("resourceFamily") not in ("Compute", "GPU"):
            continue
        market = "on-demand" if usage == "OnDemand" else "spot"
        desc = str(sku.get("description", ""))
        priced = _price(sku)
        if priced is None:
            continue
        value, unit = priced
        m = _PART.match(desc)
        g = _GPU.match(desc) if m is None else None
        if m is not None:
            kind = "core" if m.group("kind") == "Core" else "ram"
            if (kind == "core" and unit != "h") or (kind == "ram" and unit != "GiBy.h"):
                continue
            name = m.group("fam")
        elif g is not None and unit == "h":
            kind, name = "gpu", g.group("gpu")
        else:
            continue
        for region in sku.get("serviceRegions") or []:
            out[(region, market, name, kind)] = value
    return out


def price_shape(shape: CatalogRow, region: str, market: str, parts: dict[tuple[str, str, str, str], float]
                ) -> float | None:
    prefix = shape.instance_type.split("-", 1)[0]
    family = FAMILIES.get(prefix)
    if family is None or shape.instance_type.endswith("-lssd"):
        return None
    core = parts.get((region, market, family, "core"))
    ram = parts.get((region, market, family, "ram"))
    if core is None or ram is None:
        return None
    total = shape.cpus * core + shape.memory_gb * ram
    if shape.gpus:
        gpu = GPUS.get((shape.gpu_name or "").lower())
        per_gpu = parts.get((region, market, gpu, "gpu")) if gpu else None
        if per_gpu is None:
            return None
        total += shape.gpus * per_gpu
    return round(total, 6)


async def _skus(client: httpx.AsyncClient, base: str, key: str) -> list[dict]:
    url = f"{base}/v1/services/{SERVICE_ID}/skus"
    token = ""
    skus: list[dict] = []
    for _ in range(MAX_PAGES):
        params = {"key": key, "currencyCode": "USD", "pageSize": "5000"}
        if token:
            params["pageToken"] = token
        body = await request_json(client, "GET", url, params=params, provider=PROVIDER,
                                  api="Cloud Billing Catalog API", where=base, what="(services.skus.list)")
        if not isinstance(body, dict):
            raise ProviderError("Cloud Billing Catalog API answered without JSON", provider=PROVIDER)
        skus.extend(body.get("skus") or [])
        token = body.get("nextPageToken") or ""
        if not token:
            return skus
    raise ProviderError(f"Cloud Billing Catalog API: more than {MAX_PAGES} pages", provider=PROVIDER)


async def fetch_prices(*, endpoint: str | None = None, regions: Sequence[str] = (), shapes: Sequence[CatalogRow] = (),
                       api_key: str | None = None) -> list[CatalogRow]:
    """Live on-demand and spot $/h of the catalog's GCE machine types in ``regions``."""
    key = api_key or _settings.value("providers.gce.api_key")
    if not key:
        raise AuthError(f"the Cloud Billing Catalog API needs an API key: set {' or '.join(KEY_VARS)}",
                        provider=PROVIDER, code="NoApiKey")
    base = (endpoint or ENDPOINT).rstrip("/")
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    async with httpx.AsyncClient(timeout=TIMEOUT_S, follow_redirects=False) as client:
        parts = components(await _skus(client, base, key))
    wanted = tuple(regions) or DEFAULT_REGIONS
    types: dict[str, CatalogRow] = {}
    for shape in shapes:
        types.setdefault(shape.instance_type, shape)
    rows = []
    for region in wanted:
        for itype in sorted(types):
            shape = types[itype]
            od = price_shape(shape, region, "on-demand", parts)
            sp = price_shape(shape, region, "spot", parts)
            rows.append(replace(shape, region=region, zone=None, on_demand_per_hour=od, spot_per_hour=sp,
                                fetched_at=stamp,
                                source=f"Cloud Billing Catalog API (services/{SERVICE_ID}/skus, {region}; "
                                       f"components: vCPU + RAM{' + GPU' if shape.gpus else ''})"
                                       + ("" if od is not None else "; parts not priced here")))
    return rows


__all__ = ["DEFAULT_REGIONS", "ENDPOINT", "FAMILIES", "GPUS", "KEY_VARS", "SERVICE_ID", "components",
           "fetch_prices", "price_shape"]
