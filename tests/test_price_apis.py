"""The live price adapters (``providers/<name>/prices.py``) against the wire-level price-API
emulators of ``flowmesh_sdk.testing.price_apis`` on 127.0.0.1 (TEST FIXTURES standing in
for the real services, which tests never contact): request shapes, paging, filters,
credentials and error mapping, and ``catalog.refresh`` writing the user cache."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from flowmesh_sdk.catalog import Catalog, CatalogRow, refresh
from flowmesh_sdk.errors import AuthError, FlowMeshError, ProviderUnavailableError, SpecError, ThrottledError
from flowmesh_sdk.testing.price_apis import (GCE_SERVICE_ID, AlibabaEcsEmulator, AlibabaType, AwsPricingEmulator,
                                             AzureRetailPricesEmulator, GceBillingCatalogEmulator,
                                             VastSearchEmulator, gce_sku, vast_offer)

TODAY = dt.date(2026, 11, 30)


def _shipped(provider: str) -> list[CatalogRow]:
    return list(Catalog.load([provider], use_cache=False, warn=False).rows)


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch, no_real_cloud: None) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")


# --------------------------------------------------------------------------- #
# AWS Price List Query API (boto3 'pricing' client)
# --------------------------------------------------------------------------- #

async def test_ec2_adapter_reads_linux_on_demand_prices_over_pages(aws_env: None) -> None:
    from flowmesh_providers.ec2.prices import fetch_prices

    shipped = _shipped("ec2")
    with AwsPricingEmulator(shipped) as emu:
        rows = await fetch_prices(endpoint=emu.url, regions=("us-east-1",), shapes=shipped)
        reqs = list(emu.requests)
    assert len(rows) == len(shipped) == 148
    want = {r.instance_type: r for r in shipped}
    for r in rows:   # the Linux/Shared/Used price, never a decoy (Windows, dedicated, reservation)
        assert r.on_demand_per_hour == pytest.approx(want[r.instance_type].on_demand_per_hour)
        assert (r.cpus, r.memory_gb, r.gpus) == (want[r.instance_type].cpus, want[r.instance_type].memory_gb,
                                                 want[r.instance_type].gpus)
        assert r.spot_per_hour is None and r.source.startswith("AWS Price List Query API")
    assert len(reqs) == 2                                  # 148 products, 100 a page
    first, second = (json.loads(q.body) for q in reqs)
    assert reqs[0].headers["x-amz-target"] == "AWSPriceListService.GetProducts"
    assert reqs[0].headers["content-type"].startswith("application/x-amz-json-1.1")
    assert reqs[0].headers["authorization"] == "AWS4-HMAC-SHA256 ..."     # recorded without the secret
    assert first["ServiceCode"] == "AmazonEC2" and first["MaxResults"] == 100 and "NextToken" not in first
    fields = {f["Field"]: f["Value"] for f in first["Filters"]}
    assert fields == {"regionCode": "us-east-1", "operatingSystem": "Linux", "tenancy": "Shared",
                      "preInstalledSw": "NA", "capacitystatus": "Used"}
    assert second["NextToken"] == "100"


async def test_ec2_adapter_maps_auth_and_throttling(aws_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from flowmesh_providers.ec2.prices import fetch_prices

    rows = _shipped("ec2")[:3]
    with AwsPricingEmulator(rows, access_key_id="someone-else") as emu:
        with pytest.raises(AuthError, match="UnrecognizedClientException"):
            await fetch_prices(endpoint=emu.url, shapes=rows)
    with AwsPricingEmulator(rows) as emu:
        emu.fail_next(400, {"__type": "ThrottlingException", "message": "Rate exceeded"},
                      headers={"Content-Type": "application/x-amz-json-1.1"})
        with pytest.raises(ThrottledError, match="ThrottlingException"):
            await fetch_prices(endpoint=emu.url, shapes=rows)
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with AwsPricingEmulator(rows) as emu:
        with pytest.raises(AuthError, match="credentials"):
            await fetch_prices(endpoint=emu.url, shapes=rows)
        assert emu.requests == []                          # nothing unsigned went out


# --------------------------------------------------------------------------- #
# Azure Retail Prices
# --------------------------------------------------------------------------- #

async def test_azure_adapter_filters_meters_and_follows_next_page_links() -> None:
    from flowmesh_providers.azure.prices import fetch_prices

    shipped = _shipped("azure")
    spot = {r.instance_type: round(r.on_demand_per_hour * 0.37, 6) for r in shipped}
    with AzureRetailPricesEmulator([CatalogRow(**{**_fields(r), "spot_per_hour": spot[r.instance_type]})
                                    for r in shipped]) as emu:
        rows = await fetch_prices(endpoint=emu.url, regions=("eastus",), shapes=shipped)
        reqs = list(emu.requests)
    eastus = {r.instance_type: r for r in shipped if r.region == "eastus"}
    assert {r.instance_type for r in rows} == set(eastus)
    for r in rows:   # Linux pay-as-you-go, and the " Spot" meter -- never Windows or Low Priority
        assert r.on_demand_per_hour == pytest.approx(eastus[r.instance_type].on_demand_per_hour)
        assert r.spot_per_hour == pytest.approx(spot[r.instance_type])
        assert r.region == "eastus" and r.cpus == eastus[r.instance_type].cpus
    assert len(reqs) >= 3 and all(q.path == "/api/retail/prices" for q in reqs)   # paged by NextPageLink
    assert reqs[0].query["$filter"] == ["serviceName eq 'Virtual Machines' and armRegionName eq 'eastus' "
                                        "and priceType eq 'Consumption'"]
    assert reqs[0].query["api-version"] == ["2023-01-01-preview"]
    assert all("$skip" in q.query for q in reqs[1:])


def _fields(row: CatalogRow) -> dict:
    return {f: getattr(row, f) for f in row.__dataclass_fields__}


async def test_azure_adapter_errors() -> None:
    from flowmesh_providers.azure.prices import fetch_prices

    shipped = _shipped("azure")[:2]
    with AzureRetailPricesEmulator(shipped) as emu:
        emu.fail_next(429, {"Error": {"Code": "TooManyRequests", "Message": "slow down"}},
                      headers={"Retry-After": "7"})
        with pytest.raises(ThrottledError) as info:
            await fetch_prices(endpoint=emu.url, regions=("eastus",), shapes=shipped)
        assert info.value.retry_after_s == 7.0
        emu.fail_next(503, {"Error": {"Code": "ServiceUnavailable", "Message": "down"}})
        with pytest.raises(ProviderUnavailableError):
            await fetch_prices(endpoint=emu.url, regions=("eastus",), shapes=shipped)
        # a NextPageLink to another host is refused, not followed
        emu.fail_next(200, {"Items": [], "NextPageLink": "https://elsewhere.example/api/retail/prices?$skip=100"})
        with pytest.raises(FlowMeshError, match="leaves"):
            await fetch_prices(endpoint=emu.url, regions=("eastus",), shapes=shipped)


# --------------------------------------------------------------------------- #
# GCE Cloud Billing Catalog
# --------------------------------------------------------------------------- #

def _gce_skus() -> list[dict]:
    both = ["us-central1", "us-east1"]
    return [
        gce_sku("N2 Instance Core running in Americas", 0.031611, both),
        gce_sku("N2 Instance Ram running in Americas", 0.004237, both, unit="GiBy.h", group="RAM"),
        gce_sku("Spot Preemptible N2 Instance Core running in Americas", 0.007653, both, usage="Preemptible"),
        gce_sku("Spot Preemptible N2 Instance Ram running in Americas", 0.001026, both, unit="GiBy.h",
                group="RAM", usage="Preemptible"),
        gce_sku("N2 Instance Core running in Americas", 0.0199, both, usage="Commit1Yr"),   # not on-demand
        gce_sku("E2 Instance Core running in Americas", 0.021811, both),
        gce_sku("E2 Instance Ram running in Americas", 0.002923, both, unit="GiBy.h", group="RAM"),
        gce_sku("A2 Instance Core running in Americas", 0.031611, ["us-central1"]),
        gce_sku("A2 Instance Ram running in Americas", 0.004237, ["us-central1"], unit="GiBy.h", group="RAM"),
        gce_sku("Nvidia Tesla A100 GPU running in Americas", 2.933908, ["us-central1"], group="GPU", family="GPU"),
        gce_sku("Storage PD Capacity in Iowa", 0.04, ["us-central1"], unit="GiBy.mo", family="Storage"),
    ]


async def test_gce_adapter_prices_machine_types_from_components() -> None:
    from flowmesh_providers.gce.prices import fetch_prices

    shapes = [r for r in _shipped("gce") if r.region == "us-central1" and r.instance_type in
              ("n2-standard-8", "e2-standard-8", "a2-highgpu-1g", "c3-standard-8-lssd", "g4-standard-6")]
    with GceBillingCatalogEmulator(_gce_skus(), api_key="k-123", page_size=3) as emu:
        rows = await fetch_prices(endpoint=emu.url, regions=("us-central1",), shapes=shapes, api_key="k-123")
        reqs = list(emu.requests)
    by = {r.instance_type: r for r in rows}
    assert by["n2-standard-8"].on_demand_per_hour == pytest.approx(8 * 0.031611 + 32 * 0.004237)
    assert by["n2-standard-8"].spot_per_hour == pytest.approx(8 * 0.007653 + 32 * 0.001026)
    # the shipped snapshot (a third-party compilation of the same catalog) agrees
    assert by["n2-standard-8"].on_demand_per_hour == pytest.approx(
        next(s for s in shapes if s.instance_type == "n2-standard-8").on_demand_per_hour)
    a2 = next(s for s in shapes if s.instance_type == "a2-highgpu-1g")
    assert by["a2-highgpu-1g"].on_demand_per_hour == pytest.approx(
        a2.cpus * 0.031611 + a2.memory_gb * 0.004237 + 2.933908)
    assert by["c3-standard-8-lssd"].on_demand_per_hour is None     # bundled local SSD: not priced, not guessed
    assert by["g4-standard-6"].on_demand_per_hour is None
    assert all(q.path == f"/v1/services/{GCE_SERVICE_ID}/skus" for q in reqs)
    assert len(reqs) == 4 and reqs[1].query["pageToken"] == ["3"]  # 11 SKUs, 3 a page (pageSize is a cap)
    assert reqs[0].query["currencyCode"] == ["USD"]


async def test_gce_adapter_needs_a_valid_key(monkeypatch: pytest.MonkeyPatch) -> None:
    from flowmesh_providers.gce.prices import fetch_prices

    for var in ("FLOWMESH_GCE_API_KEY", "GOOGLE_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    with GceBillingCatalogEmulator(_gce_skus(), api_key="k-123") as emu:
        with pytest.raises(AuthError, match="FLOWMESH_GCE_API_KEY"):
            await fetch_prices(endpoint=emu.url, shapes=_shipped("gce")[:2])
        assert emu.requests == []
        monkeypatch.setenv("GOOGLE_API_KEY", "wrong-key")
        with pytest.raises(AuthError) as info:
            await fetch_prices(endpoint=emu.url, shapes=_shipped("gce")[:2])
        assert "wrong-key" not in str(info.value)


# --------------------------------------------------------------------------- #
# Alibaba ECS through the real SDK
# --------------------------------------------------------------------------- #

ALI_TYPES = [AlibabaType("ecs.c8a.2xlarge", 8, 16), AlibabaType("ecs.c8i.2xlarge", 8, 16),
             AlibabaType("ecs.re6.52xlarge", 208, 3072), AlibabaType("ecs.gn7i-c8g1.2xlarge", 8, 30, gpus=1,
                                                                     gpu_spec="NVIDIA A10", gpu_memory_gb=24)]
ALI_PRICES = {("cn-hangzhou", "ecs.c8a.2xlarge"): 0.2870, ("cn-hangzhou", "ecs.re6.52xlarge"): 19.5,
              ("cn-hangzhou", "ecs.gn7i-c8g1.2xlarge"): 1.45}


@pytest.fixture
def ali_env(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("alibabacloud_ecs20140526")
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_ID", "test-akid")
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_SECRET", "test-secret")


async def test_alibaba_adapter_describes_and_prices_types(ali_env: None) -> None:
    from flowmesh_providers.alibaba.prices import fetch_prices

    shapes = _shipped("alibaba") + [CatalogRow(provider="alibaba", region="unknown",
                                               instance_type="ecs.gn7i-c8g1.2xlarge", cpus=8, memory_gb=30,
                                               on_demand_per_hour=None)]
    with AlibabaEcsEmulator(ALI_TYPES, ALI_PRICES) as emu:
        rows = await fetch_prices(endpoint=emu.url, regions=("cn-hangzhou",), shapes=shapes)
        actions = [q.headers.get("x-acs-action") for q in emu.requests]
    by = {r.instance_type: r for r in rows}
    assert set(by) == {"ecs.c8a.2xlarge", "ecs.re6.52xlarge", "ecs.gn7i-c8g1.2xlarge"}   # c8i: not sold there
    assert by["ecs.c8a.2xlarge"].on_demand_per_hour == 0.2870 and by["ecs.c8a.2xlarge"].region == "cn-hangzhou"
    assert (by["ecs.re6.52xlarge"].cpus, by["ecs.re6.52xlarge"].memory_gb) == (208, 3072)
    gpu = by["ecs.gn7i-c8g1.2xlarge"]
    assert (gpu.gpus, gpu.gpu_name, gpu.gpu_memory_gb) == (1, "NVIDIA A10", 24)
    assert actions.count("DescribeInstanceTypes") == 1 and actions.count("DescribePrice") == 4


async def test_alibaba_adapter_errors(ali_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from flowmesh_providers.alibaba.prices import fetch_prices

    shapes = _shipped("alibaba")
    with AlibabaEcsEmulator(ALI_TYPES, ALI_PRICES, access_key_secret="another-secret") as emu:
        with pytest.raises(AuthError, match="IncompleteSignature"):        # the emulator checks the signature
            await fetch_prices(endpoint=emu.url, regions=("cn-hangzhou",), shapes=shapes)
    with AlibabaEcsEmulator(ALI_TYPES, ALI_PRICES, currency="CNY") as emu:
        with pytest.raises(SpecError, match="CNY"):
            await fetch_prices(endpoint=emu.url, regions=("cn-hangzhou",), shapes=shapes)
    with AlibabaEcsEmulator(ALI_TYPES, ALI_PRICES) as emu:
        emu.fail_next(400, {"Code": "Throttling.User", "Message": "Request was denied due to user flow control."})
        with pytest.raises(ThrottledError, match="Throttling.User"):
            await fetch_prices(endpoint=emu.url, regions=("cn-hangzhou",), shapes=shapes)
    monkeypatch.delenv("ALIBABA_CLOUD_ACCESS_KEY_SECRET")
    with pytest.raises(AuthError, match="ALIBABA_CLOUD_ACCESS_KEY_SECRET"):
        await fetch_prices(endpoint="http://127.0.0.1:9", regions=("cn-hangzhou",), shapes=shapes)


# --------------------------------------------------------------------------- #
# Vast.ai offer search
# --------------------------------------------------------------------------- #

VAST_OFFERS = [
    vast_offer(101, "RTX 4090", 1, 24564, 0.35, 0.18, reliability=0.995, geolocation="Texas, US"),
    vast_offer(102, "H100 SXM", 8, 81559, 16.2, 9.1, cpu_cores_effective=96, cpu_ram_mb=1_031_000,
               reliability=0.999, geolocation="Quebec, CA"),
    vast_offer(103, "RTX 3090", 2, 24576, 0.40, 0.21, geolocation="Romania, RO", verified=False),   # filtered
    vast_offer(104, "A100 SXM4", 1, 81920, 1.10, 0.55, reliability=0.97, geolocation="Oregon, US"),
]


async def test_vast_adapter_reads_offers_and_min_bids(monkeypatch: pytest.MonkeyPatch) -> None:
    from flowmesh_providers.vast.prices import fetch_prices

    monkeypatch.setenv("VAST_API_KEY", "test-vast-key")
    with VastSearchEmulator(VAST_OFFERS) as emu:
        rows = await fetch_prices(endpoint=emu.url)
        us = await fetch_prices(endpoint=emu.url, regions=("US",))
        reqs = list(emu.requests)
    by = {r.zone: r for r in rows}
    assert set(by) == {"offer-101", "offer-102", "offer-104"}       # the unverified host is not rentable here
    h100 = by["offer-102"]
    assert (h100.instance_type, h100.gpus, h100.gpu_name, h100.region) == ("8x-H100_SXM", 8, "H100 SXM", "Quebec, CA")
    assert h100.gpu_memory_gb == pytest.approx(8 * 81559 / 1024, abs=0.01)
    assert (h100.on_demand_per_hour, h100.spot_per_hour, h100.reliability, h100.available) == (16.2, 9.1, 0.999, 1)
    assert h100.cpus == 96
    assert {r.zone for r in us} == {"offer-101", "offer-104"}
    bodies = [json.loads(q.body) for q in reqs[:2]]
    assert [b["type"] for b in bodies] == ["on-demand", "bid"]
    assert bodies[0]["verified"] == {"eq": True} and bodies[0]["rentable"] == {"eq": True}
    assert reqs[0].path == "/api/v0/bundles/" and reqs[0].method == "POST"
    assert reqs[0].headers["authorization"] == "Bearer ..."


async def test_vast_adapter_rejects_a_bad_key(monkeypatch: pytest.MonkeyPatch) -> None:
    from flowmesh_providers.vast.prices import fetch_prices

    monkeypatch.setenv("VAST_API_KEY", "nope")
    with VastSearchEmulator(VAST_OFFERS) as emu:
        with pytest.raises(AuthError, match="401"):
            await fetch_prices(endpoint=emu.url)


# --------------------------------------------------------------------------- #
# refresh: entry point -> adapter -> dated cache file the catalog then prefers
# --------------------------------------------------------------------------- #

async def test_refresh_writes_a_dated_cache_the_catalog_prefers(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VAST_API_KEY", "test-vast-key")
    with VastSearchEmulator(VAST_OFFERS) as emu:
        result = await refresh("vast", endpoint=emu.url, cache=tmp_path)
    assert result.path == tmp_path / "vast.csv" and result.rows == 3 and result.priced == 3
    cat = Catalog.load(["vast"], cache=tmp_path, warn=False)
    assert cat.sources[0].origin == "cache" and not cat.sources[0].stale
    assert {r.zone for r in cat.rows} == {"offer-101", "offer-102", "offer-104"}


async def test_refresh_with_nothing_returned_keeps_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VAST_API_KEY", "test-vast-key")
    with VastSearchEmulator([]) as emu:
        with pytest.raises(FlowMeshError, match="returned no instance prices"):
            await refresh("vast", endpoint=emu.url, cache=tmp_path)
    assert not (tmp_path / "vast.csv").exists()
    with pytest.raises(SpecError, match="no price adapter"):
        await refresh("oracle", cache=tmp_path)


async def test_refresh_retries_throttling_and_outages_from_outside(tmp_path: Path) -> None:
    shipped = _shipped("azure")
    with AzureRetailPricesEmulator(shipped) as emu:
        emu.fail_next(429, {"Error": {"Code": "TooManyRequests", "Message": "slow down"}},
                      headers={"Retry-After": "0"})
        emu.fail_next(503, {"Error": {"Code": "ServiceUnavailable", "Message": "down"}})
        result = await refresh("azure", endpoint=emu.url, regions=("westus2",), cache=tmp_path, backoff_s=0.01)
        assert result.rows == sum(r.region == "westus2" for r in shipped) and result.regions == ("westus2",)
        statuses = len(emu.requests)
        assert statuses >= 4                    # two refused, then the pages of the third try
        emu.fail_next(503, {"Error": {"Code": "ServiceUnavailable", "Message": "down"}}, times=3)
        with pytest.raises(ProviderUnavailableError):
            await refresh("azure", endpoint=emu.url, regions=("westus2",), cache=tmp_path, attempts=3,
                          backoff_s=0.01)
        assert len(emu.requests) == statuses + 3    # exactly three tries, no hidden retries inside
        emu.fail_next(403, {"Error": {"Code": "Forbidden", "Message": "no"}})
        with pytest.raises(AuthError):          # not retried
            await refresh("azure", endpoint=emu.url, regions=("westus2",), cache=tmp_path, backoff_s=0.01)
        assert len(emu.requests) == statuses + 4
