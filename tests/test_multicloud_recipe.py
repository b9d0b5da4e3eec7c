"""The multi-cloud placement end to end: the main job's batch in one pool over ``local``
and EC2 (moto server, the real boto3; instances backed by real loopback sshd hosts), and
the placement benchmark's behaviour on the simulator (cost against the exact optimum,
nothing lost -- virtual time, no wall-clock assertion)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("paramiko")
pytest.importorskip("boto3")


@pytest.mark.slow
def test_the_swe_batch_runs_on_local_and_ec2_in_one_pool(fm_home, swe_image, tmp_path):
    out = tmp_path / "results.json"
    env = dict(os.environ, FLOWMESH_HOME=str(fm_home))
    proc = subprocess.run([sys.executable, "-m", "flowmesh_sdk.cli.main", "run", "multicloud_eval", "--emulator",
                           "--tasks", "6", "--json", str(out)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["ok"] is True
    rows = data["modes"]["persistent"]["results"]
    for row in rows:
        assert row["got"] == ("pass" if row["patch"] == "right" else "fail"), row
    assert set(data["tasks_by_provider"]) == {"local", "ec2"}
    assert sorted(data["where"].values()) == ["ec2", "local"]
    kinds = [p["kind"] for p in data["placement"]]
    assert "launch.decided" in kinds and "launch.failover" in kinds
    failover = next(p["detail"] for p in data["placement"] if p["kind"] == "launch.failover")
    assert failover.startswith("local/local/") and "capacity" in failover and "-> ec2/us-east-1/" in failover
    assert data["spend"]["local"]["spent"] == 0 and data["spend"]["ec2"]["spent"] > 0
    # the store saw the same: flowmesh pools --explain and status show decisions and spend
    show = subprocess.run([sys.executable, "-m", "flowmesh_sdk.cli.main", "pools", "--explain"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert show.returncode == 0, show.stderr
    assert "launch decisions" in show.stdout and "failover" in show.stdout and "swe-multi" in show.stdout


def test_the_placement_benchmark_meets_its_cost_target_and_loses_nothing():
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "multicloud_placement.py"), "--tasks", "400"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = dict(kv.split("=") for kv in proc.stdout.strip().splitlines()[-1].split())
    assert int(last["tasks_lost"]) == 0
    assert float(last["cost_over_optimal_pct"]) <= 3.0
    assert "cheapest-first" in proc.stdout and "optimum (milp)" in proc.stdout
