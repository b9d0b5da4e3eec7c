"""The ssh provider without a pinned host key, marked ``trust_on_first_use``: against a
real OpenSSH sshd on loopback (LoopbackSshd) -- recorded with a warning, pinned from then
on, and a host that comes back with a new host key refused.  Without the mark such a host
is refused (tests/test_ssh_trust.py)."""

from __future__ import annotations

import json
import logging

import pytest

from flowmesh_sdk import Fleet, InstanceSpec, PoolSpec, SandboxSpec
from flowmesh_sdk.errors import AuthError
from flowmesh_sdk.provider import TAG_FLEET, LaunchRequest
from flowmesh_sdk.remote.keys import KnownHosts, PublicKey, host_id
from flowmesh_sdk.registry.local import LocalRegistry

pytest.importorskip("paramiko")

from flowmesh_providers.ssh import SshHost, SshProvider, load_inventory  # noqa: E402
from flowmesh_sdk.testing.sshd import LoopbackSshd  # noqa: E402


def _unpinned(name: str, d: LoopbackSshd, key_path: str) -> SshHost:
    return SshHost(name=name, host=d.host, port=d.port, user=d.user, key_path=key_path, host_key=None,
                   cpus=4, memory_gb=8, trust_on_first_use=True)


async def _one_instance(prov: SshProvider, rid: str):
    (offer,) = await prov.offers(InstanceSpec(cpus=1, memory_gb=1))
    (inst,) = await prov.launch(LaunchRequest(offer=offer, spec=InstanceSpec(cpus=1, memory_gb=1), count=1,
                                              request_id=rid, tags={TAG_FLEET: "tofu"}))
    return inst


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
            and r.name == "flowmesh.remote.keys"]


def test_inventory_may_leave_host_key_out(tmp_path):
    path = tmp_path / "inv.json"
    row = {"name": "box", "host": "127.0.0.9", "key_path": "/k", "cpus": 4, "memory_gb": 8}
    for extra in ({}, {"host_key": None}, {"trust_on_first_use": True}):
        path.write_text(json.dumps({"hosts": [{**row, **extra}]}))
        (host,) = load_inventory(path)
        assert host.host_key is None          # known_hosts decides, or trust on first use if marked
        assert host.trust_on_first_use is bool(extra.get("trust_on_first_use"))


async def test_first_use_is_recorded_with_a_warning_then_pinned_and_a_new_key_refused(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    keys = tmp_path / "keys"
    d = LoopbackSshd("127.0.0.31")
    d.start()
    client_key = d.client_key_path
    prov = SshProvider([_unpinned("box", d, client_key)], state_dir=tmp_path / "state", keys_dir=keys)
    prov2 = prov3 = None
    d2 = None
    try:
        inst = await _one_instance(prov, "tofu-1")
        runner = prov.runner(inst)
        assert (await runner.run(["echo", "first"], timeout_s=20)).stdout == b"first\n"
        hid = host_id(d.host, d.port)
        key = PublicKey.parse(d.host_public_key)
        (warning,) = _warnings(caplog)
        assert hid in warning and key.fingerprint in warning and "box" in warning
        assert KnownHosts(keys / "known_hosts").get(hid) == key
        (entry,) = KnownHosts(keys / "known_hosts").entries()
        assert entry.how == "tofu"

        # pinned from now on: another coordinator (a new provider object) connects without a warning
        caplog.clear()
        prov2 = SshProvider([_unpinned("box", d, client_key)], state_dir=tmp_path / "state", keys_dir=keys)
        assert (await prov2.runner(inst).run(["echo", "again"], timeout_s=20)).stdout == b"again\n"
        assert _warnings(caplog) == []

        # the machine comes back on the same address with a new host key
        authorized = [open(client_key + ".pub").read()]
        d.stop()
        d2 = LoopbackSshd(d.host, port=d.port, authorized_keys=authorized)
        d2.start()
        new = PublicKey.parse(d2.host_public_key)
        assert new != key
        # ... a held runner reconnects and is refused; so is a fresh one
        for r in (runner, SshProvider([_unpinned("box", d2, client_key)], state_dir=tmp_path / "state",
                                      keys_dir=keys).runner(inst)):
            with pytest.raises(AuthError) as ei:
                await r.run(["true"], timeout_s=20)
            msg = str(ei.value)
            assert hid in msg and key.fingerprint in msg and new.fingerprint in msg
            await r.close()
        assert d2.accepted_logins() == 0                        # refused before logging in
        assert KnownHosts(keys / "known_hosts").get(hid) == key  # the record was not replaced
        # the user checks the machine and accepts its new key by forgetting the old one
        KnownHosts(keys / "known_hosts").forget([hid])
        prov3 = SshProvider([_unpinned("box", d2, client_key)], state_dir=tmp_path / "state", keys_dir=keys)
        assert (await prov3.runner(inst).run(["echo", "ok"], timeout_s=20)).stdout == b"ok\n"
        assert KnownHosts(keys / "known_hosts").get(hid) == new
    finally:
        for p in (prov, prov2, prov3):
            if p is not None:
                await p.terminate([i.id for i in await p.list_tagged({TAG_FLEET: "tofu"})])
                await p.close()
        if d2 is not None:
            d2.stop(cleanup=True)
        d.stop(cleanup=True)


async def test_a_pool_over_a_host_trusted_on_first_use(fm_home, busybox_image, caplog):
    caplog.set_level(logging.WARNING)
    with LoopbackSshd("127.0.0.32") as d, LocalRegistry() as reg:
        image = reg.push(busybox_image, "tofu/busybox:1")
        prov = SshProvider([_unpinned("box", d, d.client_key_path)], state_dir=fm_home / "ssh")
        async with Fleet("tofu", home=fm_home, providers={"ssh": prov}) as fleet:
            pool = await fleet.pool(PoolSpec(name="tofu", provider="ssh", min_instances=1, max_instances=1,
                                             instance=InstanceSpec(cpus=2, memory_gb=2), warm_per_image=0))
            async with pool.sandbox(SandboxSpec(image=image, cpus=1, memory_gb=0.5)) as sb:
                r = await sb.exec("echo trusted; exit 2", timeout_s=20)
                assert (r.stdout, r.exit_code) == ("trusted\n", 2)
        await prov.close()
        hid = host_id(d.host, d.port)
        # recorded once, in the default place ($FLOWMESH_HOME/keys/known_hosts), with one warning
        assert KnownHosts(fm_home / "keys" / "known_hosts").get(hid) == PublicKey.parse(d.host_public_key)
        assert len([w for w in _warnings(caplog) if hid in w]) == 1
