"""The ``vast`` provider on the Vast.ai emulator (flowmesh_sdk.testing.vast) through the real
``vastai`` SDK: 429 storms retried from outside (the library's own retries off), an offer
gone between search and create failing over to the next, a half-made instance destroyed
before the next offer, an outbid interruptible instance seen as stopped, bad keys naming
VAST_API_KEY, nothing reaching a non-loopback address, and a persistent sandbox pool on
Vast refused with the reason."""

from __future__ import annotations

import json
import sys
import uuid

import pytest

from flowmesh_sdk.errors import AuthError, CapacityError, SpecError, ThrottledError
from flowmesh_sdk.provider import TAG_FLEET, TAG_POOL, TAG_REQUEST, LaunchRequest, ProviderState
from flowmesh_sdk.specs import InstanceSpec

pytest.importorskip("vastai")

from flowmesh_providers.vast import VastProvider  # noqa: E402
from flowmesh_sdk.testing.vast import VastEmulator  # noqa: E402

SPEC = InstanceSpec(cpus=2, memory_gb=4, gpus=1)
_OUTSIDE: list[object] = []


def _hook(event: str, args: tuple) -> None:
    if event == "socket.connect":
        addr = args[1]
        if isinstance(addr, tuple) and not (str(addr[0]).startswith("127.") or addr[0] in ("::1",)):
            _OUTSIDE.append(addr)


sys.addaudithook(_hook)   # records only (audit hooks cannot be removed)


@pytest.fixture
def emu():
    with VastEmulator() as e:
        yield e


def _req(offer, rid: str | None = None) -> LaunchRequest:
    rid = rid or f"v-{uuid.uuid4().hex[:8]}"
    return LaunchRequest(offer=offer, spec=SPEC, count=1, request_id=rid,
                         tags={TAG_FLEET: "vast-test", TAG_POOL: "gpu", TAG_REQUEST: rid})


async def test_offers_carry_the_ask_its_quote_and_reliability_and_the_label_round_trips(emu):
    _OUTSIDE.clear()
    prov = emu.provider()
    offers = await prov.offers(SPEC)
    assert {o.offer_id for o in offers if not o.spot} == {"5001", "5002", "5003", "5005"}   # 5004: reliability .90
    o = next(o for o in offers if o.offer_id == "5001" and not o.spot)
    assert (o.price_per_hour, o.reliability, o.available, o.gpu_name, o.instance_type) == \
        (0.35, 0.995, 1, "rtx4090", "1x-RTX_4090")
    bid = next(o for o in offers if o.offer_id == "5001" and o.spot)
    assert bid.price_per_hour == 0.18                       # the market's minimum bid
    search = [r for r in emu.requests if r.path.rstrip("/") == "/api/v0/bundles"][0]
    assert b'"reliability2"' in search.body and b'"rented"' in search.body
    (inst,) = await prov.launch(_req(o))
    assert inst.tags[TAG_FLEET] == "vast-test" and inst.state is ProviderState.RUNNING
    row = emu.instances[0]
    assert row["label"].startswith("{") and row["is_bid"] is False and row["runtype"] == "ssh_direc ssh_proxy"
    assert [i.id for i in await prov.list_tagged({TAG_POOL: "gpu"})] == [inst.id]
    await prov.terminate([inst.id])
    assert await prov.list_tagged({}) == []
    assert VastProvider.capabilities.nested_containers is False and VastProvider.capabilities.max_batch == 1
    await prov.close()
    assert _OUTSIDE == []                                   # nothing reached past loopback


async def test_a_429_storm_is_retried_from_outside_and_the_library_makes_one_attempt(emu):
    from flowmesh_sdk.control import InProcessBackend
    from flowmesh_sdk.provisioning import Provisioner, RetryPolicy
    prov = emu.provider(spot=False)
    offer = next(o for o in await prov.offers(SPEC) if o.offer_id == "5001")
    emu.rate_limit(1)
    before = len(emu.requests)
    with pytest.raises(ThrottledError) as ei:
        await prov.describe(["9000001"])
    assert len(emu.requests) - before == 1                  # retry=1: one attempt, no hidden sleep-and-retry
    assert ei.value.retry_after_s is None and ei.value.__cause__ is not None
    emu.rate_limit(6)
    out = await Provisioner(InProcessBackend(), RetryPolicy(attempts=10, backoff_s=0.001, backoff_max_s=0.002)
                            ).launch({"vast": prov}, [offer], SPEC, 1, {TAG_FLEET: "vast-test", TAG_POOL: "gpu"})
    assert len(out.instances) == 1 and emu.count("create") == 1      # the storm hit the lookups, one create
    assert len(emu.instances) == 1
    await prov.terminate([i.id for i in out.instances])
    await prov.close()


async def test_an_offer_gone_fails_over_and_a_half_made_instance_is_destroyed_first(emu):
    from flowmesh_sdk.control import InProcessBackend
    from flowmesh_sdk.provisioning import Provisioner, RetryPolicy
    prov = emu.provider(spot=False)
    offers = sorted((o for o in await prov.offers(SPEC)), key=lambda o: o.price_per_hour)
    first, second, third = offers[:3]
    emu.gone(int(first.offer_id))                           # rented by someone else after our search
    with pytest.raises(CapacityError) as ei:
        await prov.launch(_req(first))
    assert ei.value.code == "no_such_ask"
    emu.fail_after_create(1)                                # the next create makes an instance, then errs
    out = await Provisioner(InProcessBackend(), RetryPolicy(attempts=1, backoff_s=0.001)).launch(
        {"vast": prov}, [first, second, third], SPEC, 1, {TAG_FLEET: "vast-test", TAG_POOL: "gpu"})
    assert [f.reason for f in out.failovers][:1] == ["capacity"]
    (inst,) = out.instances
    assert emu.count("destroy") >= 1                        # the half-made one on `second` went first
    assert [r["id"] for r in emu.instances] == [int(inst.id)]
    assert out.offer == third and out.failovers[0].price_delta == pytest.approx(second.price_per_hour -
                                                                                 first.price_per_hour)
    await prov.terminate([inst.id])
    await prov.close()


async def test_an_outbid_interruptible_instance_is_reported_stopped(emu):
    prov = emu.provider()
    bid = next(o for o in await prov.offers(SPEC) if o.spot and o.offer_id == "5003")
    low = bid.__class__(**{**{f: getattr(bid, f) for f in bid.__dataclass_fields__}, "price_per_hour": 0.01})
    with pytest.raises(CapacityError, match="bid_too_low"):
        await prov.launch(_req(low))
    (inst,) = await prov.launch(_req(bid))
    assert emu.instances[0]["is_bid"] is True and emu.instances[0]["bid_price"] == bid.price_per_hour
    emu.outbid(inst.id)
    (seen,) = await prov.describe([inst.id])
    assert seen.state is ProviderState.STOPPED
    await prov.terminate([inst.id])
    await prov.close()


async def test_bad_or_missing_key_names_the_variable(emu, monkeypatch, tmp_path):
    wrong = emu.provider(api_key="not-the-key")
    with pytest.raises(AuthError, match="VAST_API_KEY") as ei:
        await wrong.offers(SPEC)
    assert ei.value.__cause__ is not None and "not-the-key" not in str(ei.value) + repr(wrong)
    monkeypatch.delenv("VAST_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    none = VastProvider(server_url=emu.url)
    with pytest.raises(AuthError, match="VAST_API_KEY") as ei:
        await none.offers(SPEC)
    assert ei.value.code == "NoApiKey"
    for p in (wrong, none):
        await p.close()


async def test_an_auto_sandbox_pool_on_vast_is_refused_and_a_persistent_one_keeps_warm_instances(fm_home, emu):
    from flowmesh_sdk import Fleet, PoolSpec
    from flowmesh_sdk.pools import WarmPodPool
    prov = emu.provider()
    async with Fleet("vast-refuse", home=fm_home, providers={"vast": prov}) as fleet:
        with pytest.raises(SpecError) as ei:
            await fleet.pool(PoolSpec(name="p", provider="vast", mode="auto", instance=SPEC))
        assert "nested_containers=False" in str(ei.value) and "ephemeral pool" in str(ei.value)
        # its instances are containers: a persistent pool stocks warm ones (none without warm_images)
        pool = await fleet.pool(PoolSpec(name="w", provider="vast", mode="persistent", instance=SPEC))
        assert isinstance(pool, WarmPodPool) and pool.stats().warm == 0
    assert emu.count("create") == 0
    await prov.close()


@pytest.mark.skipif(not __import__("importlib").util.find_spec("paramiko"), reason="needs paramiko")
async def test_a_vast_instance_is_reached_over_ssh_with_exactly_the_injected_host_key(fm_home, emu):
    prov = emu.provider(ssh=True)
    offer = next(o for o in await prov.offers(SPEC) if o.offer_id == "5001" and not o.spot)
    (inst,) = await prov.launch(_req(offer))
    try:
        r = await prov.runner(inst).run(["echo", "reached-vast"], timeout_s=30)
        assert r.stdout == b"reached-vast\n" and r.exit_code == 0
        vm = emu.hosts.vm(inst.id)
        assert prov.runner(inst).target.host_key == vm.sshd.host_public_key
        assert "FLOWMESH_CLOUD_CONFIG" in emu.instances[0]["onstart"]
    finally:
        await prov.terminate([inst.id])
        await prov.close()


@pytest.mark.skipif(not __import__("importlib").util.find_spec("paramiko"), reason="needs paramiko")
async def test_an_ephemeral_pool_on_vast_runs_its_task_in_the_instance_itself(fm_home, emu, busybox_image):
    """A Vast instance is a container: it is rented with the task's image and the task runs in
    it directly -- the emulator's instances have no container runtime, so nesting would fail."""
    from flowmesh_sdk import Fleet, PoolSpec, SandboxSpec, Task
    from flowmesh_sdk.registry.local import LocalRegistry
    prov = emu.provider(ssh=True)
    with LocalRegistry() as reg:
        image = reg.push(busybox_image, "flowmesh/busybox:vast")
        async with Fleet("vast-eph", home=fm_home, providers={"vast": prov}) as fleet:
            pool = await fleet.pool(PoolSpec(name="eph", provider="vast", mode="ephemeral", instance=SPEC,
                                             heartbeat_s=None))
            res = await pool.run_task(Task(name="t", sandbox=SandboxSpec(image=image, cpus=1, memory_gb=1),
                                           command="command -v podman docker || echo no-runtime"))
            assert res.ok and res.result.stdout == "no-runtime\n", res.error
            (create,) = [r for r in emu.requests if r.method == "PUT" and r.path.startswith("/api/v0/asks/")]
            rented = json.loads(create.body)["image"]
            assert rented.startswith(image.rsplit(":", 1)[0] + "@sha256:"), rented   # the task's image, pinned
    await prov.close()
