"""The ``alibaba`` provider on the ECS emulator (flowmesh_sdk.testing.ecs) through the real
``alibabacloud-ecs20140526`` client: every error class mapped with its cause, library
retries off (one HTTP call per attempt), throttling as HTTP 400 and 429 retried from
outside with the same ClientToken, bad or missing keys named, request shapes (ClientToken,
tags, InstanceIds paging), a pool on instances booted from their user-data, and a pool whose
search space holds ``alibaba`` and ``ec2`` failing over between them."""

from __future__ import annotations

import json
import sys
import uuid
from dataclasses import replace

import pytest

from flowmesh_sdk.errors import AuthError, CapacityError, QuotaError, SpecError, ThrottledError
from flowmesh_sdk.provider import TAG_FLEET, TAG_OWNER, TAG_POOL, TAG_REQUEST, LaunchRequest
from flowmesh_sdk.specs import InstanceSpec

pytest.importorskip("alibabacloud_ecs20140526")

from flowmesh_providers.alibaba import AlibabaProvider  # noqa: E402
from flowmesh_providers.alibaba.provider import client_token  # noqa: E402
from flowmesh_sdk.testing.ecs import EcsEmulator  # noqa: E402

SPEC = InstanceSpec(cpus=2, memory_gb=4)


@pytest.fixture
async def ecs(ecs_emulator):
    prov = ecs_emulator.provider()
    ecs_emulator.clear()
    yield prov
    ecs_emulator.clear()
    await prov.terminate([i.id for i in await prov.list_tagged({})])
    await prov.close()


def _req(offer, count: int = 1, rid: str | None = None, **extra: str) -> LaunchRequest:
    rid = rid or f"t-{uuid.uuid4().hex[:10]}"
    return LaunchRequest(offer=offer, spec=SPEC, count=count, request_id=rid,
                         tags={TAG_FLEET: "ali-test", TAG_POOL: "p", TAG_OWNER: "tests", TAG_REQUEST: rid, **extra})


async def _offer(prov, itype: str = "ecs.c7.large", zone: str | None = None):
    return next(o for o in await prov.offers(SPEC) if not o.spot and o.instance_type == itype
                and (zone is None or o.zone == zone))


async def test_each_error_class_is_mapped_with_the_tea_exception_as_cause(ecs, ecs_emulator):
    offer = await _offer(ecs)
    cases = [
        (lambda: ecs_emulator.sold_out(offer.zone, offer.instance_type), CapacityError, "OperationDenied.NoStock"),
        (lambda: ecs_emulator.set_vcpu_quota(0), QuotaError, "QuotaExceed.ElasticQuota"),
        (lambda: ecs_emulator.throttle("RunInstances"), ThrottledError, "Throttling.User"),
        (lambda: ecs_emulator.throttle("RunInstances", status=429, code="Throttling"), ThrottledError, "Throttling"),
        (lambda: ecs_emulator.deny(), AuthError, "Forbidden.RAM"),
    ]
    for provoke, cls, code in cases:
        ecs_emulator.clear()
        provoke()
        before = ecs_emulator.count("RunInstances")
        with pytest.raises(cls) as ei:
            await ecs.launch(_req(offer))
        err = ei.value
        assert err.code == code and err.provider == "alibaba", err
        assert type(err.__cause__).__module__.startswith("alibabacloud_tea_openapi"), err.__cause__
        assert ecs_emulator.count("RunInstances") - before <= 1     # no hidden retry inside the client
    ecs_emulator.clear()
    bad_image = ecs_emulator.provider(image_id="no-such-image")
    with pytest.raises(SpecError) as ei:
        await bad_image.launch(_req(offer))
    assert ei.value.field == "alibaba.image_id" and ei.value.__cause__ is not None
    await bad_image.close()
    assert await ecs.list_tagged({TAG_FLEET: "ali-test"}) == []       # nothing was launched by any of them


async def test_a_throttling_storm_is_retried_from_outside_with_one_client_token(ecs, ecs_emulator):
    from flowmesh_sdk.control import InProcessBackend
    from flowmesh_sdk.provisioning import Provisioner, RetryPolicy
    offer = replace(await _offer(ecs), price_per_hour=0.07)
    ecs_emulator.throttle("RunInstances", times=3, status=429, code="Throttling")
    ecs_emulator.throttle("RunInstances", times=2, status=400, code="Throttling.Api")
    before = len(ecs_emulator.requests)
    prov = Provisioner(InProcessBackend(), RetryPolicy(attempts=10, backoff_s=0.001, backoff_max_s=0.002))
    out = await prov.launch({"alibaba": ecs}, [offer], SPEC, 3, {TAG_FLEET: "ali-test", TAG_POOL: "p"})
    assert len(out.instances) == 3 and not out.failovers
    runs = [r for r in ecs_emulator.requests[before:] if r.headers.get("x-acs-action") == "RunInstances"]
    assert len(runs) == 6                                      # 5 throttled + 1, none hidden
    assert len({r.query["ClientToken"][0] for r in runs}) == 1  # the same request each time
    assert {r.query["Amount"][0] for r in runs} == {"3"} and {r.query["MinAmount"][0] for r in runs} == {"3"}
    assert all(r.method == "POST" and r.path == "/" and r.body == b"" for r in runs)


async def test_request_shapes_client_token_tags_and_paging(ecs_emulator):
    emu = ecs_emulator
    prov = emu.provider()
    offer = await _offer(prov)
    long_rid = "r" * 100
    assert len(client_token(long_rid)) <= 64 and client_token(long_rid).isascii()
    assert client_token("short-id") == "short-id"
    with pytest.raises(SpecError, match="20 tags"):
        await prov.launch(_req(offer, **{f"x:{i}": "v" for i in range(20)}))
    with pytest.raises(SpecError, match="at most 100"):
        await prov.launch(_req(offer, count=101))
    before = len(emu.requests)
    launched = await prov.launch(_req(offer, count=5, rid=long_rid))
    try:
        run = next(r for r in emu.requests[before:] if r.headers.get("x-acs-action") == "RunInstances")
        assert run.query["ClientToken"] == [client_token(long_rid)]
        assert run.query["Tag.1.Key"] and run.query["InstanceChargeType"] == ["PostPaid"]
        assert run.query["SpotStrategy"] == ["NoSpot"] and run.query["HttpTokens"] == ["required"]
        small = EcsEmulator(page_size=2)   # the same SDK against a server paging by 2
        with small:
            p2 = small.provider()
            o2 = await _offer(p2)
            five = await p2.launch(_req(o2, count=5))
            before = len(small.requests)
            assert sorted(i.id for i in await p2.describe([i.id for i in five])) == sorted(i.id for i in five)
            pages = [r for r in small.requests[before:] if r.headers.get("x-acs-action") == "DescribeInstances"]
            assert len(pages) == 3 and "NextToken" in pages[1].query
            assert json.loads(pages[0].query["InstanceIds"][0]) == [i.id for i in five]
            assert len(await p2.list_tagged({TAG_FLEET: "ali-test"})) == 5
            await p2.terminate([i.id for i in five])
            assert await p2.list_tagged({}) == []
            await p2.close()
    finally:
        await prov.terminate([i.id for i in launched])
        await prov.close()


def _no_outside_connects(seen: list[tuple[str, object]]):
    def hook(event: str, args: tuple) -> None:
        if event == "socket.connect":
            addr = args[1]
            host = addr[0] if isinstance(addr, tuple) else str(addr)
            if not (str(host).startswith("127.") or host in ("::1", "localhost") or isinstance(addr, str)):
                seen.append((event, addr))
    return hook


_SEEN: list[tuple[str, object]] = []
sys.addaudithook(_no_outside_connects(_SEEN))   # audit hooks cannot be removed: it only records


async def test_bad_or_missing_keys_name_the_variable_and_nothing_leaves_loopback(ecs_emulator, monkeypatch, tmp_path):
    _SEEN.clear()
    wrong_id = ecs_emulator.provider(access_key_id="LTAI-wrong")
    with pytest.raises(AuthError, match="ALIBABA_CLOUD_ACCESS_KEY_ID") as ei:
        await wrong_id.offers(SPEC)
    assert ei.value.code == "InvalidAccessKeyId.NotFound" and ei.value.__cause__ is not None
    wrong_secret = ecs_emulator.provider(access_key_secret="not-the-secret")
    with pytest.raises(AuthError, match="ALIBABA_CLOUD_ACCESS_KEY_SECRET"):
        await wrong_secret.offers(SPEC)
    assert "not-the-secret" not in repr(wrong_secret) + repr(wrong_secret._client)
    # no keys anywhere: no profile file, no variables -- and no probe of the ECS metadata address
    for name in ("ALIBABA_CLOUD_ACCESS_KEY_ID", "ALIBABA_CLOUD_ACCESS_KEY_SECRET", "ALIBABA_CLOUD_SECURITY_TOKEN",
                 "ALIBABA_CLOUD_CREDENTIALS_FILE", "ALIBABA_CLOUD_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    none = AlibabaProvider(endpoint=ecs_emulator.url, vswitch_ids=ecs_emulator.vswitch_ids,
                           security_group_id=ecs_emulator.security_group_id)
    with pytest.raises(AuthError, match="ALIBABA_CLOUD_ACCESS_KEY_ID and ALIBABA_CLOUD_ACCESS_KEY_SECRET") as ei:
        await none.offers(SPEC)
    assert ei.value.code == "NoCredentials"
    # keys from Alibaba's variables work
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_ID", ecs_emulator.access_key_id)
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_SECRET", ecs_emulator.access_key_secret)
    from_env = AlibabaProvider(endpoint=ecs_emulator.url, vswitch_ids=ecs_emulator.vswitch_ids,
                               security_group_id=ecs_emulator.security_group_id)
    assert await from_env.offers(SPEC)
    assert ecs_emulator.access_key_secret not in repr(from_env) + repr(from_env._client)
    for p in (wrong_id, wrong_secret, none, from_env):
        await p.close()
    assert _SEEN == []


async def test_the_emulator_routes_the_v2_signature_with_action_in_the_query(ecs_emulator):
    from alibabacloud_ecs20140526 import models
    from alibabacloud_ecs20140526.client import Client
    from alibabacloud_tea_openapi import models as open_api_models
    cfg = open_api_models.Config(access_key_id=ecs_emulator.access_key_id,
                                 access_key_secret=ecs_emulator.access_key_secret, region_id=ecs_emulator.region,
                                 endpoint=ecs_emulator.host, protocol="HTTP", signature_algorithm="v2")
    before = len(ecs_emulator.requests)
    resp = await Client(cfg).describe_instances_async(models.DescribeInstancesRequest(region_id=ecs_emulator.region))
    assert resp.body.instances is not None
    rec = ecs_emulator.requests[before]
    assert rec.query["Action"] == ["DescribeInstances"] and "Signature" in rec.query


@pytest.mark.skipif(not __import__("importlib").util.find_spec("paramiko"), reason="needs paramiko")
async def test_a_pool_on_ecs_instances_booted_from_their_user_data(fm_home, busybox_image, ecs_emulator):
    from flowmesh_sdk import Fleet, PoolSpec, SandboxSpec
    from flowmesh_sdk.catalog import Catalog
    from flowmesh_sdk.registry.local import LocalRegistry
    ecs = ecs_emulator.provider(ssh=True)
    catalog = Catalog(await ecs_emulator.price_rows())
    with LocalRegistry() as reg:
        image = reg.push(busybox_image, "ali/busybox:1")
        try:
            async with Fleet("ali", home=fm_home, providers={"alibaba": ecs}, catalog=catalog) as fleet:
                pool = await fleet.pool(PoolSpec(name="ali", provider="alibaba", min_instances=1, max_instances=1,
                                                 sandboxes_per_instance=2, warm_per_image=0, instance=SPEC))
                (iid,) = pool.instances
                vm = ecs_emulator.hosts.vm(iid)
                assert pool.instances[iid].runtime.runner.target.host_key == vm.sshd.host_public_key
                async with pool.sandbox(SandboxSpec(image=image, cpus=1, memory_gb=0.25)) as sb:
                    r = await sb.exec("echo on-ecs; exit 3")
                    assert (r.stdout, r.exit_code) == ("on-ecs\n", 3)
                (inst,) = pool.instances.values()
                assert inst.instance.price_per_hour == pytest.approx(0.071)   # priced from the refreshed catalog
            assert await ecs.list_tagged({TAG_FLEET: "ali"}) == []
        finally:
            await ecs.close()


async def test_a_pool_over_alibaba_and_ec2_fails_over_between_them(fm_home, moto_ec2, ec2_proxy, ecs_emulator):
    """Sold out on ECS (every zone) -> the pool launches on EC2, the failover published with
    the reason and the price delta; and the other way round at the provisioner."""
    from flowmesh_sdk import EventKind, Fleet, PoolSpec
    from flowmesh_sdk.catalog import Catalog
    from flowmesh_sdk.control import InProcessBackend
    from flowmesh_sdk.provisioning import Provisioner, RetryPolicy
    from flowmesh_sdk.remote.local import LocalRunner
    ecs_emulator.clear()
    ecs = ecs_emulator.provider(instance_types=["ecs.c7.large"], spot=False)
    ec2 = moto_ec2.provider(endpoint_url=ec2_proxy.endpoint_url, runner_factory=lambda inst: LocalRunner())
    catalog = Catalog(list(Catalog.load(["ec2"], use_cache=False, warn=False).rows) + await ecs_emulator.price_rows())
    try:
        ecs_emulator.sold_out(instance_type="ecs.c7.large")          # listed in stock, refused at RunInstances
        async with Fleet("ali-ec2", home=fm_home, providers={"alibaba": ecs, "ec2": ec2}, catalog=catalog) as fleet:
            events = fleet.bus.subscribe(EventKind.LAUNCH_FAILOVER)
            pool = await fleet.pool(PoolSpec(name="mixed", infra=("alibaba", "ec2/us-east-1"), instance=SPEC,
                                             min_instances=1, max_instances=1, warm_per_image=0, policy="cost"))
            assert pool.offers[0].provider == "alibaba"              # ECS ranks first: cheaper in this catalog
            details = [(await events.next(10)).detail for _ in range(2)]   # both ECS zones refuse
            assert all(d.startswith("alibaba/cn-hangzhou/") and "capacity" in d for d in details), details
            assert "OperationDenied.NoStock" in details[0] and "$/h" in details[1]
            assert "-> ec2/us-east-1/" in details[1], details
            (mi,) = pool.instances.values()
            assert mi.instance.provider == "ec2"
        # the other way round: EC2 has no capacity, ECS has
        ecs_emulator.clear()
        ec2_proxy.fail("RunInstances", "InsufficientInstanceCapacity", times=None)
        e_offer = replace(next(o for o in await ec2.offers(SPEC) if not o.spot), price_per_hour=0.05)
        a_offer = replace(await _offer(ecs), price_per_hour=0.071)
        out = await Provisioner(InProcessBackend(), RetryPolicy(attempts=2, backoff_s=0.001)).launch(
            {"ec2": ec2, "alibaba": ecs}, [e_offer, a_offer], SPEC, 2, {TAG_FLEET: "ali-ec2", TAG_POOL: "p"})
        assert [i.provider for i in out.instances] == ["alibaba", "alibaba"]
        (fo,) = out.failovers
        assert fo.reason == "capacity" and fo.price_delta == pytest.approx(0.021)
        await ecs.terminate([i.id for i in out.instances])
    finally:
        ec2_proxy.clear()
        ecs_emulator.clear()
        await ecs.terminate([i.id for i in await ecs.list_tagged({})])
        await ec2.terminate([i.id for i in await ec2.list_tagged({TAG_FLEET: "ali-ec2"})])
        await ecs.close()
        await ec2.close()
