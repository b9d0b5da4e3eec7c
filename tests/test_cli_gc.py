"""The flowmesh CLI, and recovery after a coordinator is killed mid-run."""

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from conftest import podman_names

CRASHER = textwrap.dedent("""
    import asyncio, sys
    from flowmesh_sdk import EventKind, Fleet, InstanceSpec, PoolSpec, Task
    IMG = sys.argv[1]
    FLEET = sys.argv[2] if len(sys.argv) > 2 else "crash"
    RUN = sys.argv[3] if len(sys.argv) > 3 else None
    async def main():
        fleet = Fleet(FLEET, run=RUN)
        pool = await fleet.pool(PoolSpec(name="doomed", instance=InstanceSpec(cpus=1, memory_gb=2),
                                         min_instances=1, warm_per_image=1, warm_images=(IMG,)))
        spec = pool.default_sandbox(IMG)  # the warm shape: no warm eviction in flight at the kill
        (res,) = await pool.map([Task(name="finished-before-crash", sandbox=spec, command="echo done")])
        assert res.ok
        await fleet.store.flush()
        async with pool.sandbox(spec) as sb:
            await sb.exec("true")
            while pool.stats().warming:  # let warm refills finish: no podman call in flight
                await fleet.bus.wait_for(lambda e: e.kind is EventKind.SANDBOX_READY, 60)
            print("READY", fleet.owner, flush=True)
            await asyncio.sleep(3600)
    asyncio.run(main())
""")


def _flowmesh(*args, env=None):
    return subprocess.run([sys.executable, "-m", "flowmesh_sdk.cli.main", *args], capture_output=True,
                          text=True, env=env, timeout=300)


def _start_coordinator(env, image, tmp_path, fleet="crash", run=None) -> tuple[subprocess.Popen, str]:
    """Start CRASHER; returns the process (holding a sandbox) and its owner id."""
    script = tmp_path / "coordinator.py"
    script.write_text(CRASHER)
    proc = subprocess.Popen([sys.executable, str(script), image, fleet, *([run] if run else [])],
                            stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline()
    if not line.startswith("READY"):
        proc.kill()
        pytest.fail(f"coordinator did not start: {line!r} {proc.stderr.read()}")
    return proc, line.split()[1]


def _kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


def test_gc_reclaims_everything_after_kill_9(fm_home, busybox_image, tmp_path):
    env = dict(os.environ, FLOWMESH_HOME=str(fm_home), COLUMNS="200")
    proc, owner = _start_coordinator(env, busybox_image, tmp_path)
    _kill(proc)
    left = podman_names(f"flowmesh.owner={owner}")
    assert len(left) >= 2  # the task's sandbox and the warm one survive the crash
    assert list((fm_home / "local" / "instances").glob("*.json"))

    dry = _flowmesh("gc", env=env)
    assert dry.returncode == 0, dry.stderr
    assert "dry run" in dry.stdout and "owner process exited" in dry.stdout
    assert podman_names(f"flowmesh.owner={owner}") == left  # a dry run removes nothing

    live_before = _live_instances(fm_home, "crash")
    assert len(live_before) == 1          # the store still believes the crashed instance runs

    real = _flowmesh("gc", "--yes", env=env)
    assert real.returncode == 0, real.stdout + real.stderr
    assert "terminated 1 instance(s)" in real.stdout
    assert podman_names(f"flowmesh.owner={owner}") == []
    assert not list((fm_home / "local" / "instances").glob("*.json"))
    assert "nothing left behind" in _flowmesh("gc", env=env).stdout
    # issue 12, defect 6: gc records what it terminated, so status stops listing it as live
    assert _live_instances(fm_home, "crash") == []
    status = _flowmesh("status", env=env)
    assert not any(i in status.stdout for i in live_before), status.stdout

    # the result produced before the crash was not lost
    status = _flowmesh("status", env=env)
    assert "finished-before-crash" in status.stdout and "succeeded" in status.stdout
    pools = _flowmesh("pools", env=env)
    assert "doomed" in pools.stdout and "persistent" in pools.stdout


def _live_instances(home, fleet: str) -> list[str]:
    from flowmesh_sdk.control.store import MetadataStore
    store = MetadataStore(home / "flowmesh.db")
    try:
        return [r.id for r in store.instances(live_only=True) if r.fleet == fleet]
    finally:
        store.close()


def test_gc_touches_only_its_own_home_and_fleet(fm_home, busybox_image, tmp_path):
    """Issue 12, defect 6: gc of one FLOWMESH_HOME used to remove the orphaned containers of
    another home on the same machine (it selected containers host-wide by label)."""
    other_home = tmp_path / "other-home"
    other_home.mkdir()
    env_b = dict(os.environ, FLOWMESH_HOME=str(other_home), COLUMNS="200")
    env_a = dict(os.environ, FLOWMESH_HOME=str(fm_home), COLUMNS="200")
    proc, owner = _start_coordinator(env_b, busybox_image, tmp_path, fleet="elsewhere")
    _kill(proc)
    left = podman_names(f"flowmesh.owner={owner}")
    assert len(left) >= 2
    try:
        a = _flowmesh("gc", "--yes", env=env_a)            # home A never launched these
        assert a.returncode == 0, a.stdout + a.stderr
        assert "nothing left behind" in a.stdout
        assert podman_names(f"flowmesh.owner={owner}") == left
        b_other_fleet = _flowmesh("gc", "--yes", "--fleet", "not-this-one", env=env_b)
        assert "nothing left behind" in b_other_fleet.stdout
        assert podman_names(f"flowmesh.owner={owner}") == left
    finally:
        b = _flowmesh("gc", "--yes", "--fleet", "elsewhere", env=env_b)   # its own home takes them
    assert b.returncode == 0, b.stdout + b.stderr
    assert "terminated 1 instance(s)" in b.stdout
    assert podman_names(f"flowmesh.owner={owner}") == []
    assert _live_instances(other_home, "elsewhere") == []


def test_gc_leaves_a_live_coordinators_work_alone(fm_home, busybox_image, tmp_path):
    env = dict(os.environ, FLOWMESH_HOME=str(fm_home), COLUMNS="200")
    proc, owner = _start_coordinator(env, busybox_image, tmp_path)
    try:
        out = _flowmesh("gc", "--yes", env=env)
        assert out.returncode == 0 and "nothing left behind" in out.stdout
        assert podman_names(f"flowmesh.owner={owner}")
    finally:
        _kill(proc)
        _flowmesh("gc", "--yes", env=env)
    assert podman_names(f"flowmesh.owner={owner}") == []


def test_cli_errors_are_clear(fm_home):
    env = dict(os.environ, FLOWMESH_HOME=str(fm_home), COLUMNS="200")
    out = _flowmesh("gc", "--provider", "nimbus", env=env)
    assert out.returncode != 0 and "unknown provider 'nimbus'" in out.stderr
    out = _flowmesh("gc", "--older-than", "soon", env=env)
    assert out.returncode != 0 and "use a number with s, m, h or d" in out.stderr
    out = _flowmesh("run", "no_such_recipe", env=env)
    assert out.returncode != 0 and "no recipe 'no_such_recipe'" in out.stderr


def test_run_without_a_recipe_names_recipe_and_the_known_ones(fm_home):
    env = dict(os.environ, FLOWMESH_HOME=str(fm_home), COLUMNS="400")
    out = _flowmesh("run", env=env)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Missing argument 'RECIPE'" in out.stderr
    assert "ec2_swe_rollouts" in out.stderr and "local_swe_eval" in out.stderr   # the known recipes
    assert "_cloud_recipe" not in out.stderr                                     # helpers are not recipes
    out = _flowmesh("run", "--help", env=env)   # no recipe: the run command's own help
    assert out.returncode == 0, out.stderr
    assert "run [OPTIONS] [RECIPE]" in out.stdout
    assert "Known recipes:" in out.stdout and "ssh_cluster_eval" in out.stdout


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_run_passes_help_to_the_recipe(fm_home, flag):
    pytest.importorskip("boto3")
    env = dict(os.environ, FLOWMESH_HOME=str(fm_home), COLUMNS="200")
    out = _flowmesh("run", "ec2_swe_rollouts", flag, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith("usage: ec2_swe_rollouts.py")   # argparse's help, not the CLI's
    assert "--emulator, --moto" in out.stdout and "--inject-capacity-error" in out.stdout
    assert "run [OPTIONS]" not in out.stdout + out.stderr


def test_run_passes_every_argument_after_recipe_unchanged(fm_home, tmp_path):
    script = tmp_path / "argv_echo.py"
    script.write_text("import json, sys\nprint(json.dumps(sys.argv[1:]))\nsys.exit(3)\n")
    args = ["-h", "--tasks", "3", "--help", "--", "--verbose", "x"]
    out = _flowmesh("run", str(script), *args, env=dict(os.environ, FLOWMESH_HOME=str(fm_home)))
    assert out.returncode == 3, out.stdout + out.stderr   # the recipe's own exit status
    assert out.stdout.strip() == json.dumps(args)


async def test_restarted_coordinator_reconciles(fm_home, busybox_image, tmp_path):
    from flowmesh_sdk import Fleet
    env = dict(os.environ, FLOWMESH_HOME=str(fm_home))
    proc, owner = _start_coordinator(env, busybox_image, tmp_path)
    _kill(proc)
    async with Fleet("crash", home=fm_home) as fleet:     # the same fleet, restarted
        before = {r.id for r in fleet.store.instances(live_only=True) if r.fleet == "crash"}
        assert before                                       # the store still thinks they live
        report = await fleet.reconcile()
        assert set(report.terminated) == before and not report.still_present
        assert set(report.forgotten) == before   # and their records closed
        await fleet.store.flush()
        assert not [r for r in fleet.store.instances(live_only=True) if r.fleet == "crash"]
        assert await fleet.provider("local").list_tagged({"flowmesh:fleet": "crash"}) == []
        again = await fleet.reconcile()
        assert again.terminated == () and again.forgotten == ()
    _flowmesh("gc", "--yes", env=env)  # containers of the dead owner
    assert podman_names(f"flowmesh.owner={owner}") == []


def test_gc_run_reaps_one_run_and_leaves_another_runs_on_the_same_home(fm_home, busybox_image, tmp_path):
    env = dict(os.environ, FLOWMESH_HOME=str(fm_home), COLUMNS="200")
    procs = [_start_coordinator(env, busybox_image, tmp_path, run=run) for run in ("run-a", "run-b")]
    for proc, _ in procs:
        _kill(proc)
    (_, owner_a), (_, owner_b) = procs
    left_a, left_b = podman_names("flowmesh.run=run-a"), podman_names("flowmesh.run=run-b")
    assert len(left_a) >= 2 and len(left_b) >= 2
    assert left_a == podman_names(f"flowmesh.owner={owner_a}")   # each container carries its run
    dry = _flowmesh("gc", "--run", "run-a", "--json", env=env)
    assert dry.returncode == 0, dry.stderr
    found = json.loads(dry.stdout)["found"]
    assert len(found["instances"]) == 1 and sorted(c["name"] for c in found["containers"]) == sorted(left_a)
    real = _flowmesh("gc", "--run", "run-a", "--yes", env=env)
    assert real.returncode == 0, real.stdout + real.stderr
    assert "terminated 1 instance(s)" in real.stdout
    assert podman_names("flowmesh.run=run-a") == []
    assert podman_names("flowmesh.run=run-b") == left_b           # the other run's, untouched
    b = _flowmesh("gc", "--run", "run-b", "--yes", env=env)
    assert b.returncode == 0 and "terminated 1 instance(s)" in b.stdout, b.stdout + b.stderr
    assert podman_names(f"flowmesh.owner={owner_b}") == []
