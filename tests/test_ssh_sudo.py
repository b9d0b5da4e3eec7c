"""A login user that is not root, with sudo, on real OpenSSH sshd hosts on loopback: users
made with useradd and a sudoers.d file (removed afterwards).  Passwordless sudo
bootstraps a host whose runtime must be installed as root (the install, the 0600
registry credentials, the prefetch, the agent and a sandbox all go through sudo); a
password is answered only when sudo asks, never logged, and a wrong one is refused."""

from __future__ import annotations

import logging
import os
import pwd
import stat
import uuid
from pathlib import Path

import pytest

pytest.importorskip("fabric")

from ssh_testbed import keygen, login_user, need, pub, user_keys_config  # noqa: E402

from flowmesh_sdk import BootstrapPolicy, Fleet, InstanceSpec, PoolSpec, SandboxSpec  # noqa: E402
from flowmesh_sdk.errors import AuthError, FlowMeshError  # noqa: E402
from flowmesh_sdk.registry.auth import Credentials  # noqa: E402
from flowmesh_sdk.remote.ssh import SshRunner, SshTarget  # noqa: E402
from flowmesh_sdk.registry.local import LocalRegistry  # noqa: E402
from flowmesh_sdk.testing.sshd import LoopbackSshd, bin_dir_without  # noqa: E402

from flowmesh_providers.ssh import SshHost, SshProvider  # noqa: E402


async def test_a_sudo_user_bootstraps_the_runtime(fm_home, tmp_path, busybox_image):
    need("sudo", "useradd", "visudo")
    key = keygen(tmp_path / "user_key")
    # sudo's PATH (secure_path) lacks podman: the runtime step must install it, as root
    bindir = bin_dir_without(tmp_path / "bin")
    sudoers = (f'Defaults:{{user}} secure_path="{bindir}"\n'
               'Defaults:{user} env_keep += "CONTAINERS_STORAGE_CONF CONTAINERS_CONF"\n'
               "{user} ALL=(ALL) NOPASSWD: ALL\n")
    policy = BootstrapPolicy(install_command=f'test "$(id -u)" = 0 && ln -sf /usr/bin/podman {bindir}/podman')
    with login_user([pub(key)], sudoers=sudoers) as user, \
            LocalRegistry(auth="htpasswd", username="fm", password="sudo-s3cret") as reg:
        image = reg.push(busybox_image, "sudo/busybox:1")
        with LoopbackSshd("127.0.0.56", extra_config=user_keys_config(user.pw_name)) as d:
            host = SshHost(name="box", host=d.host, port=d.port, user=user.pw_name, key_path=str(key),
                           host_key=d.host_public_key, sudo=True, cpus=2, memory_gb=2)
            prov = SshProvider([host], state_dir=fm_home / "ssh")
            async with Fleet("sudo", home=fm_home, providers={"ssh": prov}, bootstrap=policy,
                             registry_credentials={reg.host: Credentials(reg.username, reg.password)}) as fleet:
                pool = await fleet.pool(PoolSpec(name="p", provider="ssh", min_instances=1, max_instances=1,
                                                 instance=InstanceSpec(cpus=2, memory_gb=2),
                                                 warm_per_image=0, warm_images=(image,)))
                (mi,) = pool.instances.values()
                steps = {s.name: s for s in mi.bootstrap.steps}
                assert steps["runtime"].changed and steps["runtime"].detail.startswith("installed podman")
                assert steps["registry_login"].changed and steps["prefetch"].detail == "1 of 1 pulled"
                assert steps["reach"].detail == f"{user.pw_name}@{d.host}:{d.port}"
                runner = mi.runtime.runner
                who = await runner.run(["sh", "-c", 'echo "$SUDO_USER $(id -u)"'], timeout_s=20)
                assert who.stdout.decode().split() == [user.pw_name, "0"]
                async with pool.sandbox(SandboxSpec(image=image, cpus=1, memory_gb=0.25)) as sb:
                    assert (await sb.exec("echo as-root-via-sudo")).stdout == "as-root-via-sudo\n"
            await prov.close()
        # the install really ran as root; the credentials went to root's home, 0600, root's
        assert os.lstat(f"{bindir}/podman").st_uid == 0
        auth = Path("/root/.config/flowmesh/auth") / ("".join(c if c.isalnum() else "_" for c in reg.host) + ".json")
        try:
            st = os.stat(auth)
            assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == 0
        finally:
            auth.unlink(missing_ok=True)
        assert not list(Path("/tmp").glob(".fm-put-*"))   # the upload's private temp file is gone


async def test_sudo_with_a_password(fm_home, tmp_path, monkeypatch, caplog):
    need("sudo", "useradd", "visudo", "chpasswd")
    caplog.set_level(logging.DEBUG)
    key = keygen(tmp_path / "user_key")
    password = f"pw-{uuid.uuid4().hex}"
    with login_user([pub(key)], sudoers="{user} ALL=(ALL) ALL\n", password=password) as user, \
            LoopbackSshd("127.0.0.57", extra_config=user_keys_config(user.pw_name)) as d:
        def host(env: str | None) -> SshHost:
            return SshHost(name="box", host=d.host, port=d.port, user=user.pw_name, key_path=str(key),
                           host_key=d.host_public_key, sudo=True, sudo_password_env=env, cpus=2, memory_gb=2)

        monkeypatch.setenv("FM_TEST_SUDO_PASSWORD", password)
        prov = SshProvider([host("FM_TEST_SUDO_PASSWORD")], state_dir=fm_home / "ssh")
        runner = prov._runner_for("box")
        try:
            r = await runner.run(["sh", "-c", "id -u; cat; echo err >&2"], timeout_s=30, input=b"typed\n")
            # sudo's prompt never reaches the caller; the input reached the command, not sudo
            assert (r.exit_code, r.stdout, r.stderr) == (0, b"0\ntyped\n", b"err\n")
            ch = await runner.open_channel(["sh"])
            await ch.write(b"id -u\n")
            assert await ch.readline() == b"0\n"
            await ch.close()
            t = await runner.run(["sh", "-c", "sleep 300 & exec sleep 301"], timeout_s=1.5)
            assert t.timed_out   # killed as root, through sudo
            left = await runner.run(["sh", "-c", "pgrep -f 'sleep 30[01]$' || true"], timeout_s=20)
            assert left.stdout == b""
            # files in root's places, through a private temp file
            src = tmp_path / "payload"
            src.write_bytes(os.urandom(4096))
            remote = f"/root/.fm-sudo-{uuid.uuid4().hex[:8]}"
            await runner.put_file(str(src), remote)
            st = os.stat(remote)
            assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o600
            await runner.get_file(remote, str(tmp_path / "back"))
            assert (tmp_path / "back").read_bytes() == src.read_bytes()
            os.unlink(remote)
        finally:
            await prov.close()
        assert repr(password) not in repr(runner) and password not in repr(runner)

        # a wrong password is refused (once: not retried against sudo's three tries)
        monkeypatch.setenv("FM_TEST_SUDO_PASSWORD", "not-" + password)
        wrong = SshProvider([host("FM_TEST_SUDO_PASSWORD")], state_dir=fm_home / "ssh2")
        with pytest.raises(AuthError, match="sudo refused the password"):
            await wrong._runner_for("box").run(["true"], timeout_s=30)
        await wrong.close()
        # no password given, but sudo wants one: sudo -n fails at once instead of hanging
        nopw = SshRunner(SshTarget(d.host, d.port, user.pw_name, str(key), d.host_public_key,
                                   ssh_config="", sudo=True))
        with pytest.raises(FlowMeshError, match="password is required"):
            await nopw.run(["true"], timeout_s=30)
        await nopw.close()
        assert pwd.getpwnam(user.pw_name).pw_uid != 0
    logged = "\n".join(f"{r.getMessage()} {r.exc_text or ''}" for r in caplog.records)
    assert password not in logged
