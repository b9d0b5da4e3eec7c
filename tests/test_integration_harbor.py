"""FlowMeshEnvironment through Harbor's own trial runner.  Harbor needs Python >= 3.12, so
the Harbor side (tests/_harbor_trial.py) runs in .venv312, the 3.12 virtual environment
``bash setup.sh --dev`` makes where such a Python exists.  Two tiny tasks (an environment
Dockerfile naming the busybox image, a reference solution, a test script) run at once
through ``Trial.create(...).run()`` with the oracle agent on sandboxes of a local pool;
one again through the ``harbor trials start`` command line; then the environment's calls
(exec with env, cwd, user and timeout; files and directories up and down; the task's
no-network policy) are driven directly.  Nothing is left behind."""

from __future__ import annotations

import glob
import importlib.util
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from flowmesh_sdk.errors import IntegrationMissingError

ROOT = Path(__file__).resolve().parents[1]
VENV312 = ROOT / ".venv312" / "bin" / "python"


def _python312() -> str | None:
    """A Python >= 3.12 on this machine (what setup.sh --dev looks for), or None."""
    found = [shutil.which(n) for n in ("python3.14", "python3.13", "python3.12")]
    found += sorted(glob.glob(str(Path.home() / ".pyenv/versions/3.1[2-9]*/bin/python3")))
    for exe in filter(None, found):
        if subprocess.run([exe, "-c", "import sys; assert sys.version_info >= (3, 12)"],
                          capture_output=True).returncode == 0:
            return exe
    return None


@pytest.fixture(scope="module")
def venv312() -> str:
    if VENV312.exists():
        return str(VENV312)
    exe = _python312()
    if exe is None:
        pytest.skip("no Python >= 3.12 on this machine: Harbor 0.25 requires it, so the Harbor "
                    "environment's tests cannot run here (install one, then bash setup.sh --dev)")
    pytest.fail(f"{exe} is a Python >= 3.12 but .venv312 is missing: run bash setup.sh --dev to make it")


@pytest.mark.skipif(importlib.util.find_spec("harbor") is not None, reason="harbor is installed here")
def test_without_harbor_the_import_names_the_extra():
    with pytest.raises(IntegrationMissingError, match=r"pip install 'flowmesh-sdk\[harbor\]'"):
        import flowmesh_sdk.integrations.harbor  # noqa: F401


def test_oracle_trials_on_a_flowmesh_pool(venv312, busybox_image, tmp_path):
    proc = subprocess.run([venv312, str(ROOT / "tests" / "_harbor_trial.py"), busybox_image, str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])

    # Harbor's trial runner, oracle agent: the reference solution passes, a wrong one does not
    assert out["right"] == {"rewards": {"reward": 1.0}, "exception": None, "oracle_output": "lo\n"}
    assert out["wrong"] == {"rewards": {"reward": 0.0}, "exception": None, "oracle_output": "lo\n"}

    # the same through `harbor trials start --env ... --environment-kwarg pool=...`: its fleet goes with the run
    assert out["cli"]["rc"] == 0 and out["cli"]["rewarded"], out["cli"]["stderr"]
    assert out["cli"]["left"] == []

    # the environment's calls, driven directly
    assert out["exec"] == ["/app\nhello x\n0\n", "err\n", 3]       # WORKDIR, ENV + exec env, root, stderr, exit
    assert out["as_nobody"] == "nobody\n"
    assert out["network"] == "lo\n"                                  # network_mode = "no-network"
    assert "timed out after 1 seconds" in out["timeout"]
    assert out["uploaded"] == "ran\nran\ndeep\n"
    assert out["downloaded"] == ["deep\n", "deep\n", "0o755"]
    assert out["is_dir"] == [True, True, False]
    assert "is not started" in out["after_stop"]
    assert out["container_after_stop"] == 1                          # stop destroyed the sandbox
    assert out["no_pool"].startswith("environment.kwargs.pool: is required")
    assert out["left"] == []                                         # nothing of the process's fleet is left


_DOCKERFILES = r'''
import json, sys
from pathlib import Path
from flowmesh_sdk.errors import SpecError
from flowmesh_sdk.integrations.harbor import base_image
out = []
for i, text in enumerate(json.loads(sys.argv[1])):
    p = Path(sys.argv[2]) / f"Dockerfile.{i}"
    p.write_text(text)
    try:
        out.append(list(base_image(p)))
    except SpecError as exc:
        out.append(str(exc))
print(json.dumps(out))
'''


def test_an_environment_dockerfile_is_read_or_refused_naming_the_line(venv312, tmp_path):
    """Only FROM, WORKDIR and ENV are taken; anything else, or a line that cannot be read (an
    unterminated quote, an ENV without a value: a ValueError or an IndexError before), is a
    SpecError that quotes the line."""
    cases = ["FROM debian:bookworm\nWORKDIR /app\nWORKDIR sub\nENV A 1\nENV B=2 C=\"x y\"\n",
             "FROM --platform=linux/amd64 busybox\n",
             "FROM debian\nRUN apt-get install -y git\n",
             "FROM debian\nENV MSG=\"unterminated\n",
             "FROM debian\nENV\n",
             "FROM debian\nENV A=1 B\n",
             "# only a comment\n"]
    proc = subprocess.run([venv312, "-c", _DOCKERFILES, json.dumps(cases), str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout)
    assert got[0] == ["debian:bookworm", "/app/sub", {"A": "1", "B": "2", "C": "x y"}]
    assert got[1] == ["busybox", None, {}]
    assert got[2].startswith("environment/Dockerfile: 'RUN apt-get install -y git': FlowMesh runs prebuilt images")
    assert got[3] == "environment/Dockerfile: 'ENV MSG=\"unterminated': No closing quotation"
    assert got[4] == got[5].replace("'ENV A=1 B'", "'ENV'") and "ENV takes KEY=VALUE" in got[4]
    assert got[6] == "environment/Dockerfile: has no FROM line"
