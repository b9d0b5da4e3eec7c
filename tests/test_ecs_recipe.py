"""recipes/ecs_persistent_pool.py: the dry-run plan (no API call, the missing Alibaba price
said), and the main job's batch on a persistent pool of provider ``alibaba`` against the ECS
emulator through the real alibabacloud-ecs20140526 client, instances booted from their
user-data as loopback sshd hosts."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("alibabacloud_ecs20140526")


def test_the_dry_run_plans_megaflows_shape_and_says_where_its_price_comes_from(fm_home):
    env = dict(os.environ, FLOWMESH_HOME=str(fm_home), COLUMNS="200")
    proc = subprocess.run([sys.executable, str(ROOT / "recipes" / "ecs_persistent_pool.py"), "--dry-run",
                           "--tasks", "10000"], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "ecs.c8a.2xlarge" in out and "1250 x ecs.c8a.2xlarge in 13 RunInstances call(s)" in out
    assert "price: $0.3015/h per instance" in out and "catalog refresh --provider alibaba" in out
    assert "price source: IMPLIED by the MegaFlow paper's totals, NOT a list price" in out   # never a list price
    assert "no API call was made" in out
    priced = subprocess.run([sys.executable, str(ROOT / "recipes" / "ecs_persistent_pool.py"), "--dry-run",
                             "--tasks", "800", "--price", "ecs.c8a.2xlarge=0.3"], env=env, capture_output=True,
                            text=True, timeout=120)
    assert priced.returncode == 0 and "$0.3000/h" in priced.stdout and "$5.00" in priced.stdout, priced.stdout


@pytest.mark.slow
def test_the_main_jobs_batch_runs_on_the_ecs_emulator(fm_home, swe_image, tmp_path):
    pytest.importorskip("paramiko")
    out = tmp_path / "results.json"
    env = dict(os.environ, FLOWMESH_HOME=str(fm_home))
    proc = subprocess.run([sys.executable, "-m", "flowmesh_sdk.cli.main", "run", "ecs_persistent_pool", "--emulator",
                           "--tasks", "4", "--json", str(out)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["ok"] is True and data["left_running"] == []
    rows = data["modes"]["persistent"]["results"]
    assert len(rows) == 4
    for row in rows:
        assert row["got"] == ("pass" if row["patch"] == "right" else "fail"), row
    assert len(data["instances"]) == 2 and all(i.startswith("i-") for i in data["instances"])
    assert data["ecs_calls"]["RunInstances"] == 1          # both instances in one call (Amount=2)
    assert data["ecs_calls"]["DeleteInstances"] >= 1
    assert any(d["kind"] == "launch.decided" and "alibaba/cn-hangzhou/" in d["detail"] for d in data["decisions"])
