"""The ec2 provider against the real boto3 and moto's EC2 in server mode on 127.0.0.1,
with a fault-injecting proxy (a test fixture) in front of moto for EC2 errors, delays
and call counts.  Nothing here talks to anything outside 127.0.0.1: every client is given
an endpoint_url, dummy keys are passed to the objects the fixtures build (never put in
os.environ), and IMDS is disabled."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid

import pytest

from flowmesh_sdk.errors import (AuthError, CapacityError, FlowMeshError, NotFoundError, ProviderError,
                                 ProviderUnavailableError, QuotaError, SpecError, ThrottledError)
from flowmesh_sdk.provider import TAG_FLEET, TAG_POOL, TAG_REQUEST, LaunchRequest, ProviderState
from flowmesh_sdk.catalog import Catalog
from flowmesh_sdk.fleet import Fleet
from flowmesh_sdk.specs import InstanceSpec, Offer, PoolSpec
from flowmesh_sdk.tags import PlainTags

boto3 = pytest.importorskip("boto3")
pytest.importorskip("moto")

from botocore.exceptions import ClientError, NoCredentialsError  # noqa: E402

from flowmesh_providers.ec2 import DEFAULT_INSTANCE_TYPES, ERROR_TABLE, Ec2Provider  # noqa: E402
from flowmesh_providers.ec2.client import DOC_THROTTLING, RATES  # noqa: E402
from flowmesh_sdk.testing.ec2fault import STATUS, Ec2FaultProxy  # noqa: E402
from flowmesh_sdk.testing.moto import MotoEc2  # noqa: E402

REGION = "us-east-1"
@pytest.fixture(autouse=True)
def _aws_env(no_real_cloud) -> None:
    """No real credentials, no IMDS, no shared config: nothing can reach AWS."""


@pytest.fixture(scope="module")
def moto_ec2():
    with MotoEc2() as m:
        yield m


@pytest.fixture(scope="module")
def proxy(moto_ec2):
    with Ec2FaultProxy(moto_ec2.endpoint_url) as p:
        yield p


@pytest.fixture(autouse=True)
def _clean_proxy(request):
    yield
    if "proxy" in request.fixturenames:
        request.getfixturevalue("proxy").clear()


@pytest.fixture(scope="module")
async def ec2(moto_ec2, proxy):
    """One provider for the module (its instance-type cache is filled once)."""
    prov = moto_ec2.provider(endpoint_url=proxy.endpoint_url)
    yield prov
    await prov.close()


def fleet_tags(pool: str = "p1") -> dict[str, str]:
    return {TAG_FLEET: f"t-{uuid.uuid4().hex[:8]}", TAG_POOL: pool, "flowmesh:owner": "tests"}


CATALOG = Catalog.load(["ec2"], use_cache=False, warn=False)   # the shipped snapshot: the one source of prices


def catalog_price(instance_type: str, region: str = REGION) -> float:
    row = next(r for r in CATALOG.rows if (r.region, r.instance_type) == (region, instance_type))
    assert row.on_demand_per_hour is not None
    return row.on_demand_per_hour


async def offer_of(prov: Ec2Provider, instance_type: str, *, spot: bool = False) -> Offer:
    """The provider's shape of ``instance_type``, priced from the catalog as the fleet does."""
    spec = InstanceSpec(cpus=1, memory_gb=0.5)
    for o in await prov.offers(spec):
        if o.instance_type == instance_type:
            assert o.price_per_hour is None
            return Offer(**{**{f: getattr(o, f) for f in o.__dataclass_fields__}, "spot": spot,
                            "price_per_hour": catalog_price(instance_type)})
    raise AssertionError(f"no offer for {instance_type}")


def request(offer: Offer, count: int, tags: dict[str, str], request_id: str | None = None) -> LaunchRequest:
    return LaunchRequest(offer=offer, spec=InstanceSpec(cpus=offer.cpus, memory_gb=offer.memory_gb,
                                                        arch=offer.arch),
                         count=count, request_id=request_id or f"fm-{uuid.uuid4().hex[:16]}", tags=tags)


# ---- packaging, capabilities, prices ------------------------------------------------------
def test_import_flowmesh_sdk_imports_no_cloud_sdk():
    code = ("import sys, flowmesh_sdk, flowmesh_providers.ec2; "
            "bad = [m for m in ('boto3', 'botocore', 'moto') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_entry_point_and_capabilities():
    from flowmesh_sdk.provider import ENTRY_POINT_GROUP, provider_class
    from importlib import metadata
    eps = {ep.name: ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}
    assert eps["ec2"].load().provider == "flowmesh_providers.ec2.provider:Ec2Provider"
    assert provider_class("ec2") is provider_class("aws") is Ec2Provider
    caps = Ec2Provider.capabilities
    assert (caps.spot, caps.gpus, caps.remote, caps.max_batch) == (True, True, True, 1000)
    assert caps.tags == PlainTags(max_key=128, max_value=256) and not caps.free and caps.nested_containers
    rates = {(r.api, r.per_instance): (r.burst, r.rate_per_s) for r in RATES}
    assert rates[("launch", False)] == (5, 2.0)        # RunInstances request bucket
    assert rates[("launch", True)] == (1000, 2.0)      # RunInstances resource bucket
    assert rates[("terminate", True)] == (1000, 20.0)
    assert caps.rates == RATES and DOC_THROTTLING.startswith("https://docs.aws.amazon.com/")


def test_the_providers_one_price_table_is_the_catalogs_snapshot():
    import flowmesh_providers.ec2 as pkg
    from importlib import resources

    from flowmesh_providers.ec2.descriptor import DESCRIPTOR
    assert [f.name for f in resources.files(pkg).iterdir() if f.name.endswith(".csv")] == ["catalog.csv"]
    assert DESCRIPTOR.snapshot == "flowmesh_providers.ec2:catalog.csv"
    assert not hasattr(pkg, "PriceTable")
    row = next(r for r in CATALOG.rows if (r.region, r.instance_type) == (REGION, "c5.2xlarge"))
    assert row.on_demand_per_hour == 0.34 and row.spot_per_hour is None
    assert "karpenter-provider-aws" in row.source and row.fetched_at == "2026-07-20"


def test_constructor_validation_and_repr_hides_secrets():
    p = Ec2Provider(regions="eu-west-1", image_id="ami-0123", session_kwargs={
        "aws_access_key_id": "AKIAEXAMPLE", "aws_secret_access_key": "s3cr3t-value"}, user_data="TOKEN=abc")
    assert p.regions == ("eu-west-1",)
    assert "s3cr3t" not in repr(p) and "AKIA" not in repr(p) and "TOKEN" not in repr(p)
    with pytest.raises(SpecError, match="ec2.regions"):
        Ec2Provider(regions=["not a region"])
    with pytest.raises(SpecError, match="ec2.max_workers"):
        Ec2Provider(max_workers=0)
    with pytest.raises(SpecError, match="ec2.instance_types"):
        Ec2Provider(instance_types=["C5 large"])
    assert Ec2Provider(instance_types="c7i.*").instance_types == ("c7i.*",)
    assert Ec2Provider().instance_types == DEFAULT_INSTANCE_TYPES


def test_region_defaults_from_environment(monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-central-1")
    assert Ec2Provider().regions == ("eu-central-1",)
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    monkeypatch.setenv("AWS_REGION", "ap-south-1")
    assert Ec2Provider().regions == ("ap-south-1",)
    monkeypatch.delenv("AWS_REGION")
    assert Ec2Provider().regions == ("us-east-1",)


# ---- offers ----------------------------------------------------------------------------
async def test_offers_for_8_cpus_16_gb_are_shapes_without_prices(ec2, proxy):
    before = proxy.calls["DescribeInstanceTypes"]
    offers = await ec2.offers(InstanceSpec(cpus=8, memory_gb=16))
    by_type = {o.instance_type: o for o in offers}
    assert {"c5.2xlarge", "c6i.2xlarge", "c6a.2xlarge", "c7i.2xlarge", "m6i.2xlarge"} <= set(by_type)
    c5 = by_type["c5.2xlarge"]
    assert (c5.provider, c5.region, c5.cpus, c5.memory_gb, c5.gpus, c5.zone, c5.arch) == \
           ("ec2", REGION, 8, 16.0, 0, None, "x86_64")
    assert all(o.price_per_hour is None for o in offers)          # shapes: the catalog prices them
    assert not any(o.spot for o in offers)                        # on-demand shapes; the fleet adds spot
    assert all(o.cpus >= 8 and o.memory_gb >= 16 for o in offers)
    assert [(o.cpus, o.memory_gb, o.instance_type) for o in offers] == \
        sorted((o.cpus, o.memory_gb, o.instance_type) for o in offers)   # smallest first
    # bounded: the searched families only, not every one of the region's types
    families = {p.split(".")[0] for p in DEFAULT_INSTANCE_TYPES}
    assert {o.instance_type.split(".")[0] for o in offers} <= families and len(offers) < 400
    await ec2.offers(InstanceSpec(cpus=2, memory_gb=4))
    assert proxy.calls["DescribeInstanceTypes"] - before <= 1      # described once per region, cached


async def test_offers_arch_filter(ec2):
    arm = await ec2.offers(InstanceSpec(cpus=8, memory_gb=16, arch="arm64"))
    assert arm and all(o.arch == "arm64" for o in arm)
    assert {o.instance_type.split(".")[0] for o in arm} >= {"g5g", "c7g"}
    x86 = await ec2.offers(InstanceSpec(cpus=8, memory_gb=16))
    assert not any(o.instance_type.startswith(("g5g.", "c7g.")) for o in x86)


async def test_offers_gpu_filter(ec2):
    a10g = await ec2.offers(InstanceSpec(cpus=4, memory_gb=16, gpus=1, gpu_name="a10g"))
    assert a10g and all(o.gpus >= 1 and o.gpu_name == "a10g" for o in a10g)
    assert a10g[0].instance_type == "g5.xlarge"                   # the smallest that fits
    a100 = await ec2.offers(InstanceSpec(cpus=32, memory_gb=256, gpus=8, gpu_name="a100"))
    assert {o.instance_type for o in a100} >= {"p4d.24xlarge"}
    assert all(o.gpus == 8 for o in a100)
    any_gpu = await ec2.offers(InstanceSpec(cpus=4, memory_gb=16, gpus=1))
    assert {o.gpu_name for o in any_gpu} >= {"a10g", "t4", "l4"}


async def test_instance_types_option_narrows_the_search(moto_ec2, proxy):
    prov = moto_ec2.provider(endpoint_url=proxy.endpoint_url, instance_types=["c7i.*", "m6i.2xlarge"])
    offers = await prov.offers(InstanceSpec(cpus=8, memory_gb=16))
    assert {o.instance_type for o in offers} >= {"c7i.2xlarge", "m6i.2xlarge"}
    assert all(o.instance_type.startswith("c7i.") or o.instance_type == "m6i.2xlarge" for o in offers)
    assert await prov.offers(InstanceSpec(cpus=2, memory_gb=4096)) == []
    why = prov.explain_misfit(InstanceSpec(cpus=2, memory_gb=4096))
    assert "c7i.*" in why and "4096 GiB" in why and "instance_types" in why
    assert "price" not in why and "snapshot" not in why
    await prov.close()


async def test_fleet_prices_ec2_offers_from_the_catalog(ec2, tmp_path):
    """Through a Fleet: the shapes are priced from the catalog (c5.2xlarge $0.34/h), an
    unpriced type is left out, and a launch at the priced offer carries its price."""
    spec = PoolSpec(name="priced", provider="ec2", mode="persistent", instance=InstanceSpec(cpus=8, memory_gb=16),
                    min_instances=0, max_instances=2)
    async with Fleet("ec2-priced", home=tmp_path, providers={"ec2": ec2}, catalog=CATALOG,
                     reconcile_interval_s=None) as fleet:
        pool = await fleet.pool(spec)
        priced = {o.instance_type: o for o in pool.offers}
        assert priced["c5.2xlarge"].price_per_hour == 0.34 and not priced["c5.2xlarge"].spot
        assert all(o.price_per_hour == catalog_price(o.instance_type) for o in priced.values())
        assert "m5.2xlarge" not in priced           # a shape the snapshot has no price for ...
        assert any(x.startswith("ec2/us-east-1/m5.2xlarge: no on-demand price") for x in pool.placement.excluded)
        offer = priced["c5.2xlarge"]
        insts = await ec2.launch(request(offer, 1, fleet_tags()))
        assert insts[0].price_per_hour == 0.34
        assert (await ec2.describe([insts[0].id]))[0].price_per_hour == 0.34   # this object remembers it
        await pool.drain()
    await ec2.terminate([i.id for i in insts])


async def test_a_region_the_catalog_lacks_is_refused_by_the_fleet(moto_ec2, proxy, tmp_path):
    prov = moto_ec2.provider(regions=["us-west-2"], endpoint_url=proxy.endpoint_url)
    offers = await prov.offers(InstanceSpec(cpus=8, memory_gb=16))
    assert offers and all(o.region == "us-west-2" and o.price_per_hour is None for o in offers)
    spec = PoolSpec(name="west", provider="ec2", region="us-west-2", mode="persistent",
                    instance=InstanceSpec(cpus=8, memory_gb=16), min_instances=0, max_instances=1)
    async with Fleet("ec2-west", home=tmp_path, providers={"ec2": prov}, catalog=CATALOG,
                     reconcile_interval_s=None) as fleet:
        with pytest.raises(SpecError) as ei:
            await fleet.pool(spec)
    assert ei.value.field == "pool.instance" and "no on-demand price in the catalog" in str(ei.value)
    assert "us-west-2" in str(ei.value)


# ---- launch ----------------------------------------------------------------------------
async def test_launch_five_in_one_call_tagged_instances_and_volumes(ec2, moto_ec2, proxy):
    offer = await offer_of(ec2, "c5.2xlarge")
    tags = fleet_tags()
    req = request(offer, 5, tags)
    before = proxy.calls["RunInstances"]
    insts = await ec2.launch(req)
    assert proxy.calls["RunInstances"] == before + 1
    run = proxy.params("RunInstances")[-1]
    assert (run["MinCount"], run["MaxCount"], run["ClientToken"]) == ("5", "5", req.request_id)
    assert len(insts) == 5 and len({i.id for i in insts}) == 5
    for i in insts:
        assert (i.provider, i.region, i.instance_type, i.price_per_hour) == ("ec2", REGION, "c5.2xlarge", 0.34)
        assert i.zone and i.zone.startswith(REGION) and i.port is None
        assert i.state in (ProviderState.PENDING, ProviderState.RUNNING)
        assert i.tags[TAG_REQUEST] == req.request_id and i.tags[TAG_FLEET] == tags[TAG_FLEET]
        assert i.address and i.launched_at > 0 and i.spec == req.spec

    client = moto_ec2.client(REGION)
    res = client.describe_instances(InstanceIds=[i.id for i in insts])["Reservations"]
    for inst in (x for r in res for x in r["Instances"]):
        got = {t["Key"]: t["Value"] for t in inst["Tags"]}
        assert {**tags, TAG_REQUEST: req.request_id}.items() <= got.items()
        assert got["Name"] == "flowmesh-p1"
    vols = client.describe_volumes(Filters=[{"Name": "tag:flowmesh:request", "Values": [req.request_id]}])
    assert len(vols["Volumes"]) == 5
    for vol in vols["Volumes"]:
        got = {t["Key"]: t["Value"] for t in vol["Tags"]}
        assert {**tags, TAG_REQUEST: req.request_id}.items() <= got.items()
        assert vol["Size"] == req.spec.disk_gb
    await ec2.terminate([i.id for i in insts])


async def test_relaunch_with_same_request_id_returns_the_same_instances(ec2, moto_ec2, proxy):
    offer = await offer_of(ec2, "c6i.2xlarge")
    tags = fleet_tags()
    req = request(offer, 3, tags)
    first = await ec2.launch(req)
    runs = proxy.calls["RunInstances"]
    again = await ec2.launch(req)
    assert sorted(i.id for i in again) == sorted(i.id for i in first)
    assert proxy.calls["RunInstances"] == runs                     # nothing launched the second time
    assert len(await ec2.list_tagged({TAG_FLEET: tags[TAG_FLEET]})) == 3
    # a fresh provider (a restarted coordinator) finds them by the request tag too
    fresh = moto_ec2.provider(endpoint_url=proxy.endpoint_url)
    assert sorted(i.id for i in await fresh.launch(req)) == sorted(i.id for i in first)
    assert proxy.calls["RunInstances"] == runs
    await fresh.close()
    await ec2.terminate([i.id for i in first])


async def test_spot_offer_asks_for_the_spot_market(ec2, moto_ec2, proxy):
    offer = await offer_of(ec2, "c5.2xlarge", spot=True)
    insts = await ec2.launch(request(offer, 1, fleet_tags()))
    run = proxy.params("RunInstances")[-1]
    assert run["InstanceMarketOptions.MarketType"] == "spot"
    assert run["InstanceMarketOptions.SpotOptions.SpotInstanceType"] == "one-time"
    assert run["InstanceMarketOptions.SpotOptions.InstanceInterruptionBehavior"] == "terminate"
    raw = moto_ec2.client(REGION).describe_instances(InstanceIds=[insts[0].id])["Reservations"][0]
    assert raw["Instances"][0]["InstanceLifecycle"] == "spot"
    await ec2.terminate([i.id for i in insts])


async def test_capacity_error_for_one_type_only(ec2, proxy):
    proxy.fail("RunInstances", "InsufficientInstanceCapacity", times=None,
               when=lambda p: p.get("InstanceType") == "c5.2xlarge")
    with pytest.raises(CapacityError) as ei:
        await ec2.launch(request(await offer_of(ec2, "c5.2xlarge"), 2, fleet_tags()))
    assert ei.value.code == "InsufficientInstanceCapacity"
    assert isinstance(ei.value.__cause__, ClientError)
    ok = await ec2.launch(request(await offer_of(ec2, "c6a.2xlarge"), 2, fleet_tags()))
    assert len(ok) == 2
    await ec2.terminate([i.id for i in ok])


async def test_invalid_instance_type_is_a_spec_error_before_run_instances(ec2, proxy):
    good = await offer_of(ec2, "c5.2xlarge")
    bad = Offer(**{**{f: getattr(good, f) for f in good.__dataclass_fields__}, "instance_type": "c5.bogus"})
    before = proxy.calls["RunInstances"]
    with pytest.raises(SpecError) as ei:
        await ec2.launch(request(bad, 1, fleet_tags()))
    assert ei.value.field == "launch.offer.instance_type"
    assert proxy.calls["RunInstances"] == before


async def test_missing_ami_is_a_spec_error_before_any_call(moto_ec2, proxy, ec2):
    offer = await offer_of(ec2, "c5.2xlarge")
    prov = moto_ec2.provider(endpoint_url=proxy.endpoint_url, image_id=None)
    before = sum(proxy.calls.values())
    with pytest.raises(SpecError) as ei:
        await prov.launch(request(offer, 1, fleet_tags()))
    assert ei.value.field == "ec2.image_id" and "FLOWMESH_EC2_AMI" in str(ei.value)
    assert sum(proxy.calls.values()) == before
    await prov.close()


async def test_unknown_ami_is_a_spec_error_before_run_instances(moto_ec2, proxy, ec2):
    offer = await offer_of(ec2, "c5.2xlarge")
    prov = moto_ec2.provider(endpoint_url=proxy.endpoint_url, image_id="ami-0000000000000dead")
    before = proxy.calls["RunInstances"]
    with pytest.raises(SpecError) as ei:
        await prov.launch(request(offer, 1, fleet_tags()))
    assert ei.value.field == "ec2.image_id" and ei.value.code == "InvalidAMIID.NotFound"
    assert isinstance(ei.value.__cause__, ClientError)
    assert proxy.calls["RunInstances"] == before
    await prov.close()


async def test_arm_offer_with_x86_ami_is_a_spec_error(ec2, proxy):
    offer = (await ec2.offers(InstanceSpec(cpus=4, memory_gb=8, arch="arm64")))[0]
    before = proxy.calls["RunInstances"]
    with pytest.raises(SpecError, match="arm64"):
        await ec2.launch(request(offer, 1, fleet_tags()))
    assert proxy.calls["RunInstances"] == before


async def test_moto_validates_amis_itself(moto_ec2):
    """The fixture switched moto's AMI validation on: RunInstances refuses an unknown AMI."""
    with pytest.raises(ClientError) as ei:
        moto_ec2.client(REGION).run_instances(ImageId="ami-0000000000000dead", MinCount=1, MaxCount=1,
                                              InstanceType="c5.large")
    assert ei.value.response["Error"]["Code"] == "InvalidAMIID.NotFound"


async def test_offer_in_another_region_is_refused(ec2):
    offer = await offer_of(ec2, "c5.2xlarge")
    elsewhere = Offer(**{**{f: getattr(offer, f) for f in offer.__dataclass_fields__}, "region": "eu-west-1"})
    with pytest.raises(SpecError, match="launch.offer.region"):
        await ec2.launch(request(elsewhere, 1, fleet_tags()))


async def test_launch_options_reach_run_instances(moto_ec2, proxy, ec2):
    import base64
    client = moto_ec2.client(REGION)
    subnet = client.describe_subnets()["Subnets"][0]
    sg = client.describe_security_groups(GroupNames=["default"])["SecurityGroups"][0]["GroupId"]
    key = f"fm-{uuid.uuid4().hex[:6]}"
    client.create_key_pair(KeyName=key)
    iam = boto3.session.Session(**moto_ec2.session_kwargs).client("iam", region_name=REGION,
                                                                  endpoint_url=moto_ec2.endpoint_url)
    iam.create_instance_profile(InstanceProfileName=key)
    script = "#!/bin/sh\necho flowmesh\n"
    prov = moto_ec2.provider(endpoint_url=proxy.endpoint_url, subnet_id=subnet["SubnetId"],
                             security_group_ids=[sg], key_name=key, iam_instance_profile=key,
                             user_data=script, partial_ok=True)
    insts = await prov.launch(request(await offer_of(ec2, "c5.2xlarge"), 2, fleet_tags()))
    run = proxy.params("RunInstances")[-1]
    assert (run["MinCount"], run["MaxCount"]) == ("1", "2")          # partial_ok: EC2 may launch fewer
    assert run["SubnetId"] == subnet["SubnetId"] and run["SecurityGroupId.1"] == sg
    assert run["KeyName"] == key and run["IamInstanceProfile.Name"] == key
    assert base64.b64decode(run["UserData"]).decode() == script     # botocore base64-encodes it
    assert run["BlockDeviceMapping.1.Ebs.VolumeSize"] == "100"
    raw = client.describe_instances(InstanceIds=[insts[0].id])["Reservations"][0]["Instances"][0]
    assert raw["SubnetId"] == subnet["SubnetId"] and raw["KeyName"] == key
    await prov.terminate([i.id for i in insts])
    await prov.close()


# ---- describe / list_tagged / terminate ----------------------------------------------------
async def test_describe_list_terminate_round_trip(ec2, moto_ec2, proxy):
    tags = fleet_tags()
    insts = await ec2.launch(request(await offer_of(ec2, "m6i.2xlarge"), 4, tags))
    ids = [i.id for i in insts]
    untagged = await ec2.launch(request(await offer_of(ec2, "m6i.2xlarge"), 1, {"flowmesh:owner": "x"}))

    described = await ec2.describe(ids + ["i-0123456789abcdef0", "not-an-id", ids[0]])
    assert [i.id for i in described] == ids                     # unknown and malformed omitted, no error
    assert all(i.spec.cpus == 8 for i in described)

    listed = await ec2.list_tagged({TAG_FLEET: tags[TAG_FLEET]})
    assert sorted(i.id for i in listed) == sorted(ids)
    assert sorted(i.id for i in await ec2.list_tagged({TAG_FLEET: tags[TAG_FLEET], TAG_POOL: "p1"})) == \
        sorted(ids)
    assert await ec2.list_tagged({TAG_FLEET: tags[TAG_FLEET], TAG_POOL: "other"}) == []
    every = {i.id for i in await ec2.list_tagged({})}
    assert set(ids) <= every and untagged[0].id not in every    # {} = everything carrying flowmesh:fleet

    await ec2.terminate(ids[:2] + ["i-0123456789abcdef0", "bogus"])   # unknown ids are not an error
    left = await ec2.list_tagged({TAG_FLEET: tags[TAG_FLEET]})
    assert sorted(i.id for i in left) == sorted(ids[2:])
    states = {i.id: i.state for i in await ec2.describe(ids)}
    assert states[ids[0]] is ProviderState.TERMINATED and states[ids[3]] is not ProviderState.TERMINATED

    # a fresh provider (no id -> region map) over two regions terminates by locating them
    fresh = moto_ec2.provider(regions=["us-west-2", REGION], endpoint_url=proxy.endpoint_url)
    described = await fresh.describe(ids[2:])
    assert sorted(i.id for i in described) == sorted(ids[2:]) and all(i.region == REGION for i in described)
    assert all(i.spec.cpus == 8 and i.spec.memory_gb == 32 for i in described)   # from the instance type
    assert all(i.price_per_hour == 0.0 for i in described)     # the provider keeps no prices of its own
    await fresh.terminate(ids[2:] + [untagged[0].id])
    assert await ec2.list_tagged({TAG_FLEET: tags[TAG_FLEET]}) == []
    await ec2.terminate(ids)                                     # terminating again is not an error
    await fresh.close()


async def test_a_stopped_instance_reads_stopped_and_stays_listed(ec2, moto_ec2):
    tags = fleet_tags()
    (inst,) = await ec2.launch(request(await offer_of(ec2, "c5.2xlarge"), 1, tags))
    moto_ec2.client(REGION).stop_instances(InstanceIds=[inst.id])
    (seen,) = await ec2.describe([inst.id])
    assert seen.state is ProviderState.STOPPED and seen.zone == inst.zone
    assert [i.id for i in await ec2.list_tagged({TAG_FLEET: tags[TAG_FLEET]})] == [inst.id]
    await ec2.terminate([inst.id])
    assert await ec2.list_tagged({TAG_FLEET: tags[TAG_FLEET]}) == []


async def test_tags_past_ec2_limits_are_a_spec_error_before_run_instances(ec2, proxy):
    before = proxy.calls["RunInstances"]
    with pytest.raises(SpecError) as ei:
        await ec2.launch(request(await offer_of(ec2, "c5.2xlarge"), 1, {**fleet_tags(), "note": "x" * 257}))
    assert ei.value.field == "launch.tags['note']" and "256" in str(ei.value)
    assert proxy.calls["RunInstances"] == before


async def test_terminate_drops_ids_ec2_says_are_gone(ec2, proxy):
    insts = await ec2.launch(request(await offer_of(ec2, "c5.2xlarge"), 2, fleet_tags()))
    ids = [i.id for i in insts]
    gone = "i-0fedcba9876543210"
    ec2._region_of[gone] = REGION          # a stale map entry: EC2 will say it does not exist
    before = proxy.calls["TerminateInstances"]
    await ec2.terminate(ids + [gone])
    assert proxy.calls["TerminateInstances"] == before + 2       # the chunk, then without the gone id
    assert proxy.params("TerminateInstances")[-1].get("InstanceId.3") is None
    assert all(i.state is ProviderState.TERMINATED for i in await ec2.describe(ids))


async def test_calls_run_off_the_event_loop(ec2, proxy):
    proxy.delay("DescribeInstances", 0.3, times=1)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1
    task = asyncio.create_task(ticker())
    try:
        await ec2.list_tagged(fleet_tags())
    finally:
        task.cancel()
    assert ticks >= 5          # the loop kept running while the call waited in a worker thread


# ---- errors ----------------------------------------------------------------------------
@pytest.mark.parametrize("code,cls", sorted(ERROR_TABLE.items()), ids=sorted(ERROR_TABLE))
async def test_every_error_code_maps_to_its_class(ec2, proxy, code, cls):
    before = proxy.calls["DescribeInstances"]
    proxy.fail("DescribeInstances", code)
    with pytest.raises(FlowMeshError) as ei:
        await ec2.list_tagged(fleet_tags())
    err = ei.value
    assert type(err) is cls
    assert err.code == code                                    # type: ignore[attr-defined]
    assert isinstance(err.__cause__, ClientError)              # botocore's own parse of the EC2 XML
    assert err.__cause__.response["Error"]["Code"] == code
    assert err.__cause__.response["ResponseMetadata"]["HTTPStatusCode"] == STATUS.get(code, 400)
    assert proxy.calls["DescribeInstances"] == before + 1     # no hidden retry inside the driver
    if cls is ThrottledError:
        assert err.retry_after_s is None                       # type: ignore[attr-defined]


async def test_unknown_code_is_a_plain_provider_error(ec2, proxy):
    proxy.fail("DescribeInstances", "SomethingNew")
    with pytest.raises(ProviderError) as ei:
        await ec2.list_tagged(fleet_tags())
    assert type(ei.value) is ProviderError and ei.value.code == "SomethingNew"
    assert isinstance(ei.value.__cause__, ClientError)


async def test_error_table_classes():
    assert ERROR_TABLE["InsufficientInstanceCapacity"] is CapacityError
    assert ERROR_TABLE["InsufficientReservedInstanceCapacity"] is CapacityError
    assert ERROR_TABLE["VcpuLimitExceeded"] is QuotaError
    assert ERROR_TABLE["RequestLimitExceeded"] is ThrottledError
    assert ERROR_TABLE["OptInRequired"] is AuthError
    assert ERROR_TABLE["InvalidInstanceID.NotFound"] is NotFoundError
    assert ERROR_TABLE["InvalidAMIID.NotFound"] is SpecError


async def test_missing_credentials_is_an_auth_error_naming_what_to_set(moto_ec2):
    prov = Ec2Provider(regions=[REGION], endpoint_url=moto_ec2.endpoint_url, image_id="ami-0123")
    with pytest.raises(AuthError) as ei:
        await prov.list_tagged({})
    msg = str(ei.value)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "role"):
        assert name in msg
    assert ei.value.code == "NoCredentials" and isinstance(ei.value.__cause__, NoCredentialsError)
    await prov.close()


async def test_refused_credentials_say_which_to_check(ec2, proxy):
    proxy.fail("DescribeInstances", "AuthFailure")
    with pytest.raises(AuthError, match="AWS_ACCESS_KEY_ID") as ei:
        await ec2.list_tagged(fleet_tags())
    assert "testing" not in str(ei.value)                        # no key material in the message


async def test_unreachable_endpoint():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    prov = Ec2Provider(regions=[REGION], endpoint_url=f"http://127.0.0.1:{port}", image_id="ami-0123",
                       session_kwargs={"aws_access_key_id": "x", "aws_secret_access_key": "y"})
    with pytest.raises(ProviderError) as ei:
        await prov.list_tagged({})
    assert type(ei.value) is ProviderUnavailableError and ei.value.code == "EndpointUnreachable"
    await prov.close()


# ---- runner --------------------------------------------------------------------------
async def test_runner_needs_a_factory(ec2, moto_ec2, proxy):
    from flowmesh_sdk.remote.local import LocalRunner
    insts = await ec2.launch(request(await offer_of(ec2, "c5.2xlarge"), 1, fleet_tags()))
    with pytest.raises(ProviderError, match="SSH") as ei:
        ec2.runner(insts[0])
    assert ei.value.code == "NoRunner"
    runner = LocalRunner()
    prov = moto_ec2.provider(endpoint_url=proxy.endpoint_url, runner_factory=lambda inst: runner)
    assert prov.runner(insts[0]) is runner
    await ec2.terminate([i.id for i in insts])
    await prov.close()


def test_no_test_endpoint_leaves_loopback(moto_ec2, proxy):
    for url in (moto_ec2.endpoint_url, proxy.endpoint_url):
        assert url.startswith("http://127.0.0.1:")
    assert "AWS_ACCESS_KEY_ID" not in os.environ


def test_moto_reset_forgets_instances(moto_ec2):
    """Last in the module: it empties the shared moto server."""
    client = moto_ec2.client(REGION)
    client.run_instances(ImageId=moto_ec2.a_valid_ami(REGION), MinCount=1, MaxCount=1, InstanceType="c5.large")
    assert client.describe_instances()["Reservations"]
    moto_ec2.reset()
    assert client.describe_instances()["Reservations"] == []
