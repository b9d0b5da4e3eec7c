"""bench/sandbox_burst.py runs end to end at a tiny size and prints its last line."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_sandbox_burst_bench_prints_its_ratios(busybox_image, fm_home):
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "sandbox_burst.py"), "--n", "3",
                          "--patterns", "sequential,burst", "--image", busybox_image],
                         capture_output=True, text=True, timeout=600, cwd=ROOT,
                         env={**__import__("os").environ, "FLOWMESH_HOME": str(fm_home)})
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    last = out.stdout.strip().splitlines()[-1]
    m = re.fullmatch(r"burst3_warm_p99_ms=([0-9.]+) cold_throughput_vs_podman=([0-9.]+)", last)
    assert m, last
    assert float(m.group(1)) > 0 and float(m.group(2)) > 0
    for side in ("warm", "cold", "podman"):
        assert re.search(rf"\b3 .*burst .*{side}", out.stdout), out.stdout
