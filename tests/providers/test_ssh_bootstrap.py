"""Bootstrapping machines reached over SSH, on real OpenSSH sshd hosts on loopback
addresses (each host with its own container storage): timed idempotent steps, a host
without podman, a failed host replaced, and a host that dies under a task."""

from __future__ import annotations

import asyncio
import os
import stat

import pytest

from flowmesh_sdk import BootstrapPolicy, EventKind, Fleet, InstanceSpec, PoolSpec, SandboxSpec, Task
from flowmesh_sdk.errors import BootstrapError
from flowmesh_sdk.registry.auth import Credentials
from flowmesh_sdk.registry.local import LocalRegistry

pytest.importorskip("paramiko")

from flowmesh_providers.ssh import SshHost, SshProvider  # noqa: E402
from flowmesh_sdk.testing.sshd import LoopbackSshd, bin_dir_without  # noqa: E402

STEPS = ["reach", "runtime", "registry_login", "prefetch", "agent"]


def _host(name: str, d: LoopbackSshd, cpus: int = 4) -> SshHost:
    return SshHost(name=name, host=d.host, port=d.port, user=d.user, key_path=d.client_key_path,
                   host_key=d.host_public_key, cpus=cpus, memory_gb=8)


def _events(fleet: Fleet, kind: EventKind) -> list:
    out: list = []
    fleet.bus.on(out.append, kind)
    return out


@pytest.fixture(scope="module")
def auth_registry():
    with LocalRegistry(auth="htpasswd", username="fm", password="boot-s3cret") as reg:
        yield reg


async def test_fresh_host_bootstraps_in_timed_steps_and_a_rerun_changes_nothing(
        fm_home, auth_registry, busybox_image):
    reg = auth_registry
    image = reg.push(busybox_image, "boot/busybox:1")
    creds = {reg.host: Credentials(reg.username, reg.password)}
    with LoopbackSshd("127.0.0.11") as d:
        reports = []
        for run in range(2):
            prov = SshProvider([_host("box", d)], state_dir=fm_home / f"ssh{run}")
            async with Fleet(f"boot{run}", home=fm_home, providers={"ssh": prov},
                             registry_credentials=creds) as fleet:
                ready = _events(fleet, EventKind.INSTANCE_READY)
                pool = await fleet.pool(PoolSpec(name="p", provider="ssh", min_instances=1,
                                                 instance=InstanceSpec(cpus=2, memory_gb=2),
                                                 warm_per_image=0, warm_images=(image,)))
                (mi,) = pool.instances.values()
                assert [e.instance_id for e in ready] == [mi.id]
                report = ready[0].bootstrap
                assert report is mi.bootstrap and [s.name for s in report.steps] == STEPS
                assert ready[0].detail == report.summary()
                reports.append(report)
                async with pool.sandbox(SandboxSpec(image=image, cpus=1, memory_gb=0.25)) as sb:
                    assert (await sb.exec("echo booted")).stdout == "booted\n"
            await prov.close()
        first, second = ({s.name: s for s in r.steps} for r in reports)
        # the first run put the credentials there and pulled the image into the host's own store
        assert first["registry_login"].changed and first["prefetch"].changed
        assert first["prefetch"].detail == "1 of 1 pulled"
        assert first["runtime"].detail.startswith("podman ") and not first["runtime"].changed
        # the second run found everything in place
        assert not reports[1].changed, reports[1].summary()
        # the auth file went under the login user's home on the host (the test host's own), 0600
        remote = os.path.join(d.home, ".config/flowmesh/auth", reg.host.replace('.', '_').replace(':', '_') + ".json")
        assert stat.S_IMODE(os.stat(remote).st_mode) == 0o600
        assert reg.password not in first["registry_login"].detail
        # the image went to this host's storage, not the machine's shared store
        assert os.path.isdir(os.path.join(d.storage_root, "graph", "overlay-images"))


async def test_host_without_podman_fails_its_runtime_step_clearly(fm_home, tmp_path):
    with LoopbackSshd("127.0.0.12", path=bin_dir_without(tmp_path / "bin")) as d:
        prov = SshProvider([_host("bare", d)], state_dir=fm_home / "ssh")
        async with Fleet("bare", home=fm_home, providers={"ssh": prov},
                         bootstrap=BootstrapPolicy(install_runtime=False)) as fleet:
            failed = _events(fleet, EventKind.INSTANCE_FAILED)
            with pytest.raises(BootstrapError) as ei:
                await fleet.pool(PoolSpec(name="p", provider="ssh", min_instances=1,
                                          instance=InstanceSpec(cpus=2, memory_gb=2)))
            err = ei.value
            assert err.step == "runtime"
            assert "no container runtime (podman or docker)" in str(err)
            assert f"root@{d.host}:{d.port}" in str(err) and "install_runtime is off" in str(err)
            assert failed and "runtime" in failed[0].detail
        assert await prov.list_tagged({}) == []   # the failed instance was terminated
        await prov.close()


async def test_missing_runtime_is_installed_once_then_found(fm_home, tmp_path):
    bindir = bin_dir_without(tmp_path / "bin")
    # the install command for this test host: put podman on its PATH (a real install step on
    # a real host; on a VM the default runs apt-get/dnf)
    policy = BootstrapPolicy(install_command=f"ln -sf /usr/bin/podman {bindir}/podman")
    with LoopbackSshd("127.0.0.13", path=bindir) as d:
        runtime_steps = []
        for run in range(2):
            prov = SshProvider([_host("fresh", d)], state_dir=fm_home / f"ssh{run}")
            async with Fleet(f"inst{run}", home=fm_home, providers={"ssh": prov}, bootstrap=policy) as fleet:
                pool = await fleet.pool(PoolSpec(name="p", provider="ssh", min_instances=1,
                                                 instance=InstanceSpec(cpus=2, memory_gb=2)))
                (mi,) = pool.instances.values()
                runtime_steps.append(next(s for s in mi.bootstrap.steps if s.name == "runtime"))
            await prov.close()
    assert runtime_steps[0].changed and runtime_steps[0].detail.startswith("installed podman")
    assert not runtime_steps[1].changed and runtime_steps[1].detail.startswith("podman ")


async def test_a_host_that_fails_bootstrap_is_replaced_by_another(fm_home, tmp_path):
    with LoopbackSshd("127.0.0.14", path=bin_dir_without(tmp_path / "bin")) as bad, \
            LoopbackSshd("127.0.0.15") as good:
        # the bad host has more free cpus, so placement tries it first
        prov = SshProvider([_host("bad", bad, cpus=16), _host("good", good, cpus=4)],
                           state_dir=fm_home / "ssh")
        async with Fleet("repl", home=fm_home, providers={"ssh": prov},
                         bootstrap=BootstrapPolicy(install_runtime=False)) as fleet:
            failed = _events(fleet, EventKind.INSTANCE_FAILED)
            pool = await fleet.pool(PoolSpec(name="p", provider="ssh", min_instances=1,
                                             instance=InstanceSpec(cpus=2, memory_gb=2)))
            (mi,) = pool.instances.values()
            assert mi.instance.address == "good"
            assert len(failed) == 1 and failed[0].instance_id.startswith("ssh-bad-")
            assert "bad" in prov.quarantined()
        await prov.close()


async def test_task_on_a_host_that_dies_is_redispatched_and_published_once(fm_home, busybox_image):
    with LoopbackSshd("127.0.0.16") as a, LoopbackSshd("127.0.0.17") as b, LocalRegistry() as reg:
        image = reg.push(busybox_image, "boot/busybox:1")
        sshds = {"a": a, "b": b}
        prov = SshProvider([_host("a", a), _host("b", b)], state_dir=fm_home / "ssh")
        async with Fleet("loss", home=fm_home, providers={"ssh": prov}) as fleet:
            ends = _events(fleet, EventKind.TASK_SUCCEEDED)
            again = _events(fleet, EventKind.TASK_REDISPATCHED)
            failed = _events(fleet, EventKind.INSTANCE_FAILED)
            pool = await fleet.pool(PoolSpec(name="p", provider="ssh", min_instances=2, max_instances=2,
                                             instance=InstanceSpec(cpus=2, memory_gb=2),
                                             warm_per_image=0, warm_images=(image,)))
            task = Task(name="t", sandbox=SandboxSpec(image=image, cpus=1, memory_gb=0.25),
                        command="sleep 3; echo done", timeout_s=60)
            started = asyncio.ensure_future(fleet.bus.wait_for(
                lambda e: e.kind is EventKind.TASK_STARTED, 60))
            running = asyncio.ensure_future(pool.run_task(task))
            first = await started
            doomed = pool.instances[first.instance_id].instance.address
            await asyncio.to_thread(sshds[doomed].stop)     # the machine vanishes mid-task
            res = await running
            assert res.ok, res.error
            assert res.result.stdout == "done\n"
            survivor = next(mi for mi in pool.instances.values() if mi.instance.address != doomed)
            assert res.instance_id == survivor.id != first.instance_id
            assert [e.task_id for e in ends] == [res.task_id]        # published once
            assert [e.task_id for e in again] == [res.task_id]
            assert [e.instance_id for e in failed] == [first.instance_id]
            assert "lost" in failed[0].detail
            rows = [r for r in fleet.store.tasks() if r.id == res.task_id]
            assert len(rows) == 1 and rows[0].state == "succeeded"
        await prov.close()
