"""The gVisor tier (``kernel="gvisor"``, issue 24) through the public API on real podman
and Debian's runsc: one test per sandbox feature -- exec, sessions, processes, files,
snapshots, limits -- and the hardening checks, under gVisor's kernel.  A network is
refused under it (docs/security.md says why), so the metadata address has nothing to
reach it through; that is checked too.  Skipped only where runsc is not installed
(setup.sh installs it)."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from flowmesh_sdk import Fleet, InstanceSpec, PoolSpec, SandboxSpec, SpecError, Task
from flowmesh_sdk.errors import RuntimeMissingError, SandboxClosedError, SandboxFileError
from flowmesh_sdk.remote.local import LocalRunner
from flowmesh_sdk.remote.runtime import ContainerRuntime, RuntimeConfig
from conftest import local_pool  # noqa: E402
from test_sandbox_hardening import EXPECTED_CAPS, _assert_sleeps  # noqa: E402 - the runc checks' own

pytestmark = pytest.mark.skipif(shutil.which("runsc") is None,
                                reason="gVisor's runsc is not installed (bash setup.sh installs it)")

DISK_LIMIT_MB = 32


@pytest.fixture(scope="module")
async def gv(tmp_path_factory, busybox_image, swe_image, snapshot_registry):
    """A persistent pool whose sandboxes all run under gVisor (the pool's kernel)."""
    config = RuntimeConfig(disk_limit_mb=DISK_LIMIT_MB, snapshot_registry=snapshot_registry.host)
    async with local_pool(tmp_path_factory.mktemp("fmhome-gvisor"), "gv", warm_per_image=0,
                          runtime_config=config, kernel="gvisor") as (fleet, pool):
        yield pool


def _spec(image: str, **kw) -> SandboxSpec:
    return SandboxSpec(**{"image": image, "cpus": 1, "memory_gb": 0.5, "kernel": "gvisor", **kw})


async def test_the_pools_kernel_is_gvisors_for_every_sandbox(gv, busybox_image):
    host = os.uname().release
    assert gv.default_sandbox(busybox_image).kernel == "gvisor"
    # a spec that asks for the host's kernel still gets gVisor's on a gVisor pool: the floor
    async with gv.sandbox(SandboxSpec(image=busybox_image, cpus=1, memory_gb=0.5)) as sb:
        assert sb.spec.kernel == "gvisor"
        r = await sb.exec("uname -r; dmesg 2>/dev/null | head -n 3")
        release, _, boot = r.stdout.partition("\n")
        assert release != host, r                    # not the host's kernel ...
        assert "gVisor" in boot, r                   # ... gVisor's, which says so at boot
    res = await gv.run_task(Task(name="t", sandbox=SandboxSpec(image=busybox_image, cpus=1, memory_gb=0.5),
                                 command="uname -r"))
    assert res.ok and res.result.stdout.strip() != host, res


async def test_exec_under_gvisor(gv, swe_image):
    async with gv.sandbox(_spec(swe_image, env={"A": "x y"}, workdir="/tmp")) as sb:
        r = await sb.exec('echo "$A" "$(pwd)"; echo err >&2; exit 3')
        assert (r.exit_code, r.stdout, r.stderr) == (3, "x y /tmp\n", "err\n"), r
        # a timeout kills the command's whole tree, orphans too, and the sandbox goes on
        for cmd in ("sleep 30 & sleep 31", "(sleep 32 &) ; sleep 33 & sleep 34; echo never",
                    "bash -c 'sleep 37 & sleep 38 & wait'"):
            r = await sb.exec(cmd, timeout_s=1)
            assert r.timed_out and "never" not in r.stdout, (cmd, r)
            await _assert_sleeps(sb, "0", cmd)
        # a background job of an earlier exec is not killed by a later exec's timeout
        job = (await sb.exec("nohup sleep 39 >/dev/null 2>&1 & echo $!")).stdout.strip()
        assert (await sb.exec("sleep 5", timeout_s=0.5)).timed_out
        await _assert_sleeps(sb, "1", "the earlier exec's background job")
        await sb.exec(f"kill {job}")
        await _assert_sleeps(sb, "0", "pkill")
        data = bytes(range(256)) * 64
        await sb.write_file("/tmp/bin", data)
        out = await sb.exec("cat /tmp/bin", binary=True)
        assert out.stdout_raw == data


async def test_a_session_keeps_its_state_and_survives_a_timeout_under_gvisor(gv, swe_image):
    async with gv.sandbox(_spec(swe_image)) as sb:
        s = sb.session()
        await s.run("cd /etc && export MODE=gv && f() { echo in-f; }")
        r = await s.run("sleep 100; echo not-reached", timeout_s=1)
        assert r.timed_out and "not-reached" not in r.stdout, r
        r = await s.run('pwd; echo "$MODE"; f')
        assert r.stdout == "/etc\ngv\nin-f\n", r


async def test_a_started_process_streams_and_is_killed_under_gvisor(gv, busybox_image):
    async with gv.sandbox(_spec(busybox_image)) as sb:
        proc = await sb.start("for i in 1 2 3; do echo line$i; done; sleep 30")
        got = b""
        async for chunk in proc.stdout:
            got += chunk
            if got.count(b"\n") >= 3:
                break
        assert got == b"line1\nline2\nline3\n"
        await proc.kill()
        res = await proc.wait(timeout_s=30)
        assert res.exit_code != 0
        await _assert_sleeps(sb, "0", "the killed process")


async def test_files_and_the_disk_limit_under_gvisor(gv, busybox_image, tmp_path):
    async with gv.sandbox(_spec(busybox_image)) as sb:
        blob = os.urandom(1 << 20)
        await sb.write_file("/root/blob", blob)
        assert await sb.read_file("/root/blob") == blob
        # a tree up and back down (tar over the runtime's exec)
        (tmp_path / "up" / "pkg").mkdir(parents=True)
        (tmp_path / "up" / "pkg" / "a.txt").write_text("a\n")
        (tmp_path / "up" / "b.bin").write_bytes(blob[:4096])
        await sb.upload(str(tmp_path / "up"), "/work/up")
        assert (await sb.exec("cat /work/up/pkg/a.txt; wc -c < /work/up/b.bin")).stdout == "a\n4096\n"
        await sb.download("/work/up", str(tmp_path / "down"))
        assert (tmp_path / "down" / "up" / "pkg" / "a.txt").read_text() == "a\n"
        assert (tmp_path / "down" / "up" / "b.bin").read_bytes() == blob[:4096]
        over = DISK_LIMIT_MB + 8
        r = await sb.exec(f"dd if=/dev/zero of=/root/big bs=1M count={over} 2>&1; echo rc=$?")
        assert "rc=0" not in r.stdout, r
        assert int((await sb.exec("wc -c < /root/big")).stdout) <= DISK_LIMIT_MB << 20
        with pytest.raises(SandboxFileError):
            await sb.write_file("/root/big2", b"\x00" * (over << 20))
        assert (await sb.exec("rm -f /root/big && echo fine")).stdout == "fine\n"


async def test_memory_and_process_limits_hold_under_gvisor(gv, busybox_image):
    async with gv.sandbox(_spec(busybox_image, pids=40, memory_gb=0.125)) as sb:
        # the process limit is the sandbox's own (gVisor's RLIMIT_NPROC), less the agent's 8
        assert (await sb.exec("ulimit -u")).stdout == "32\n"
        r = await sb.exec("(f(){ f|f & }; f) 2>/dev/null & while :; do :; done", timeout_s=3)
        assert r.timed_out, r
        for _ in range(3):
            assert (await sb.exec("echo alive")).stdout == "alive\n"
    # allocating 200 MB in a 128 MB sandbox: the host's OOM killer sees one process, gVisor's
    # kernel, and ends it: the sandbox is lost as a whole (docs/security.md), its neighbour is not
    async with gv.sandbox(_spec(busybox_image)) as calm:
        async with gv.sandbox(_spec(busybox_image, memory_gb=0.125)) as sb:
            with pytest.raises(SandboxClosedError):
                await sb.exec("dd if=/dev/zero of=/dev/null bs=200M count=1", timeout_s=60)
        assert (await calm.exec("echo calm")).stdout == "calm\n"


@pytest.mark.parametrize("which", ["busybox", "debian"])
async def test_hardening_holds_under_gvisor(gv, which, busybox_image, swe_image):
    image = busybox_image if which == "busybox" else swe_image
    async with gv.sandbox(_spec(image)) as sb:
        st = (await sb.exec("cat /proc/self/status")).stdout
        fields = dict(line.split(":\t", 1) for line in st.splitlines() if ":\t" in line)
        assert int(fields["CapEff"], 16) == EXPECTED_CAPS, st
        assert int(fields["CapBnd"], 16) == EXPECTED_CAPS, st
        if which == "debian":   # gVisor's status has no NoNewPrivs line: ask the kernel
            r = await sb.exec("python3 -c 'import ctypes; print(ctypes.CDLL(None).prctl(39, 0, 0, 0, 0))'")
            assert r.stdout == "1\n", r
        assert (await sb.exec("id -u")).stdout == "0\n"
        assert "refused" in (await sb.exec("mount -t tmpfs none /mnt 2>&1 || echo refused")).stdout
        r = await sb.exec("touch /root/o && chown 1000:1000 /root/o && chmod 600 /root/o && echo fine")
        assert r.stdout == "fine\n", r
        r = await sb.exec("sleep 5 & kill $! && echo killed")
        assert r.stdout == "killed\n", r
        # root inside is not root on the host: what it writes is the mapped uid's there
        upper = subprocess.run(["podman", "inspect", "--format", "{{.GraphDriver.Data.UpperDir}}",
                                sb.container_id], capture_output=True, text=True, check=True).stdout.strip()
        st_host = os.stat(Path(upper) / "root" / "o")
        assert st_host.st_uid == 100000 + 1000, st_host
        await sb.write_file("/root/mine", b"x")
        assert os.stat(Path(upper) / "root" / "mine").st_uid == 100000
        # and no process of the sandbox is a host process: gVisor's kernel runs them
        await sb.start("exec sleep 4242")
        host_cmds = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
        assert "sleep 4242" not in host_cmds
        assert "4242" in (await sb.exec("cat /proc/[0-9]*/cmdline | tr '\\000' ' '")).stdout
        # no network but gVisor's loopback: the metadata address is unreachable
        devs = (await sb.exec("cat /proc/net/dev")).stdout
        assert {line.split(":")[0].strip() for line in devs.splitlines()[2:]} == {"lo"}, devs
        r = await sb.exec("nc -w 3 169.254.169.254 80 </dev/null 2>&1; echo rc=$?" if which == "busybox" else
                          "python3 -c \"import socket\ntry: socket.create_connection(('169.254.169.254', 80), 3)\n"
                          "except OSError as e: print('refused', e.errno)\nelse: print('connected')\"", timeout_s=10)
        assert "rc=0" not in r.stdout and "connected" not in r.stdout and r.duration_s < 3, r


async def test_a_snapshot_under_gvisor_keeps_the_files(gv, busybox_image, tmp_path):
    async with gv.sandbox(_spec(busybox_image)) as sb:
        await sb.write_file("/work/state/model.txt", "prepared\n")
        await sb.exec("echo step2 >> /work/state/model.txt && echo scratch > /tmp/scratch")
        ref = await sb.snapshot()
    async with gv.sandbox(_spec(ref)) as fork:
        assert (await fork.exec("cat /work/state/model.txt")).stdout == "prepared\nstep2\n"
        # /tmp is a tmpfs inside gVisor (docs/security.md): not part of the snapshot
        assert (await fork.exec("test -e /tmp/scratch || echo absent")).stdout == "absent\n"
        owners = await fork.exec("stat -c '%u:%g' /work/state/model.txt")
        assert owners.stdout == "0:0\n", owners
        assert (await fork.exec("echo step3 >> /work/state/model.txt && tail -n 1 /work/state/model.txt")
                ).stdout == "step3\n"


async def test_a_network_under_gvisor_is_refused_with_the_reason(gv, busybox_image):
    for network in (True, ("10.0.0.0/8",)):
        with pytest.raises(SpecError, match=r"sandbox\.network.*kernel='gvisor'.*gvisor#10704"):
            SandboxSpec(image=busybox_image, kernel="gvisor", network=network)
    # a task that asks for a network on a gVisor pool fails with the same reason, before any container
    res = await gv.run_task(Task(name="net", sandbox=SandboxSpec(image=busybox_image, network=True),
                                 command="true"))
    assert not res.ok and "sandbox.network" in (res.error or ""), res
    with pytest.raises(SpecError, match="sandbox.kernel"):
        SandboxSpec(image=busybox_image, kernel="kvm")
    with pytest.raises(SpecError, match="pool.kernel"):
        PoolSpec(name="p", kernel="runsc")


async def test_a_host_without_runsc_says_what_to_install(tmp_path, monkeypatch, busybox_image):
    # every tool of this host's PATH but runsc
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for d in os.environ["PATH"].split(":"):
        if os.path.isdir(d):
            for name in os.listdir(d):
                if name != "runsc" and not (bin_dir / name).exists():
                    (bin_dir / name).symlink_to(Path(d) / name)
    monkeypatch.setenv("PATH", str(bin_dir))
    rt = ContainerRuntime(LocalRunner())
    info = await rt.probe()
    assert not info.runsc
    with pytest.raises(RuntimeMissingError, match=r"kernel='gvisor' needs gVisor's runsc on local.*apt-get install -y runsc"):
        await rt.create("fm-gv-missing", _spec(busybox_image), {})
    left = subprocess.run(["podman", "ps", "-a", "--filter", "name=fm-gv-missing", "--format", "{{.Names}}"],
                          capture_output=True, text=True, check=True).stdout
    assert not left.strip()


async def test_a_terminal_under_gvisor_runs_a_repl_and_takes_ctrl_c(gv, swe_image, busybox_image):
    # runsc cannot give `exec` a terminal, and gVisor's takes Ctrl-C as a byte: the
    # terminal is made inside (util-linux's script) and an interrupt signals the shell's job
    async with gv.sandbox(_spec(swe_image)) as sb:
        t = await sb.terminal(cwd="/etc", env={"X": "it's"})
        await t.sendline('echo "$X" "$(pwd)" "$(tty)"')
        got = await t.expect([t.prompt], 10)
        assert got.before.strip() == "it's /etc /dev/pts/0", got
        await t.sendline("python3 -q")
        assert (await t.expect([">>> "], 10)).index == 0
        await t.sendline("import time; time.sleep(60)")
        assert (await t.expect([">>> "], 1)).timed_out
        await t.interrupt()
        got = await t.expect([">>> "], 10)
        assert "KeyboardInterrupt" in got.before, got
        await t.sendline("exit()")
        assert (await t.expect([t.prompt], 10)).index == 0
        await t.close()
    async with gv.sandbox(_spec(busybox_image)) as sb:   # no `script` in the image: said so
        with pytest.raises(SpecError, match=r"sandbox\.image: .*busybox.* has no util-linux `script`"):
            await sb.terminal()
        assert (await sb.exec("echo fine")).stdout == "fine\n"
