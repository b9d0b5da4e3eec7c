"""The #cloud-config user-data that injects a host key and the fleet key
(flowmesh_sdk.remote.cloudinit): read the way cloud-init reads it (PyYAML's safe_load),
with cloud-init's key names, the keys usable by paramiko and OpenSSH, and the secret kept
out of reprs and error messages."""

from __future__ import annotations

import subprocess

import pytest

paramiko = pytest.importorskip("paramiko")
yaml = pytest.importorskip("yaml")

from flowmesh_sdk.errors import SpecError  # noqa: E402
from flowmesh_sdk.remote.cloudinit import (MAX_USER_DATA_BYTES, CloudConfig, build_user_data,  # noqa: E402
                                           parse_user_data)
from flowmesh_sdk.remote.keys import generate_ed25519, secret_fragments  # noqa: E402


def _secret(pair) -> list[str]:
    return secret_fragments(pair.private_openssh())


def test_user_data_is_cloud_config_with_cloud_inits_ssh_keys(tmp_path):
    host, fleet = generate_ed25519(), generate_ed25519()
    text = build_user_data(host, [fleet.public])
    assert text.splitlines()[0] == "#cloud-config"
    cfg = yaml.safe_load(text)                      # what cloud-init does with it
    assert cfg["ssh_deletekeys"] is True
    assert cfg["ssh_genkeytypes"] == []
    assert set(cfg["ssh_keys"]) == {"ed25519_private", "ed25519_public"}
    assert cfg["ssh_keys"]["ed25519_public"].split()[:2] == host.public.line.split()
    assert [k.split()[:2] for k in cfg["ssh_authorized_keys"]] == [fleet.public.line.split()]
    assert cfg["disable_root"] is False             # root logs in with the fleet key
    # the private host key as cloud-init writes it to /etc/ssh/ssh_host_ed25519_key
    path = tmp_path / "ssh_host_ed25519_key"
    path.write_text(cfg["ssh_keys"]["ed25519_private"])
    path.chmod(0o600)
    assert paramiko.PKey.from_path(str(path)).asbytes() == host.public.blob
    derived = subprocess.run(["ssh-keygen", "-y", "-f", str(path)], check=True, capture_output=True,
                             text=True).stdout.split()
    assert f"{derived[0]} {derived[1]}" == host.public.line
    # the fleet's private key is never in it
    assert not any(s in text for s in _secret(fleet))


def test_another_login_user_keeps_cloud_inits_root_default():
    cfg = yaml.safe_load(build_user_data(generate_ed25519(), [generate_ed25519().public], user="ec2-user"))
    assert "disable_root" not in cfg
    with pytest.raises(SpecError) as ei:
        build_user_data(generate_ed25519(), [generate_ed25519().public], user="bad user;")
    assert ei.value.field == "cloudinit.user"


def test_parse_reads_back_the_host_public_key_only():
    host, fleet = generate_ed25519(), generate_ed25519()
    parsed = parse_user_data(build_user_data(host, [fleet.public]).encode())
    assert parsed.host_public == host.public
    assert parsed.authorized_keys == (fleet.public,)
    assert parsed.deletes_image_keys
    assert not any(s in repr(parsed) for s in _secret(host))


@pytest.mark.parametrize("text", ["#!/bin/sh\necho hi\n", "#cloud-config\nssh_keys: [\n",
                                  "#cloud-config\n{\"ssh_keys\": {}}\n", ""])
def test_parse_refuses_what_it_did_not_write(text):
    with pytest.raises(SpecError) as ei:
        parse_user_data(text)
    assert ei.value.field.startswith("cloudinit.")


def test_reprs_and_errors_never_show_the_private_key():
    host = generate_ed25519()
    cc = CloudConfig(host, (generate_ed25519().public,))
    assert host.public.fingerprint in repr(cc)
    assert not any(s in repr(cc) for s in _secret(host))
    text = cc.render()
    with pytest.raises(SpecError) as ei:      # a broken document: the message quotes nothing of it
        parse_user_data(text.replace('"ssh_keys"', '"ssh_keys" "'))
    assert not any(s in str(ei.value) for s in _secret(host))


def test_inputs_are_checked():
    host = generate_ed25519()
    with pytest.raises(SpecError) as ei:
        CloudConfig(host, ())
    assert ei.value.field == "cloudinit.authorized_keys"
    with pytest.raises(SpecError) as ei:
        CloudConfig("not a key", (host.public,))  # type: ignore[arg-type]
    assert ei.value.field == "cloudinit.host_key"
    assert len(build_user_data(host, [host.public] * 20).encode()) < MAX_USER_DATA_BYTES
    with pytest.raises(SpecError) as ei:
        build_user_data(host, [host.public] * 400)   # past EC2's 16 KB
    assert ei.value.field == "cloudinit.user_data"
