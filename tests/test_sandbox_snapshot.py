"""Snapshots through the public API: sb.snapshot() commits the sandbox's filesystem,
pushes it to the registry (a LocalRegistry on 127.0.0.1) and returns a digest-pinned
reference; a sandbox started from it in another pool (a fresh instance) has the files
and none of the processes.  Issue 13."""

from __future__ import annotations

import re
import subprocess

import pytest

from flowmesh_sdk import Fleet, InstanceSpec, PoolSpec, SandboxSpec, SpecError
from flowmesh_sdk.remote.runtime import RuntimeConfig
from flowmesh_sdk.registry.local import LocalRegistry


@pytest.fixture(scope="module")
async def registry():
    async with LocalRegistry() as reg:
        host = reg.host
        yield reg
    # the snapshots the forks pulled go with the registry
    listed = subprocess.run(["podman", "images", "--format", "{{.ID}} {{.Repository}}"],
                            capture_output=True, text=True, check=True).stdout.split("\n")
    ids = {line.split()[0] for line in listed if f" {host}/" in line}
    if ids:
        subprocess.run(["podman", "rmi", "-f", *ids], capture_output=True, check=False)


@pytest.fixture(params=["busybox", "bash"])
def image(request, busybox_image, swe_image) -> str:
    return busybox_image if request.param == "busybox" else swe_image


async def test_snapshot_starts_elsewhere_with_the_files_not_the_processes(tmp_path, image, registry):
    from flowmesh_providers.local import LocalProvider

    config = RuntimeConfig(snapshot_registry=registry.host)
    provider = LocalProvider(cpus=2, memory_gb=8, state_dir=tmp_path / "local" / "instances",
                             runtime_config=config)
    async with Fleet("snap", home=tmp_path, providers={"local": provider}, runtime_config=config) as fleet:
        first = await fleet.pool(PoolSpec(name="snap-a", instance=InstanceSpec(cpus=1, memory_gb=2),
                                          min_instances=1, max_instances=1, warm_per_image=0))
        spec = SandboxSpec(image=image, cpus=0.5, memory_gb=0.25)
        async with first.sandbox(spec) as sb:
            await sb.write_file("/work/state/model.txt", "prepared\n")
            sh = sb.session()
            await sh.run("cd /work/state && echo step2 >> model.txt && export SECRET_STATE=1")
            server = await sb.start("exec sleep 1000")
            ref = await sb.snapshot()
            assert re.fullmatch(re.escape(registry.host) + r"/flowmesh/snapshots@sha256:[0-9a-f]{64}", ref), ref
            assert server.returncode is None                 # the sandbox kept running
            assert (await sb.exec("cat /work/state/model.txt")).stdout == "prepared\nstep2\n"
            first_instance = sb.instance_id
        # the commit's local name is gone; the image lives under its digest in the registry
        names = subprocess.run(["podman", "images", "--format", "{{.Repository}}"], capture_output=True,
                               text=True, check=True).stdout
        assert "snapshot-work" not in names
        second = await fleet.pool(PoolSpec(name="snap-b", mode="ephemeral",
                                           instance=InstanceSpec(cpus=1, memory_gb=2),
                                           min_instances=0, max_instances=1))
        async with second.sandbox(SandboxSpec(image=ref, cpus=0.5, memory_gb=0.25)) as fork:
            assert fork.instance_id != first_instance
            assert (await fork.exec("cat /work/state/model.txt")).stdout == "prepared\nstep2\n"
            procs = (await fork.exec("for f in /proc/[0-9]*/cmdline; do tr '\\000' ' ' < $f; echo; done")).stdout
            assert "sleep 1000" not in procs, procs
            r = await fork.session().run('pwd; echo "[$SECRET_STATE]"')
            assert r.stdout == "/\n[]\n"                      # no shell state either
            # the files keep the owners the first sandbox gave them, so root here can
            # write them (podman stores a user-namespaced container's host ids)
            owners = await fork.exec("stat -c '%u:%g %a' /work/state/model.txt /work/state")
            assert owners.stdout == "0:0 644\n0:0 755\n", owners
            wrote = await fork.exec("echo step3 >> /work/state/model.txt && tail -n 1 /work/state/model.txt")
            assert wrote.exit_code == 0 and wrote.stdout == "step3\n", wrote
        # a snapshot needs somewhere to go
        plain = Fleet("snap2", home=tmp_path / "h2",
                      providers={"local": LocalProvider(cpus=2, memory_gb=8,
                                                        state_dir=tmp_path / "h2" / "local")})
        async with plain:
            p = await plain.pool(PoolSpec(name="snap-c", instance=InstanceSpec(cpus=1, memory_gb=2),
                                          min_instances=1, max_instances=1, warm_per_image=0))
            async with p.sandbox(spec) as sb:
                with pytest.raises(SpecError, match="snapshot.registry"):
                    await sb.snapshot()
