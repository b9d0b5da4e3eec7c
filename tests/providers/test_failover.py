"""Retry and failover wrapped around the contract (flowmesh_sdk.provisioning), against the
EC2 provider on moto with real EC2 error responses injected by the fault proxy."""

from __future__ import annotations

import time
import uuid
from dataclasses import replace

import pytest

from flowmesh_sdk.catalog import Catalog
from flowmesh_sdk.control import InProcessBackend
from flowmesh_sdk.errors import AuthError, QuotaError
from flowmesh_sdk.provider import TAG_FLEET, TAG_OWNER, TAG_POOL
from flowmesh_sdk.provisioning import Failover, Provisioner, RetryPolicy
from flowmesh_sdk.specs import InstanceSpec

from .test_conformance import CountingProvider

SPEC = InstanceSpec(cpus=2, memory_gb=4)


@pytest.fixture
async def ec2(moto_ec2, ec2_proxy):
    prov = moto_ec2.provider(endpoint_url=ec2_proxy.endpoint_url)
    ec2_proxy.reset_counts()
    yield prov
    ec2_proxy.clear()
    await prov.terminate([i.id for i in await prov.list_tagged({})])
    await prov.close()


def _tags() -> dict[str, str]:
    return {TAG_FLEET: f"f-{uuid.uuid4().hex[:6]}", TAG_POOL: "p", TAG_OWNER: "tests"}


CATALOG = Catalog.load(["ec2"], use_cache=False, warn=False)


async def _offers(prov, k: int):
    """The provider's shapes priced from the catalog (the one source of prices; the
    provider reports None), cheapest first, one per type."""
    prices = {(r.region, r.instance_type): r.on_demand_per_hour for r in CATALOG.rows
              if r.provider == "ec2" and r.on_demand_per_hour is not None}
    offers = sorted((replace(o, price_per_hour=prices[(o.region, o.instance_type)])
                     for o in await prov.offers(SPEC)
                     if not o.spot and o.price_per_hour is None and (o.region, o.instance_type) in prices),
                    key=lambda o: (o.price_per_hour, o.instance_type))
    types = []
    for o in offers:
        if o.instance_type not in {t.instance_type for t in types}:
            types.append(o)
    assert len(types) >= k
    return types[:k]


async def test_capacity_on_first_two_offers_fails_over_to_the_third(ec2, ec2_proxy):
    offers = await _offers(ec2, 3)
    full = {offers[0].instance_type, offers[1].instance_type}
    ec2_proxy.fail("RunInstances", "InsufficientInstanceCapacity", times=None,
                   when=lambda p: p.get("InstanceType") in full)
    seen: list[Failover] = []
    prov = Provisioner(InProcessBackend(), RetryPolicy(attempts=3, backoff_s=0.01),
                       on_failover=lambda f, nxt: seen.append(f))
    out = await prov.launch({"ec2": ec2}, offers, SPEC, 2, _tags())
    assert out.offer == offers[2] and len(out.instances) == 2
    assert all(i.instance_type == offers[2].instance_type for i in out.instances)
    assert [f.reason for f in out.failovers] == ["capacity", "capacity"] and seen == list(out.failovers)
    assert "InsufficientInstanceCapacity" in out.failovers[0].error
    assert out.failovers[0].price_delta == pytest.approx(offers[1].price_per_hour - offers[0].price_per_hour)
    assert out.failovers[1].price_delta == pytest.approx(offers[2].price_per_hour - offers[1].price_per_hour)
    assert ec2_proxy.calls["RunInstances"] == 3      # capacity is not retried on the same offer


async def test_quota_everywhere_is_a_clear_error_and_the_region_is_skipped(ec2, ec2_proxy):
    offers = await _offers(ec2, 2)
    ec2_proxy.fail("RunInstances", "VcpuLimitExceeded", times=None)
    prov = Provisioner(InProcessBackend(), RetryPolicy(attempts=3, backoff_s=0.01))
    with pytest.raises(QuotaError) as ei:
        await prov.launch({"ec2": ec2}, offers, SPEC, 1, _tags())
    msg = str(ei.value)
    assert offers[0].instance_type in msg and "quota" in msg and isinstance(ei.value.__cause__, QuotaError)
    assert ec2_proxy.calls["RunInstances"] == 1        # the region was skipped after the first
    assert ("ec2", "us-east-1") in prov.skipped
    with pytest.raises(QuotaError, match="quota \\(skipped\\)"):
        await prov.launch({"ec2": ec2}, offers, SPEC, 1, _tags())
    assert ec2_proxy.calls["RunInstances"] == 1        # nothing more was asked of EC2


async def test_auth_stops_at_once(ec2, ec2_proxy):
    offers = await _offers(ec2, 2)
    ec2_proxy.fail("RunInstances", "UnauthorizedOperation", times=None)
    prov = Provisioner(InProcessBackend(), RetryPolicy(attempts=3, backoff_s=0.01))
    with pytest.raises(AuthError):
        await prov.launch({"ec2": ec2}, offers, SPEC, 1, _tags())
    assert ec2_proxy.calls["RunInstances"] == 1


async def test_throttling_storm_is_retried_none_lost_and_the_bucket_holds(ec2, ec2_proxy):
    (offer,) = await _offers(ec2, 1)
    ec2_proxy.fail("RunInstances", "RequestLimitExceeded", times=7)
    counting = CountingProvider(ec2)
    stamps: list[float] = []
    inner_launch = counting.launch

    async def stamped(req):
        stamps.append(time.monotonic())
        return await inner_launch(req)
    counting.launch = stamped  # type: ignore[method-assign]
    prov = Provisioner(InProcessBackend(), RetryPolicy(attempts=10, backoff_s=0.001, backoff_max_s=0.002))
    out = await prov.launch({"ec2": counting}, [offer], SPEC, 3, _tags())
    assert len(out.instances) == 3 and not out.failovers
    assert ec2_proxy.calls["RunInstances"] == 8 and len(stamps) == 8
    assert len({p["ClientToken"] for p in ec2_proxy.params("RunInstances")}) == 1   # same request retried
    (rate,) = [r for r in ec2.capabilities.rates if r.api == "launch" and not r.per_instance]
    for i, t in enumerate(stamps):   # calls in any window never exceed what the bucket allows
        for j in range(i, len(stamps)):
            window = stamps[j] - t
            assert j - i + 1 <= rate.burst + rate.rate_per_s * window + 1e-6 + 1


async def test_fleet_publishes_failovers_with_price_delta(fm_home, ec2, ec2_proxy, busybox_image):
    from flowmesh_sdk import EventKind, Fleet, PoolSpec
    from flowmesh_sdk.remote.local import LocalRunner
    ec2.runner_factory = lambda inst: LocalRunner()   # stand-in: moto has no machines
    async with Fleet("fo", home=fm_home, providers={"ec2": ec2}, catalog=CATALOG) as fleet:
        # the fleet's own ranking of the catalog-priced offers, from a pool that launches nothing
        probe = await fleet.pool(PoolSpec(name="probe", provider="ec2", instance=SPEC, min_instances=0,
                                          warm_per_image=0))
        offers = list(probe.offers[:2])
        await probe.drain()
        assert all(o.price_per_hour is not None for o in offers)
        ec2_proxy.fail("RunInstances", "InsufficientInstanceCapacity", times=None,
                       when=lambda p: p.get("InstanceType") == offers[0].instance_type)
        events = fleet.bus.subscribe(EventKind.LAUNCH_FAILOVER)
        pool = await fleet.pool(PoolSpec(name="fo", provider="ec2", instance=SPEC, min_instances=1,
                                         warm_per_image=0))
        assert pool.offers[:2] == tuple(offers)
        ev = await events.next(10)
        assert offers[0].instance_type in ev.detail and offers[1].instance_type in ev.detail
        assert "$/h" in ev.detail and "capacity" in ev.detail
        (mi,) = pool.instances.values()
        assert mi.instance.instance_type == offers[1].instance_type
        async with pool.sandbox(image=busybox_image) as sb:
            assert (await sb.exec("echo on-ec2-standin")).stdout == "on-ec2-standin\n"
    assert await ec2.list_tagged({TAG_FLEET: "fo"}) == []
