""":class:`AzureRetailPricesEmulator` -- a TEST FIXTURE emulating the Azure Retail Prices
REST API: ``GET /api/retail/prices?api-version=...&$filter=...`` (unauthenticated;
OData ``field eq 'value'`` clauses joined by ``and``), pages of 100 ``Items`` linked by
``NextPageLink`` (the same URL plus ``$skip``).  Source: "Azure Retail Prices overview",
learn.microsoft.com/rest/api/cost-management/retail-prices/azure-retail-prices.

A TEST FIXTURE: see :mod:`flowmesh_sdk.testing.price_apis`."""

from __future__ import annotations

import re
import urllib.parse
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ...catalog.records import CatalogRow
from .base import Answer, _Emulator, _one

__all__ = ["AzureRetailPricesEmulator", "azure_items"]


def azure_items(row: CatalogRow) -> list[dict[str, Any]]:
    """Retail-price items for a VM row: the Linux consumption meter, its Spot and Low
    Priority meters, the Windows meter and a 1-year reservation (what a filter must skip)."""
    assert row.on_demand_per_hour is not None
    size = row.instance_type.removeprefix("Standard_").replace("_", " ")
    series = re.sub(r"^([A-Z]+)\d+", r"\1", size.split(" ")[0])
    base = {"currencyCode": "USD", "tierMinimumUnits": 0.0, "armRegionName": row.region, "location": row.region,
            "effectiveStartDate": "2026-06-01T00:00:00Z", "productId": f"DZH318Z0BQ{abs(hash(series)) % 1000:04d}",
            "serviceName": "Virtual Machines", "serviceId": "DZH313Z7MMC8", "serviceFamily": "Compute",
            "unitOfMeasure": "1 Hour", "isPrimaryMeterRegion": True, "armSkuName": row.instance_type}

    def item(meter_suffix: str, product_suffix: str, price: float, kind: str = "Consumption",
             extra: dict[str, Any] | None = None) -> dict[str, Any]:
        meter = f"{size}{meter_suffix}"
        return {**base, "retailPrice": price, "unitPrice": price, "meterId": str(uuid.uuid5(uuid.NAMESPACE_URL, meter +
                product_suffix + kind)), "meterName": meter, "skuId": f"DZH318Z0BQ/{meter}", "productName":
                f"Virtual Machines {series} Series{product_suffix}", "skuName": meter, "type": kind, **(extra or {})}

    od = row.on_demand_per_hour
    spot = row.spot_per_hour if row.spot_per_hour is not None else round(od * 0.2, 6)
    return [item("", "", od), item(" Spot", "", spot), item(" Low Priority", "", round(od * 0.2, 6)),
            item("", " Windows", round(od * 1.8, 6)),
            item("", "", round(od * 8760 * 0.6, 2), kind="Reservation",
                 extra={"reservationTerm": "1 Year", "unitOfMeasure": "1 Hour"})]


class AzureRetailPricesEmulator(_Emulator):
    """A TEST FIXTURE emulating the Azure Retail Prices REST API (see module doc)."""

    name = "azure-retail-prices"
    PAGE = 100
    _CLAUSE = re.compile(r"^\s*(\w+)\s+eq\s+'([^']*)'\s*$")
    _FIELD = {"priceType": "type"}

    def __init__(self, rows: Iterable[CatalogRow] = (), items: Sequence[dict[str, Any]] | None = None) -> None:
        super().__init__()
        self.items = list(items or [])
        for row in rows:
            self.items.extend(azure_items(row))

    def answer(self, method: str, path: str, query: Mapping[str, list[str]], headers: Mapping[str, str],
               body: bytes, *, raw_query: str) -> Answer:
        if method != "GET" or path.rstrip("/") != "/api/retail/prices":
            return 404, {"Error": {"Code": "NotFound", "Message": f"{method} {path}"}}, {}
        version = _one(query, "api-version")
        if version not in (None, "2021-10-01-preview", "2023-01-01-preview"):
            return 400, {"Error": {"Code": "InvalidApiVersion", "Message": f"api-version {version!r}"}}, {}
        clauses: list[tuple[str, str]] = []
        text = _one(query, "$filter") or ""
        if text:
            for part in re.split(r"\s+and\s+", text):
                m = self._CLAUSE.match(part)
                if not m:
                    return 400, {"Error": {"Code": "InvalidFilter", "Message": f"unsupported clause {part!r}"}}, {}
                clauses.append((m.group(1), m.group(2)))
        # the filter names the price type ``priceType``; items carry it as ``type`` (as the real API)
        hits = [it for it in self.items if all(str(it.get(self._FIELD.get(k, k), "")) == v for k, v in clauses)]
        skip = int(_one(query, "$skip") or 0)
        page = hits[skip:skip + self.PAGE]
        nxt = None
        if skip + self.PAGE < len(hits):
            params = {k: v[0] for k, v in query.items() if k != "$skip"}
            params["$skip"] = str(skip + self.PAGE)
            nxt = f"{self.url}/api/retail/prices?{urllib.parse.urlencode(params, quote_via=urllib.parse.quote)}"
        return 200, {"BillingCurrency": "USD", "CustomerEntityId": "Default", "CustomerEntityType": "Retail",
                     "Items": page, "NextPageLink": nxt, "Count": len(page)}, {}
