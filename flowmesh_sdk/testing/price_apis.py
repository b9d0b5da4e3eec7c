"""TEST FIXTURES emulating the five providers' price APIs on 127.0.0.1, at the wire level,
for the live price adapters (``providers/<name>/prices.py``) and ``flowmesh catalog
refresh --endpoint``.  None of them is the real service; each speaks the request and
response shapes of the real API for the calls the adapters make, as documented
(sources below, read 2026-11-30), and rejects requests the real API would reject
(wrong target, missing credentials, unknown parameters, bad signatures), so an adapter
that sends the wrong request fails here too.

* :class:`AwsPricingEmulator` -- a TEST FIXTURE emulating the AWS Price List Query API
  ``GetProducts`` (AWS JSON 1.1: ``POST /`` with ``X-Amz-Target:
  AWSPriceListService.GetProducts``, ``Content-Type: application/x-amz-json-1.1``, a
  SigV4 ``Authorization`` for service ``pricing``).  Request ``{ServiceCode, Filters:
  [{Type: TERM_MATCH, Field, Value}], FormatVersion, MaxResults (1-100), NextToken}``;
  response ``{FormatVersion: "aws_v1", PriceList: [JSON string], NextToken}``.  Source:
  AWS Price List Service API Reference, GetProducts
  (docs.aws.amazon.com/aws-cost-management/latest/APIReference/API_pricing_GetProducts.html).
  moto 5.2 has no ``pricing`` backend, hence this emulator.
* :class:`AzureRetailPricesEmulator` -- a TEST FIXTURE emulating the Azure Retail Prices
  REST API: ``GET /api/retail/prices?api-version=...&$filter=...`` (unauthenticated;
  OData ``field eq 'value'`` clauses joined by ``and``), pages of 100 ``Items`` linked by
  ``NextPageLink`` (the same URL plus ``$skip``).  Source: "Azure Retail Prices overview",
  learn.microsoft.com/rest/api/cost-management/retail-prices/azure-retail-prices.
* :class:`GceBillingCatalogEmulator` -- a TEST FIXTURE emulating the Cloud Billing
  Catalog API ``GET /v1/services/6F81-5844-456A/skus?key=...&pageToken=...`` (Compute
  Engine's service id), answering ``{skus: [{skuId, description, category: {resourceFamily,
  resourceGroup, usageType}, serviceRegions, pricingInfo: [{pricingExpression: {usageUnit,
  tieredRates: [{startUsageAmount, unitPrice: {currencyCode, units, nanos}}]}}]}],
  nextPageToken}``.  Source: "Get Google Cloud pricing information"
  (cloud.google.com/billing/v1/how-tos/catalog-api).
* :class:`AlibabaEcsEmulator` -- a TEST FIXTURE emulating Alibaba Cloud ECS (API version
  2014-05-26, RPC style) ``DescribeInstanceTypes`` and ``DescribePrice`` as the official
  Python SDK (``alibabacloud-ecs20140526``) sends them: ``POST /?<params>`` with
  ``x-acs-action``, ``x-acs-version`` and an ``ACS3-HMAC-SHA256`` signature, which is
  verified.  ``DescribePrice`` answers ``{RequestId, PriceInfo: {Price: {OriginalPrice,
  DiscountPrice, TradePrice, Currency}, Rules: {Rule: []}}}``.  Sources: ECS API
  reference, DescribePrice (help.aliyun.com/en/ecs/developer-reference/api-ecs-2014-05-26-describeprice)
  and the SDK's request model (``DescribePriceRequest``); signature: "Request syntax and
  signature method V3", Alibaba Cloud API docs.
* :class:`VastSearchEmulator` -- a TEST FIXTURE emulating Vast.ai's offer search
  ``POST /api/v0/bundles/`` (JSON query of ``{field: {op: value}}`` filters with ``order``,
  ``type`` = ``on-demand`` | ``bid``, ``limit``; ``Authorization: Bearer KEY``) answering
  ``{"offers": [...]}`` with the fields the real search returns (``id``, ``gpu_name``,
  ``num_gpus``, ``gpu_ram``/``gpu_total_ram`` in MB, ``cpu_cores_effective``, ``cpu_ram``
  in MB, ``dph_total``, ``min_bid``, ``reliability2``, ``geolocation``, ...).  Source:
  ``vast-ai/vast-python`` ``vast.py`` ``search__offers`` and its sample output
  ``search.json``.

Each emulator is an :class:`~flowmesh_sdk.testing.httpserver.HttpServer` (aiohttp on a
loop of its own in a daemon thread, so blocking clients such as boto3 and async ones both
work), records every request (``.requests``; credentials
are kept out of the record) and can inject faults (:meth:`_Emulator.fail_next`).
Use as a context manager; ``.url`` is the base URL.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import threading
import urllib.parse
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from ..catalog.records import CatalogRow
from .httpserver import HttpServer, json_response

__all__ = ["AlibabaEcsEmulator", "AwsPricingEmulator", "AzureRetailPricesEmulator", "GceBillingCatalogEmulator",
           "Recorded", "VastSearchEmulator", "GCE_SERVICE_ID"]

GCE_SERVICE_ID = "6F81-5844-456A"
_SECRET_HEADERS = {"authorization", "x-api-key"}


@dataclass(frozen=True, slots=True)
class Recorded:
    """One request as the emulator saw it (``Authorization`` replaced by its scheme)."""

    method: str
    path: str
    query: Mapping[str, list[str]]
    headers: Mapping[str, str]
    body: bytes


@dataclass(slots=True)
class _Fault:
    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    times: int = 1


class _Emulator(HttpServer):
    """Base: an :class:`~flowmesh_sdk.testing.httpserver.HttpServer` with request
    recording and fault injection; a subclass answers in :meth:`answer`."""

    name = "emulator"

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[Recorded] = []
        self._faults: list[_Fault] = []
        self._lock = threading.Lock()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        split = urllib.parse.urlsplit(request.raw_path)
        query = urllib.parse.parse_qs(split.query, keep_blank_values=True)
        headers = {k.lower(): v for k, v in request.headers.items()}
        shown = {k: (v.split(" ", 1)[0] + " ..." if k in _SECRET_HEADERS else v) for k, v in headers.items()}
        with self._lock:
            self.requests.append(Recorded(request.method, split.path, query, shown, body))
            fault = self._faults[0] if self._faults else None
            if fault is not None:
                fault.times -= 1
                if fault.times <= 0:
                    self._faults.pop(0)
        if fault is not None:
            status, payload, extra = fault.status, fault.body, dict(fault.headers)
        else:
            status, payload, extra = self.answer(request.method, split.path, query, headers, body,
                                                 raw_query=split.query)
            extra = dict(extra)
        content_type = extra.pop("Content-Type", "application/json")
        return json_response(status, payload, extra, content_type=content_type)

    def fail_next(self, status: int, body: dict[str, Any] | None = None, *, times: int = 1,
                  headers: Mapping[str, str] | None = None) -> None:
        """Answer the next ``times`` requests with ``status`` and ``body`` (fault injection)."""
        with self._lock:
            self._faults.append(_Fault(status, dict(body or {}), dict(headers or {}), times))

    def answer(self, method: str, path: str, query: Mapping[str, list[str]], headers: Mapping[str, str],
               body: bytes, *, raw_query: str) -> tuple[int, Any, dict[str, str]]:
        raise NotImplementedError


def _one(query: Mapping[str, list[str]], key: str) -> str | None:
    values = query.get(key)
    return values[0] if values else None


# --------------------------------------------------------------------------- #
# AWS Price List Query API (GetProducts)
# --------------------------------------------------------------------------- #

_AWS_LOCATIONS = {"us-east-1": "US East (N. Virginia)", "us-west-2": "US West (Oregon)",
                  "eu-west-1": "EU (Ireland)"}


def aws_product(row: CatalogRow, *, operating_system: str = "Linux", tenancy: str = "Shared",
                capacitystatus: str = "Used", preinstalled: str = "NA", price: float | None = None) -> dict[str, Any]:
    """A Price List product document for ``row`` (the ``aws_v1`` shape: product + terms)."""
    sku = hashlib.sha1(f"{row.region}/{row.instance_type}/{operating_system}/{tenancy}/{capacitystatus}/"
                       f"{preinstalled}".encode()).hexdigest()[:16].upper()
    usd = row.on_demand_per_hour if price is None else price
    attrs = {"servicecode": "AmazonEC2", "instanceType": row.instance_type, "vcpu": f"{row.cpus:g}",
             "memory": f"{row.memory_gb:g} GiB", "regionCode": row.region,
             "location": _AWS_LOCATIONS.get(row.region, row.region), "operatingSystem": operating_system,
             "tenancy": tenancy, "capacitystatus": capacitystatus, "preInstalledSw": preinstalled,
             "processorArchitecture": "64-bit", "locationType": "AWS Region", "usagetype": f"BoxUsage:{row.instance_type}",
             "operation": "RunInstances"}
    if row.gpus:
        attrs["gpu"] = str(row.gpus)
        attrs["gpuMemory"] = f"{row.gpu_memory_gb:g} GiB" if row.gpu_memory_gb else "NA"
    return {
        "product": {"productFamily": "Compute Instance", "attributes": attrs, "sku": sku},
        "serviceCode": "AmazonEC2",
        "terms": {"OnDemand": {f"{sku}.JRTCKXETXF": {
            "offerTermCode": "JRTCKXETXF", "sku": sku, "effectiveDate": "2026-11-01T00:00:00Z",
            "termAttributes": {},
            "priceDimensions": {f"{sku}.JRTCKXETXF.6YS6EN2CT7": {
                "rateCode": f"{sku}.JRTCKXETXF.6YS6EN2CT7", "unit": "Hrs", "beginRange": "0", "endRange": "Inf",
                "description": f"${usd} per On Demand {operating_system} {row.instance_type} Instance Hour",
                "appliesTo": [], "pricePerUnit": {"USD": f"{usd:.10f}"}}}}}},
        "version": "20261101000000", "publicationDate": "2026-11-01T00:00:00Z",
    }


class AwsPricingEmulator(_Emulator):
    """A TEST FIXTURE emulating the AWS Price List Query API ``GetProducts`` (see module doc).

    ``products`` are price-list documents (:func:`aws_product`); by default, for each
    row given, the Linux/Shared/Used product plus decoys a request without the right
    filters would also receive (Windows, dedicated tenancy, unused capacity
    reservations) at other prices."""

    name = "aws-pricing"
    TARGET = "AWSPriceListService.GetProducts"

    def __init__(self, rows: Iterable[CatalogRow] = (), products: Sequence[dict[str, Any]] | None = None,
                 access_key_id: str = "testing") -> None:
        super().__init__()
        self.access_key_id = access_key_id
        docs = list(products or [])
        for row in rows:
            docs.append(aws_product(row))
            assert row.on_demand_per_hour is not None
            docs.append(aws_product(row, operating_system="Windows", price=row.on_demand_per_hour * 2 + 0.1))
            docs.append(aws_product(row, tenancy="Dedicated", price=row.on_demand_per_hour * 1.1 + 0.05))
            docs.append(aws_product(row, capacitystatus="UnusedCapacityReservation", price=0.0001))
        self.products = docs

    @staticmethod
    def _error(kind: str, message: str, status: int = 400) -> tuple[int, Any, dict[str, str]]:
        return status, {"__type": kind, "message": message}, {"Content-Type": "application/x-amz-json-1.1"}

    def answer(self, method, path, query, headers, body, *, raw_query):
        if method != "POST" or path != "/":
            return self._error("UnknownOperationException", f"{method} {path}", 404)
        if headers.get("x-amz-target") != self.TARGET:
            return self._error("UnknownOperationException", f"unknown target {headers.get('x-amz-target')!r}")
        if not headers.get("content-type", "").startswith("application/x-amz-json-1.1"):
            return self._error("SerializationException", "Content-Type must be application/x-amz-json-1.1")
        auth = headers.get("authorization", "")
        m = re.match(r"AWS4-HMAC-SHA256 Credential=([^/]+)/\d{8}/([a-z0-9-]+)/([a-z0-9]+)/aws4_request", auth)
        if not m:
            return self._error("MissingAuthenticationTokenException", "request is not signed (SigV4)", 403)
        if m.group(1) != self.access_key_id:
            return self._error("UnrecognizedClientException", "The security token included in the request is invalid",
                               403)
        if m.group(3) != "pricing":
            return self._error("InvalidSignatureException", f"signed for service {m.group(3)!r}, not 'pricing'", 403)
        try:
            req = json.loads(body or b"{}")
        except ValueError:
            return self._error("SerializationException", "body is not JSON")
        if req.get("ServiceCode") != "AmazonEC2":
            return self._error("InvalidParameterException", f"unsupported ServiceCode {req.get('ServiceCode')!r}")
        if req.get("FormatVersion", "aws_v1") != "aws_v1":
            return self._error("InvalidParameterException", "FormatVersion must be aws_v1")
        size = int(req.get("MaxResults", 100))
        if not 1 <= size <= 100:
            return self._error("InvalidParameterException", "MaxResults must be in [1, 100]")
        filters = req.get("Filters") or []
        for f in filters:
            if f.get("Type") != "TERM_MATCH" or not f.get("Field"):
                return self._error("InvalidParameterException", f"unsupported filter {f!r}")
        hits = [p for p in self.products if all(self._matches(p, f["Field"], f.get("Value", "")) for f in filters)]
        start = int(req.get("NextToken") or 0) if str(req.get("NextToken") or "0").isdigit() else -1
        if start < 0:
            return self._error("InvalidNextTokenException", "invalid NextToken")
        page = hits[start:start + size]
        out: dict[str, Any] = {"FormatVersion": "aws_v1", "PriceList": [json.dumps(p) for p in page]}
        if start + size < len(hits):
            out["NextToken"] = str(start + size)
        return 200, out, {"Content-Type": "application/x-amz-json-1.1"}

    @staticmethod
    def _matches(product: dict[str, Any], fieldname: str, value: str) -> bool:
        p = product["product"]
        if fieldname == "productFamily":
            return str(p.get("productFamily", "")).lower() == value.lower()
        attrs = {k.lower(): v for k, v in p["attributes"].items()}
        return str(attrs.get(fieldname.lower(), "")).lower() == value.lower()


# --------------------------------------------------------------------------- #
# Azure Retail Prices
# --------------------------------------------------------------------------- #

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

    def answer(self, method, path, query, headers, body, *, raw_query):
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


# --------------------------------------------------------------------------- #
# GCE Cloud Billing Catalog
# --------------------------------------------------------------------------- #

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

    def answer(self, method, path, query, headers, body, *, raw_query):
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


# --------------------------------------------------------------------------- #
# Alibaba Cloud ECS (DescribeInstanceTypes, DescribePrice)
# --------------------------------------------------------------------------- #

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

    def _error(self, status: int, code: str, message: str) -> tuple[int, Any, dict[str, str]]:
        return status, {"RequestId": str(uuid.uuid4()).upper(), "HostId": "ecs.aliyuncs.com", "Code": code,
                        "Message": message, "Recommend": "https://api.aliyun.com/troubleshoot"}, {}

    def answer(self, method, path, query, headers, body, *, raw_query):
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

    def _describe_instance_types(self, params: Mapping[str, str]) -> tuple[int, Any, dict[str, str]]:
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

    def _describe_price(self, params: Mapping[str, str]) -> tuple[int, Any, dict[str, str]]:
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


# --------------------------------------------------------------------------- #
# Vast.ai offer search
# --------------------------------------------------------------------------- #

def vast_offer(offer_id: int, gpu_name: str, num_gpus: int, gpu_ram_mb: int, dph_total: float, min_bid: float,
               *, cpu_cores_effective: float = 16.0, cpu_ram_mb: int = 64_000, reliability: float = 0.99,
               geolocation: str = "Texas, US", verified: bool = True, rentable: bool = True) -> dict[str, Any]:
    """One offer in the shape of Vast.ai's search results (a subset of its ~80 fields)."""
    return {"id": offer_id, "ask_contract_id": offer_id, "machine_id": 10_000 + offer_id, "gpu_name": gpu_name,
            "num_gpus": num_gpus, "gpu_ram": gpu_ram_mb, "gpu_total_ram": gpu_ram_mb * num_gpus,
            "cpu_cores": int(cpu_cores_effective * 2), "cpu_cores_effective": cpu_cores_effective,
            "cpu_ram": cpu_ram_mb, "cpu_arch": "amd64", "dph_base": round(dph_total * 0.98, 6),
            "dph_total": dph_total, "min_bid": min_bid, "reliability": reliability, "reliability2": reliability,
            "geolocation": geolocation, "verification": "verified" if verified else "unverified",
            "verified": verified, "rentable": rentable, "rented": False, "external": False,
            "disk_space": 500.0, "inet_down": 900.0, "inet_up": 800.0, "gpu_mem_bw": 3000.0,
            "total_flops": 80.0, "cuda_max_good": 12.4, "is_bid": False}


class VastSearchEmulator(_Emulator):
    """A TEST FIXTURE emulating Vast.ai's ``/api/v0/bundles/`` offer search (see module doc)."""

    name = "vast-search"
    _OPS = {"eq": lambda a, b: a == b, "neq": lambda a, b: a != b, "gt": lambda a, b: a > b,
            "gte": lambda a, b: a >= b, "lt": lambda a, b: a < b, "lte": lambda a, b: a <= b,
            "in": lambda a, b: a in b, "notin": lambda a, b: a not in b}

    def __init__(self, offers: Sequence[dict[str, Any]] = (), api_key: str | None = "test-vast-key") -> None:
        super().__init__()
        self.offers = list(offers)
        self.api_key = api_key

    def answer(self, method, path, query, headers, body, *, raw_query):
        if path.rstrip("/") != "/api/v0/bundles":
            return 404, {"success": False, "error": "not_found", "msg": f"{method} {path}"}, {}
        if self.api_key is not None:
            auth = headers.get("authorization", "")
            key = auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else _one(query, "api_key")
            if key != self.api_key:
                return 401, {"success": False, "error": "invalid_api_key", "msg": "Invalid user key"}, {}
        try:
            if method == "POST":
                q = json.loads(body or b"{}")
            else:
                q = json.loads(_one(query, "q") or "{}")
        except ValueError:
            return 400, {"success": False, "error": "invalid_request", "msg": "query is not JSON"}, {}
        kind = q.pop("type", "on-demand")
        if kind not in ("on-demand", "bid", "reserved"):
            return 400, {"success": False, "error": "invalid_request", "msg": f"type {kind!r}"}, {}
        order = q.pop("order", [])
        limit = q.pop("limit", None)
        q.pop("allocated_storage", None)
        q.pop("disable_bundling", None)
        hits = []
        for offer in self.offers:
            ok = True
            for fname, cond in q.items():
                if not isinstance(cond, dict):
                    return 400, {"success": False, "error": "invalid_request", "msg": f"bad filter {fname!r}"}, {}
                for op, want in cond.items():
                    fn = self._OPS.get(op)
                    if fn is None:
                        return 400, {"success": False, "error": "invalid_request", "msg": f"bad operator {op!r}"}, {}
                    if fname not in offer or not fn(offer[fname], want):
                        ok = False
            if ok:
                hits.append({**offer, "is_bid": kind == "bid"})
        for fname, direction in reversed(order or []):
            hits.sort(key=lambda o: o.get(fname, 0), reverse=direction == "desc")
        if limit is not None:
            hits = hits[:int(limit)]
        return 200, {"offers": hits}, {}
