"""recipes/ssh_gpu_workers.py and bench/gpu_worker.py, run as scripts.

* ``--dry-run`` prints the plan from an inventory whose machines are never contacted
  (127.0.0.99 / .98 on a port nothing listens on).
* For real, against two loopback OpenSSH daemons that share this machine's image store:
  one serves (the stand-in worker image, a TEST FIXTURE with the REAL entrypoint.py and
  FakeVllmServer as ``vllm``), the other runs a REAL TRL SFT step on the tiny random
  model, its checkpoints published to a local content-addressed store.
* The bench runs on the CPU and ends with its ``key=value`` line.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from flowmesh_sdk.imagebuild import GPU_WORKER_ENTRYPOINT

from flowmesh_sdk.testing.fake_vllm import build_standin_worker_image

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "ssh_gpu_workers.py"
BENCH = ROOT / "bench" / "gpu_worker.py"
ENTRYPOINT = GPU_WORKER_ENTRYPOINT
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"


def _script(path: Path, args: list[str], home: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, FLOWMESH_HOME=str(home), PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, str(path), *args], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=ROOT)


def _inventory(path: Path, hosts: list[dict]) -> Path:
    path.write_text(json.dumps({"hosts": hosts}))
    return path


def test_dry_run_prints_the_plan_and_connects_to_nothing(tmp_path):
    inv = _inventory(tmp_path / "inv.json", [
        {"name": "box1", "host": "127.0.0.99", "port": 1, "user": "root", "key_path": "/nonexistent",
         "host_key": KEY, "cpus": 64, "memory_gb": 512},
        {"name": "box2", "host": "127.0.0.98", "port": 1, "user": "root", "key_path": "/nonexistent",
         "host_key": KEY, "cpus": 64, "memory_gb": 512}])
    res = _script(RECIPE, ["--inventory", str(inv), "--image", "reg.example:5000/flowmesh/gpu-worker:1",
                           "--model", "Qwen/Qwen2.5-7B-Instruct", "--num-heads", "28", "--serve", "box1",
                           "--train", "box2", "--train-dataset", "/data/sft", "--train-output", "/data/out",
                           "--max-steps", "10", "--gpus", "box1=8,box2=2", "--dry-run"], tmp_path)
    assert res.returncode == 0, res.stderr
    out = res.stdout.splitlines()
    assert out[0] == "box1 (root@127.0.0.99:1): inference, 8 GPU(s) -> tensor-parallel 4"
    assert "--device nvidia.com/gpu=all --ipc host -p 127.0.0.99::8000" in out[1]
    assert out[2] == ("  worker:    vllm serve Qwen/Qwen2.5-7B-Instruct --host 0.0.0.0 --port 8000 "
                      "--tensor-parallel-size 4")
    assert out[4] == "box2 (root@127.0.0.98:1): training (sft), 2 GPU(s) -> 2 process(es)"
    assert "-v /data/sft:/data/sft:ro -v /data/out:/data/out:rw" in out[5]
    assert out[6] == ("  worker:    accelerate launch --num_processes 2 --num_machines 1 --multi_gpu "
                      "--dynamo_backend no -m trl.scripts.sft --model_name_or_path Qwen/Qwen2.5-7B-Instruct "
                      "--dataset_name /data/sft --output_dir /data/out --max_steps 10")
    # a machine named by its ssh config alias alone is shown (and served) where the config sends it
    alias = _inventory(tmp_path / "alias.json", [{"name": "gpubox", "cpus": 64, "memory_gb": 512}])
    (tmp_path / "ssh_config").write_text("Host gpubox\n  HostName 127.0.0.97\n  User ops\n  Port 2222\n")
    res = _script(RECIPE, ["--inventory", str(alias), "--ssh-config", str(tmp_path / "ssh_config"),
                           "--image", "i:1", "--model", "Qwen/Qwen2.5-7B-Instruct", "--num-heads", "28",
                           "--gpus", "gpubox=2", "--dry-run"], tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[0] == "gpubox (ops@127.0.0.97:2222): inference, 2 GPU(s) -> tensor-parallel 2"
    assert "  endpoint:  http://127.0.0.97:<published port>/v1" in res.stdout
    # a size that cannot work is refused in the plan, with the entrypoint's reason
    res = _script(RECIPE, ["--inventory", str(inv), "--image", "i:1", "--model", "m", "--serve", "box1",
                           "--train", "box2", "--train-dataset", "/d", "--train-output", "/o", "--dry-run",
                           "--gpus", "2", "--train-processes", "4"], tmp_path)
    assert res.returncode == 1
    assert ("  worker:    REFUSED: entrypoint.py train: error: argument --num-processes: 4 is more than "
            "the 2 visible GPU(s)") in res.stdout


async def test_recipe_serves_and_trains_on_loopback_hosts(tmp_path, images_mod):
    for mod in ("torch", "transformers", "tokenizers", "trl", "accelerate", "paramiko"):
        pytest.importorskip(mod)
    import accelerate

    from flowmesh_sdk.testing.sshd import LoopbackSshd
    from flowmesh_sdk.testing.tiny_model import OFFLINE_ENV, build_tiny_lm

    images_mod.build_swe_base()
    image = build_standin_worker_image(str(ENTRYPOINT), base=images_mod.SWE_BASE_IMAGE,
                                       build_args=images_mod.podman_build_args())
    lm = build_tiny_lm(tmp_path / "tiny")
    site = str(Path(accelerate.__file__).resolve().parents[1])
    with LoopbackSshd("127.0.0.9", own_storage=False) as a, LoopbackSshd("127.0.0.10", own_storage=False) as b:
        inv = _inventory(tmp_path / "inv.json", [
            {"name": n, "host": d.host, "port": d.port, "user": d.user, "key_path": d.client_key_path,
             "host_key": d.host_public_key, "cpus": 2, "memory_gb": 4} for n, d in (("gpu1", a), ("gpu2", b))])
        env_args = [x for k, v in {"FAKE_GPUS": "4", "PYTHONPATH": "/opt/hostsp", **OFFLINE_ENV}.items()
                    for x in ("--env", f"{k}={v}")]
        res = _script(RECIPE, [
            "--inventory", str(inv), "--image", image, "--gpu-devices", "none", *env_args,
            "--mount", f"{site}:/opt/hostsp", "--model", str(lm.model), "--served-model-name", "tiny",
            "--num-heads", "4", "--serve", "gpu1", "--train", "gpu2", "--train-dataset", str(lm.data),
            "--train-output", str(tmp_path / "out"), "--max-steps", "2", "--train-processes", "1",
            "--train-args", "--per_device_train_batch_size 4 --save_strategy steps --save_steps 2 "
                            "--report_to none --disable_tqdm true --use_cpu true",
            "--serve-s", "0", "--store", str(tmp_path / "cas")], tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = res.stdout
    assert re.search(r"^gpu1: endpoint http://127\.0\.0\.9:\d+/v1  model tiny  tensor-parallel 4$", out, re.M), out
    assert re.search(r"^gpu2: training accelerate launch --num_processes 1 .* -m trl\.scripts\.sft ", out, re.M), out
    assert re.search(r"^gpu2: checkpoint checkpoint-2 -> sha256:[0-9a-f]{64} \(\d+ files\)$", out, re.M), out
    assert re.search(r"^gpu2: checkpoint final -> sha256:[0-9a-f]{64}", out, re.M), out
    assert "gpu1: drained (0 answered, 0 cut off)" in out
    for kind in ("worker.ready", "worker.stopped", "checkpoint.published"):
        assert f"[{kind}]" in out
    left = subprocess.run(["podman", "ps", "-a", "--filter", "label=flowmesh.fleet=ssh-gpu-workers",
                           "--filter", "label=flowmesh.instance=gpu1", "-q"], capture_output=True, text=True)
    assert left.stdout.split() == []


def test_bench_runs_on_cpu(tmp_path):
    for mod in ("torch", "transformers", "tokenizers", "trl", "accelerate"):
        pytest.importorskip(mod)
    res = _script(BENCH, ["--steps", "2", "--batch", "4", "--devices", "cpu"], tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    last = res.stdout.strip().splitlines()[-1]
    m = re.fullmatch(r"cpu_samples_per_s=(\d+\.\d) gpu_samples_per_s=na gpu_vs_cpu=na", last)
    assert m and float(m[1]) > 0, last
