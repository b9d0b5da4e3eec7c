"""The suite cleans up after itself: a test host's containers are removed (and confirmed gone)
before its storage is deleted, and the session-end leak check (tests/_leakcheck.py) fails a
session that leaves a process, a container or a temporary directory behind."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from flowmesh_sdk.imagebuild import podman_runtime_args
from flowmesh_sdk.remote.runtime import SHM_ARGS
from flowmesh_sdk.testing import hygiene
from flowmesh_sdk.testing.sshd import LoopbackSshd

TESTS = Path(__file__).resolve().parent


def ssh_argv(d: LoopbackSshd, command: str) -> list[str]:
    """The plain OpenSSH client running ``command`` in a session of ``d``."""
    return ["ssh", "-i", d.client_key_path, "-p", str(d.port), "-o", "BatchMode=yes", "-o",
            "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
            f"root@{d.host}", command]


def podman_run(image: str, name: str, command: str) -> str:
    # the OCI runtime the SDK's probe picks on this host (the hosts are this machine), and the
    # limits it sets where there is no CAP_SYS_RESOURCE (a container-in-a-container CI)
    # and /dev/shm as the SDK's containers have it (SHM_ARGS: no mount on the host to race)
    runtime = " ".join([*podman_runtime_args(), *SHM_ARGS])
    return (f"podman run -d --name {name} {runtime} --ulimit nofile=1024:1024 --ulimit nproc=1024:1024 "
            f"{image} {command}")


def start_container(d: LoopbackSshd, image: str, name: str) -> None:
    """``image`` loaded into ``d``'s own store and a container of it started, over SSH."""
    saved = subprocess.run(["podman", "save", image], capture_output=True, check=True).stdout
    subprocess.run(ssh_argv(d, "podman load -q"), input=saved, capture_output=True, check=True)
    res = subprocess.run(ssh_argv(d, podman_run(image, name, "sh -c 'while :; do sleep 1; done'")),
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def _left_of(host_dir: Path) -> list[str]:
    procs = hygiene.processes()
    roots = hygiene.tagged(procs, f"={host_dir}") | hygiene.conmons_of(procs, host_dir / "containers")
    return [str(procs[p]) for p in hygiene.with_descendants(procs, roots)]


def test_a_host_takes_its_containers_and_session_commands_with_it(busybox_image):
    with LoopbackSshd("127.0.0.231") as d:
        start_container(d, busybox_image, "fm-p-hygiene-1")
        subprocess.run(ssh_argv(d, "nohup sleep 1000 >/dev/null 2>&1 &"), check=True)
        # and a `podman run` still creating its container as the host goes away
        in_flight: subprocess.Popen[Any] = subprocess.Popen(
            ssh_argv(d, "echo started; exec " + podman_run(busybox_image, "fm-p-hygiene-2", "sleep 1000")),
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert in_flight.stdout is not None and in_flight.stdout.readline() == b"started\n"
        host_dir = Path(d._tmp)
        assert any("conmon" in p for p in _left_of(host_dir))
    in_flight.communicate(timeout=30)
    assert _left_of(host_dir) == []
    assert not host_dir.exists()
    assert host_dir / "containers" not in hygiene.STORES


def test_the_leak_check_fails_a_session_that_leaves_things_behind(tmp_path, busybox_image):
    (tmp_path / "test_leaky.py").write_text(textwrap.dedent(f'''
        import shutil, subprocess, tempfile
        from flowmesh_sdk.testing import hygiene
        from flowmesh_sdk.testing.sshd import LoopbackSshd
        from test_suite_hygiene import start_container

        def test_leaks():
            subprocess.Popen(["sleep", "1000"])
            tempfile.mkdtemp(prefix="fm-leaky-")
            # a file a subprocess writes, as a worker's engine log is
            subprocess.run(["sh", "-c", "echo log > " + tempfile.gettempdir() + "/flowmesh-leaky.log"], check=True)
            d = LoopbackSshd("127.0.0.232").start()   # never stopped
            start_container(d, {busybox_image!r}, "fm-p-leaky")
            print("HOSTDIR", d._tmp)
            # what the old teardown did: the store deleted under a running container
            gone = LoopbackSshd("127.0.0.233").start()
            start_container(gone, {busybox_image!r}, "fm-p-orphan")
            gone.stop()
            hygiene.unmount_under(gone._tmp)
            shutil.rmtree(gone._tmp, ignore_errors=True)
            print("GONEDIR", gone._tmp)
    '''))
    env = {k: v for k, v in os.environ.items() if k != hygiene.SESSION_VAR}
    env["PYTHONPATH"] = str(TESTS)
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "-p", "_leakcheck",
                          "-p", "no:asyncio", "test_leaky.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    out = res.stdout + res.stderr
    assert res.returncode == 1 and "1 passed" in out, out    # the test passed; the session did not
    host_dir = Path(out.split("HOSTDIR ", 1)[1].split()[0])
    gone_dir = Path(out.split("GONEDIR ", 1)[1].split()[0])
    report = out.split("left these behind", 1)[1]
    assert "sleep 1000" in report, out
    assert f"sshd -D -e -f {host_dir}/sshd_config" in report, out
    assert f"conmon of container fm-p-leaky " in report and "while :; do sleep 1; done" in report, out
    assert f"fm-p-leaky running in {host_dir}/containers" in report, out
    assert f"directory {host_dir}\n" in report and "directory /tmp/fm-leaky-" in report, out
    assert "file /tmp/flowmesh-leaky.log\n" in report, out
    # the orphan's conmon, found by the session's tag though podman cannot see it any more
    assert f"conmon of container fm-p-orphan " in report, out
    # ... and removed after the report: nothing of it is left
    assert _left_of(host_dir) == [] and _left_of(gone_dir) == []
    assert not host_dir.exists() and not Path("/tmp/flowmesh-leaky.log").exists()
    sleeper = int(report.split("): sleep 1000", 1)[0].rsplit("process pid ", 1)[1].split()[0])
    assert sleeper not in hygiene.processes()
