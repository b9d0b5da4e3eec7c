"""The SSH runner against a real OpenSSH sshd on 127.0.0.2 (testing.sshd.LoopbackSshd)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import time
import uuid

import pytest

paramiko = pytest.importorskip("paramiko")

from flowmesh_sdk.errors import AuthError  # noqa: E402
from flowmesh_sdk.remote.runtime import ContainerRuntime  # noqa: E402
from flowmesh_sdk.remote.ssh import SshRunner, SshTarget  # noqa: E402
from flowmesh_sdk.sandbox import Sandbox  # noqa: E402
from flowmesh_sdk.specs import SandboxSpec  # noqa: E402
from flowmesh_sdk.testing.sshd import LoopbackSshd  # noqa: E402

LABEL = "flowmesh.test"


@pytest.fixture(scope="module")
def sshd():
    # the machine's own container store: the runner-level sandbox test runs a localhost/ image
    with LoopbackSshd("127.0.0.2", own_storage=False) as d:
        yield d


def target_of(d: LoopbackSshd) -> SshTarget:
    return SshTarget(d.host, d.port, d.user, d.client_key_path, d.host_public_key)


@pytest.fixture
async def runner(sshd):
    r = SshRunner(target_of(sshd), connect_timeout_s=10)
    yield r
    await r.close()


def pgrep(pattern: str) -> list[str]:
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout
    return out.split()


async def test_run_streams_exit_codes_and_input(runner, sshd):
    assert runner.label == f"root@127.0.0.2:{sshd.port}" and runner.on_this_host is False
    r = await runner.run(["sh", "-c", "echo out; echo err >&2; exit 7"], timeout_s=20)
    assert (r.exit_code, r.stdout, r.stderr, r.timed_out) == (7, b"out\n", b"err\n", False)
    r = await runner.run(["cat"], timeout_s=20, input=b"a\x00b\nline two")
    assert r.ok and r.stdout == b"a\x00b\nline two" and r.stderr == b""
    # no input: stdin is at EOF at once (cat would otherwise wait forever)
    r = await runner.run(["cat"], timeout_s=20)
    assert r.ok and r.stdout == b""
    # arguments arrive exactly, spaces and quotes included
    r = await runner.run(["printf", "%s|", "a b", "it's", "$HOME", ""], timeout_s=20)
    assert r.stdout == b"a b|it's|$HOME||"
    big = os.urandom(3 << 20)
    r = await runner.run(["sh", "-c", "cat; echo done >&2"], timeout_s=60, input=big)
    assert r.stdout == big and r.stderr == b"done\n"
    assert "AAAA" not in repr(runner.target) and "AAAA" not in repr(runner)


async def test_timeout_kills_the_remote_tree(runner):
    tag = f"fm-ssh-{uuid.uuid4().hex[:8]}"
    t0 = time.monotonic()
    r = await runner.run(["sh", "-c", f"echo started; echo e >&2; sleep 300 & exec sleep 301 # {tag}"],
                         timeout_s=1.5)
    took = time.monotonic() - t0
    assert r.timed_out and not r.ok and r.stdout == b"started\n" and r.stderr == b"e\n"
    assert took < 8, took
    # the shell's background child (`sleep 300`, same group) is gone too
    for _ in range(50):
        if not pgrep(tag) and not pgrep("sleep 30[01]$"):
            break
        await asyncio.sleep(0.1)
    assert not pgrep(tag)
    # the connection is still fine
    assert (await runner.run(["true"], timeout_s=10)).ok


async def test_wrong_host_key_is_refused(sshd):
    before = sshd.accepted_logins()
    other = LoopbackSshd("127.0.0.3")  # keys only; never started
    try:
        bad = dataclasses.replace(target_of(sshd), host_key=other.host_public_key)
        r = SshRunner(bad)
        with pytest.raises(AuthError, match="host key mismatch"):
            await r.run(["true"], timeout_s=10)
        with pytest.raises(AuthError):  # still refused, never accepted on a retry
            await r.open_channel(["cat"])
        assert r.connects == 0
        await r.close()
        assert sshd.accepted_logins() == before  # never authenticated
        garbage = dataclasses.replace(target_of(sshd), host_key="ssh-ed25519 not*base64")
        with pytest.raises(AuthError):
            await SshRunner(garbage).run(["true"], timeout_s=10)
    finally:
        other.stop(cleanup=True)


async def test_put_and_get_files(runner, tmp_path):
    src = tmp_path / "src.bin"
    data = os.urandom(1 << 20)
    src.write_bytes(data)
    remote = f"/tmp/fm-ssh-{uuid.uuid4().hex[:8]}.bin"
    try:
        await runner.put_file(str(src), remote)
        r = await runner.run(["sha256sum", remote], timeout_s=20)
        import hashlib
        assert r.text().split()[0] == hashlib.sha256(data).hexdigest()
        back = tmp_path / "back.bin"
        await runner.get_file(remote, str(back))
        assert back.read_bytes() == data
    finally:
        os.unlink(remote)


async def test_concurrent_runs_share_one_connection(runner, sshd):
    before = sshd.accepted_logins()
    results = await asyncio.gather(*[
        runner.run(["sh", "-c", f"sleep 0.3; echo {i}"], timeout_s=30) for i in range(24)])
    assert [r.stdout for r in results] == [f"{i}\n".encode() for i in range(24)]
    chans = await asyncio.gather(*[runner.open_channel(["cat"]) for _ in range(3)])
    for i, ch in enumerate(chans):
        await ch.write(f"hello {i}\n".encode())
        assert await asyncio.wait_for(ch.readline(), 10) == f"hello {i}\n".encode()
        assert ch.alive
    for ch in chans:
        await ch.close()
        assert not ch.alive
    assert runner.connects == 1
    assert sshd.accepted_logins() - before == 1


async def test_reconnects_after_sshd_restart(runner, sshd):
    assert (await runner.run(["true"], timeout_s=10)).ok
    await asyncio.to_thread(sshd.restart)  # kills the connection; same port and keys
    r = await runner.run(["echo", "again"], timeout_s=20)
    assert r.stdout == b"again\n"
    assert runner.connects == 2


async def test_channel_close_kills_a_stuck_process(runner):
    tag = f"fm-chan-{uuid.uuid4().hex[:8]}"
    ch = await runner.open_channel(["sh", "-c", f"trap '' HUP; sleep 300 # {tag}"])
    assert ch.alive and pgrep(tag)
    t0 = time.monotonic()
    await ch.close()
    assert time.monotonic() - t0 < 10
    for _ in range(50):
        if not pgrep(tag):
            break
        await asyncio.sleep(0.1)
    assert not pgrep(tag)


async def test_sandbox_over_ssh(runner, busybox_image):
    rt = ContainerRuntime(runner)
    info = await rt.probe()
    assert info.binary == "podman"
    spec = SandboxSpec(image=busybox_image)
    name = f"fm-ssh-{uuid.uuid4().hex[:8]}"
    cid = await rt.create(name, spec, {LABEL: "ssh-sandbox"})
    sb = Sandbox(rt, cid, name, spec)
    try:
        await sb.start()
        r = await sb.exec("echo out; echo err >&2; exit 7")
        assert (r.exit_code, r.stdout, r.stderr, r.timed_out) == (7, "out\n", "err\n", False)
        r = await sb.exec("cat /etc/hostname >/dev/null && printf 'x%.0s' $(seq 1 1000)")
        assert r.ok and r.stdout == "x" * 1000
        t0 = time.monotonic()
        r = await sb.exec("sleep 100 & sleep 200", timeout_s=1)
        assert r.timed_out and time.monotonic() - t0 < 10
        r = await sb.exec("ps | grep -c '[s]leep [12]00' || true")
        assert r.stdout.strip() == "0"
        r = await sb.exec("echo still here")
        assert r.ok and r.stdout == "still here\n"
    finally:
        await sb.close()
    assert not await rt.list({LABEL: "ssh-sandbox"})
    assert runner.connects == 1


async def test_input_not_read_is_no_error(runner):
    r = await runner.run(["sh", "-c", "head -c 10; exit 4"], timeout_s=30, input=b"y" * (8 << 20))
    assert (r.exit_code, r.stdout, r.timed_out) == (4, b"y" * 10, False)


async def test_more_channels_than_max_sessions_open_a_second_connection(sshd):
    # sshd here allows 64 sessions; the runner is told 3 per connection, as if MaxSessions
    # were 3: five held-open channels need two connections, and all five answer
    runner = SshRunner(target_of(sshd), max_sessions=3, max_connections=2)
    chans = []
    try:
        for _ in range(5):
            chans.append(await runner.open_channel(["sh"]))
        assert runner.connects == 2
        for i, ch in enumerate(chans):
            await ch.write(f"echo chan-{i}\n".encode())
            assert await asyncio.wait_for(ch.readline(), 10) == f"chan-{i}\n".encode()
        # all six slots of two connections: the seventh caller waits until one is given back
        chans.append(await runner.open_channel(["sh"]))
        waiting = asyncio.ensure_future(runner.open_channel(["sh"]))
        await asyncio.sleep(0.5)
        assert not waiting.done()
        await chans.pop(0).close()
        chans.append(await asyncio.wait_for(waiting, 10))
        assert runner.connects == 2
    finally:
        for ch in chans:
            await ch.close()
        await runner.close()


async def test_a_test_hosts_sessions_read_startup_files_from_its_own_home(runner, sshd):
    # each LoopbackSshd is a machine of its own: its sessions' shell takes ~/.bashrc from the
    # daemon's home, never this machine's user's (whose pyenv init could stall every shell)
    rc = os.path.join(sshd.home, ".bashrc")
    with open(rc, "w") as f:
        f.write("export FM_FROM_HOME=yes\n")
    try:
        r = await runner.run(["sh", "-c", 'echo "$HOME $FM_FROM_HOME"'], timeout_s=20)
    finally:
        os.unlink(rc)
    assert r.stdout.decode().split() == [sshd.home, "yes"]
