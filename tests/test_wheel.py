"""The package installs like one: build the wheel from a copy of the checkout, install it
into a fresh venv outside the checkout, and run ``flowmesh --help``, ``flowmesh cost
estimate`` and the main job (``flowmesh run local_swe_eval``) from there.

Offline: the wheel is built with ``--no-build-isolation --no-index`` (setuptools from this
venv), installed with ``--no-deps``, and the fresh venv sees its dependencies (typer, rich,
numpy, ...) through a ``.pth`` line naming this venv's site-packages -- a plain path entry,
so this venv's editable install of the SDK (a .pth *hook* there) is not loaded: the SDK
the fresh venv imports is the wheel's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow   # the main job needs the SWE image
_SKIP = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
                               "oom", "*.png")


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=_SKIP)     # no stale build/ of the shared checkout in the wheel
    wheels = tmp / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    "-w", str(wheels), str(src)], check=True, capture_output=True, timeout=300)
    (whl,) = wheels.glob("flowmesh_sdk-*.whl")
    names = set(zipfile.ZipFile(whl).namelist())
    for shipped in ("flowmesh_sdk/py.typed", "flowmesh_sdk/__main__.py", "flowmesh_recipes/local_swe_eval.py",
                    "flowmesh_recipes/_main_job.py", "flowmesh_sdk/imagebuild/swe-task.Containerfile",
                    "flowmesh_sdk/imagebuild/gpu-worker/entrypoint.py", "flowmesh_sdk/catalog/data/README.md",
                    *(f"flowmesh_providers/{p}/catalog.csv" for p in ("ec2", "gce", "azure", "alibaba", "vast")),
                    "flowmesh_providers/ec2/descriptor.py", "flowmesh_providers/local/__init__.py"):
        assert shipped in names, f"{shipped} missing from {whl.name}"
    assert not any(n.startswith(("recipes/", "images/", "tests/")) for n in names)
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = Path(subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               check=True, capture_output=True, text=True).stdout.strip())
    (site / "_flowmesh_test_deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                    "--no-deps", "--no-index", str(whl)], check=True, capture_output=True, timeout=300)
    return venv


def _run(venv: Path, cwd: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PATH=f"{venv / 'bin'}:{env.get('PATH', '')}", FLOWMESH_HOME=str(cwd / "home"))
    return subprocess.run(list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_installed_wheel_runs_the_cli_and_the_main_job(installed: Path, tmp_path: Path, swe_image: str) -> None:
    py = str(installed / "bin" / "python")
    where = _run(installed, tmp_path, py, "-c", "import flowmesh_sdk, flowmesh_recipes; "
                 "print(flowmesh_sdk.__file__); print(flowmesh_recipes.__path__[0])")
    assert where.returncode == 0, where.stderr
    sdk, recipes = where.stdout.split()
    assert sdk.startswith(str(installed)) and recipes.startswith(str(installed)), where.stdout
    assert not sdk.startswith(str(ROOT))

    helped = _run(installed, tmp_path, str(installed / "bin" / "flowmesh"), "--help")
    assert helped.returncode == 0 and "cost" in helped.stdout and "--log-level" in helped.stdout
    via_m = _run(installed, tmp_path, py, "-m", "flowmesh_sdk", "--help")
    assert via_m.returncode == 0 and "cost" in via_m.stdout and "--log-level" in via_m.stdout

    est = _run(installed, tmp_path, "flowmesh", "cost", "estimate", "--tasks", "100", "--minutes", "30",
               "--providers", "ec2", "--json")
    assert est.returncode == 0, est.stderr
    doc = json.loads(est.stdout)
    assert doc["schema"] == "flowmesh.cost.estimate/1" and doc["estimates"][0]["provider"] == "ec2"
    assert doc["estimates"][0]["instances"] == 100

    out = tmp_path / "results.json"
    job = _run(installed, tmp_path, "flowmesh", "run", "local_swe_eval", "--tasks", "2", "--mode", "persistent",
               "--json", str(out), timeout=600)
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    assert "every verdict matched its expectation" in job.stdout
    data = json.loads(out.read_text())
    rows = data["modes"]["persistent"]["results"]
    assert data["ok"] is True and len(rows) == 2
    assert all(r["got"] == ("pass" if r["patch"] == "right" else "fail") for r in rows)
