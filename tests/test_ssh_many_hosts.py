"""Twenty machines, each a real OpenSSH sshd on its own loopback address, bootstrapped by
one pool at the same time: every one reaches READY through the five timed steps on a
single SSH connection of its own, and all twenty were bootstrapping at once."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("fabric")

from flowmesh_sdk import Fleet, InstanceSpec, PoolSpec  # noqa: E402
from flowmesh_sdk.lifecycle import InstanceState  # noqa: E402
from flowmesh_sdk.testing.sshd import LoopbackSshd  # noqa: E402

from flowmesh_providers.ssh import SshHost, SshProvider  # noqa: E402

N = 20
STEPS = ["reach", "runtime", "registry_login", "prefetch", "agent"]


async def test_twenty_hosts_bootstrap_concurrently(fm_home):
    # the machine's shared container store: twenty fresh stores would only measure podman
    sshds = [LoopbackSshd(f"127.0.0.{120 + i}", own_storage=False) for i in range(N)]
    try:
        await asyncio.gather(*(asyncio.to_thread(d.start) for d in sshds))
        hosts = [SshHost(name=f"m{i}", host=d.host, port=d.port, user=d.user, key_path=d.client_key_path,
                         host_key=d.host_public_key, cpus=2, memory_gb=2) for i, d in enumerate(sshds)]
        prov = SshProvider(hosts, state_dir=fm_home / "ssh")
        async with Fleet("many", home=fm_home, providers={"ssh": prov}) as fleet:
            pool = await fleet.pool(PoolSpec(name="p", provider="ssh", min_instances=N, max_instances=N,
                                             instance=InstanceSpec(cpus=2, memory_gb=2), warm_per_image=0))
            managed = list(pool.instances.values())
            assert sorted(mi.instance.address for mi in managed) == sorted(h.name for h in hosts)
            for mi in managed:
                assert mi.state is InstanceState.READY
                assert [s.name for s in mi.bootstrap.steps] == STEPS
                assert all(s.seconds >= 0 for s in mi.bootstrap.steps)
            # all twenty were bootstrapping at once: the last one to start did so before the
            # first one finished
            started = max(mi.lifecycle.entered(InstanceState.RUNNING) for mi in managed)
            finished = min(mi.lifecycle.entered(InstanceState.READY) for mi in managed)
            assert started < finished
        await prov.close()
        assert [d.accepted_logins() for d in sshds] == [1] * N   # one multiplexed connection each
    finally:
        for d in sshds:
            d.stop(cleanup=True)
