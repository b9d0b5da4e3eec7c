"""TEST FIXTURES emulating the five providers' price APIs on 127.0.0.1, at the wire level,
for the live price adapters (``providers/<name>/prices.py``) and ``flowmesh catalog
refresh --endpoint``.  None of them is the real service; each speaks the request and
response shapes of the real API for the calls the adapters make, as documented
(sources below, read 2026-11-30), and rejects requests the real API would reject
(wrong target, missing credentials, unknown parameters, bad signatures), so an adapter
that sends the wrong request fails here too.

One module per price API, each naming the real API's wire format and its source:
``aws_pricing`` (:class:`AwsPricingEmulator`, the Price List Query API ``GetProducts``),
``azure_retail`` (:class:`AzureRetailPricesEmulator`, the Retail Prices REST API),
``gce_billing`` (:class:`GceBillingCatalogEmulator`, the Cloud Billing Catalog API),
``alibaba_ecs`` (:class:`AlibabaEcsEmulator`, ECS ``DescribeInstanceTypes`` and
``DescribePrice`` with a verified ACS3 signature) and ``vast_search``
(:class:`VastSearchEmulator`, Vast.ai's offer search).

Each emulator is an :class:`~flowmesh_sdk.testing.httpserver.HttpServer` (aiohttp on a
loop of its own in a daemon thread, so blocking clients such as boto3 and async ones both
work), records every request (``.requests``; credentials
are kept out of the record) and can inject faults (:meth:`_Emulator.fail_next`).
Use as a context manager; ``.url`` is the base URL.
"""

from __future__ import annotations

from .alibaba_ecs import AlibabaEcsEmulator, AlibabaType, acs3_signature
from .aws_pricing import AwsPricingEmulator, aws_product
from .azure_retail import AzureRetailPricesEmulator, azure_items
from .base import Answer, Recorded
from .gce_billing import GCE_SERVICE_ID, GceBillingCatalogEmulator, gce_sku
from .vast_search import VastSearchEmulator, vast_offer

__all__ = ["AlibabaEcsEmulator", "AwsPricingEmulator", "AzureRetailPricesEmulator", "GceBillingCatalogEmulator",
           "Recorded", "VastSearchEmulator", "GCE_SERVICE_ID",
           # the builders of the documents the emulators serve, importable from here as before the split
           "AlibabaType", "Answer", "acs3_signature", "aws_product", "azure_items", "gce_sku", "vast_offer"]
