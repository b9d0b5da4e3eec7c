"""recipes/ssh_cluster_eval.py: the main job's batch run end to end through the SSH path,
on a demo cluster of real OpenSSH sshd hosts on loopback addresses (each with its own
container storage, so every machine really bootstraps and pulls)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow
pytest.importorskip("paramiko")


def test_swe_batch_on_two_ssh_machines(fm_home, swe_image, tmp_path):
    out = tmp_path / "results.json"
    env = dict(os.environ, FLOWMESH_HOME=str(fm_home))
    proc = subprocess.run([sys.executable, "-m", "flowmesh_sdk.cli.main", "run", "ssh_cluster_eval",
                           "--loopback", "2", "--tasks", "4", "--json", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["ok"] is True
    rows = data["modes"]["persistent"]["results"]
    assert len(rows) == 4
    for row in rows:
        assert row["got"] == ("pass" if row["patch"] == "right" else "fail"), row
        assert row["instance_id"].startswith("ssh-box"), row
    assert {r["instance_id"].split("-")[1] for r in rows} == {"box1", "box2"}   # both machines worked
    boots = data["bootstrap"]
    assert len(boots) == 2
    for b in boots:
        steps = {s["name"]: s for s in b["steps"]}
        assert list(steps) == ["reach", "runtime", "registry_login", "prefetch", "agent"]
        assert steps["prefetch"]["changed"] and steps["prefetch"]["detail"] == "1 of 1 pulled"
