"""The ec2 provider in SSH mode: each launch carries #cloud-config user-data with a fresh
host key and the fleet's client key; the runner is pinned to exactly that host key.

EC2 is moto's server (real boto3 over HTTP); the VMs are CloudInitVms, a TEST FIXTURE
emulating cloud-init: it reads each instance's user-data back over the EC2 API and boots a
real OpenSSH sshd on a loopback address with exactly the keys it found there."""

from __future__ import annotations

import base64
import logging
import os
import stat

import pytest

from flowmesh_sdk import Fleet, InstanceSpec, PoolSpec, SandboxSpec, SpecError
from flowmesh_sdk.errors import AuthError
from flowmesh_sdk.provider import TAG_FLEET, LaunchRequest
from flowmesh_sdk.remote.cloudinit import parse_user_data
from flowmesh_sdk.remote.keys import FleetKey, KnownHosts, PublicKey, secret_fragments
from flowmesh_sdk.registry.local import LocalRegistry

pytest.importorskip("paramiko")
yaml = pytest.importorskip("yaml")

from flowmesh_providers.ec2.provider import SshMode, trust_id  # noqa: E402
from flowmesh_sdk.testing.cloudinit import CloudInitVms  # noqa: E402


def _b64_fragments(text: str, secret: str) -> list[str]:
    """Runs of base64(text) that encode only bytes of ``secret`` (where it sits in text):
    what botocore would log for user-data holding the key."""
    raw = text.encode()
    off = raw.find(secret.encode())
    assert off >= 0
    enc = base64.b64encode(raw).decode()
    start, end = -(-off // 3) * 4, ((off + len(secret.encode())) // 3) * 4
    return [enc[start:end]] if end - start >= 16 else []


def _assert_no_secret(haystack: str, needles: list[str]) -> None:
    flat = haystack.replace("\\n", "").replace("\n", "")
    leaked = [n for n in needles if n in flat]
    assert not leaked, "private key material found"


def _offer_request(ec2, offers, count: int, rid: str) -> LaunchRequest:
    offer = next(o for o in offers if not o.spot)
    return LaunchRequest(offer=offer, spec=InstanceSpec(cpus=2, memory_gb=4), count=count, request_id=rid,
                         tags={TAG_FLEET: "ci-test"})


async def test_pool_on_ec2_over_ssh_with_injected_keys(fm_home, moto_ec2, busybox_image, caplog):
    caplog.set_level(logging.DEBUG)    # everything, botocore's request/response dumps included
    with CloudInitVms(moto_ec2) as vms, LocalRegistry() as reg:
        image = reg.push(busybox_image, "ci/busybox:1")
        ec2 = moto_ec2.provider(ssh=SshMode(address_map=vms.address))
        try:
            async with Fleet("ci", home=fm_home, providers={"ec2": ec2}) as fleet:
                pool = await fleet.pool(PoolSpec(name="ci", provider="ec2", min_instances=2, max_instances=2,
                                                 sandboxes_per_instance=2, warm_per_image=0,
                                                 instance=InstanceSpec(cpus=2, memory_gb=4)))
                assert pool.stats().ready == 2
                ids = sorted(pool.instances)
                assert sorted(vms.vms) == ids            # each instance booted from its own user-data
                fleet_key = FleetKey.load_or_create()     # in $FLOWMESH_HOME/keys
                client = moto_ec2.client()
                user_data = {}
                for iid in ids:
                    runner = pool.instances[iid].runtime.runner
                    vm = vms.vm(iid)
                    # read back over the EC2 API, independently of the provider
                    text = vms.user_data(iid)
                    user_data[iid] = text
                    parsed = parse_user_data(text)
                    assert runner.target.host_key == parsed.host_public.line == vm.sshd.host_public_key
                    assert runner.target.key_path == fleet_key.private_path
                    assert parsed.authorized_keys == (fleet_key.public,)
                    assert (runner.target.host, runner.target.port) == (vm.sshd.host, vm.sshd.port)
                    # the VM saw the fleet's key log in
                    assert fleet_key.public.fingerprint in vm.sshd.log_text()
                    # IMDSv2, hop limit 1: containers cannot read this user-data from IMDS
                    md = client.describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]
                    assert md["MetadataOptions"]["HttpTokens"] == "required"
                    assert md["MetadataOptions"]["HttpPutResponseHopLimit"] == 1
                # one host key pair per launch request: the two instances of one batch share it
                assert len({vms.vm(i).injected_host_public for i in ids}) == 1
                assert KnownHosts(fm_home / "keys" / "known_hosts").get(trust_id(ids[0])) is not None

                spec = SandboxSpec(image=image, cpus=1, memory_gb=0.25)
                for _ in range(2):
                    async with pool.sandbox(spec) as sb:
                        r = await sb.exec("echo injected; exit 5")
                        assert (r.stdout, r.exit_code) == ("injected\n", 5)
                reprs = " ".join(repr(x) for x in (ec2, fleet_key, *[pool.instances[i].runtime.runner
                                                                      for i in ids]))
            assert await ec2.list_tagged({TAG_FLEET: "ci"}) == []
            # terminated instances leave the trust record
            assert KnownHosts(fm_home / "keys" / "known_hosts").get(trust_id(ids[0])) is None
        finally:
            await ec2.close()

        # the keys directory: 0700, every file 0600
        kdir = fm_home / "keys"
        assert stat.S_IMODE(os.stat(kdir).st_mode) == 0o700
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in kdir.iterdir()}
        assert modes and all(m == 0o600 for m in modes.values()), modes
        # no private key -- the fleet's, or a host's from the user-data -- in any log or repr
        needles = secret_fragments((kdir / "fleet_ed25519").read_text())
        for text in user_data.values():
            host_private = yaml.safe_load(text)["ssh_keys"]["ed25519_private"]
            frags = secret_fragments(host_private)
            needles += frags
            needles += [f for s in frags for f in _b64_fragments(text, s)]
        assert len(needles) >= 4
        assert "UserData" in caplog.text                         # botocore's dumps were captured ...
        _assert_no_secret(caplog.text, needles)                 # ... with the user-data blanked
        _assert_no_secret(reprs, needles)


async def test_an_instance_presenting_another_host_key_is_refused(fm_home, moto_ec2):
    # the emulated VM ignores the injected host key (a man in the middle, or a broken image)
    with CloudInitVms(moto_ec2, ignore_injected_host_key=True) as vms:
        ec2 = moto_ec2.provider(ssh=SshMode(address_map=vms.address, connect_timeout_s=5))
        try:
            req = _offer_request(ec2, await ec2.offers(InstanceSpec(cpus=2, memory_gb=4)), 1, "mitm-1")
            (inst,) = await ec2.launch(req)
            runner = ec2.runner(inst)
            vm = vms.vm(inst.id)
            assert vm.sshd.host_public_key != vm.injected_host_public
            with pytest.raises(AuthError) as ei:
                await runner.run(["true"], timeout_s=10)
            msg = str(ei.value)
            injected = parse_user_data(vms.user_data(inst.id)).host_public
            presented = PublicKey.parse(vm.sshd.host_public_key)
            assert vm.sshd.host in msg
            assert injected.fingerprint.removeprefix("SHA256:") in msg
            assert presented.fingerprint.removeprefix("SHA256:") in msg
            assert vm.sshd.accepted_logins() == 0            # refused before authenticating
        finally:
            await ec2.terminate([i.id for i in await ec2.list_tagged({TAG_FLEET: "ci-test"})])
            await ec2.close()


async def test_keys_survive_a_new_provider_and_are_recovered_from_user_data(fm_home, moto_ec2):
    with CloudInitVms(moto_ec2) as vms:
        first = moto_ec2.provider(ssh=SshMode(address_map=vms.address))
        offers = await first.offers(InstanceSpec(cpus=2, memory_gb=4))
        (inst,) = await first.launch(_offer_request(first, offers, 1, "recover-1"))
        assert (await first.runner(inst).run(["echo", "one"], timeout_s=20)).stdout == b"one\n"
        await first.close()
        second = None
        try:
            # another process on this machine: the trust record knows the instance
            second = moto_ec2.provider(ssh=SshMode(address_map=vms.address))
            assert (await second.runner(inst).run(["echo", "two"], timeout_s=20)).stdout == b"two\n"
            await second.close()
            # the record is lost: a retried launch (same request id) reads the key back from
            # the instance's user-data (DescribeInstanceAttribute) instead of trusting on first use
            KnownHosts(fm_home / "keys" / "known_hosts").forget([trust_id(inst.id)])
            second = moto_ec2.provider(ssh=SshMode(address_map=vms.address))
            with pytest.raises(AuthError) as ei:
                second.runner(inst)
            assert ei.value.code == "NoHostKey"
            (again,) = await second.launch(_offer_request(second, offers, 1, "recover-1"))
            assert again.id == inst.id
            runner = second.runner(again)
            assert runner.target.host_key == vms.vm(inst.id).sshd.host_public_key
            assert (await runner.run(["echo", "three"], timeout_s=20)).stdout == b"three\n"
        finally:
            if second is not None:
                await second.terminate([inst.id])
                await second.close()


async def test_an_instance_launched_without_ssh_mode_gets_no_runner(fm_home, moto_ec2):
    plain = moto_ec2.provider()
    ssh = moto_ec2.provider(ssh=True)
    offers = await plain.offers(InstanceSpec(cpus=2, memory_gb=4))
    try:
        (inst,) = await plain.launch(_offer_request(plain, offers, 1, "plain-1"))
        with pytest.raises(AuthError) as ei:
            ssh.runner(inst)
        assert ei.value.code == "NoHostKey" and inst.id in str(ei.value)
        # a retried launch finds the instance, but its user-data is not ours: still no runner
        (again,) = await ssh.launch(_offer_request(ssh, offers, 1, "plain-1"))
        with pytest.raises(AuthError):
            ssh.runner(again)
    finally:
        await plain.terminate([inst.id])
        await plain.close()
        await ssh.close()


def test_ssh_mode_options_are_checked(moto_ec2):
    with pytest.raises(SpecError) as ei:
        moto_ec2.provider(ssh=SshMode(), user_data="#!/bin/sh\necho hi\n")
    assert ei.value.field == "ec2.user_data"
    with pytest.raises(SpecError) as ei:
        moto_ec2.provider(ssh=True, runner_factory=lambda inst: None)
    assert ei.value.field == "ec2.runner_factory"
    with pytest.raises(SpecError) as ei:
        moto_ec2.provider(ssh="yes")
    assert ei.value.field == "ec2.ssh"
    for kwargs, field in [({"user": "Bad User"}, "ec2.ssh.user"), ({"port": 0}, "ec2.ssh.port"),
                          ({"address": "elastic"}, "ec2.ssh.address"), ({"imds_hop_limit": 65},
                                                                        "ec2.ssh.imds_hop_limit"),
                          ({"max_sessions": 0}, "ec2.ssh.max_sessions"),
                          ({"address_map": "127.0.0.1"}, "ec2.ssh.address_map")]:
        with pytest.raises(SpecError) as ei:
            SshMode(**kwargs)
        assert ei.value.field == field


async def test_runner_address_is_the_private_or_the_public_ip(fm_home, moto_ec2):
    # no connection is made here: the runner connects lazily, and these are moto's fake IPs
    client = moto_ec2.client()
    for address, field in (("private", "PrivateIpAddress"), ("public", "PublicIpAddress")):
        ec2 = moto_ec2.provider(ssh=SshMode(address=address, port=2222, user="ec2-user"))
        try:
            offers = await ec2.offers(InstanceSpec(cpus=2, memory_gb=4))
            (inst,) = await ec2.launch(_offer_request(ec2, offers, 1, f"addr-{address}"))
            runner = ec2.runner(inst)
            item = client.describe_instances(InstanceIds=[inst.id])["Reservations"][0]["Instances"][0]
            assert item[field]
            assert (runner.target.host, runner.target.port, runner.target.user) == (item[field], 2222, "ec2-user")
            assert ec2.runner(inst) is runner                    # one runner (one connection) per instance
            cfg = yaml.safe_load(base64.b64decode(client.describe_instance_attribute(
                InstanceId=inst.id, Attribute="userData")["UserData"]["Value"]))
            assert "disable_root" not in cfg                      # not root: cloud-init's default stays
        finally:
            await ec2.terminate([inst.id])
            await ec2.close()
