"""recipes/k8s_eval.py and bench/k8s_pods.py: the recipe's --dry-run plan (no API call), a
real run refused without a registry, and (slow-marked: the debootstrap SWE image) the main
job's batch as pods on the Kubernetes emulator, spilling over to EC2 (moto) when the
namespace's quota is full; the bench's last line, on a small burst."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(args: list[str], env: dict[str, str], timeout: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flowmesh_sdk.cli.main", "run", "k8s_eval", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=timeout)


def test_dry_run_prints_the_plan_and_a_real_run_needs_a_registry(fm_home, no_real_cloud):
    env = dict(os.environ, FLOWMESH_HOME=str(fm_home), COLUMNS="200")
    proc = _run(["--dry-run", "--tasks", "200", "--instances", "20", "--price-per-cpu-hour", "0.05"], env, 120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "no API call was made" in proc.stdout and "10 wave(s)" in proc.stdout
    assert "$0.6667" in proc.stdout       # 200 pods x 2 vCPUs x $0.05 x 2/60 h
    proc = _run(["--tasks", "2"], env, 120)
    assert proc.returncode == 2 and "a real run needs --registry HOST:PORT" in proc.stdout, proc.stdout[-2000:]
    proc = _run(["--quota-pods", "1"], env, 120)
    assert proc.returncode == 2 and "--quota-pods is for --emulator" in proc.stderr


@pytest.mark.slow
def test_the_swe_batch_runs_as_pods_and_spills_over_to_ec2_when_the_quota_is_full(fm_home, swe_image, tmp_path,
                                                                                no_real_cloud):
    pytest.importorskip("kubernetes")
    out = tmp_path / "results.json"
    env = dict(os.environ, FLOWMESH_HOME=str(fm_home), COLUMNS="200")
    proc = _run(["--emulator", "--tasks", "4", "--instances", "2", "--quota-pods", "1", "--spill", "ec2",
                 "--json", str(out)], env, 900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["ok"] is True
    rows = data["modes"]["ephemeral"]["results"]
    assert len(rows) == 4 and all(r["got"] == ("pass" if r["patch"] == "right" else "fail") for r in rows), rows
    decided = [json.loads(p["detail"]) for p in data["placement"] if p["kind"] == "launch.decided"]
    assert decided and decided[0]["winner"]["offer"].startswith("k8s/emu/default")   # the free cluster first
    assert any(p["kind"] == "launch.failover" and "quota" in p["detail"] and "ec2/us-east-1" in p["detail"]
               for p in data["placement"]), data["placement"]                # full: on to the priced cloud
    assert data["spend"]["ec2"]["spent"] > 0, data["spend"]                     # where the rest ran, and paid for
    assert "STAND-IN" in proc.stdout                                            # moto has no machines: said so
    assert "launch.decided" in proc.stdout                                         # the decisions, printed


def _kubectl_minor() -> int:
    import shutil
    if shutil.which("kubectl") is None:
        return 0
    out = subprocess.run(["kubectl", "version", "--client", "-o", "json"], capture_output=True, text=True,
                         timeout=60, env=dict(os.environ, KUBECONFIG=os.devnull)).stdout
    try:
        return int("".join(c for c in json.loads(out)["clientVersion"]["minor"] if c.isdigit()))
    except (ValueError, KeyError):
        return 0


@pytest.mark.skipif(_kubectl_minor() < 31, reason="needs kubectl >= 1.31 (WebSocket exec)")
def test_bench_k8s_pods_prints_its_ratios(fm_home, no_real_cloud):
    pytest.importorskip("kubernetes")
    env = dict(os.environ, FLOWMESH_HOME=str(fm_home), COLUMNS="200")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "k8s_pods.py"), "--n", "2", "--burst", "4"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    last = dict(kv.split("=", 1) for kv in proc.stdout.strip().splitlines()[-1].split())
    assert set(last) == {"k8s_api_calls_per_sandbox", "k8s_exec_ratio", "k8s_ttfc_ratio", "k8s_cold_ttfc_ratio",
                         "burst4_p50_s", "burst4_p99_s"}, last
    assert float(last["k8s_api_calls_per_sandbox"]) >= 3       # a create, an exec stream and a delete at least
    assert all(float(v) > 0 for v in last.values())
