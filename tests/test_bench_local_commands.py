"""bench/local_commands.py with tiny numbers: both sides run and the last line carries the
three ratios (their values are the bench's to report, not this test's to judge)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_prints_its_line():
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "local_commands.py"), "--concurrency", "4",
                           "--rounds", "1"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "a thread per child" in proc.stdout and "SDK (pidfd in the loop)" in proc.stdout
    last = proc.stdout.strip().splitlines()[-1]
    m = re.fullmatch(r"local_cmd_cpu_ratio=(\d+\.\d{3}) local_cmd_wall_ratio=(\d+\.\d{3}) "
                     r"loop_lag_max_ratio=(\d+\.\d{3})", last)
    assert m and all(float(x) > 0 for x in m.groups()), last
    bad = subprocess.run([sys.executable, str(ROOT / "bench" / "local_commands.py"), "--rounds", "0"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--rounds must be 1 or more, got" in bad.stderr
