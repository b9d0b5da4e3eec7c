"""bench/sandbox_fusion_api.py end to end with tiny numbers: the real client through the
server on a local pool and ``podman run --rm`` beside it; the last line carries the three
numbers (their values are the bench's to report, not this test's to judge)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench" / "sandbox_fusion_api.py"


def test_bench_prints_its_line(tmp_path, images_mod):
    images_mod.build_code_runner()
    env = dict(os.environ, FLOWMESH_HOME=str(tmp_path / "fmhome"), NO_PROXY="127.0.0.1,localhost",
               no_proxy="127.0.0.1,localhost")
    proc = subprocess.run([sys.executable, str(BENCH), "--n", "3", "--concurrency", "1,16", "--podman-n", "1",
                           "--slots", "2"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    m = re.fullmatch(r"sf_rps_c16=(\d+\.\d+) sf_p99_ms_c16=(\d+\.\d+) sf_vs_podman_run_p50=(\d+\.\d+)", last)
    assert m, f"bad last line: {last!r}"
    assert float(m.group(1)) > 0 and float(m.group(2)) > 0 and float(m.group(3)) > 0
