"""The main job (recipes/local_swe_eval.py), the README example and the benchmark, run
for real on the SWE image built from Debian packages (built once, then cached)."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def test_main_job_verdicts_are_honest(fm_home, swe_image, tmp_path):
    out = tmp_path / "results.json"
    env = dict(os.environ, FLOWMESH_HOME=str(fm_home))
    proc = subprocess.run([sys.executable, "-m", "flowmesh_sdk.cli.main", "run", "local_swe_eval",
                           "--tasks", "4", "--json", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "every verdict matched its expectation" in proc.stdout
    data = json.loads(out.read_text())
    assert data["ok"] is True and set(data["modes"]) == {"persistent", "ephemeral"}
    host = data["registry"]
    assert re.fullmatch(r"127\.0\.0\.1:\d+", host), host  # the throw-away local registry
    for mode in data["modes"].values():
        rows = mode["results"]
        assert len(rows) == 4
        for row in rows:
            # right patches pass, wrong patches fail -- decided by pytest inside the sandbox
            assert row["got"] == ("pass" if row["patch"] == "right" else "fail"), row
            assert row["exit_code"] == (0 if row["patch"] == "right" else 1), row
            # each task ran its own image, pulled from the registry and pinned by digest
            assert row["image"].startswith(f"{host}/flowmesh/swe-task-"), row["image"]
            assert row["digest"].startswith("sha256:") and len(row["digest"]) == 71, row["digest"]
            assert row["pinned"] == row["image"].rsplit(":", 1)[0] + "@" + row["digest"], row
        assert len({r["digest"] for r in rows}) == 4  # one image per task
    # the persistent mode also drives a right and a wrong patch step by step in one session
    agent = data["modes"]["persistent"]["agent_session"]
    assert [a["got"] for a in agent] == ["pass", "fail"] and all(a["matched"] for a in agent), agent
    for a in agent:
        assert a["steps"][0]["cmd"].startswith("cd /work/repo") and a["restarts"] == 0, a
        assert not any("cd " in st["cmd"] for st in a["steps"][1:]), a   # the cwd carried over
        assert mode["pulls"] >= 1, mode["pull_events"]
        assert {r["patch"] for r in rows} >= {"right"} and any(r["patch"] != "right" for r in rows)
    per = data["modes"]["persistent"]
    assert per["prefetch_s"] is not None and per["pulls"] == 4  # all prefetched onto one instance
    eph = data["modes"]["ephemeral"]["results"]
    assert len({r["instance_id"] for r in eph}) == 4  # a fresh instance per task
    # clean-up: nothing pulled from the registry (or built for it) is left behind
    left = subprocess.run(["podman", "images", "-q", "--filter", f"reference={host}/*/*"],
                          capture_output=True, text=True, check=True).stdout.split()
    assert left == []


def test_readme_example_runs(fm_home, swe_image, tmp_path):
    code = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)[0]
    script = tmp_path / "readme_example.py"
    script.write_text(code)
    proc = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, FLOWMESH_HOME=str(fm_home)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("0 ") and "1 passed" in proc.stdout
    assert lines[-1] == str([f"{i}\n" for i in range(8)])


def test_benchmark_prints_ratios(fm_home, busybox_image):
    gvisor = shutil.which("runsc") is not None      # setup.sh installs it: gVisor's beside runc's
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "sandbox_latency.py"),
                           "--image", busybox_image, "--n", "3", *(["--isolation", "gvisor"] if gvisor else [])],
                          cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, FLOWMESH_HOME=str(fm_home)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = (r"ttfc_ratio=\d+\.\d{3} exec_ratio=\d+\.\d{3} session_ratio=\d+\.\d{3} warm_ttfc_p50_ms=\d+\.\d{2}"
            r" exec_output_ratio=\d+\.\d{3} exec_stream_ratio=\d+\.\d{3}"
            r"( sandbox_cpu_ms_per_exec=\d+\.\d{3})?")   # where the container's cgroup can be read
    if gvisor:
        line += "".join(rf" {k}=\d+\.\d{{3}}" for k in ("gvisor_ttfc_ratio", "gvisor_exec_ratio",
                                                        "gvisor_vs_runc_ttfc", "gvisor_vs_runc_exec"))
    assert re.fullmatch(line, proc.stdout.strip().splitlines()[-1]), proc.stdout[-2000:]
