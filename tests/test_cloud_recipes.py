"""recipes/gce_eval.py and recipes/azure_persistent_pool.py: the --dry-run plan (no API
call, priced from the catalog) and, slow-marked (the debootstrap SWE image), the main job's
batch end to end on each cloud's emulator -- VMs created through the real client library,
booted as loopback sshd hosts, bootstrapped over SSH, sandboxes executed."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RECIPES = [("gce_eval", "gce", "google.cloud.compute_v1"), ("azure_persistent_pool", "azure", "azure.mgmt.compute")]


def _run(args: list[str], env: dict[str, str], timeout: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flowmesh_sdk.cli.main", "run", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("recipe, provider, lib", RECIPES)
def test_dry_run_prints_the_plan_and_its_cost(recipe, provider, lib, fm_home, no_real_cloud):
    pytest.importorskip(lib)
    env = dict(os.environ, FLOWMESH_HOME=str(fm_home), COLUMNS="200")
    proc = _run([recipe, "--dry-run", "--tasks", "200", "--instances", "10"], env, 120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "no API call was made" in proc.stdout
    plan = dict(kv.split("=", 1) for kv in proc.stdout.strip().splitlines()[-1].split()[1:])
    assert plan["provider"] == provider and plan["instances"] == "10" and plan["waves"] == "10"
    assert float(plan["cost_usd"]) > 0


@pytest.mark.parametrize("recipe, provider, lib", RECIPES)
def test_a_real_run_without_a_registry_is_refused_before_any_api_call(recipe, provider, lib, fm_home,
                                                                      no_real_cloud):
    pytest.importorskip(lib)
    env = dict(os.environ, FLOWMESH_HOME=str(fm_home), COLUMNS="200")
    proc = _run([recipe, "--tasks", "2"], env, 120)   # neither --dry-run nor --emulator: a real run
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "a real run needs --registry HOST:PORT" in proc.stdout and "nothing was launched" in proc.stdout
    assert "a real run:" not in proc.stdout   # the billed-run banner: no provider was built
    help_text = _run([recipe, "--help"], env, 120).stdout
    assert "--registry HOST:PORT" in help_text and "--emulator" in help_text


@pytest.mark.slow
@pytest.mark.parametrize("recipe, provider, lib", RECIPES)
def test_the_swe_batch_runs_on_the_emulator(recipe, provider, lib, fm_home, swe_image, tmp_path, no_real_cloud):
    pytest.importorskip(lib)
    pytest.importorskip("paramiko")
    out = tmp_path / "results.json"
    env = dict(os.environ, FLOWMESH_HOME=str(fm_home), COLUMNS="200")
    proc = _run([recipe, "--emulator", "--tasks", "4", "--json", str(out)], env, 900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["ok"] is True
    rows = data["modes"]["persistent"]["results"]
    assert len(rows) == 4
    for row in rows:
        assert row["got"] == ("pass" if row["patch"] == "right" else "fail"), row
    assert data["spend"][provider]["spent"] > 0
    assert any(p["kind"] == "launch.decided" for p in data["placement"])
