"""The azure provider against the ARM emulator (flowmesh_sdk.testing.azure) with the real
azure-mgmt clients over HTTP: each error class injected and mapped as the contract says
(cause chained), an operation that never finishes (a deadline, not a hang), the clients'
own retries off, deterministic names make a retried launch idempotent, all-or-nothing
launches, and a pool whose VMs are real loopback sshd hosts booted from their customData."""

from __future__ import annotations

import time
import uuid

import pytest

from flowmesh_sdk import Fleet, InstanceSpec, PoolSpec, SandboxSpec
from flowmesh_sdk.errors import (AuthError, CapacityError, NotFoundError, ProviderUnavailableError, QuotaError,
                                 SpecError, ThrottledError)
from flowmesh_sdk.provider import TAG_FLEET, TAG_OWNER, TAG_POOL, LaunchRequest, ProviderState
from flowmesh_sdk.remote.cloudinit import parse_user_data
from flowmesh_sdk.remote.keys import FleetKey, secret_fragments

pytest.importorskip("azure.mgmt.compute")
pytest.importorskip("paramiko")

SPEC = InstanceSpec(cpus=2, memory_gb=4)
OTHER_SUB = "11111111-1111-4111-8111-111111111111"


@pytest.fixture
def emu(azure_emulator):
    azure_emulator.clear()
    yield azure_emulator
    azure_emulator.clear()


@pytest.fixture
async def az(emu):
    prov = emu.provider(operation_timeout_s=5)
    yield prov
    emu.clear()
    await prov.terminate([i.id for i in await prov.list_tagged({})])
    await prov.close()


def _req(offer, count: int = 1, rid: str | None = None) -> LaunchRequest:
    rid = rid or f"t-{uuid.uuid4().hex[:10]}"
    return LaunchRequest(offer=offer, spec=SPEC, count=count, request_id=rid,
                         tags={TAG_FLEET: f"a-{uuid.uuid4().hex[:6]}", TAG_POOL: "p", TAG_OWNER: "tests"})


async def _offer(prov, size: str = "Standard_D2s_v5"):
    return next(o for o in await prov.offers(SPEC) if o.instance_type == size and not o.spot)


@pytest.mark.parametrize("inject, cls, code", [
    (lambda e: e.exhaust(), CapacityError, "AllocationFailed"),
    (lambda e: e.exhaust(how="ZonalAllocationFailed"), CapacityError, "ZonalAllocationFailed"),
    (lambda e: e.exhaust(how="SkuNotAvailable"), CapacityError, "SkuNotAvailable"),
    (lambda e: e.set_core_quota("eastus", 1), QuotaError, "OperationNotAllowed"),
    (lambda e: e.fail("vm", "PUT", 429, "TooManyRequests"), ThrottledError, "TooManyRequests"),
    (lambda e: e.fail("vm", "PUT", 403, "AuthorizationFailed"), AuthError, "AuthorizationFailed"),
    (lambda e: e.fail("vm", "PUT", 401, "InvalidAuthenticationToken"), AuthError, "InvalidAuthenticationToken"),
    (lambda e: e.fail("vm", "PUT", 500, "InternalServerError"), ProviderUnavailableError, "InternalServerError"),
])
async def test_each_error_class_maps_with_its_cause(emu, az, inject, cls, code):
    offer = await _offer(az)
    inject(emu)
    with pytest.raises(cls) as ei:
        await az.launch(_req(offer, count=2))
    err = ei.value
    assert err.provider == "azure" and err.code == code and err.__cause__ is not None
    if cls is ThrottledError:
        assert err.retry_after_s == 1.0                      # the server's Retry-After
    if cls is AuthError:
        assert "DefaultAzureCredential" in str(err)
    emu.clear()
    assert [v["name"] for v in emu.vms if v["tags"].get(TAG_POOL) == "p"] == []   # all or nothing


async def test_wrong_subscription_is_not_found_naming_it(emu):
    prov = emu.provider(subscription_id=OTHER_SUB)
    try:
        with pytest.raises(NotFoundError) as ei:
            await prov.offers(SPEC)
        assert OTHER_SUB in str(ei.value) and ei.value.code == "SubscriptionNotFound"
        assert ei.value.__cause__ is not None
    finally:
        await prov.close()


async def test_an_operation_that_never_finishes_is_a_deadline_and_the_retry_is_idempotent(emu):
    prov = emu.provider(operation_timeout_s=0.5)
    try:
        offer = await _offer(prov)
        req = _req(offer, count=2)
        emu.slow_operations(None, kinds=("vm",))
        t0 = time.monotonic()
        with pytest.raises(ProviderUnavailableError) as ei:
            await prov.launch(req)
        assert ei.value.code == "OperationTimeout" and time.monotonic() - t0 < 10
        # all or nothing: the timed-out request's VMs were deleted, nothing is left running
        emu.clear()
        emu.finish_operations()
        assert [v for v in emu.vms if v["tags"].get("flowmesh:request") == req.request_id] == []
        first = await prov.launch(req)        # the provisioner's retry, same request id
        puts = emu.count("vm", "PUT")
        again = await prov.launch(req)        # deterministic names: found by the request tag
        assert len(first) == 2 and sorted(i.id for i in again) == sorted(i.id for i in first)
        assert emu.count("vm", "PUT") == puts  # nothing created twice
        await prov.terminate([i.id for i in first])
    finally:
        emu.clear()
        await prov.close()


async def test_the_clients_own_retries_are_off(emu, az):
    emu.fail("vms", "GET", 503, "ServiceUnavailable", times=3)
    before = emu.count("vms", "GET")
    with pytest.raises(ProviderUnavailableError):
        await az.list_tagged({})
    assert emu.count("vms", "GET") == before + 1


async def test_spot_vms_and_delete_options(emu, az):
    offer = await _offer(az)
    spot = offer.__class__(**{**{f: getattr(offer, f) for f in offer.__dataclass_fields__}, "spot": True})
    (inst,) = await az.launch(LaunchRequest(offer=spot, spec=SPEC, count=1, request_id=f"s-{uuid.uuid4().hex[:6]}",
                                            tags={TAG_FLEET: "spot"}))
    vm = next(v for v in emu.vms if v["properties"]["vmId"] == inst.id)
    props = vm["properties"]
    assert (props["priority"], props["evictionPolicy"], props["billingProfile"]["maxPrice"]) == ("Spot", "Delete", -1)
    assert props["storageProfile"]["osDisk"]["deleteOption"] == "Delete"
    nic_conf = props["networkProfile"]["networkInterfaceConfigurations"][0]
    assert nic_conf["properties"]["deleteOption"] == "Delete"
    assert "customData" not in props["osProfile"]            # ARM never returns it
    assert inst.state is ProviderState.RUNNING and inst.region == "eastus"
    await az.terminate([inst.id])
    assert await az.describe([inst.id]) == []


async def test_bad_input_is_refused_before_any_call(emu, az):
    offer = await _offer(az)
    elsewhere = offer.__class__(**{**{f: getattr(offer, f) for f in offer.__dataclass_fields__},
                                   "region": "westeurope"})
    before = emu.count("vm", "PUT")
    with pytest.raises(SpecError, match="launch.offer.region"):
        await az.launch(_req(elsewhere))
    with pytest.raises(SpecError, match="azure.subscription_id"):
        emu.provider(subscription_id="not-a-guid")
    with pytest.raises(SpecError, match="azure.allow_http"):
        from flowmesh_providers.azure import AzureProvider
        AzureProvider(subscription_id=OTHER_SUB, base_url="https://management.azure.com", allow_http=True)
    assert emu.count("vm", "PUT") == before


async def test_pool_on_azure_vms_booted_from_their_custom_data(fm_home, emu, busybox_image):
    from flowmesh_sdk.registry.local import LocalRegistry
    with LocalRegistry() as reg:
        image = reg.push(busybox_image, "az/busybox:1")
        prov = emu.provider(ssh=True)
        try:
            async with Fleet("azure", home=fm_home, providers={"azure": prov}) as fleet:
                pool = await fleet.pool(PoolSpec(name="azure", provider="azure", min_instances=1, max_instances=1,
                                                 sandboxes_per_instance=2, warm_per_image=0, instance=SPEC))
                (iid,) = list(pool.instances)
                import base64
                text = base64.b64decode(emu.custom_data(iid)).decode()
                parsed = parse_user_data(text)
                fleet_key = FleetKey.load_or_create()
                assert parsed.authorized_keys == (fleet_key.public,)
                runner = pool.instances[iid].runtime.runner
                assert runner.target.host_key == parsed.host_public.line == emu.hosts.vm(iid).sshd.host_public_key
                assert not any(f in text for f in secret_fragments((fm_home / "keys" / "fleet_ed25519").read_text()))
                async with pool.sandbox(SandboxSpec(image=image, cpus=1, memory_gb=0.25)) as sb:
                    r = await sb.exec("echo on-azure; exit 6")
                    assert (r.stdout, r.exit_code) == ("on-azure\n", 6)
                emu.delete_behind(iid)
                result = await fleet.reconcile_pools()
                assert result["azure"].gone == (iid,) and iid not in pool.instances
            assert await prov.list_tagged({TAG_FLEET: "azure"}) == []
        finally:
            await prov.close()
