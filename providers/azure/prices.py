"""Live Azure VM prices from the Azure Retail Prices REST API.

``GET https://prices.azure.com/api/retail/prices?api-version=2023-01-01-preview&$filter=...``
(no authentication), with ``serviceName eq 'Virtual Machines' and armRegionName eq
'<region>' and priceType eq 'Consumption'``, following ``NextPageLink`` page by page.
Source: "Azure Retail Prices overview",
https://learn.microsoft.com/rest/api/cost-management/retail-prices/azure-retail-prices
(read 2026-11-30): filter values are case-sensitive from 2023-01-01-preview on; each page
holds up to 100 items; ``NextPageLink`` is empty on the last page.

Which meters are kept (the same rules as ``Azure/karpenter-provider-azure``'s price
generator, which built the shipped snapshot): product names ending in " Windows" are
Windows licences and skipped; meter names ending in " Low Priority" are the retired
low-priority market and skipped; meter names ending in " Spot" are the spot price;
the rest is the Linux pay-as-you-go price, per hour (``unitOfMeasure`` "1 Hour").

The API prices SKUs but does not describe them, so vCPUs, memory and GPUs come from the
catalog's rows for the same ``armSkuName`` (``shapes``); a SKU the catalog has no shape
for is left out (it cannot be sized).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import replace

import httpx

from flowmesh_sdk.catalog.http import MAX_PAGES, TIMEOUT_S, request_json, same_origin
from flowmesh_sdk.catalog.records import CatalogRow
from flowmesh_sdk.errors import ProviderError

PROVIDER = "azure"
ENDPOINT = "https://prices.azure.com"
API_VERSION = "2023-01-01-preview"
DEFAULT_REGIONS = ("eastus", "westus2")


def _filter(region: str) -> str:
    return (f"serviceName eq 'Virtual Machines' and armRegionName eq '{region}' "
            f"and priceType eq 'Consumption'")


async def _items(client: httpx.AsyncClient, base: str, region: str) -> list[dict]:
    url: str | None = f"{base}/api/retail/prices"
    params: dict[str, str] | None = {"api-version": API_VERSION, "$filter": _filter(region)}
    items: list[dict] = []
    for _ in range(MAX_PAGES):
        if url is None:
            return items
        body = await request_json(client, "GET", url, params=params, provider=PROVIDER,
                                  api="Retail Prices API", where=base, what=f"({region})")
        if not isinstance(body, dict) or not isinstance(body.get("Items"), list):
            raise ProviderError(f"Retail Prices API ({region}) answered without Items", provider=PROVIDER)
        items.extend(body["Items"])
        nxt = body.get("NextPageLink") or None
        if nxt is not None and not same_origin(nxt, base):
            raise ProviderError(f"Retail Prices API NextPageLink leaves {base}: refused", provider=PROVIDER)
        url, params = nxt, None
    raise ProviderError(f"Retail Prices API ({region}): more than {MAX_PAGES} pages", provider=PROVIDER)


def rows_from_items(items: Sequence[dict], region: str, shapes: dict[str, CatalogRow], fetched_at: str
                    ) -> list[CatalogRow]:
    od: dict[str, float] = {}
    spot: dict[str, float] = {}
    for it in items:
        if it.get("type") != "Consumption" or it.get("unitOfMeasure") != "1 Hour":
            continue
        if it.get("armRegionName") != region or str(it.get("productName", "")).endswith(" Windows"):
            continue
        meter = str(it.get("meterName", ""))
        if meter.endswith(" Low Priority"):
            continue
        sku = it.get("armSkuName")
        price = it.get("retailPrice")
        if not sku or not isinstance(price, (int, float)) or price <= 0:
            continue
        target = spot if meter.endswith(" Spot") else od
        target[sku] = min(float(price), target.get(sku, float("inf")))
    rows = []
    for sku in sorted(set(od) | set(spot)):
        shape = shapes.get(sku)
        if shape is None:
            continue
        rows.append(replace(shape, region=region, zone=None, on_demand_per_hour=od.get(sku),
                            spot_per_hour=spot.get(sku), fetched_at=fetched_at,
                            source=f"Azure Retail Prices API ({API_VERSION}, {region}); shape: {shape.source}"))
    return rows


async def fetch_prices(*, endpoint: str | None = None, regions: Sequence[str] = (),
                       shapes: Sequence[CatalogRow] = ()) -> list[CatalogRow]:
    """Live Linux on-demand and spot $/h for the catalog's Azure VM sizes in ``regions``."""
    base = (endpoint or ENDPOINT).rstrip("/")
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    by_sku = {r.instance_type: r for r in shapes}
    rows: list[CatalogRow] = []
    async with httpx.AsyncClient(timeout=TIMEOUT_S, follow_redirects=False) as client:
        for region in tuple(regions) or DEFAULT_REGIONS:
            rows.extend(rows_from_items(await _items(client, base, region), region, by_sku, stamp))
    return rows


__all__ = ["API_VERSION", "DEFAULT_REGIONS", "ENDPOINT", "fetch_prices", "rows_from_items"]
