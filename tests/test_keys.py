"""SSH keys and the trust record (flowmesh_sdk.remote.keys): generation, OpenSSH format
(checked against the real ssh-keygen and paramiko), the fleet key's files and their
permissions, trust on first use, and private keys kept out of reprs and logs."""

from __future__ import annotations

import logging
import os
import stat
import subprocess
import threading
import traceback

import pytest

paramiko = pytest.importorskip("paramiko")

from flowmesh_sdk.errors import AuthError, SpecError  # noqa: E402
from flowmesh_sdk.remote.keys import (FleetKey, KeyPair, KnownHosts, PublicKey,  # noqa: E402
                                      generate_ed25519, host_id, keys_dir, secret_fragments)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _secret_lines(pair: KeyPair) -> list[str]:
    """What must never be shown: the base64 runs that encode the private seed."""
    return secret_fragments(pair.private_openssh())


def test_secret_fragments_mark_the_seed_only():
    pair = generate_ed25519()
    frags = secret_fragments(pair.private_openssh())
    assert frags and all(len(f) >= 16 for f in frags)
    body = "".join(ln for ln in pair.private_openssh().splitlines() if not ln.startswith("-----"))
    assert all(f in body for f in frags)
    assert not any(f in pair.public.line for f in frags)


def test_generated_key_is_openssh_format_and_its_fingerprint_is_openssh_s(tmp_path):
    pair = generate_ed25519("t")
    priv = tmp_path / "k"
    priv.write_text(pair.private_openssh())
    priv.chmod(0o600)
    # OpenSSH derives the same public key from our private key file ...
    derived = subprocess.run(["ssh-keygen", "-y", "-f", str(priv)], check=True, capture_output=True,
                             text=True).stdout.split()
    assert f"{derived[0]} {derived[1]}" == pair.public.line
    # ... prints the same fingerprint ...
    (tmp_path / "k.pub").write_text(pair.public.line + "\n")
    out = subprocess.run(["ssh-keygen", "-l", "-f", str(tmp_path / "k.pub")], check=True,
                         capture_output=True, text=True).stdout
    assert pair.public.fingerprint in out.split()
    # ... and paramiko loads it
    assert paramiko.PKey.from_path(str(priv)).asbytes() == pair.public.blob
    # two keys are never the same
    assert generate_ed25519().public != pair.public


def test_public_key_parsing_names_the_field():
    pair = generate_ed25519()
    assert PublicKey.parse(pair.public.line + " a comment") == pair.public
    wrong_type = "ssh-rsa " + pair.public.line.split()[1]
    for bad in ("AAAA", "ssh-ed25519 not*base64", "ssh-ed25519 AAAA", wrong_type):
        with pytest.raises(SpecError) as ei:
            PublicKey.parse(bad, field_name="x.host_key")
        assert ei.value.field == "x.host_key"


def test_private_key_is_hidden_from_reprs_and_messages(tmp_path):
    pair = generate_ed25519("hidden")
    secret = _secret_lines(pair)
    for text in (repr(pair), str(pair), repr(pair.public), str(pair.public)):
        assert not any(s in text for s in secret)
        assert "PRIVATE" not in text
    assert pair.public.fingerprint in repr(pair)
    assert KeyPair.from_private_openssh(pair.private_openssh()).public == pair.public
    with pytest.raises(SpecError) as ei:
        line = pair.private_openssh().splitlines()[2]   # the header's key type: cryptography quotes it
        KeyPair.from_private_openssh(pair.private_openssh().replace(line, line[::-1]))
    # cryptography's own error quotes key bytes: it is not chained into what gets logged
    shown = "".join(traceback.format_exception(ei.value))
    assert "Unsupported key type" not in shown and not any(s in shown for s in secret)


def test_fleet_key_made_once_0600_in_a_0700_dir(tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    old = os.umask(0)          # a careless umask must not make the files readable
    try:
        d = tmp_path / "keys"
        key = FleetKey.load_or_create(d)
    finally:
        os.umask(old)
    assert _mode(d) == 0o700
    assert sorted(p.name for p in d.iterdir()) == ["fleet_ed25519", "fleet_ed25519.pub"]
    assert {p.name: _mode(p) for p in d.iterdir()} == {"fleet_ed25519": 0o600, "fleet_ed25519.pub": 0o600}
    assert FleetKey.load_or_create(d) == key                       # generated once
    assert (d / "fleet_ed25519.pub").read_text().split()[:2] == key.public.line.split()
    assert paramiko.PKey.from_path(key.private_path).asbytes() == key.public.blob
    secret = secret_fragments((d / "fleet_ed25519").read_text())
    assert not any(s in caplog.text or s in repr(key) for s in secret)
    assert key.public.fingerprint in caplog.text                    # the log names the key by fingerprint


def test_concurrent_creation_agrees_on_one_key(tmp_path):
    d = tmp_path / "keys"
    got: list[FleetKey] = []
    threads = [threading.Thread(target=lambda: got.append(FleetKey.load_or_create(d))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 8 and len({k.public for k in got}) == 1
    assert [p.name for p in d.iterdir() if p.name.startswith(".")] == []   # no temp files left


def test_default_location_is_under_flowmesh_home(fm_home):
    assert keys_dir() == fm_home / "keys"
    assert FleetKey.load_or_create().private_path == str(fm_home / "keys" / "fleet_ed25519")


def test_too_open_permissions_are_fixed_or_refused(tmp_path, caplog):
    d = tmp_path / "keys"
    key = FleetKey.load_or_create(d)
    # a directory only readable by others: tightened, with a warning
    d.chmod(0o755)
    caplog.set_level(logging.WARNING)
    assert FleetKey.load_or_create(d) == key
    assert _mode(d) == 0o700 and "readable by other users" in caplog.text
    # a private key others could read: refused (it may have leaked)
    os.chmod(key.private_path, 0o644)
    with pytest.raises(AuthError, match="may have leaked.*chmod 600"):
        FleetKey.load_or_create(d)
    os.chmod(key.private_path, 0o600)
    # a directory others can write to: refused (keys could have been swapped)
    d.chmod(0o777)
    with pytest.raises(AuthError, match="writable by other users"):
        FleetKey.load_or_create(d)
    d.chmod(0o700)
    # the trust record: readable by others -> tightened; writable by others -> refused
    kh = KnownHosts(d / "known_hosts")
    kh.check("box", generate_ed25519().public)
    os.chmod(kh.path, 0o644)
    kh.entries()
    assert _mode(kh.path) == 0o600
    os.chmod(kh.path, 0o666)
    with pytest.raises(AuthError, match="writable by other users"):
        kh.entries()


def test_trust_on_first_use_then_pinned_then_a_change_refused(tmp_path, caplog):
    kh = KnownHosts(tmp_path / "keys" / "known_hosts")
    first, other = generate_ed25519().public, generate_ed25519().public
    hid = host_id("127.0.0.9", 2222)
    assert hid == "[127.0.0.9]:2222" and host_id("box") == "box"
    caplog.set_level(logging.INFO)
    kh.check(hid, first, name="ssh host box")
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert hid in warnings[0].getMessage() and first.fingerprint in warnings[0].getMessage()
    assert _mode(kh.path) == 0o600
    caplog.clear()
    kh.check(hid, first)                                   # pinned now: accepted, no warning
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    with pytest.raises(AuthError) as ei:
        kh.check(hid, other)
    msg = str(ei.value)
    assert hid in msg and first.fingerprint in msg and other.fingerprint in msg
    assert kh.get(hid) == first                            # the record is not replaced
    # OpenSSH reads the record: ssh-keygen -F finds the host with the pinned key
    out = subprocess.run(["ssh-keygen", "-F", hid, "-f", str(kh.path)], capture_output=True, text=True).stdout
    assert first.line.split()[1] in out
    # the user accepts a reinstalled machine by forgetting it
    kh.forget([hid])
    kh.check(hid, other)
    assert kh.get(hid) == other


def test_pin_injected_keys(tmp_path):
    kh = KnownHosts(tmp_path / "known_hosts")
    a, b = generate_ed25519().public, generate_ed25519().public
    kh.pin_many([("ec2:i-1", a), ("ec2:i-2", a)])
    kh.pin("ec2:i-1", a)                                  # the same key again: a no-op
    with pytest.raises(AuthError, match="already has a different trusted key"):
        kh.pin("ec2:i-1", b)
    assert {(e.host, e.how) for e in kh.entries()} == {("ec2:i-1", "injected"), ("ec2:i-2", "injected")}
    kh.forget(["ec2:i-1", "ec2:i-404"])
    assert kh.get("ec2:i-1") is None and kh.get("ec2:i-2") == a


def test_a_broken_trust_record_is_refused_not_skipped(tmp_path):
    kh = KnownHosts(tmp_path / "known_hosts")
    kh.pin("box", generate_ed25519().public)
    with open(kh.path, "a") as fh:
        fh.write("box2 ssh-ed25519 ###\n")
    with pytest.raises(AuthError, match="line 5"):
        kh.get("box")
