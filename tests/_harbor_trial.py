"""The Harbor side of tests/test_integration_harbor.py, run by .venv312's Python (Harbor needs
>= 3.12): tiny Harbor tasks run through Harbor's own trial runner (``Trial.create`` +
``trial.run``) with its oracle agent on FlowMesh sandboxes of a local pool, plus the
environment's calls driven directly.  Prints one JSON object of what it saw; the main
suite's test asserts on it.

    .venv312/bin/python tests/_harbor_trial.py IMAGE WORKDIR
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from harbor.models.trial.config import AgentConfig, EnvironmentConfig, TaskConfig, TrialConfig
from harbor.trial.trial import Trial

from flowmesh_sdk.config import Owner
from flowmesh_sdk.errors import SandboxTimeout, SpecError
from flowmesh_sdk.integrations import close_shared_fleets
from flowmesh_sdk.integrations.harbor import FlowMeshEnvironment

IMPORT_PATH = "flowmesh_sdk.integrations.harbor:FlowMeshEnvironment"
IFACES = "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '"   # the sandbox's network interfaces
TEST_SH = """#!/bin/sh
if [ "$(cat /app/answer.txt)" = "42" ] && [ "$GREETING" = hello ]; then echo 1; else echo 0; fi \
  > /logs/verifier/reward.txt
"""


def make_task(root: Path, name: str, image: str, answer: str) -> Path:
    """A Harbor task directory: task.toml, instruction.md, environment/Dockerfile (a base
    image only), solution/solve.sh (the oracle's reference solution), tests/test.sh."""
    task = root / name
    for sub in ("environment", "solution", "tests"):
        (task / sub).mkdir(parents=True)
    (task / "task.toml").write_text('schema_version = "1.4"\n[metadata]\n[agent]\ntimeout_sec = 120.0\n'
                                    '[verifier]\ntimeout_sec = 120.0\n'
                                    '[environment]\ncpus = 1\nmemory_mb = 512\nnetwork_mode = "no-network"\n')
    (task / "instruction.md").write_text("Write the answer to /app/answer.txt.\n")
    (task / "environment" / "Dockerfile").write_text(f"FROM {image}\nWORKDIR /app\nENV GREETING=hello\n")
    (task / "solution" / "solve.sh").write_text(f"#!/bin/sh\necho '{answer}' > answer.txt\n{IFACES}\n")
    (task / "tests" / "test.sh").write_text(TEST_SH)
    return task


async def run_trial(task: Path, trials: Path, pool: dict) -> dict:
    config = TrialConfig(task=TaskConfig(path=task), trials_dir=trials, agent=AgentConfig(name="oracle"),
                         environment=EnvironmentConfig(import_path=IMPORT_PATH, kwargs={"pool": pool}))
    result = await (await Trial.create(config)).run()
    oracle_log = Path(result.trial_uri.removeprefix("file://")) / "agent" / "oracle.txt"
    return {"rewards": result.verifier_result.rewards if result.verifier_result else None,
            "exception": result.exception_info.exception_message if result.exception_info else None,
            "oracle_output": oracle_log.read_text() if oracle_log.is_file() else None}


async def drive_environment(task: Path, trials: Path, pool: dict, out: dict) -> None:
    """The environment's calls as Harbor's agents and verifier make them."""
    from harbor.environments.factory import EnvironmentFactory
    from harbor.models.task.task import Task
    from harbor.models.trial.paths import TrialPaths

    t = Task(task)
    paths = TrialPaths(trials / "direct")
    paths.mkdir()
    env = EnvironmentFactory.create_environment_from_import_path(
        IMPORT_PATH, environment_dir=t.paths.environment_dir, environment_name="direct",
        session_id="direct__env", trial_paths=paths, task_env_config=t.config.environment,
        network_policy=t.config.environment.resolve_baseline(), pool=pool)
    await env.start(force_build=False)
    sb = env.lease.sandbox
    out["container"] = sb.container_id
    try:
        r = await env.exec('pwd; echo "$GREETING $EXTRA"; id -u; echo err >&2; exit 3', env={"EXTRA": "x"})
        out["exec"] = [r.stdout, r.stderr, r.return_code]
        out["as_nobody"] = (await env.exec("id -un", user="nobody")).stdout
        out["network"] = (await env.exec(IFACES)).stdout
        try:
            await env.exec("sleep 30", timeout_sec=1)
        except SandboxTimeout as exc:
            out["timeout"] = str(exc)
        src = trials / "up"
        (src / "sub").mkdir(parents=True)
        (src / "sub" / "f.txt").write_text("deep\n")
        (src / "run.sh").write_text("#!/bin/sh\necho ran\n")
        (src / "run.sh").chmod(0o755)
        await env.upload_dir(src, "/data")
        await env.upload_file(src / "run.sh", "/bin2/run.sh")
        out["uploaded"] = (await env.exec("/data/run.sh; /bin2/run.sh; cat /data/sub/f.txt")).stdout
        await env.download_dir("/data", trials / "down")
        await env.download_file("/data/sub/f.txt", trials / "one" / "f.txt")
        out["downloaded"] = [(trials / "down" / "sub" / "f.txt").read_text(), (trials / "one" / "f.txt").read_text(),
                             oct((trials / "down" / "run.sh").stat().st_mode & 0o777)]
        out["is_dir"] = [await env.is_dir("/data"), await env.is_file("/data/run.sh"), await env.is_dir("/nope")]
    finally:
        await env.stop(delete=True)
    try:
        await env.exec("true")
    except SpecError as exc:
        out["after_stop"] = str(exc)


def harbor_cli(task: Path, root: Path, pool: dict) -> dict:
    """The same trial through Harbor's command line, as docs/integrations.md shows it."""
    harbor = Path(sys.executable).parent / "harbor"
    proc = subprocess.run([str(harbor), "trials", "start", "-p", str(task), "-a", "oracle", "--env", IMPORT_PATH,
                           "--environment-kwarg", f"pool={json.dumps(pool)}"],
                          capture_output=True, text=True, cwd=root)
    left = subprocess.run(["podman", "ps", "-a", "--filter", f"name=fm-{pool['name']}-", "--format", "{{.Names}}"],
                          capture_output=True, text=True, check=True).stdout.split()
    return {"rc": proc.returncode, "rewarded": "Rewards: {'reward': 1.0}" in proc.stdout,
            "stderr": proc.stderr[-2000:], "left": left}


def containers_of_this_process() -> list[str]:
    listed = subprocess.run(["podman", "ps", "-a", "--filter", f"label=flowmesh.owner={Owner.current()}",
                             "--format", "{{.Names}}"], capture_output=True, text=True, check=True).stdout
    return listed.split()


async def main(image: str, root: Path) -> dict:
    pool = {"name": "harbor-t", "instance": {"cpus": 2, "memory_gb": 4}, "min_instances": 1, "max_instances": 1,
            "sandboxes_per_instance": 3,
            "fleet": {"name": "harbor-test", "home": str(root / "fmhome"),
                      "provider_options": {"local": {"cpus": 2, "memory_gb": 8}}}}
    right, wrong = make_task(root, "answer-right", image, "42"), make_task(root, "answer-wrong", image, "41")
    out: dict = {}
    try:
        out["right"], out["wrong"] = await asyncio.gather(run_trial(right, root / "trials", pool),
                                                          run_trial(wrong, root / "trials", pool))
        # a host of its own for the command's fleet: the pool above holds this one's capacity
        cli_fleet = {**pool["fleet"], "home": str(root / "fmhome-cli")}
        cli_pool = {**pool, "name": "harbor-cli", "fleet": cli_fleet}
        out["cli"] = await asyncio.to_thread(harbor_cli, right, root, cli_pool)
        await drive_environment(right, root / "trials", pool, out)
        out["container_after_stop"] = subprocess.run(["podman", "container", "exists", out["container"]]).returncode
        try:
            FlowMeshEnvironment(environment_dir=root, environment_name="x", session_id="x",
                                trial_paths=None, task_env_config=None)
        except SpecError as exc:
            out["no_pool"] = str(exc)
    finally:
        await asyncio.to_thread(close_shared_fleets, 60)
    out["left"] = containers_of_this_process()
    return out


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], Path(sys.argv[2])))))
