"""Containers on an SSH machine that was lost when its instance was terminated: the ssh
provider frees the slice and remembers them, and `flowmesh gc -p ssh` says it cannot reach
the machine, then removes them once it answers again.  A real loopback sshd with its own
container storage, a pool over SSH, the CLI as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from flowmesh_sdk import EventKind, Fleet, InstanceSpec, PoolSpec
from flowmesh_sdk.provider import TAG_FLEET
from flowmesh_sdk.registry.local import LocalRegistry

pytest.importorskip("paramiko")

from flowmesh_sdk.testing.sshd import LoopbackSshd  # noqa: E402

from flowmesh_providers.ssh import SshProvider  # noqa: E402


def _containers(d: LoopbackSshd) -> list[str]:
    """The names of the containers in the machine's own store (asked without sshd)."""
    env = dict(os.environ, CONTAINERS_STORAGE_CONF=f"{d.storage_root}/storage.conf",
               CONTAINERS_CONF=f"{d.storage_root}/containers.conf")
    out = subprocess.run(["podman", "ps", "-a", "--filter", "label=flowmesh.fleet=lost", "--format",
                          "{{.Names}}"], capture_output=True, text=True, env=env, check=True)
    return out.stdout.split()


def _gc(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flowmesh_sdk.cli.main", "gc", "-p", "ssh", *args],
                          capture_output=True, text=True, env=env, timeout=300)


async def test_gc_sweeps_a_lost_machines_containers_once_it_answers(fm_home, tmp_path, busybox_image,
                                                                     monkeypatch, caplog):
    with LoopbackSshd("127.0.0.76") as d, LocalRegistry() as reg:
        image = reg.push(busybox_image, "lost/busybox:1")
        inv = tmp_path / "inventory.json"
        inv.write_text(json.dumps({"hosts": [{
            "name": "box1", "host": d.host, "port": d.port, "user": "root", "key_path": d.client_key_path,
            "host_key": d.host_public_key, "cpus": 4, "memory_gb": 8}]}))
        monkeypatch.setenv("FLOWMESH_SSH_INVENTORY", str(inv))
        env = dict(os.environ, FLOWMESH_HOME=str(fm_home), COLUMNS="250")
        prov = SshProvider()                  # as `flowmesh gc -p ssh` loads it
        async with Fleet("lost", home=fm_home, providers={"ssh": prov}) as fleet:
            pool = await fleet.pool(PoolSpec(name="p", provider="ssh", min_instances=1, max_instances=1,
                                             instance=InstanceSpec(cpus=2, memory_gb=2),
                                             warm_per_image=1, warm_images=(image,)))
            while pool.stats().warming or not pool.stats().warm:
                await fleet.bus.wait_for(lambda e: e.kind is EventKind.SANDBOX_READY, 60)
            held = _containers(d)
            assert held                       # the warm sandbox's container is on box1
            d.stop()                          # box1 goes away: its containers keep running
        await prov.close()
        # the fleet's end terminated the instance while box1 did not answer: the slice is free ...
        assert await SshProvider().list_tagged({TAG_FLEET: "lost"}) == []
        assert "did not answer at termination" in caplog.text and "flowmesh gc -p ssh" in caplog.text
        assert _containers(d) == held         # ... and its containers are still there

        dry = _gc(env)
        assert dry.returncode == 0, dry.stdout + dry.stderr
        assert "could not reach box1 (ssh)" in " ".join(dry.stderr.split())
        real = _gc(env, "--yes")
        assert real.returncode == 2, real.stdout + real.stderr   # what box1 holds stays, and gc says so
        assert "could not reach box1" in " ".join(real.stderr.split())
        assert _containers(d) == held

        d.start()                             # box1 answers again
        dry = _gc(env, "--json")
        assert dry.returncode == 0, dry.stdout + dry.stderr
        found = json.loads(dry.stdout)["found"]
        assert sorted(lo["container_name"] for lo in found["leftovers"]) == sorted(held)
        assert {(lo["provider"], lo["machine"], lo["fleet"], lo["pool"]) for lo in found["leftovers"]} == {
            ("ssh", "box1", "lost", "p")}
        assert found["unreachable"] == [] and _containers(d) == held     # a dry run removes nothing
        real = _gc(env, "--yes")
        assert real.returncode == 0, real.stdout + real.stderr
        assert f"removed {len(held)} container(s)" in real.stdout
        assert _containers(d) == []
        again = _gc(env)
        assert "nothing left behind" in again.stdout and "could not reach" not in again.stderr
