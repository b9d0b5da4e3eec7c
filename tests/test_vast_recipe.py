"""recipes/vast_vllm_workers.py: the dry-run plan from the catalog (no API call); on the
Vast.ai emulator (real vastai client) two workers rented down the ranked offers with an ask
gone between search and create, each running the named vLLM stand-in
(flowmesh_sdk.testing.fake_vllm) started over SSH, answering, and released; and the --elastic
demo (scale up by U, one worker outbid and replaced, idle workers drained and released)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "vast_vllm_workers.py"
pytest.importorskip("vastai")


def test_the_dry_run_prints_the_plan_and_calls_nothing(fm_home):
    env = dict(os.environ, FLOWMESH_HOME=str(fm_home), COLUMNS="200")
    proc = subprocess.run([sys.executable, str(RECIPE), "--dry-run", "--workers", "3", "--min-vram", "24"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "plan: rent 3 of" in proc.stdout and "no API call was made" in proc.stdout


def test_workers_rent_fail_over_start_answer_and_are_released(fm_home, tmp_path):
    pytest.importorskip("paramiko")
    out = tmp_path / "workers.json"
    env = dict(os.environ, FLOWMESH_HOME=str(fm_home), COLUMNS="200")
    proc = subprocess.run([sys.executable, str(RECIPE), "--emulator", "--workers", "2", "--gone", "1", "--json",
                           str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["ok"] is True and data["left_running"] == []
    workers = data["workers"]
    assert len(workers) == 2 and len({w["offer"] for w in workers}) == 2
    assert "5001" not in {w["offer"] for w in workers}        # the ask that was gone
    assert workers[0]["failovers"] >= 1
    assert all(w["answer"] == "ok:hello" and w["endpoint"].startswith("http://127.0.0.") for w in workers)


def test_the_elastic_demo_scales_up_replaces_an_outbid_worker_and_releases_all(fm_home, tmp_path):
    pytest.importorskip("paramiko")
    out = tmp_path / "elastic.json"
    env = dict(os.environ, FLOWMESH_HOME=str(fm_home), COLUMNS="200")
    proc = subprocess.run([sys.executable, str(RECIPE), "--emulator", "--elastic", "--workers", "2", "--requests", "10",
                           "--json", str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["ok"] is True and data["left_running"] == [] and data["answered"] == 10
    assert data["lost"] == 1 and data["rented"] == 3 and data["released"] >= 2 and len(data["lags"]) == 3
    assert "worker.outbid" in proc.stdout and "workers.scaled" in proc.stdout
