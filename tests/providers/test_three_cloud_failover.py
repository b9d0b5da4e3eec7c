"""One pool whose search space holds ec2, gce and azure, all on emulators driven through the
real client libraries (moto + boto3, the Compute Engine emulator + google-cloud-compute, the
ARM emulator + azure-mgmt): EC2 and GCE are out of capacity, so the pool fails over, offer by
offer and cloud by cloud, until Azure launches; the instance is a real loopback sshd host
booted from the keys the provider injected, and a sandbox runs on it."""

from __future__ import annotations

import pytest

from flowmesh_sdk import EventKind, Fleet, InstanceSpec, PoolSpec, SandboxSpec
from flowmesh_sdk.catalog import Catalog
from flowmesh_sdk.provider import TAG_FLEET

pytest.importorskip("paramiko")
pytest.importorskip("boto3")
pytest.importorskip("google.cloud.compute_v1")
pytest.importorskip("azure.mgmt.compute")

SPEC = InstanceSpec(cpus=2, memory_gb=4)


async def test_a_pool_over_three_clouds_fails_over_on_capacity_to_the_last(
        fm_home, moto_ec2, ec2_proxy, gce_emulator, azure_emulator, busybox_image):
    from flowmesh_sdk.registry.local import LocalRegistry
    catalog = Catalog.load(["ec2", "gce", "azure"], use_cache=False, warn=False)
    ec2 = moto_ec2.provider(endpoint_url=ec2_proxy.endpoint_url, instance_types=("m5.large", "c5.large"))
    gce = gce_emulator.provider(machine_types=("e2-standard-2", "n2-standard-2"))
    azure = azure_emulator.provider(ssh=True, vm_sizes=("Standard_D2s_v5",))
    ec2_proxy.fail("RunInstances", "InsufficientInstanceCapacity", times=None)
    gce_emulator.exhaust()
    try:
        with LocalRegistry() as reg:
            image = reg.push(busybox_image, "three/busybox:1")
            async with Fleet("three", home=fm_home, providers={"ec2": ec2, "gce": gce, "azure": azure},
                             catalog=catalog) as fleet:
                events = fleet.bus.subscribe(EventKind.LAUNCH_FAILOVER)
                pool = await fleet.pool(PoolSpec(name="three", infra=("ec2", "gce", "azure"), instance=SPEC,
                                                 min_instances=1, max_instances=1, warm_per_image=0,
                                                 policy="cost"))
                ranked = [o.provider for o in pool.offers]
                assert {"ec2", "gce", "azure"} <= set(ranked)
                (mi,) = pool.instances.values()
                assert mi.instance.provider == "azure"
                failovers = []
                while True:
                    try:
                        failovers.append((await events.next(0.5)).detail)
                    except TimeoutError:   # no more events
                        break
                assert any(d.startswith("ec2/") and "capacity" in d for d in failovers), failovers
                assert any(d.startswith("gce/") and "capacity" in d for d in failovers), failovers
                assert any("-> azure/" in d for d in failovers), failovers
                # every EC2 and GCE offer ranked above Azure's was tried once
                before = ranked[:ranked.index("azure")]
                assert ec2_proxy.calls["RunInstances"] >= before.count("ec2") > 0
                assert gce_emulator.count("bulkInsert") >= before.count("gce") > 0
                async with pool.sandbox(SandboxSpec(image=image, cpus=1, memory_gb=0.25)) as sb:
                    r = await sb.exec("echo landed-on-azure")
                    assert r.stdout == "landed-on-azure\n"
        assert await azure.list_tagged({TAG_FLEET: "three"}) == []
        assert await gce.list_tagged({TAG_FLEET: "three"}) == []
        assert await ec2.list_tagged({TAG_FLEET: "three"}) == []
    finally:
        ec2_proxy.clear()
        gce_emulator.clear()
        for p in (ec2, gce, azure):
            await p.close()
