"""SSH the way users already have it, on real OpenSSH sshd hosts on loopback addresses:
an ssh config file given to the fleet (a host alias with User/Port/IdentityFile, nothing
else in the inventory), a host reached only through a bastion (ProxyJump, and a two-hop
chain), and a key held by a real ssh-agent.

"Only through a bastion" is real: an nftables rule rejects every connection to the
target's (and the second bastion's) port that does not come from a process of the
bastions' login user -- the sshd forwarding a ProxyJump channel runs as that user, this
test runs as root."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("fabric")

from ssh_testbed import hash_known_hosts, keygen, login_user, need, only_user_reaches, pub, ssh_agent  # noqa: E402,I001

from flowmesh_sdk import Fleet, InstanceSpec, PoolSpec, SandboxSpec  # noqa: E402
from flowmesh_sdk.errors import ProviderUnavailableError  # noqa: E402
from flowmesh_sdk.provider import TAG_FLEET, LaunchRequest  # noqa: E402
from flowmesh_sdk.remote.keys import host_id  # noqa: E402
from flowmesh_sdk.remote.ssh import SshRunner, SshTarget  # noqa: E402
from flowmesh_sdk.registry.local import LocalRegistry  # noqa: E402
from flowmesh_sdk.testing.sshd import LoopbackSshd  # noqa: E402

from flowmesh_providers.ssh import SshHost, SshProvider  # noqa: E402

STEPS = ["reach", "runtime", "registry_login", "prefetch", "agent"]


def known_hosts(path: Path, *hosts: LoopbackSshd) -> Path:
    path.write_text("".join(f"{host_id(d.host, d.port)} {d.host_public_key}\n" for d in hosts))
    hash_known_hosts(path)
    return path


def block(name: str, d: LoopbackSshd, *, user: str, key: str | None, extra: str = "") -> str:
    lines = [f"Host {name}", f"    HostName {d.host}", f"    Port {d.port}", f"    User {user}"]
    if key:
        lines.append(f"    IdentityFile {key}")
    return "\n".join(lines) + (f"\n    {extra}" if extra else "") + "\n"


async def _one(prov: SshProvider, rid: str):
    spec = InstanceSpec(cpus=1, memory_gb=1)
    (offer,) = await prov.offers(spec)
    (inst,) = await prov.launch(LaunchRequest(offer=offer, spec=spec, count=1, request_id=rid,
                                              tags={TAG_FLEET: "cfg"}))
    return inst


async def test_an_alias_from_an_ssh_config_given_to_the_fleet(fm_home, tmp_path, busybox_image):
    with LoopbackSshd("127.0.0.51") as d, LocalRegistry() as reg:
        image = reg.push(busybox_image, "cfg/busybox:1")
        cfg = tmp_path / "ssh_config"
        cfg.write_text(block("lab-box", d, user="root", key=d.client_key_path)
                       + f"Host *\n    UserKnownHostsFile {known_hosts(tmp_path / 'known_hosts', d)}\n")
        # the inventory names the machine by its alias alone (and its size)
        prov = SshProvider([SshHost(name="lab-box", cpus=2, memory_gb=2)], state_dir=fm_home / "ssh",
                           ssh_config=cfg)
        async with Fleet("cfg", home=fm_home, providers={"ssh": prov}) as fleet:
            pool = await fleet.pool(PoolSpec(name="p", provider="ssh", min_instances=1, max_instances=1,
                                             instance=InstanceSpec(cpus=2, memory_gb=2),
                                             warm_per_image=0, warm_images=(image,)))
            (mi,) = pool.instances.values()
            assert [s.name for s in mi.bootstrap.steps] == STEPS
            assert mi.bootstrap.steps[0].detail == f"lab-box (root@{d.host}:{d.port})"
            async with pool.sandbox(SandboxSpec(image=image, cpus=1, memory_gb=0.25)) as sb:
                assert (await sb.exec("echo via-alias")).stdout == "via-alias\n"
        await prov.close()
        assert d.accepted_logins() == 1   # bootstrap and sandbox on one multiplexed connection


async def test_a_host_reached_only_through_bastions(fm_home, tmp_path):
    need("nft", "useradd")
    user_key = keygen(tmp_path / "user_key")
    with login_user([pub(user_key)]) as jump:
        jump_cfg = ("Match User " + jump.pw_name, "    AuthorizedKeysFile .ssh/authorized_keys")
        with LoopbackSshd("127.0.0.52") as target, \
                LoopbackSshd("127.0.0.53", extra_config=jump_cfg) as b1, \
                LoopbackSshd("127.0.0.54", extra_config=jump_cfg) as b2, \
                only_user_reaches(jump.pw_uid, [(target.host, target.port), (b2.host, b2.port)]):
            known = known_hosts(tmp_path / "known_hosts", target, b1, b2)
            cfg = tmp_path / "ssh_config"
            cfg.write_text(block("bastion1", b1, user=jump.pw_name, key=str(user_key))
                           + block("bastion2", b2, user=jump.pw_name, key=str(user_key))
                           + block("inner", target, user="root", key=target.client_key_path,
                                   extra="ProxyJump bastion1")
                           + block("inner2", target, user="root", key=target.client_key_path,
                                   extra="ProxyJump bastion1,bastion2")
                           + f"Host *\n    UserKnownHostsFile {known}\n    ConnectTimeout 5\n")
            # the target is not reachable directly, nor is the second bastion
            for d in (target, b2):
                direct = SshRunner(SshTarget(d.host, d.port, "root", d.client_key_path, d.host_public_key,
                                             ssh_config=""))
                with pytest.raises(ProviderUnavailableError, match="cannot connect"):
                    await direct.run(["true"], timeout_s=10)
                await direct.close()
            prov = SshProvider([SshHost(name="inner", cpus=2, memory_gb=2),
                                SshHost(name="inner2", cpus=2, memory_gb=2)],
                               state_dir=fm_home / "ssh", ssh_config=cfg)
            try:
                for name, via in (("inner", [b1]), ("inner2", [b1, b2])):
                    before = [b.accepted_logins() for b in (b1, b2)]
                    runner = prov._runner_for(name)
                    await runner.wait_reachable(30)
                    r = await runner.run(["sh", "-c", "echo $SSH_CONNECTION"], timeout_s=20)
                    # the target saw the connection come from 127.0.0.1, forwarded by a bastion's sshd
                    assert r.ok and r.stdout.split()[2:] == [target.host.encode(), str(target.port).encode()]
                    used = [b.accepted_logins() - n for b, n in zip((b1, b2), before)]
                    assert used == [1 if b in via else 0 for b in (b1, b2)], (name, used)
                    chans = [await runner.open_channel(["cat"]) for _ in range(3)]
                    for i, ch in enumerate(chans):
                        await ch.write(f"{name}-{i}\n".encode())
                        assert await ch.readline() == f"{name}-{i}\n".encode()
                        await ch.close()
                    assert runner.connects == 1
                inst = await _one(prov, "via-bastion")
                assert (await prov.runner(inst).run(["hostname"], timeout_s=20)).ok
                await prov.terminate([inst.id])
            finally:
                await prov.close()


async def test_a_key_held_by_ssh_agent(tmp_path, monkeypatch):
    need("ssh-agent", "ssh-add")
    with LoopbackSshd("127.0.0.55") as d:
        held = tmp_path / "held_key"
        Path(d.client_key_path).rename(held)       # the key exists only in the agent from now on
        Path(d.client_key_path + ".pub").rename(f"{held}.pub")
        with ssh_agent(tmp_path, held) as sock:
            held.unlink()
            monkeypatch.setenv("SSH_AUTH_SOCK", sock)
            monkeypatch.setenv("HOME", str(tmp_path))      # no ~/.ssh/id_* to fall back on
            cfg = tmp_path / "ssh_config"
            cfg.write_text(block("agent-box", d, user="root", key=None)
                           + f"    UserKnownHostsFile {known_hosts(tmp_path / 'known_hosts', d)}\n")
            r = SshRunner(SshTarget("agent-box", ssh_config=str(cfg)))
            assert (await r.run(["echo", "agent"], timeout_s=20)).stdout == b"agent\n"
            await r.close()
            monkeypatch.delenv("SSH_AUTH_SOCK")
            from flowmesh_sdk.errors import AuthError
            with pytest.raises(AuthError, match="no key to log in as root"):
                await SshRunner(SshTarget("agent-box", ssh_config=str(cfg))).run(["true"], timeout_s=20)


def test_what_the_ssh_config_resolves_and_what_the_target_overrides(tmp_path):
    cfg = tmp_path / "ssh_config"
    cfg.write_text("Host slow\n    HostName 127.0.0.58\n    Port 2222\n    User alice\n    ConnectTimeout 3\n")
    r = SshRunner(SshTarget("slow", ssh_config=str(cfg)))
    r._build()      # reads the config, opens nothing
    assert (r.connect_timeout_s, r.label) == (3, "slow (alice@127.0.0.58:2222)")
    # given explicitly, port, user and the timeout win over the config, as on ssh's command line
    r = SshRunner(SshTarget("slow", port=22, user="bob", ssh_config=str(cfg)), connect_timeout_s=7)
    r._build()
    assert (r.connect_timeout_s, r.label) == (7, "slow (bob@127.0.0.58:22)")
