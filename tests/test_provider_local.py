"""The provider contract and the local provider."""

import subprocess
import sys

import pytest

from flowmesh_sdk.errors import CapacityError, SpecError
from flowmesh_sdk.provider import (TAG_FLEET, TAG_REQUEST, LaunchRequest, ProviderState,
                                   available_providers, load_provider)
from flowmesh_sdk.specs import InstanceSpec
from flowmesh_providers.local import LocalProvider


def test_importing_the_sdk_imports_no_cloud_sdk():
    code = ("import sys, flowmesh_sdk, flowmesh_sdk.fleet, flowmesh_sdk.cli.main;"
            "bad=[m for m in ('boto3','botocore','google.cloud','azure','alibabacloud_ecs20140526',"
            "'vastai','fabric','paramiko') if m in sys.modules]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert out.stdout.strip() == "[]"


def test_local_is_registered_as_entry_point():
    assert "local" in available_providers()
    prov = load_provider("local", cpus=2, memory_gb=4)
    assert isinstance(prov, LocalProvider)
    assert prov.capabilities.remote is False and prov.capabilities.spot is False


def test_unknown_provider_is_a_spec_error():
    with pytest.raises(SpecError, match=r"pool.provider: unknown provider 'nimbus'; installed providers: .*local"):
        load_provider("nimbus")


def _req(prov: LocalProvider, spec: InstanceSpec, count: int, rid: str, **tags: str) -> LaunchRequest:
    offer = prov._offer(spec)
    return LaunchRequest(offer=offer, spec=spec, count=count, request_id=rid,
                         tags={TAG_FLEET: "t", **tags})


async def test_capacity_accounting_idempotency_and_tags(tmp_path):
    prov = LocalProvider(cpus=4, memory_gb=8, state_dir=tmp_path)
    spec = InstanceSpec(cpus=2, memory_gb=3)
    assert len(await prov.offers(spec)) == 1
    assert await prov.offers(InstanceSpec(cpus=8, memory_gb=1)) == []
    first = await prov.launch(_req(prov, spec, 2, "req-1"))
    assert len({i.id for i in first}) == 2
    again = await prov.launch(_req(prov, spec, 2, "req-1"))
    assert {i.id for i in again} == {i.id for i in first}  # same request id: nothing new
    with pytest.raises(CapacityError, match="host full.*0 cpus"):
        await prov.launch(_req(prov, InstanceSpec(cpus=1, memory_gb=1), 1, "req-2"))
    # a second provider object on the same state dir (another process) sees the same host
    other = LocalProvider(cpus=4, memory_gb=8, state_dir=tmp_path)
    with pytest.raises(CapacityError):
        await other.launch(_req(other, InstanceSpec(cpus=1, memory_gb=1), 1, "req-3"))
    tagged = await other.list_tagged({TAG_REQUEST: "req-1"})
    assert {i.id for i in tagged} == {i.id for i in first}
    assert all(i.state is ProviderState.RUNNING for i in tagged)
    assert await other.list_tagged({TAG_REQUEST: "nope"}) == []
    await prov.terminate([first[0].id, "local-unknown"])
    assert [i.id for i in await prov.describe([i.id for i in first])] == [first[1].id]
    (inst,) = await prov.launch(_req(prov, InstanceSpec(cpus=2, memory_gb=1), 1, "req-4"))
    await prov.terminate([first[1].id, inst.id])
    assert await prov.list_tagged({}) == []


async def test_impossible_size_is_a_clear_spec_error(tmp_path):
    prov = LocalProvider(cpus=2, memory_gb=4, state_dir=tmp_path)
    spec = InstanceSpec(cpus=64, memory_gb=1)
    with pytest.raises(SpecError, match="this host has 2 cpus.*asked for 64 cpus"):
        await prov.launch(LaunchRequest(offer=prov._offer(spec), spec=spec, count=1, request_id="r"))


async def test_contract_fields_free_tags_port_zone_and_fresh_ids(tmp_path):
    from flowmesh_sdk.tags import TagCodec
    prov = LocalProvider(cpus=4, memory_gb=8, state_dir=tmp_path)
    caps = prov.capabilities
    assert caps.free and isinstance(caps.tags, TagCodec) and caps.nested_containers
    spec = InstanceSpec(cpus=1, memory_gb=1)
    (offer,) = await prov.offers(spec)
    assert offer.price_per_hour == 0.0 and offer.offer_id is None
    (a,) = await prov.launch(_req(prov, spec, 1, "r-a"))
    assert (a.port, a.zone, a.price_per_hour) == (None, None, 0.0)
    await prov.terminate([a.id])
    (b,) = await prov.launch(_req(prov, spec, 1, "r-b"))
    assert b.id != a.id                                   # an id is never handed out again
    (seen,) = await LocalProvider(cpus=4, memory_gb=8, state_dir=tmp_path).describe([b.id])
    assert seen == b                                      # the record keeps every field
    await prov.terminate([b.id])
