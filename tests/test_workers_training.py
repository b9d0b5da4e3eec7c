"""The training role: a REAL TRL SFT step on the CPU, its checkpoints landing in the
content-addressed store.

The model is a tiny randomly initialised Llama (hidden size 32, 2 layers) and a
word-level tokenizer, both built here with transformers and tokenizers -- nothing is
downloaded (HF_HUB_OFFLINE=1).  The job runs through the worker image's real
``entrypoint.py train`` path (``accelerate launch -m trl.scripts.sft``):

* in a container under podman, over a real loopback sshd (so the checkpoints are
  fetched over SFTP before publishing).  The image is a TEST FIXTURE standing in for the
  GPU worker image (swe-base + the REAL entrypoint.py); the host's own accelerate, TRL,
  transformers and torch are mounted into it read-only instead of being baked in;
* as a process on this host (what bench/gpu_worker.py does on a GPU machine).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from flowmesh_sdk.cas import LocalDirStore
from flowmesh_sdk.control.events import EventBus, EventKind
from flowmesh_sdk.errors import SpecError
from flowmesh_sdk.imagebuild import GPU_WORKER_ENTRYPOINT
from flowmesh_sdk.remote.local import LocalRunner
from flowmesh_sdk.remote.runtime import ContainerRuntime
from flowmesh_sdk.testing.fake_vllm import build_standin_worker_image
from flowmesh_sdk.testing.tiny_model import OFFLINE_ENV, build_tiny_lm
from flowmesh_sdk.workers import (Mount, TrainingFailedError, TrainingSpec, TrainingWorker, WorkerState,
                                  parse_train_metrics, read_manifest, restore_checkpoint)

ROOT = Path(__file__).resolve().parents[1]
ENTRYPOINT = GPU_WORKER_ENTRYPOINT
VENV_BIN = str(Path(sys.executable).parent)
OFFLINE = OFFLINE_ENV
#: trainer flags for a 2-step CPU run that checkpoints every step
STEP_ARGS = ("--per_device_train_batch_size", "4", "--save_strategy", "steps", "--save_steps", "1",
             "--logging_steps", "1", "--report_to", "none", "--disable_tqdm", "true", "--use_cpu", "true")


def test_training_spec_validation():
    ok = TrainingSpec("sft", "/m", "/d", "/o", max_steps=2, num_processes=1)
    assert ok.train_args() == ["train", "--recipe", "sft", "--model", "/m", "--dataset", "/d", "--output", "/o",
                               "--num-processes", "1", "--max-steps", "2"]
    with pytest.raises(SpecError, match="training.reward_funcs: required with recipe grpo"):
        TrainingSpec("grpo", "/m", "/d", "/o")
    with pytest.raises(SpecError, match="training.use_vllm: only allowed with recipe grpo"):
        TrainingSpec("dpo", "/m", "/d", "/o", use_vllm=True)
    with pytest.raises(SpecError, match="training.recipe: must be one of sft, dpo, grpo"):
        TrainingSpec("ppo", "/m", "/d", "/o")
    with pytest.raises(SpecError, match="training.dataset: must be an absolute path"):
        TrainingSpec("sft", "/m", "data", "/o")
    assert "hf_x" not in repr(TrainingSpec("sft", "/m", "/d", "/o", env={"HF_TOKEN": "hf_x"}))


def test_parse_train_metrics():
    out = ("{'loss': '4.9', 'epoch': '0.06'}\n"
           "{'train_runtime': '0.0677', 'train_samples_per_second': '118.2', 'train_loss': '4.922', "
           "'epoch': '0.125'}\n✅ Training completed.\n")
    assert parse_train_metrics(out) == {"train_runtime": 0.0677, "train_samples_per_second": 118.2,
                                        "train_loss": 4.922, "epoch": 0.125}
    assert parse_train_metrics("no metrics here") == {}


# --------------------------------------------------------------------------- #
# a tiny random model, built here
# --------------------------------------------------------------------------- #

@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    for mod in ("torch", "transformers", "tokenizers", "trl", "accelerate", "datasets"):
        pytest.importorskip(mod)
    os.environ.update(OFFLINE)
    root = tmp_path_factory.mktemp("tiny")
    lm = build_tiny_lm(root)   # hidden size 32, 2 layers, random weights, local tokenizer
    return {"model": lm.model, "data": lm.data, "root": root}


def _check_landed(result, store_root: Path, tmp: Path) -> tuple[LocalDirStore, Path]:
    """Both checkpoints and the final model were published, each under its ref."""
    assert [c.name for c in result.checkpoints] == ["checkpoint-1", "checkpoint-2"]
    assert [c.step for c in result.checkpoints] == [1, 2]
    assert result.final is not None and result.final.step == 2
    assert result.metrics["train_samples_per_second"] > 0 and "train_loss" in result.metrics
    store = LocalDirStore(store_root)
    for ck in (*result.checkpoints, result.final):
        assert ck.digest.startswith("sha256:") and ck.files >= 4 and ck.bytes > 0
        assert ck.ref is not None and store.ref_path(ck.ref).exists()
    return store, tmp / "restored"


async def _restore_and_load(store, result, dest: Path, output: Path | None) -> None:
    """The final model reads back byte for byte and loads with transformers."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert (await store.read_ref(result.final.ref)) == result.final.digest.encode()
    manifest = await read_manifest(store, result.checkpoints[-1].digest)
    assert "trainer_state.json" in manifest["files"] and "model.safetensors" in manifest["files"]
    files = await restore_checkpoint(store, result.final.digest, dest)
    assert "model.safetensors" in files and "config.json" in files
    if output is not None:  # byte for byte what the job wrote
        for rel in files:
            assert (dest / rel).read_bytes() == (output / rel).read_bytes(), rel
    model = AutoModelForCausalLM.from_pretrained(dest)
    assert model.config.hidden_size == 32 and model.config.num_hidden_layers == 2
    tok = AutoTokenizer.from_pretrained(dest)
    assert tok.eos_token == "</s>"


async def test_sft_step_in_a_container_over_ssh_lands_in_the_store(tiny, images_mod, tmp_path):
    pytest.importorskip("paramiko")
    from flowmesh_sdk.remote.ssh import SshRunner, SshTarget
    from flowmesh_sdk.testing.sshd import LoopbackSshd

    import accelerate
    site_packages = str(Path(accelerate.__file__).resolve().parents[1])
    images_mod.build_swe_base()
    image = build_standin_worker_image(str(ENTRYPOINT), base=images_mod.SWE_BASE_IMAGE,
                                       build_args=images_mod.podman_build_args())
    output = tiny["root"] / f"out-{uuid.uuid4().hex[:6]}"
    spec = TrainingSpec("sft", str(tiny["model"]), str(tiny["data"]), str(output), image=image, gpus="none",
                        max_steps=2, num_processes=1, mounts=(Mount(site_packages, "/opt/hostsp"),),
                        env={"PYTHONPATH": "/opt/hostsp", **OFFLINE}, extra_args=STEP_ARGS, timeout_s=600)
    fleet = f"t-{uuid.uuid4().hex[:8]}"
    bus = EventBus()
    sub = bus.subscribe()
    with LoopbackSshd("127.0.0.8", own_storage=False) as sshd:
        runner = SshRunner(SshTarget(sshd.host, sshd.port, sshd.user, sshd.client_key_path,
                                     sshd.host_public_key))
        try:
            worker = TrainingWorker(ContainerRuntime(runner), spec, store=LocalDirStore(tmp_path / "cas"),
                                    fleet=fleet, bus=bus, staging_dir=tmp_path / "staging")
            result = await worker.run()
        finally:
            await runner.close()
    assert worker.state is WorkerState.STOPPED and result.exit_code == 0
    # the exact command the image's entrypoint planned (and then ran)
    assert result.argv[:8] == ("accelerate", "launch", "--num_processes", "1", "--num_machines", "1",
                               "--dynamo_backend", "no")
    assert result.argv[8:10] == ("-m", "trl.scripts.sft") and "--max_steps" in result.argv
    store, dest = _check_landed(result, tmp_path / "cas", tmp_path)
    await _restore_and_load(store, result, dest, output)
    assert list((tmp_path / "staging").iterdir()) == []   # the staging copy is gone
    kinds = []
    while not sub.queue.empty():
        kinds.append(sub.queue.get_nowait().kind)
    assert kinds == [EventKind.WORKER_STARTING, EventKind.WORKER_READY, EventKind.WORKER_DRAINING,
                     *[EventKind.CHECKPOINT_PUBLISHED] * 3, EventKind.WORKER_STOPPED]
    left = subprocess.run(["podman", "ps", "-a", "--filter", f"label=flowmesh.fleet={fleet}", "-q"],
                          capture_output=True, text=True, check=True).stdout.split()
    assert left == []


def _process_spec(tiny, output: Path, **kw) -> TrainingSpec:
    env = {"PATH": f"{VENV_BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}", **OFFLINE}
    fields = {"max_steps": 2, "num_processes": 1, "python": sys.executable, "env": env,
              "extra_args": STEP_ARGS, **kw}
    return TrainingSpec("sft", str(tiny["model"]), str(tiny["data"]), str(output), **fields)


async def test_sft_step_as_a_process_lands_in_the_store(tiny, tmp_path):
    output = tmp_path / "out"
    worker = TrainingWorker(LocalRunner(), _process_spec(tiny, output), store=LocalDirStore(tmp_path / "cas"))
    result = await worker.run()
    assert result.argv[:2] == ("accelerate", "launch")
    store, dest = _check_landed(result, tmp_path / "cas", tmp_path)
    await _restore_and_load(store, result, dest, output)


async def test_a_failing_job_raises_with_its_log(tiny, tmp_path):
    spec = _process_spec(tiny, tmp_path / "out", extra_args=(*STEP_ARGS, "--learning_rate", "not-a-number"))
    worker = TrainingWorker(LocalRunner(), spec, store=LocalDirStore(tmp_path / "cas"))
    with pytest.raises(TrainingFailedError, match="exited") as info:
        await worker.run()
    assert info.value.exit_code not in (0, None)
    assert "learning_rate" in info.value.log_tail
    assert worker.state is WorkerState.FAILED


async def test_a_refused_plan_is_a_spec_error(tiny, tmp_path):
    if shutil.which("nvidia-smi") or os.environ.get("CUDA_VISIBLE_DEVICES"):
        pytest.skip("this machine has GPUs: auto would find them")
    # two processes, but the entrypoint sees no GPU at all: refused before anything runs
    spec = _process_spec(tiny, tmp_path / "out", num_processes=None)
    worker = TrainingWorker(LocalRunner(), spec, store=LocalDirStore(tmp_path / "cas"))
    with pytest.raises(SpecError, match="training: argument --num-processes: auto"):
        await worker.start()
    assert worker.state is WorkerState.FAILED


async def test_stop_ends_the_job_and_publishes_what_is_complete(tiny, tmp_path):
    output = tmp_path / "out"
    spec = _process_spec(tiny, output, max_steps=100000)
    worker = TrainingWorker(LocalRunner(), spec, store=LocalDirStore(tmp_path / "cas"))
    await worker.start()
    result = await worker.stop()   # right away: the job is still importing torch
    assert worker.state is WorkerState.STOPPED and result.exit_code is None and result.final is None
    for ck in result.checkpoints:   # only complete ones, should any exist
        assert "trainer_state.json" in (await read_manifest(LocalDirStore(tmp_path / "cas"), ck.digest))["files"]
    alive = subprocess.run(["pgrep", "-f", str(output)], capture_output=True, text=True).stdout.split()
    assert alive == [], "the stopped job left processes behind"
