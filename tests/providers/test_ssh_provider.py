"""The ssh provider (the user's own machines): inventory validation, and a persistent pool
whose sandboxes run over SSH on a real loopback sshd, from an image pinned by digest."""

from __future__ import annotations

import json

import pytest

from flowmesh_sdk import Fleet, InstanceSpec, PoolSpec, SandboxSpec, SpecError
from flowmesh_sdk.provider import TAG_FLEET
from flowmesh_sdk.registry.local import LocalRegistry

pytest.importorskip("paramiko")

from flowmesh_providers.ssh import SshHost, SshProvider, load_inventory  # noqa: E402


@pytest.mark.parametrize("row, field", [
    ({"name": "Box"}, "ssh.hosts[].name"),
    ({"port": 0}, "ssh.hosts[box].port"),
    ({"cpus": 0}, "ssh.hosts[box].cpus"),
    ({"host_key": "AAAA"}, "ssh.hosts[box].host_key"),
    ({"arch": "mips"}, "ssh.hosts[box].arch"),
])
def test_inventory_errors_name_the_field(tmp_path, row, field):
    good = {"name": "box", "host": "127.0.0.9", "key_path": "/k", "host_key": "ssh-ed25519 AAAA",
            "cpus": 4, "memory_gb": 8}
    path = tmp_path / "inv.json"
    path.write_text(json.dumps({"hosts": [{**good, **row}]}))
    with pytest.raises(SpecError) as ei:
        load_inventory(path)
    assert ei.value.field == field


def test_inventory_file_problems(tmp_path, monkeypatch):
    with pytest.raises(SpecError, match="cannot read"):
        load_inventory(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(SpecError, match="is not JSON"):
        load_inventory(tmp_path / "bad.json")
    monkeypatch.delenv("FLOWMESH_SSH_INVENTORY", raising=False)
    with pytest.raises(SpecError, match="FLOWMESH_SSH_INVENTORY"):
        SshProvider()


async def test_pool_on_my_own_machines_over_ssh(fm_home, byo_sshd, busybox_image):
    d = byo_sshd
    host = SshHost(name="box1", host=d.host, port=d.port, user=d.user, key_path=str(d.client_key_path),
                   host_key=d.host_public_key, cpus=4, memory_gb=8)
    prov = SshProvider([host], state_dir=fm_home / "ssh")
    with LocalRegistry() as reg:
        image = reg.push(busybox_image, "byo/busybox:1")
        async with Fleet("byo", home=fm_home, providers={"ssh": prov}) as fleet:
            with pytest.raises(SpecError, match="no machine in the inventory is that large"):
                await fleet.pool(PoolSpec(name="big", provider="ssh", instance=InstanceSpec(cpus=64)))
            pool = await fleet.pool(PoolSpec(name="byo", provider="ssh", min_instances=2, max_instances=2,
                                             instance=InstanceSpec(cpus=2, memory_gb=2),
                                             warm_per_image=1, warm_images=(image,)))
            assert {mi.runtime.runner.label for mi in pool.instances.values()} == {
                f"root@{d.host}:{d.port}"}
            async with pool.sandbox(SandboxSpec(image=image, cpus=1, memory_gb=0.5)) as sb:
                r = await sb.exec("echo mine; exit 4", timeout_s=20)
                assert (r.stdout, r.exit_code) == ("mine\n", 4)
                assert sb.image_id == reg.pushed[image]
    assert await prov.list_tagged({TAG_FLEET: "byo"}) == []
    await prov.close()
