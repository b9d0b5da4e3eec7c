"""Host-key trust for the user's own machines, against real OpenSSH sshd hosts on loopback:
the user's known_hosts (hashed by ssh-keygen -H), a host certificate signed by a CA listed
@cert-authority (ssh-keygen -s ... -h), @revoked keys, a changed key refused before
authentication, and nothing ever added without trust on first use being asked for."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

pytest.importorskip("fabric")

from ssh_testbed import hash_known_hosts, keygen, pub, sign_host_key  # noqa: E402

from flowmesh_sdk.errors import AuthError  # noqa: E402
from flowmesh_sdk.remote.keys import KnownHosts, host_id  # noqa: E402
from flowmesh_sdk.remote.known_hosts import host_matches  # noqa: E402
from flowmesh_sdk.remote.ssh import SshRunner, SshTarget  # noqa: E402
from flowmesh_sdk.remote.trust import HostTrust  # noqa: E402
from flowmesh_sdk.testing.sshd import LoopbackSshd  # noqa: E402


def runner(d: LoopbackSshd, known: Path, **trust) -> SshRunner:
    return SshRunner(SshTarget(d.host, d.port, d.user, d.client_key_path, ssh_config=""),
                     trust=HostTrust(known_hosts_files=(str(known),), **trust))


def test_host_patterns_as_openssh_matches_them():
    assert host_matches(["[127.0.0.4*]:*"], ["[127.0.0.45]:2222"])
    assert not host_matches(["127.0.0.4*"], ["[127.0.0.45]:2222"])      # [host]:port is a name of its own
    assert host_matches(["*.lab", "!bad.lab"], ["good.lab"])
    assert not host_matches(["*.lab", "!bad.lab"], ["bad.lab"])
    assert host_matches(["BOX?.Lab"], ["box1.lab"]) and not host_matches(["box?.lab"], ["box12.lab"])


async def test_known_hosts_hashed_entry_accepted_unknown_refused_and_never_added(tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    with LoopbackSshd("127.0.0.45") as d, LoopbackSshd("127.0.0.46") as other:
        known = tmp_path / "known_hosts"
        known.write_text(f"{host_id(d.host, d.port)} {d.host_public_key}\n")
        hash_known_hosts(known)
        assert d.host not in known.read_text() and known.read_text().startswith("|1|")
        r = runner(d, known)
        assert (await r.run(["echo", "known"], timeout_s=20)).stdout == b"known\n"
        await r.close()
        # a host known_hosts does not list: refused, nothing recorded anywhere
        before = known.read_text()
        stranger = runner(other, known)
        with pytest.raises(AuthError, match="is not in known_hosts") as ei:
            await stranger.run(["true"], timeout_s=20)
        assert "trust_on_first_use" in str(ei.value)
        assert other.accepted_logins() == 0 and known.read_text() == before
        await stranger.close()


async def test_trust_on_first_use_only_when_asked_then_recorded_with_a_flowmesh_warning(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    with LoopbackSshd("127.0.0.47") as d:
        record = KnownHosts(tmp_path / "keys" / "known_hosts")
        r = runner(d, tmp_path / "empty_known_hosts", tofu=record, name="ssh host lab")
        assert (await r.run(["true"], timeout_s=20)).ok
        await r.close()
        (w,) = [x for x in caplog.records if x.levelno == logging.WARNING]
        assert w.name == "flowmesh.remote.keys" and "trust on first use" in w.getMessage()
        assert record.get(host_id(d.host, d.port)) is not None
        assert not (tmp_path / "empty_known_hosts").exists()      # the user's file is never written


async def test_changed_host_key_is_refused_before_authentication(tmp_path):
    with LoopbackSshd("127.0.0.48") as d:
        old = keygen(tmp_path / "old_host_key")
        known = tmp_path / "known_hosts"
        known.write_text(f"{host_id(d.host, d.port)} {pub(old)}\n")
        r = runner(d, known)
        with pytest.raises(AuthError, match="host key changed") as ei:
            await r.run(["true"], timeout_s=20)
        assert f"{known}:1" in str(ei.value)
        assert d.accepted_logins() == 0 and r.connects == 0
        await r.close()
        # @revoked: even the right key is refused once the user revokes it
        known.write_text(f"{host_id(d.host, d.port)} {d.host_public_key}\n@revoked * {d.host_public_key}\n")
        with pytest.raises(AuthError, match="@revoked"):
            await runner(d, known).run(["true"], timeout_s=20)
        assert d.accepted_logins() == 0


async def test_host_certificate_signed_by_a_known_ca(tmp_path):
    ca = keygen(tmp_path / "ca")
    host = "127.0.0.49"
    cases = {"good": (host, "-5m:+1h"), "other_name": ("box.other", "-5m:+1h"),
             "expired": (host, "20200101:20200102")}
    for case, (principal, validity) in cases.items():
        key = keygen(tmp_path / f"host_{case}")
        cert = sign_host_key(ca, key, principal, validity)
        with LoopbackSshd(host, host_key_path=str(key), extra_config=(f"HostCertificate {cert}",)) as d:
            known = tmp_path / f"known_{case}"
            # only the CA is listed, for every port of 127.0.0.4x: no key of the host itself
            known.write_text(f"@cert-authority [127.0.0.4*]:* {pub(ca)}\n")
            r = runner(d, known)
            if case == "good":
                assert (await r.run(["echo", "certified"], timeout_s=20)).stdout == b"certified\n"
                # a CA the user revoked no longer certifies anything
                known.write_text(known.read_text() + f"@revoked * {pub(ca)}\n")
                await r.close()
                with pytest.raises(AuthError, match="CA .* @revoked"):
                    await runner(d, known).run(["true"], timeout_s=20)
                assert d.accepted_logins() == 1
            else:
                reason = "not one of its principals" if case == "other_name" else "valid from"
                with pytest.raises(AuthError, match=reason):
                    await r.run(["true"], timeout_s=20)
                assert d.accepted_logins() == 0
            await r.close()
    # a certificate from a CA known_hosts does not list is judged by its plain key: unknown here
    other_ca = keygen(tmp_path / "other_ca")
    key = keygen(tmp_path / "host_other_ca")
    cert = sign_host_key(other_ca, key, host)
    with LoopbackSshd(host, host_key_path=str(key), extra_config=(f"HostCertificate {cert}",)) as d:
        known = tmp_path / "known_other_ca"
        known.write_text(f"@cert-authority * {pub(ca)}\n")
        with pytest.raises(AuthError, match="is not in known_hosts"):
            await runner(d, known).run(["true"], timeout_s=20)
