"""recipes/ssh_cluster_eval.py: the main job's batch run end to end through the SSH path,
on a demo cluster of real OpenSSH sshd hosts on loopback addresses (each with its own
container storage, so every machine really bootstraps and pulls) -- the recipe's default
without --inventory -- and its command line."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "ssh_cluster_eval.py"
_PARSE = ("import json, runpy, sys; m = runpy.run_path(sys.argv[1]); "
          "print(json.dumps(vars(m['parse_args'](sys.argv[2:]))))")


def _parsed(*args: str) -> subprocess.CompletedProcess[str]:
    """The recipe's own parse_args on ``args`` (nothing started), in a fresh interpreter."""
    return subprocess.run([sys.executable, "-c", _PARSE, str(RECIPE), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def test_without_inventory_the_default_is_two_loopback_hosts():
    def parsed(*args: str) -> dict:
        proc = _parsed(*args)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    assert parsed()["loopback"] == 2 and parsed()["inventory"] is None
    assert parsed("--loopback", "3")["loopback"] == 3
    got = parsed("--inventory", "hosts.json", "--registry", "10.0.0.5:5000")
    assert got["loopback"] is None and got["inventory"] == "hosts.json"   # no demo hosts beside an inventory
    proc = _parsed("--inventory", "hosts.json", "--loopback", "2")
    assert proc.returncode == 2 and "not allowed with argument" in proc.stderr
    proc = _parsed("--inventory", "hosts.json")
    assert proc.returncode == 2 and "--inventory needs --registry" in proc.stderr


@pytest.mark.slow
def test_swe_batch_on_two_ssh_machines(fm_home, swe_image, tmp_path):
    pytest.importorskip("paramiko")
    out = tmp_path / "results.json"
    env = dict(os.environ, FLOWMESH_HOME=str(fm_home))
    # no --loopback: `flowmesh run ssh_cluster_eval` alone runs on two loopback sshd machines
    proc = subprocess.run([sys.executable, "-m", "flowmesh_sdk.cli.main", "run", "ssh_cluster_eval",
                           "--tasks", "4", "--json", str(out)], cwd=ROOT, env=env,
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
