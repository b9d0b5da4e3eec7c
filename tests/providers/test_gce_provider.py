"""The gce provider against the Compute Engine emulator (flowmesh_sdk.testing.gce) with the
real google-cloud-compute client over HTTP: each error class injected and mapped as the
contract says (cause chained), an operation that never finishes (a deadline, not a hang),
the library's own retries off, labels encoded, and a pool whose instances are real loopback
sshd hosts booted from the user-data the provider sent."""

from __future__ import annotations

import time
import uuid

import pytest

from flowmesh_sdk import Fleet, InstanceSpec, PoolSpec, SandboxSpec
from flowmesh_sdk.errors import (AuthError, CapacityError, NotFoundError, ProviderUnavailableError, QuotaError,
                                 SpecError, ThrottledError)
from flowmesh_sdk.provider import TAG_FLEET, TAG_OWNER, TAG_POOL, TAG_REQUEST, LaunchRequest, ProviderState
from flowmesh_sdk.remote.cloudinit import parse_user_data
from flowmesh_sdk.remote.keys import FleetKey, secret_fragments

pytest.importorskip("google.cloud.compute_v1")
pytest.importorskip("paramiko")

from flowmesh_sdk.testing.gce import GceEmulator  # noqa: E402

SPEC = InstanceSpec(cpus=2, memory_gb=4)


@pytest.fixture
def emu(gce_emulator):
    gce_emulator.clear()
    yield gce_emulator
    gce_emulator.clear()


@pytest.fixture
async def gce(emu):
    prov = emu.provider(operation_timeout_s=5)
    yield prov
    emu.clear()
    await prov.terminate([i.id for i in await prov.list_tagged({})])
    await prov.close()


def _req(offer, count: int = 1, rid: str | None = None, **tags: str) -> LaunchRequest:
    rid = rid or f"t-{uuid.uuid4().hex[:10]}"
    return LaunchRequest(offer=offer, spec=SPEC, count=count, request_id=rid,
                         tags={TAG_FLEET: f"g-{uuid.uuid4().hex[:6]}", TAG_POOL: "p", TAG_OWNER: "tests", **tags})


async def _offer(prov, itype: str = "e2-standard-2", spot: bool = False):
    return next(o for o in await prov.offers(SPEC) if o.instance_type == itype and o.spot == spot)


@pytest.mark.parametrize("inject, cls, code", [
    (lambda e: e.exhaust(), CapacityError, "ZONE_RESOURCE_POOL_EXHAUSTED"),
    (lambda e: e.fail("bulkInsert", 503, "insufficientCapacity"), CapacityError, "insufficientCapacity"),
    (lambda e: e.set_cpu_quota("us-central1", 1), QuotaError, "QUOTA_EXCEEDED"),
    (lambda e: e.fail("bulkInsert", 403, "quotaExceeded", "Quota 'INSTANCES' exceeded.  Limit: 8.0 in region "
                      "us-central1."), QuotaError, "quotaExceeded"),
    (lambda e: e.fail("bulkInsert", 403, "rateLimitExceeded"), ThrottledError, "rateLimitExceeded"),
    (lambda e: e.fail("bulkInsert", 429, "rateLimitExceeded"), ThrottledError, "rateLimitExceeded"),
    (lambda e: e.fail("bulkInsert", 403, "forbidden", "Required 'compute.instances.create' permission"),
     AuthError, "forbidden"),
    # a 401 makes google-auth try to refresh the credentials first; anonymous ones cannot be
    (lambda e: e.fail("bulkInsert", 401, "authError", "Invalid Credentials"), AuthError, "DefaultCredentialsError"),
    (lambda e: e.fail("bulkInsert", 500, "backendError"), ProviderUnavailableError, "500"),
])
async def test_each_error_class_maps_with_its_cause(emu, gce, inject, cls, code):
    offer = await _offer(gce)
    inject(emu)
    with pytest.raises(cls) as ei:
        await gce.launch(_req(offer))
    err = ei.value
    assert err.provider == "gce" and err.code == code and err.__cause__ is not None
    if cls is QuotaError:
        assert err.scope == "us-central1" and "us-central1" in str(err)   # its scope, said
    if cls is AuthError:
        assert "Application Default Credentials" in str(err)
    emu.clear()
    assert await gce.list_tagged({TAG_POOL: "p"}) == []                   # nothing was left running


async def test_wrong_project_is_not_found_naming_it(emu):
    prov = emu.provider(project="not-my-project")
    try:
        with pytest.raises(NotFoundError) as ei:
            await prov.list_tagged({})
        assert "not-my-project" in str(ei.value) and ei.value.code == "projectNotFound"
        assert ei.value.__cause__ is not None
    finally:
        await prov.close()


async def test_an_operation_that_never_finishes_is_a_deadline_and_the_retry_finds_its_instances(emu):
    prov = emu.provider(operation_timeout_s=1.0)
    try:
        offer = await _offer(prov)
        req = _req(offer, count=2)
        emu.slow_operations(None, kinds=("bulkInsert",))
        before = emu.count("bulkInsert")
        t0 = time.monotonic()
        with pytest.raises(ProviderUnavailableError) as ei:
            await prov.launch(req)
        assert ei.value.code == "OperationTimeout" and time.monotonic() - t0 < 10
        # the operation completes later; the same request id (the provisioner's retry) launches
        # nothing new: the request label finds what the first call made
        emu.clear()
        emu.finish_operations()
        first = await prov.launch(req)
        again = await prov.launch(req)
        assert len(first) == 2 and sorted(i.id for i in again) == sorted(i.id for i in first)
        assert emu.count("bulkInsert") == before + 1
        await prov.terminate([i.id for i in first])
    finally:
        emu.clear()
        await prov.close()


async def test_the_librarys_own_retries_are_off(emu, gce):
    emu.fail("aggregatedList", 503, "backendError", times=3)
    before = emu.count("aggregatedList")
    with pytest.raises(ProviderUnavailableError):
        await gce.list_tagged({})
    assert emu.count("aggregatedList") == before + 1   # one call: the provisioner owns retries


async def test_labels_are_encoded_and_round_trip(emu, gce):
    offer = await _offer(gce)
    rid = f"Mixed_Case/{uuid.uuid4().hex[:6]}"
    tags = {TAG_POOL: "Pool.With:Odd/Chars", "flowmesh:note": "x" * 80}   # one needs the hash cut
    (inst,) = await gce.launch(_req(offer, rid=rid, **tags))
    raw = next(i for i in emu.instances if i["id"] == inst.id)
    assert all(k == k.lower() and len(k) <= 63 and len(v) <= 63 for k, v in raw["labels"].items())
    assert inst.tags[TAG_POOL] == "Pool.With:Odd/Chars" and inst.tags[TAG_REQUEST] == rid
    assert [i.id for i in await gce.list_tagged({TAG_POOL: "Pool.With:Odd/Chars"})] == [inst.id]
    assert [i.id for i in await gce.list_tagged({"flowmesh:note": "x" * 80})] == [inst.id]
    await gce.terminate([inst.id])


async def test_spot_and_gpu_launches_send_their_scheduling_and_accelerators(emu, gce):
    gpu = InstanceSpec(cpus=4, memory_gb=16, gpus=1, gpu_name="l4")
    (offer,) = [o for o in await gce.offers(gpu) if o.zone == "us-central1-a"]
    assert (offer.instance_type, offer.gpus, offer.gpu_name, offer.price_per_hour) == ("g2-standard-4", 1, "l4",
                                                                                      None)
    spot = offer.__class__(**{**{f: getattr(offer, f) for f in offer.__dataclass_fields__}, "spot": True})
    (inst,) = await gce.launch(LaunchRequest(offer=spot, spec=gpu, count=1, request_id=f"s-{uuid.uuid4().hex[:6]}",
                                             tags={TAG_FLEET: "gpu"}))
    raw = next(i for i in emu.instances if i["id"] == inst.id)
    assert raw["scheduling"]["provisioningModel"] == "SPOT"
    assert raw["scheduling"]["instanceTerminationAction"] == "DELETE"
    assert raw["scheduling"]["onHostMaintenance"] == "TERMINATE"
    assert raw["guestAccelerators"] == [{"acceleratorType": "nvidia-l4", "acceleratorCount": 1}]
    assert inst.spec == gpu and inst.state is ProviderState.RUNNING
    await gce.terminate([inst.id])


async def test_bad_input_is_refused_before_any_call(emu, gce):
    offer = await _offer(gce)
    elsewhere = offer.__class__(**{**{f: getattr(offer, f) for f in offer.__dataclass_fields__},
                                   "zone": "europe-west4-a"})
    before = emu.count("bulkInsert")
    with pytest.raises(SpecError, match="launch.offer.zone"):
        await gce.launch(_req(elsewhere))
    with pytest.raises(SpecError, match="gce.project"):
        emu.provider(project="Bad Project!")
    assert emu.count("bulkInsert") == before


async def test_pages_are_followed(emu):
    small = GceEmulator(project=emu.project, page_size=2)
    with small:
        prov = small.provider()
        try:
            offer = await _offer(prov)
            launched = await prov.launch(_req(offer, count=5))
            assert len(launched) == 5
            assert len(await prov.list_tagged({})) == 5
            assert sorted(i.id for i in await prov.describe([i.id for i in launched])) == sorted(
                i.id for i in launched)
            await prov.terminate([i.id for i in launched])
            assert await prov.list_tagged({}) == []
        finally:
            await prov.close()


async def test_pool_on_gce_instances_booted_from_their_user_data(fm_home, emu, busybox_image):
    """Instances launched through the real client, booted (emulated cloud-init) as loopback
    sshd hosts with exactly the injected keys, bootstrapped over SSH, sandboxes run there; an
    instance deleted behind the SDK's back is noticed by the reconciler."""
    from flowmesh_sdk.registry.local import LocalRegistry
    with LocalRegistry() as reg:
        image = reg.push(busybox_image, "gce/busybox:1")
        prov = emu.provider(ssh=True)
        try:
            async with Fleet("gce", home=fm_home, providers={"gce": prov}) as fleet:
                pool = await fleet.pool(PoolSpec(name="gce", provider="gce", min_instances=1, max_instances=1,
                                                 sandboxes_per_instance=2, warm_per_image=0, instance=SPEC))
                (iid,) = list(pool.instances)
                raw = next(i for i in emu.instances if i["id"] == iid)
                meta = {m["key"]: m["value"] for m in raw["metadata"]["items"]}
                fleet_key = FleetKey.load_or_create()
                parsed = parse_user_data(meta["user-data"])
                assert parsed.authorized_keys == (fleet_key.public,)
                assert meta["ssh-keys"] == f"root:{fleet_key.public.line}"
                runner = pool.instances[iid].runtime.runner
                vm = emu.hosts.vm(iid)
                assert runner.target.host_key == parsed.host_public.line == vm.sshd.host_public_key
                # the fleet's client private key never travels in metadata
                assert not any(f in meta["user-data"] for f in secret_fragments(
                    (fm_home / "keys" / "fleet_ed25519").read_text()))
                async with pool.sandbox(SandboxSpec(image=image, cpus=1, memory_gb=0.25)) as sb:
                    r = await sb.exec("echo on-gce; exit 4")
                    assert (r.stdout, r.exit_code) == ("on-gce\n", 4)
                emu.delete_behind(iid)
                result = await fleet.reconcile_pools()
                assert result["gce"].gone == (iid,) and iid not in pool.instances
            assert await prov.list_tagged({TAG_FLEET: "gce"}) == []
        finally:
            await prov.close()


async def test_the_host_key_in_user_data_never_reaches_a_log(emu, fm_home, monkeypatch):
    """At DEBUG (google-api-core client logging, GOOGLE_SDK_PYTHON_LOGGING_SCOPE) the Compute
    REST transports log request and response payloads as structured extras; the user-data
    value (the private host key) is blanked in all of them."""
    import logging

    import yaml
    monkeypatch.setenv("GOOGLE_SDK_PYTHON_LOGGING_SCOPE", "google.cloud.compute_v1")
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)
    top = logging.getLogger("google.cloud.compute_v1")
    keep, level = Keep(logging.DEBUG), top.level
    top.addHandler(keep)
    top.setLevel(logging.DEBUG)
    prov = emu.provider(ssh=True)
    try:
        offer = await _offer(prov)
        (inst,) = await prov.launch(_req(offer))
        await prov.describe([inst.id])
        raw = next(i for i in emu.instances if i["id"] == inst.id)
        text = next(m["value"] for m in raw["metadata"]["items"] if m["key"] == "user-data")
        needles = secret_fragments(yaml.safe_load(text)["ssh_keys"]["ed25519_private"])
        assert needles
        dumped = []
        for rec in records:
            dumped.append(rec.getMessage())
            for name in ("httpRequest", "httpResponse"):
                extra = getattr(rec, name, None)
                if isinstance(extra, dict):
                    dumped.append(str(extra.get("payload")))
        flat = "\n".join(dumped).replace("\\n", "").replace("\n", "")
        assert "<redacted>" in flat                         # the payloads were logged ...
        assert not [n for n in needles if n in flat]        # ... without the key
        await prov.terminate([inst.id])
    finally:
        top.removeHandler(keep)
        top.setLevel(level)
        await prov.close()
