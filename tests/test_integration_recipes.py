"""The integrations' recipes run offline through ``flowmesh run`` (the local provider,
images built here): SWE-ReX's calls on FlowMeshDeployment grade the main job's tasks, and
TRL's GRPO step takes its rewards from sandboxes.  (recipes/mini_swe_agent_eval.py runs
in tests/test_integration_minisweagent.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _flowmesh_run(fm_home: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, FLOWMESH_HOME=str(fm_home), MSWEA_SILENT_STARTUP="1")
    return subprocess.run([sys.executable, "-m", "flowmesh_sdk.cli.main", "run", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def test_swerex_backend_recipe(fm_home, swe_image, tmp_path):
    pytest.importorskip("swerex")
    out = tmp_path / "swerex.json"
    proc = _flowmesh_run(fm_home, "swerex_backend", "--tasks", "2", "--json", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads(out.read_text())["results"]
    assert [(r["expected"], r["got"]) for r in rows] == [("pass", "pass"), ("fail", "fail")]
    assert all(len(r["commit"]) == 12 and r["calls_s"]["run_in_session"] for r in rows)


def test_trl_grpo_code_reward_recipe(fm_home, swe_image, tmp_path):
    for mod in ("trl", "torch", "datasets"):
        pytest.importorskip(mod)
    out = tmp_path / "trl.json"
    proc = _flowmesh_run(fm_home, "trl_grpo_code_reward", "--steps", "1", "--timeout", "2", "--json", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["steps"] == 1 and len(data["scored"]) == 24
    st = data["stats"]
    assert st["executed"] + st["reused"] == 24 and st["reused"] > 0
    hang = [r for r in data["scored"] if "sleep(60)" in r["tests"]]
    assert len(hang) == 8 == st["timeouts"] and all(r["reward"] == 0.0 for r in hang)
    for r in data["scored"]:
        assert r["reuse"] in ("executed", "joined", "hit")
        if r not in hang:   # the reward is the tests' verdict on the answer, run in a sandbox
            want = 2 if "== 2," in r["tests"] else 3
            assert r["reward"] == (1.0 if r["answer"].strip() == str(want) else 0.0), r
