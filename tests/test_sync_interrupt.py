"""SyncFleet and Ctrl-C (issue 12, defect 12): a KeyboardInterrupt while a call waits
cancels the coroutine on the facade's loop, and leaving the ``with`` block drains and
closes the fleet, so the script exits and leaves no container behind."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import podman_names

SCRIPT = textwrap.dedent("""
    import signal, sys
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as at a terminal, even if inherited ignored
    from flowmesh_sdk import InstanceSpec, Task
    from flowmesh_sdk.sync import SyncFleet
    IMG, HOW = sys.argv[1], sys.argv[2]
    try:
        with SyncFleet("sigint") as fleet:
            pool = fleet.pool(name="ctrlc", instance=InstanceSpec(cpus=1, memory_gb=1))
            print("READY", fleet.fleet.owner, flush=True)
            if HOW == "run_task":
                pool.run_task(Task(name="forever", sandbox=pool.default_sandbox(IMG), command="sleep 3600",
                                   timeout_s=7200))
            else:
                with pool.sandbox(image=IMG) as sb:
                    sb.exec("sleep 3600", timeout_s=7200)
    except KeyboardInterrupt:
        print("INTERRUPTED", flush=True)
        sys.exit(130)
    print("NOT INTERRUPTED", flush=True)
""")


def _wait_for_sleep(owner: str, deadline_s: float = 120.0) -> None:
    """Until ``sleep 3600`` runs in one of the owner's containers (bounded by a deadline)."""
    end = time.monotonic() + deadline_s
    out = ""
    while time.monotonic() < end:
        for container in podman_names(f"flowmesh.owner={owner}"):
            top = subprocess.run(["podman", "top", container, "pid", "args"], capture_output=True, text=True)
            out = top.stdout + top.stderr
            if "sleep 3600" in out:
                return
        time.sleep(0.2)
    raise AssertionError(f"sleep 3600 never started in a container of {owner}: {out}")


@pytest.mark.parametrize("how", ["run_task", "sandbox_exec"])
def test_ctrl_c_cancels_the_running_call_and_closes_cleanly(fm_home, busybox_image, tmp_path, how):
    script = tmp_path / "sync_script.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, FLOWMESH_HOME=str(fm_home))
    proc = subprocess.Popen([sys.executable, str(script), busybox_image, how], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    owner = None
    try:
        line = proc.stdout.readline()
        assert line.startswith("READY"), line + proc.stderr.read()
        owner = line.split()[1]
        _wait_for_sleep(owner)
        proc.send_signal(signal.SIGINT)
        out, errs = proc.communicate(timeout=120)   # before the fix: drain waited on the 1 h task
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            if owner:   # do not leave the killed script's sandboxes behind
                subprocess.run([sys.executable, "-m", "flowmesh_sdk.cli.main", "gc", "--yes"], env=env,
                               capture_output=True, timeout=300)
    assert proc.returncode == 130, out + errs
    assert "INTERRUPTED" in out
    assert podman_names(f"flowmesh.owner={owner}") == []   # the sandbox was closed, not leaked
    # the fleet was closed: its instance is terminated in the store
    from flowmesh_sdk.control.store import MetadataStore
    store = MetadataStore(fm_home / "flowmesh.db")
    try:
        assert [i.id for i in store.instances(live_only=True) if i.fleet == "sigint"] == []
    finally:
        store.close()
