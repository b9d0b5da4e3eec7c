"""FlowMeshTool through verl's own tool API: the tools are loaded from a tool-config YAML by
verl's ``initialize_tools_from_config`` (as its agent loops load them), then a scripted
trajectory (no model, no training) runs create -> execute code -> execute a failing
command -> calc_reward with the task's tests -> release, on real podman sandboxes of a
local pool the YAML describes (the tool owns its fleet).  Two trajectories at once stay
isolated, and a released sandbox is gone."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("verl.tools.tool_registry")

from verl.tools.schemas import ToolResponse  # noqa: E402
from verl.tools.tool_registry import initialize_tools_from_config  # noqa: E402

from flowmesh_sdk.errors import SpecError  # noqa: E402
from flowmesh_sdk.integrations import close_shared_fleets  # noqa: E402
from flowmesh_sdk.integrations.verl import FlowMeshTool  # noqa: E402

TESTS = "from answer import add\nassert add(2, 3) == 5, 'add is wrong'\nprint('tests passed')\n"
SCHEMA = {"type": "function", "function": {"name": "NAME", "description": "run it",
                                           "parameters": {"type": "object", "required": ["PARAM"],
                                                          "properties": {"PARAM": {"type": "string"}}}}}


def _tool_yaml(tmp: Path, image: str) -> Path:
    pool = {"name": "verl-t", "instance": {"cpus": 2, "memory_gb": 4}, "min_instances": 1, "max_instances": 1,
            "sandboxes_per_instance": 3,
            "fleet": {"name": "verl-test", "home": str(tmp / "fmhome"),
                      "provider_options": {"local": {"cpus": 2, "memory_gb": 8}}}}
    common = {"type": "native", "image": image, "pool": pool, "sandbox": {"cpus": 0.5, "memory_gb": 0.5}}

    def schema(name: str, param: str) -> dict:
        return json.loads(json.dumps(SCHEMA).replace("NAME", name).replace("PARAM", param))
    tools = {"tools": [
        {"class_name": "flowmesh_sdk.integrations.verl.FlowMeshTool", "config": {**common, "timeout_s": 3},
         "tool_schema": schema("code_interpreter", "code")},
        {"class_name": "flowmesh_sdk.integrations.verl.FlowMeshTool", "config": {**common, "language": "bash"},
         "tool_schema": schema("shell", "command")},
    ]}
    path = tmp / "tools.yaml"
    path.write_text(json.dumps(tools))        # JSON is YAML: verl reads it with OmegaConf.load
    return path


def _exists(container_id: str) -> bool:
    return subprocess.run(["podman", "container", "exists", container_id]).returncode == 0


@pytest.fixture(scope="module")
async def tools(tmp_path_factory, swe_image):
    loaded = initialize_tools_from_config(str(_tool_yaml(tmp_path_factory.mktemp("verl"), swe_image)))
    yield {t.name: t for t in loaded}
    await asyncio.to_thread(close_shared_fleets, 60)


async def test_scripted_trajectory(tools):
    code, shell = tools["code_interpreter"], tools["shell"]
    assert isinstance(code, FlowMeshTool) and code.parameter == "code" and shell.parameter == "command"
    iid, created = await code.create(create_kwargs={"tests": TESTS})     # as verl's ToolAgentLoop calls it
    assert isinstance(created, ToolResponse)
    sb = code.sandbox(iid)
    assert _exists(sb.container_id)

    resp, reward, metrics = await code.execute(iid, {"code": "def add(a, b):\n    return a + b\nprint(add(1, 1))\n"})
    assert isinstance(resp, ToolResponse) and resp.text == "2\n" and reward == 0.0
    assert metrics["exit_code"] == 0.0 and metrics["timed_out"] == 0.0

    failed, _, m = await code.execute(iid, {"code": "import sys\nprint('out')\nsys.exit('boom')\n"})
    assert failed.text == "out\nboom\n\n[exit code 1]" and m["exit_code"] == 1.0
    slow, _, m = await code.execute(iid, {"code": "while True:\n    pass\n"})
    assert slow.text.endswith("[timed out after 3 s]") and m["timed_out"] == 1.0

    # the last code run is the answer: rewrite add, then the tests pass in this sandbox
    await code.execute(iid, {"code": "def add(a, b):\n    return a + b\n"})
    assert await code.calc_reward(iid) == 1.0
    assert await code.calc_reward(iid, tests="from answer import add\nassert add(1, 1) == 3\n") == 0.0

    await code.release(iid)
    assert not _exists(sb.container_id)
    await code.release(iid)                      # a second release is a no-op
    with pytest.raises(SpecError, match="instance_id"):
        await code.execute(iid, {"code": "print(1)"})


async def test_shell_session_and_failing_command(tools):
    shell = tools["shell"]
    iid, _ = await shell.create(instance_id="traj-shell", files={"/work/data.txt": "hello\n"})
    assert iid == "traj-shell"
    try:
        await shell.execute(iid, {"command": "cd /work && export GREETING=hi"})
        resp, _, _ = await shell.execute(iid, {"command": 'pwd; echo "$GREETING"; cat data.txt'})
        assert resp.text == "/work\nhi\nhello\n"                     # the session keeps cwd and variables
        bad, _, m = await shell.execute(iid, {"command": "ls /no/such/dir"})
        assert "No such file or directory" in bad.text and bad.text.endswith("[exit code 2]")
        assert m["exit_code"] == 2.0
        wrong, _, _ = await shell.execute(iid, {"code": "echo wrong parameter"})
        assert "'command' parameter must be a string" in (wrong.text or "")
    finally:
        await shell.release(iid)


async def test_trajectories_are_isolated(tools):
    code = tools["code_interpreter"]
    (a, _), (b, _) = await asyncio.gather(code.create(create_kwargs={"tests": TESTS}),
                                          code.create(create_kwargs={"tests": TESTS}))
    try:
        assert code.sandbox(a).container_id != code.sandbox(b).container_id
        write = "open('/tmp/secret', 'w').write('a')\ndef add(x, y):\n    return x + y\n"
        peek = "import os\nprint(os.path.exists('/tmp/secret'))\ndef add(x, y):\n    return x - y\n"
        (ra, _, _), (rb, _, _) = await asyncio.gather(code.execute(a, {"code": write}),
                                                      code.execute(b, {"code": peek}))
        assert ra.text == "" and rb.text == "False\n"
        assert await asyncio.gather(code.calc_reward(a), code.calc_reward(b)) == [1.0, 0.0]
    finally:
        await asyncio.gather(code.release(a), code.release(b))


async def test_config_errors_name_the_field(swe_image):
    from verl.tools.schemas import OpenAIFunctionToolSchema
    code_schema = OpenAIFunctionToolSchema.model_validate(json.loads(json.dumps(SCHEMA).replace("PARAM", "code")))
    with pytest.raises(SpecError, match=r"tool.config.image: is required"):
        FlowMeshTool({"type": "native", "pool": "p"}, code_schema)
    with pytest.raises(SpecError, match=r"tool.config.pools: is not a FlowMeshTool setting; allowed: image, pool"):
        FlowMeshTool({"type": "native", "image": swe_image, "pools": "p"}, code_schema)
    with pytest.raises(SpecError, match=r"tool.config.pool.instance.gpu: is not a InstanceSpec field"):
        FlowMeshTool({"image": swe_image, "pool": {"name": "p", "instance": {"gpu": 1}}}, code_schema)
    with pytest.raises(SpecError, match=r"tool.config.language: must be one of python, bash, sh"):
        FlowMeshTool({"image": swe_image, "pool": "p", "language": "cobol"}, code_schema)
    bare = OpenAIFunctionToolSchema.model_validate({"type": "function", "function": {"name": "x", "description": "d"}})
    with pytest.raises(SpecError, match=r"tool_schema.function.parameters.properties: must have the parameter"):
        FlowMeshTool({"image": swe_image, "pool": "p"}, bare)
    unregistered = FlowMeshTool({"image": swe_image, "pool": "nowhere"}, None)   # verl's YAML may omit the schema
    assert unregistered.name == "code_interpreter" and unregistered.parameter == "code"
    with pytest.raises(SpecError, match=r"tool.config.pool: no pool is registered as 'nowhere'"):
        await unregistered.create()
