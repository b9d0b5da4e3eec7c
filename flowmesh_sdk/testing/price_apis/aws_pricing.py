""":class:`AwsPricingEmulator` -- a TEST FIXTURE emulating the AWS Price List Query API
``GetProducts`` (AWS JSON 1.1: ``POST /`` with ``X-Amz-Target:
AWSPriceListService.GetProducts``, ``Content-Type: application/x-amz-json-1.1``, a
SigV4 ``Authorization`` for service ``pricing``).  Request ``{ServiceCode, Filters:
[{Type: TERM_MATCH, Field, Value}], FormatVersion, MaxResults (1-100), NextToken}``;
response ``{FormatVersion: "aws_v1", PriceList: [JSON string], NextToken}``.  Source:
AWS Price List Service API Reference, GetProducts
(docs.aws.amazon.com/aws-cost-management/latest/APIReference/API_pricing_GetProducts.html).
moto 5.2 has no ``pricing`` backend, hence this emulator.

A TEST FIXTURE: see :mod:`flowmesh_sdk.testing.price_apis`."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ...catalog.records import CatalogRow
from .base import Answer, _Emulator

__all__ = ["AwsPricingEmulator", "aws_product"]

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
             "processorArchitecture": "64-bit", "locationType": "AWS Region",
             "usagetype": f"BoxUsage:{row.instance_type}", "operation": "RunInstances"}
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
    def _error(kind: str, message: str, status: int = 400) -> Answer:
        return status, {"__type": kind, "message": message}, {"Content-Type": "application/x-amz-json-1.1"}

    def answer(self, method: str, path: str, query: Mapping[str, list[str]], headers: Mapping[str, str],
               body: bytes, *, raw_query: str) -> Answer:
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
