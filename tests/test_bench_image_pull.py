"""bench/image_pull.py end to end: a real registry behind the counting proxy, three fresh
images, N sandboxes at once on one instance.  The SDK must fetch every new layer blob
exactly once (a count, not a timing), and the script must leave nothing pulled behind."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench" / "image_pull.py"


def _bench_images() -> list[str]:
    out = subprocess.run(["podman", "images", "--all", "--format", "{{.Repository}}"],
                         capture_output=True, text=True).stdout
    return [r for r in out.split() if "/fmbench-pull/" in r]


HAVE_REGISTRY = shutil.which("docker-registry") is not None or os.access("/usr/bin/docker-registry", os.X_OK)


@pytest.mark.skipif(not HAVE_REGISTRY,
                    reason="docker-registry is not installed (apt-get install -y docker-registry)")
def test_bench_image_pull_fetches_each_new_layer_once(tmp_path, busybox_image):
    home = tmp_path / "fmhome"
    home.mkdir()
    env = dict(os.environ, FLOWMESH_HOME=str(home), NO_PROXY="127.0.0.1,localhost",
               no_proxy="127.0.0.1,localhost")
    before = set(_bench_images())
    proc = subprocess.run([sys.executable, str(BENCH), "--n", "3"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    last = lines[-1]
    m = re.fullmatch(r"blob_fetches_per_image=(\d+\.\d{3})", last)
    assert m, f"bad last line: {last!r}"
    assert m.group(1) == "1.000", proc.stdout[-3000:]
    # the SDK rows: one pull for three sandboxes, one fetch of the one new layer
    # (requested, pulls performed, distinct layers needed, blob fetches made, per layer)
    rows = [[c.strip() for c in re.split(r"[│|]", line)[1:-1]] for line in lines
            if re.match(r"^[│|] \((a|b)\) ", line)]
    assert len(rows) == 2, proc.stdout[-3000:]
    for cells in rows:
        assert cells[1:6] == ["3", "1", "1", "1", "1.000"], cells
    assert set(_bench_images()) <= before            # what it pulled is gone again
