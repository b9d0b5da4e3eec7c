"""FlowMeshEnvironment: the interface mini-swe-agent's agents call (execute with cwd and
timeouts, the output dict, Submitted, template variables, serialize), on real podman; and
mini-swe-agent's own DefaultAgent loop end to end on the main job's SWE-style tasks
(recipes/mini_swe_agent_eval.py), its model a scripted policy standing in for an LLM
(the package's DeterministicModel), every submitted patch graded in a fresh sandbox."""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
# mini-swe-agent reads its global config (a .env) once, at import: an empty one, not the
# user's; gone again right after, so the suite leaves no temporary directory behind
_CONFIG_DIR = tempfile.mkdtemp(prefix="mswea-config-")
_OWN_CONFIG = os.environ.setdefault("MSWEA_GLOBAL_CONFIG_DIR", _CONFIG_DIR) == _CONFIG_DIR
try:
    pytest.importorskip("minisweagent")
finally:
    if _OWN_CONFIG:
        del os.environ["MSWEA_GLOBAL_CONFIG_DIR"]
    shutil.rmtree(_CONFIG_DIR, ignore_errors=True)

from minisweagent.exceptions import Submitted  # noqa: E402
from minisweagent.environments.local import LocalEnvironment  # noqa: E402

from flowmesh_sdk import InstanceSpec, PoolSpec, SandboxSpec  # noqa: E402
from flowmesh_sdk.errors import IntegrationMissingError, SpecError  # noqa: E402
from flowmesh_sdk.integrations.minisweagent import FlowMeshEnvironment  # noqa: E402
from flowmesh_sdk.sync import SyncFleet  # noqa: E402
from conftest import local_pool  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
async def pool(tmp_path_factory, swe_image):
    async with local_pool(tmp_path_factory.mktemp("fmhome-mini"), "mini") as (_, p):
        yield p


async def test_execute_templates_and_submit(pool, swe_image):
    async with pool.sandbox(SandboxSpec(image=swe_image, cpus=1, memory_gb=0.5)) as sb:
        env = FlowMeshEnvironment(sandbox=sb, cwd="/tmp", timeout=20, env={"FROM_CFG": "cfg"})
        stateful = FlowMeshEnvironment(sandbox=sb, cwd="/tmp", session="stateful", stateful=True)
        with pytest.raises(SpecError, match="worker thread"):
            env.execute({"command": "true"})        # on the loop's own thread it would deadlock

        def drive() -> dict:
            out = {"first": env.execute({"command": 'pwd; echo "err $FROM_CFG" >&2; exit 3'})}
            env.execute({"command": "cd / && export A=1"})
            out["fresh"] = env.execute({"command": 'pwd; echo "[$A]"'})
            out["cwd"] = env.execute({"command": "pwd"}, cwd="/usr")
            out["timeout"] = env.execute({"command": "sleep 30; echo no"}, timeout=1)
            stateful.execute({"command": "cd /usr && export B=2"})
            out["stateful"] = stateful.execute({"command": 'pwd; echo "[$B]"'}, cwd="/usr")
            # a cwd that cannot be entered: reported as LocalEnvironment reports subprocess.run's error,
            # the command not run, and a stateful session's shell (its variables) not ended by it
            out["nocwd"] = [e.execute({"command": "echo ran"}, cwd=d) for e in (env, stateful)
                            for d in ("/no/such/dir", "/etc/hostname")]
            out["kept"] = stateful.execute({"command": 'echo "[$B]"'}, cwd="/usr")
            out["local"] = [LocalEnvironment().execute({"command": "echo ran"}, cwd=d)
                            for d in ("/no/such/dir", "/etc/hostname")]
            try:
                env.execute({"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; echo the patch"})
            except Submitted as exc:
                out["submitted"] = exc.messages[0]
            out["vars"] = env.get_template_vars(task="t")
            return out

        out = await asyncio.to_thread(drive)
    assert out["first"] == {"output": "/tmp\nerr cfg\n", "returncode": 3, "exception_info": ""}
    assert out["fresh"]["output"] == "/tmp\n[]\n"           # every action in a fresh subshell
    assert out["cwd"]["output"] == "/usr\n"
    t = out["timeout"]
    assert t["returncode"] == -1 and "timed out after 1 seconds" in t["exception_info"]
    assert t["extra"]["exception_type"] == "TimeoutExpired" and "no" not in t["output"]
    assert out["stateful"]["output"] == "/usr\n[2]\n"
    assert out["nocwd"] == out["local"] * 2 and out["local"][0]["returncode"] == -1
    assert out["local"][0]["extra"]["exception_type"] == "FileNotFoundError"
    assert out["local"][1]["extra"]["exception_type"] == "NotADirectoryError"
    assert out["kept"]["output"] == "[2]\n"
    assert out["submitted"]["extra"] == {"exit_status": "Submitted", "submission": "the patch\n"}
    v = out["vars"]
    assert v["system"] == "Linux" and v["machine"] and v["cwd"] == "/tmp" and v["task"] == "t"
    ser = env.serialize()["info"]["config"]
    assert ser["environment"]["timeout"] == 20 and ser["sandbox"]["name"] == sb.name
    assert ser["environment_type"] == "flowmesh_sdk.integrations.minisweagent.FlowMeshEnvironment"


def test_from_a_sync_script(busybox_image, tmp_path):
    from flowmesh_providers.local import LocalProvider

    home = tmp_path / "home"
    with SyncFleet("mini-sync", home=home, providers={
            "local": LocalProvider(cpus=2, memory_gb=8, state_dir=home / "local" / "instances")}) as fleet:
        pool = fleet.pool(PoolSpec(name="s", instance=InstanceSpec(cpus=1, memory_gb=1), max_instances=1))
        with pool.sandbox(image=busybox_image) as sb:
            env = FlowMeshEnvironment(sandbox=sb, cwd="/tmp")
            assert env.execute({"command": "pwd && echo hi"}) == {"output": "/tmp\nhi\n", "returncode": 0,
                                                                  "exception_info": ""}
            with pytest.raises(SpecError, match="environment.cwd"):
                FlowMeshEnvironment(sandbox=sb, cwd="relative")


@pytest.mark.slow
async def test_agent_loop_end_to_end_on_swe_tasks(fm_home, swe_image, tmp_path):
    sys.path.insert(0, str(ROOT / "recipes"))
    try:
        recipe = importlib.import_module("mini_swe_agent_eval")
    finally:
        sys.path.remove(str(ROOT / "recipes"))
    out = tmp_path / "mini.json"
    assert await recipe.main(["--tasks", "4", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["ok"] is True
    rows = {r["task"]: r for r in data["results"]}
    assert {r["expected"] for r in rows.values()} == {"pass", "fail"}
    for r in rows.values():
        assert r["exit_status"] == "Submitted" and r["model_calls"] == 4
        assert r["step_exit_codes"][0] == 1                  # the test failed before the patch
        assert r["submission"].startswith("diff --git a/")   # the agent's git diff, from the sandbox
        assert r["got"] == r["expected"]
    # a bad fix still fails its own test run inside the agent loop; a right one passes
    assert rows["t00-off-by-one"]["step_exit_codes"] == [1, 0, 0]
    assert rows["t01-wrong-operator"]["step_exit_codes"] == [1, 0, 1]
    assert "tests/test_seqs.py" in rows["t03-wrong-index"]["submission"]   # edited the test: still fails


def test_missing_package_names_the_extra(monkeypatch):
    monkeypatch.delitem(sys.modules, "flowmesh_sdk.integrations.minisweagent")
    monkeypatch.setitem(sys.modules, "minisweagent", None)
    with pytest.raises(IntegrationMissingError, match=r"pip install 'flowmesh-sdk\[minisweagent\]'"):
        importlib.import_module("flowmesh_sdk.integrations.minisweagent")
