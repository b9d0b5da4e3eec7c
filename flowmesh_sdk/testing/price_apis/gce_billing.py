""":class:`GceBillingCatalogEmulator` -- a TEST FIXTURE emulating the Cloud Billing
Catalog API ``GET /v1/services/6F81-5844-456A/skus?key=...&pageToken=...`` (Compute
Engine's service id), answering ``{skus: [{skuId, description, category: {resourceFamily,
resourceGroup, usageType}, serviceRegions, pricingInfo: [{pricingExpression: {usageUnit,
tieredRates: [{startUsageAmount, unitPrice: {currencyCode, units, nanos}}]}}]}],
nextPageToken}``.  Source: "Get Google Cloud pricing information"
(cloud.google.com/billing/v1/how-tos/catalog-api).

A TEST FIXTURE: see :mod:`flowmesh_sdk.testing.price_apis`."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

from .base import Answer, _Emulator, _one

__all__ = ["GCE_SERVICE_ID", "GceBillingCatalogEmulator", "gce_sku"]

GCE_SERVICE_ID = "6F81-5844-456A"


def gce_sku(description: str, price: float, regions: Sequence[str], *, usage: str = "OnDemand",
            unit: str = "h", group: str = "CPU", family: str = "Compute") -> dict[str, Any]:
    units, nanos = divmod(round(price * 1e9), 10**9)
    sku_id = hashlib.sha1(f"{description}/{usage}".encode()).hexdigest()[:12].upper()
    sku_id = f"{sku_id[:4]}-{sku_id[4:8]}-{sku_id[8:12]}"
    return {"name": f"services/{GCE_SERVICE_ID}/skus/{sku_id}", "skuId": sku_id, "description": description,
            "category": {"serviceDisplayName": "Compute Engine", "resourceFamily": family, "resourceGroup": group,
                         "usageType": usage},
            "serviceRegions": list(regions),
            "pricingInfo": [{"summary": "", "effectiveTime": "2026-11-01T00:00:00Z",
                             "pricingExpression": {"usageUnit": unit, "displayQuantity": 1,
                                                   "usageUnitDescription": "hour" if unit == "h" else "gibibyte hour",
                                                   "baseUnit": "s" if unit == "h" else "By.s",
                                                   "baseUnitConversionFactor": 3600,
                                                   "tieredRates": [{"startUsageAmount": 0, "unitPrice": {
                                                       "currencyCode": "USD", "units": str(units), "nanos": nanos}}]},
                             "aggregationInfo": {"aggregationLevel": "ACCOUNT", "aggregationInterval": "DAILY",
                                                 "aggregationCount": 1},
                             "currencyConversionRate": 1}],
            "serviceProviderName": "Google", "geoTaxonomy": {"type": "MULTI_REGIONAL", "regions": list(regions)}}


class GceBillingCatalogEmulator(_Emulator):
    """A TEST FIXTURE emulating the Cloud Billing Catalog API's SKU listing (see module doc).

    ``skus`` are SKU documents (:func:`gce_sku`); ``api_key`` is the key it accepts
    (``?key=``) -- a bearer token is accepted too; ``page_size`` is the most SKUs it puts
    in one page whatever the client asks (so paging is exercised)."""

    name = "gce-billing-catalog"

    def __init__(self, skus: Sequence[dict[str, Any]] = (), api_key: str = "test-key", page_size: int = 50) -> None:
        super().__init__()
        self.skus = list(skus)
        self.api_key = api_key
        self.page_size = page_size

    def answer(self, method: str, path: str, query: Mapping[str, list[str]], headers: Mapping[str, str],
               body: bytes, *, raw_query: str) -> Answer:
        m = re.fullmatch(r"/v1/services/([^/]+)/skus", path)
        if method != "GET" or not m:
            return 404, {"error": {"code": 404, "message": f"{method} {path}", "status": "NOT_FOUND"}}, {}
        key = _one(query, "key")
        bearer = headers.get("authorization", "").startswith("Bearer ")
        if not bearer and key != self.api_key:
            status, reason = (403, "API key not valid") if key else (403, "The request is missing a valid API key.")
            return status, {"error": {"code": status, "message": reason, "status": "PERMISSION_DENIED"}}, {}
        if m.group(1) != GCE_SERVICE_ID:
            return 404, {"error": {"code": 404, "message": f"service {m.group(1)} not found",
                                   "status": "NOT_FOUND"}}, {}
        currency = _one(query, "currencyCode") or "USD"
        if currency != "USD":
            return 400, {"error": {"code": 400, "message": "this emulator prices USD only",
                                   "status": "INVALID_ARGUMENT"}}, {}
        # pageSize is the most the client wants (5,000 at most); the server may send fewer
        size = max(1, min(int(_one(query, "pageSize") or 5000), 5000, self.page_size))
        token = _one(query, "pageToken") or "0"
        if not token.isdigit():
            return 400, {"error": {"code": 400, "message": "invalid page token", "status": "INVALID_ARGUMENT"}}, {}
        start = int(token)
        page = self.skus[start:start + size]
        nxt = str(start + size) if start + size < len(self.skus) else ""
        return 200, {"skus": page, "nextPageToken": nxt}, {}
