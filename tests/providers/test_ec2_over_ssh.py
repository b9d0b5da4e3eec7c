"""EC2 instances (moto, real boto3) backed by real OpenSSH sshd hosts on loopback
addresses: the pool launches through the EC2 API, reaches each instance over SSH (host
keys pinned), and runs sandboxes there from an image pinned by its registry digest."""

from __future__ import annotations

import pytest

from flowmesh_sdk import Fleet, InstanceSpec, PoolSpec, SandboxSpec
from flowmesh_sdk.provider import TAG_FLEET, Instance
from flowmesh_sdk.registry.local import LocalRegistry

pytest.importorskip("paramiko")

from flowmesh_sdk.remote.ssh import SshRunner, SshTarget  # noqa: E402
from flowmesh_sdk.testing.sshd import LoopbackSshd  # noqa: E402


async def test_pool_on_ec2_instances_reached_over_ssh(fm_home, moto_ec2, busybox_image):
    with LoopbackSshd("127.0.0.3") as host_a, LoopbackSshd("127.0.0.4") as host_b, \
            LocalRegistry() as reg:
        image = reg.push(busybox_image, "ssh/busybox:1")
        hosts = [host_a, host_b]
        runners: dict[str, SshRunner] = {}

        def runner_for(inst: Instance) -> SshRunner:
            # each launched instance gets its own machine: the next loopback sshd
            if inst.id not in runners:
                d = hosts[len(runners) % len(hosts)]
                runners[inst.id] = SshRunner(SshTarget(d.host, d.port, d.user, d.client_key_path,
                                                       d.host_public_key))
            return runners[inst.id]

        ec2 = moto_ec2.provider(runner_factory=runner_for)
        try:
            async with Fleet("ssh", home=fm_home, providers={"ec2": ec2}) as fleet:
                pool = await fleet.pool(PoolSpec(name="ssh", provider="ec2", min_instances=2,
                                                 max_instances=2, sandboxes_per_instance=2,
                                                 warm_per_image=0,
                                                 instance=InstanceSpec(cpus=2, memory_gb=4)))
                assert pool.stats().ready == 2
                labels = {mi.runtime.runner.label for mi in pool.instances.values()}
                assert labels == {f"root@127.0.0.3:{host_a.port}", f"root@127.0.0.4:{host_b.port}"}
                spec = SandboxSpec(image=image, cpus=1, memory_gb=0.25)
                for _ in range(2):
                    async with pool.sandbox(spec) as sb:
                        r = await sb.exec("echo over-ssh; exit 3")
                        assert (r.stdout, r.exit_code) == ("over-ssh\n", 3)
                        assert sb.image_id == reg.pushed[image]   # pinned to the registry's digest
                assert all(r.connects == 1 for r in runners.values())   # one connection each
            assert await ec2.list_tagged({TAG_FLEET: "ssh"}) == []
        finally:
            for r in runners.values():
                await r.close()
            await ec2.close()


async def test_a_spot_instance_reclaimed_under_a_task_ends_it_preempted(fm_home, moto_ec2, busybox_image):
    """The cloud takes a spot instance back (terminated in moto behind the pool's back, its
    machine gone): the task on it ends PREEMPTED (no retry left), not a zero of its own."""
    import asyncio

    from flowmesh_sdk import EventKind, InfraFailure, Task
    from flowmesh_sdk.catalog import Catalog

    with LoopbackSshd("127.0.0.6") as host, LocalRegistry() as reg:
        image = reg.push(busybox_image, "ssh/busybox:1")
        runner = SshRunner(SshTarget(host.host, host.port, host.user, host.client_key_path, host.host_public_key))
        ec2 = moto_ec2.provider(runner_factory=lambda inst: runner, instance_types=["c5.large"])
        catalog = Catalog.load(["ec2"], warn=False).with_prices({"c5.large": 0.03}, market="spot")
        try:
            async with Fleet("spot", home=fm_home, providers={"ec2": ec2}, catalog=catalog,
                             reconcile_interval_s=None) as fleet:
                pool = await fleet.pool(PoolSpec(name="spot", provider="ec2", mode="ephemeral", spot="only",
                                                 warm_per_image=0, heartbeat_s=None, retry_infra_failures=0,
                                                 instance=InstanceSpec(cpus=2, memory_gb=4)))
                started = asyncio.ensure_future(fleet.bus.wait_for(lambda e: e.kind is EventKind.TASK_STARTED, 120))
                running = asyncio.ensure_future(pool.run_task(Task(
                    name="victim", sandbox=SandboxSpec(image=image, cpus=1, memory_gb=0.25),
                    command="sleep 60", timeout_s=120)))
                ev = await started
                assert pool.instances[ev.instance_id].offer.spot
                moto_ec2.client().terminate_instances(InstanceIds=[ev.instance_id])   # the spot reclaim ...
                host.stop()                                                # ... and its machine gone
                res = await asyncio.wait_for(running, 120)
            assert (res.infra_failure, res.attempts, res.result) == (InfraFailure.PREEMPTED, 1, None), res
            assert res.cost > 0
        finally:
            await runner.close()
            await ec2.close()
