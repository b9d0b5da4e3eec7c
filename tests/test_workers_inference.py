"""The inference role, tested honestly without a GPU.

* The tensor-parallel rule is the worker image's own (images/gpu-worker/entrypoint.py,
  loaded by path), checked as a function and through ``--dry-run``.
* The client (rate limit, locality, micro-batching, errors, drain) talks over real HTTP
  to ``FakeVllmServer`` -- a TEST FIXTURE standing in for vLLM's OpenAI-compatible server.
* The launch path runs for real under podman, locally and over a real loopback sshd: the
  runtime starts a TEST FIXTURE image that carries the REAL entrypoint.py, a stand-in
  ``vllm`` (FakeVllmServer) and a stand-in ``nvidia-smi`` listing ``$FAKE_GPUS`` made-up
  GPUs; the entrypoint counts them, chooses the tensor-parallel size and execs the
  stand-in, which the health check then waits for.  What needs a real GPU (CDI device
  injection, vLLM itself) is listed in docs/workers.md.
"""

from __future__ import annotations

import asyncio
import importlib.util
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pytest

from flowmesh_sdk.control.events import EventBus, EventKind
from flowmesh_sdk.errors import (NotFoundError, PoolClosedError, ProviderUnavailableError, SpecError,
                                 ThrottledError)
from flowmesh_sdk.imagebuild import GPU_WORKER_ENTRYPOINT
from flowmesh_sdk.remote.local import LocalRunner
from flowmesh_sdk.remote.runtime import ContainerRuntime
from flowmesh_sdk.testing.fake_vllm import FakeVllmServer, build_standin_worker_image
from flowmesh_sdk.workers import (HEADER_G_LOC, HEADER_MODEL, HEADER_WORKER, ChatMessage, ClientLimits,
                                  InferenceEndpoint, InferenceSpec, InferenceWorker, SamplingParams,
                                  WorkerStartError, WorkerState, gpu_flags, group_key, wait_until_healthy)

ROOT = Path(__file__).resolve().parents[1]
ENTRYPOINT = GPU_WORKER_ENTRYPOINT


def _entrypoint_module():
    spec = importlib.util.spec_from_file_location("gpu_worker_entrypoint", ENTRYPOINT)
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod


# --------------------------------------------------------------------------- #
# tensor-parallel choice: the image's one rule
# --------------------------------------------------------------------------- #

@pytest.mark.parametrize("gpus, heads, tp", [
    (1, 32, 1), (2, 32, 2), (3, 32, 2), (4, 32, 4), (6, 32, 4), (8, 32, 8), (16, 32, 16),
    (8, 14, 2),    # Qwen2.5-0.5B: 14 heads -> 2 of 8 GPUs
    (8, 28, 4),    # Qwen2.5-7B: 28 heads
    (8, 12, 4), (8, 7, 1), (5, None, 4), (0, 32, 0),
])
def test_fit_tensor_parallel_rule(gpus, heads, tp):
    assert _entrypoint_module().fit_tensor_parallel(gpus, heads) == tp


def _dry(args: list[str], cvd: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ENTRYPOINT), *args, "--dry-run"], capture_output=True,
                          text=True, timeout=60, env={"PATH": "/nonexistent", "CUDA_VISIBLE_DEVICES": cvd})


def test_entrypoint_fit_flag():
    res = _dry(["serve", "--model", "m", "--tensor-parallel-fit", "--num-heads", "28"], "0,1,2,3,4,5")
    assert res.returncode == 0, res.stderr
    assert res.stdout.split()[-2:] == ["--tensor-parallel-size", "4"]
    bad = _dry(["serve", "--model", "m", "--tensor-parallel", "2", "--tensor-parallel-fit"], "0,1")
    assert bad.returncode == 2
    assert "argument --tensor-parallel-fit: only allowed with --tensor-parallel auto, not 2" in bad.stderr


def test_specs_name_the_bad_field():
    with pytest.raises(SpecError, match=r"inference.gpus: must be 'all', 'none' or GPU indices"):
        InferenceSpec("m", "img:1", gpus="two")
    with pytest.raises(SpecError, match=r"inference.tensor_parallel: 3 does not divide num_heads 32"):
        InferenceSpec("m", "img:1", num_heads=32, tensor_parallel=3)
    with pytest.raises(SpecError, match=r"sampling.top_p"):
        SamplingParams(top_p=0)
    with pytest.raises(SpecError, match=r"limits.max_batch"):
        ClientLimits(max_batch=0)
    with pytest.raises(SpecError, match=r"chat.role: must be one of"):
        ChatMessage("robot", "hi")
    spec = InferenceSpec("m", "img:1", env={"HF_TOKEN": "hf_secret_value"})
    assert "hf_secret_value" not in repr(spec)
    assert spec.serve_args() == ["serve", "--model", "m", "--port", "8000", "--tensor-parallel", "auto",
                                 "--tensor-parallel-fit"]


def test_gpu_flags_per_runtime():
    assert gpu_flags("podman", "all") == ["--device", "nvidia.com/gpu=all"]
    assert gpu_flags("podman", "0,2") == ["--device", "nvidia.com/gpu=0", "--device", "nvidia.com/gpu=2"]
    assert gpu_flags("docker", "all") == ["--gpus", "all"]
    assert gpu_flags("docker", "0,2") == ["--gpus", '"device=0,2"']
    assert gpu_flags("podman", "none") == []


def test_group_key_is_model_and_sampling_only():
    a = SamplingParams(max_tokens=8, temperature=0.0).payload()
    assert group_key("m", a) == group_key("m", dict(reversed(list(a.items()))))
    assert group_key("m", a) != group_key("m2", a)
    assert group_key("m", a) != group_key("m", SamplingParams(max_tokens=9, temperature=0.0).payload())


# --------------------------------------------------------------------------- #
# the client against FakeVllmServer (a TEST FIXTURE standing in for vLLM)
# --------------------------------------------------------------------------- #

@pytest.fixture
def fake():
    with FakeVllmServer("fake/tiny", served_model_name="tiny") as srv:
        yield srv


async def test_micro_batches_group_by_parameters_and_answer_each_caller(fake):
    limits = ClientLimits(max_batch=4, max_batch_wait_s=0.05)
    async with InferenceEndpoint(fake.url, "tiny", worker="w-1", limits=limits) as ep:
        greedy = SamplingParams(max_tokens=8, temperature=0.0)
        prompts = [f"p{i}" for i in range(8)]
        answers = await asyncio.gather(*(ep.complete(p, greedy) for p in prompts))
        assert [a.text for a in answers] == [f"ok:{p}" for p in prompts]
        assert fake.batch_sizes == [4, 4] and ep.batch_sizes == [4, 4]
        assert all(a.batch_size == 4 for a in answers)
        # a group smaller than max_batch goes out at the latency bound, one per parameter set
        fake.batch_sizes.clear()
        hot = SamplingParams(max_tokens=8, temperature=0.7)
        mixed = await asyncio.gather(ep.complete("a", greedy), ep.complete("b", hot),
                                     ep.complete("c", greedy), ep.complete("d", hot))
        assert [m.text for m in mixed] == ["ok:a", "ok:b", "ok:c", "ok:d"]
        assert sorted(fake.batch_sizes) == [2, 2]
        bodies = [r.body for r in fake.requests if r.path == "/v1/completions"][-2:]
        assert sorted(b["temperature"] for b in bodies) == [0.0, 0.7]
        # n > 1: each caller gets its own n choices out of the batch
        two = await asyncio.gather(ep.complete("x", SamplingParams(n=2)), ep.complete("y", SamplingParams(n=2)))
        assert [t.choices for t in two] == [("ok:x#0", "ok:x#1"), ("ok:y#0", "ok:y#1")]


async def test_requests_carry_locality_and_chat_works(fake):
    async with InferenceEndpoint(fake.url, "tiny", worker="gpu-7", limits=ClientLimits(max_batch=1)) as ep:
        done = await ep.complete("hello")
        assert (done.worker, done.g_loc, done.model) == ("gpu-7", 1.0, "tiny")
        msgs = [ChatMessage("system", "be brief"), ChatMessage("user", "what is 2+2")]
        chat = await ep.chat(msgs, SamplingParams(max_tokens=4))
        assert chat.text == "ok:what is 2+2" and chat.batch_size == 1
        assert await ep.models() == ("tiny",)
    for req in fake.requests:
        assert req.headers == {HEADER_WORKER.lower(): "gpu-7", HEADER_G_LOC.lower(): "1",
                               HEADER_MODEL.lower(): "tiny"}, req
    assert [r.path for r in fake.requests] == ["/v1/completions", "/v1/chat/completions"]


async def test_rate_limit_is_the_first_tier(fake):
    # 2 requests/s, no saving up: a second call right away would wait 0.5 s for its token
    async with InferenceEndpoint(fake.url, "tiny", limits=ClientLimits(rate_per_s=2, burst=1, max_batch=1)) as ep:
        await ep.complete("first", timeout_s=5)
        with pytest.raises(ThrottledError, match="rate limit"):
            await ep.complete("second", timeout_s=0.1)
    assert len(fake.requests) == 1  # the throttled call never reached the server


async def test_http_errors_map_to_the_error_tree(fake):
    async with InferenceEndpoint(fake.url, "tiny", limits=ClientLimits(max_batch=1)) as ep:
        fake.fail_status = 429
        with pytest.raises(ThrottledError):
            await ep.complete("x")
        fake.fail_status = 503
        with pytest.raises(ProviderUnavailableError, match="answered 503"):
            await ep.complete("x")
        fake.fail_status = None
    async with InferenceEndpoint(fake.url, "not-served", limits=ClientLimits(max_batch=1)) as ep:
        with pytest.raises(NotFoundError, match="does not exist"):
            await ep.complete("x")
    url = fake.url
    fake.stop()
    async with InferenceEndpoint(url, "tiny", limits=ClientLimits(max_batch=1)) as ep:
        with pytest.raises(ProviderUnavailableError, match="Unreachable"):
            await ep.complete("x")


async def test_drain_waits_for_in_flight_then_refuses(fake):
    fake.delay_s = 0.3
    async with InferenceEndpoint(fake.url, "tiny", limits=ClientLimits(max_batch=8, max_batch_wait_s=30)) as ep:
        calls = [asyncio.create_task(ep.complete(f"q{i}")) for i in range(3)]
        await asyncio.sleep(0)  # the three calls are admitted (and wait in a batch)
        assert ep.in_flight == 3
        # a batch would wait 30 s for more prompts; the drain (20 s deadline) sends what
        # waits at once and holds nothing back after, so all three are answered in time
        report = await ep.drain(timeout_s=20)
        assert (report.completed, report.abandoned) == (3, 0)
        assert [c.result().text for c in calls] == ["ok:q0", "ok:q1", "ok:q2"]
        assert sum(fake.batch_sizes) == 3
        with pytest.raises(PoolClosedError, match="draining"):
            await ep.complete("late")


async def test_drain_deadline_fails_the_stragglers(fake):
    fake.delay_s = 2.0
    async with InferenceEndpoint(fake.url, "tiny", limits=ClientLimits(max_batch=1)) as ep:
        calls = [asyncio.create_task(ep.complete(f"slow{i}")) for i in range(2)]
        await asyncio.sleep(0)
        report = await ep.drain(timeout_s=0.2)
        assert (report.completed, report.abandoned) == (0, 2)
        for c in calls:
            with pytest.raises(PoolClosedError, match="left before it answered"):
                await c


async def test_health_check_deadline_and_death(fake):
    async with httpx.AsyncClient() as client:
        rep = await wait_until_healthy(client, fake.url, "tiny", timeout_s=5)
        assert rep.models == ("tiny",) and rep.attempts == 1
        with pytest.raises(WorkerStartError, match=r"lists \['tiny'\], not 'other'"):
            await wait_until_healthy(client, fake.url, "other", timeout_s=0.3)
        fake.healthy = False
        with pytest.raises(WorkerStartError, match="not healthy after 0.3 s .* /health answered 503"):
            await wait_until_healthy(client, fake.url, "tiny", timeout_s=0.3)

        async def dead() -> str:
            return "container exited (exit 1): CUDA out of memory"
        with pytest.raises(WorkerStartError, match="stopped before it was healthy .* CUDA out of memory"):
            await wait_until_healthy(client, fake.url, "tiny", timeout_s=60, alive=dead)


# --------------------------------------------------------------------------- #
# the real launch path under podman, with the stand-in image
# --------------------------------------------------------------------------- #

@pytest.fixture(scope="module")
def standin_image(images_mod) -> str:
    """TEST FIXTURE image: swe-base + the REAL entrypoint.py + stand-in vllm and nvidia-smi."""
    images_mod.build_swe_base()
    return build_standin_worker_image(str(ENTRYPOINT), base=images_mod.SWE_BASE_IMAGE,
                                      build_args=images_mod.podman_build_args())


def _left(fleet: str) -> list[str]:
    out = subprocess.run(["podman", "ps", "-a", "--filter", f"label=flowmesh.fleet={fleet}",
                          "--format", "{{.Names}}"], capture_output=True, text=True, check=True).stdout
    return out.split()


def _spec(image: str, **kw) -> InferenceSpec:
    env = {"FAKE_GPUS": "6", **kw.pop("env", {})}
    return InferenceSpec(model="/models/fake-llama", served_model_name="fake-llama", image=image,
                         num_heads=32, gpus="none", env=env, **kw)


async def test_join_serve_leave_under_podman(standin_image):
    fleet = f"t-{uuid.uuid4().hex[:8]}"
    bus = EventBus()
    sub = bus.subscribe()
    runtime = ContainerRuntime(LocalRunner())
    worker = InferenceWorker(runtime, _spec(standin_image, env={"FAKE_VLLM_LOAD_S": "1"}), fleet=fleet,
                             bus=bus, limits=ClientLimits(max_batch=4, max_batch_wait_s=0.05))
    try:
        ep = await worker.join()
        assert worker.state is WorkerState.READY
        # 6 stand-in GPUs, 32 heads: the entrypoint in the container chose 4
        assert worker.tensor_parallel == ep.tensor_parallel == 4
        assert worker.launch_argv[:3] == ["vllm", "serve", "/models/fake-llama"]
        assert worker.health is not None and worker.health.models == ("fake-llama",)
        async with httpx.AsyncClient() as c:  # what the stand-in vllm was really exec'd with
            launched = (await c.get(f"{ep.base_url}/fake/launch")).json()["argv"]
        assert launched == worker.launch_argv
        answers = await asyncio.gather(*(ep.complete(f"t{i}") for i in range(4)))
        assert [a.text for a in answers] == [f"ok:t{i}" for i in range(4)]
        assert ep.batch_sizes == [4] and answers[0].worker == worker.name
        report = await worker.leave(timeout_s=10)
        assert report.abandoned == 0 and worker.state is WorkerState.STOPPED
        with pytest.raises(PoolClosedError):
            await ep.complete("after leave")
    finally:
        if worker.state is not WorkerState.STOPPED:
            subprocess.run(["podman", "rm", "-f", "-t", "0", worker.name], capture_output=True)
    kinds = []
    while not sub.queue.empty():
        kinds.append(sub.queue.get_nowait().kind)
    assert kinds == [EventKind.WORKER_STARTING, EventKind.WORKER_READY, EventKind.WORKER_DRAINING,
                     EventKind.WORKER_STOPPED]
    assert _left(fleet) == []


async def test_refused_plan_starts_nothing(standin_image):
    fleet = f"t-{uuid.uuid4().hex[:8]}"
    runtime = ContainerRuntime(LocalRunner())
    worker = InferenceWorker(runtime, _spec(standin_image, tensor_parallel=8, env={"FAKE_GPUS": "4"}),
                             fleet=fleet)
    with pytest.raises(SpecError, match="inference: argument --tensor-parallel: 8 is more than the 4 visible"):
        await worker.join()
    assert worker.state is WorkerState.FAILED
    assert _left(fleet) == []


async def test_container_that_dies_fails_the_join_fast(standin_image):
    fleet = f"t-{uuid.uuid4().hex[:8]}"
    bus = EventBus()
    sub = bus.subscribe(EventKind.WORKER_FAILED)
    runtime = ContainerRuntime(LocalRunner())
    # an argument the (stand-in) server rejects: it exits while the health check waits
    worker = InferenceWorker(runtime, _spec(standin_image, extra_args=("--max-model-len", "lots"),
                                            start_timeout_s=120), fleet=fleet, bus=bus)
    # podman reports an ended container as "exited" or, for a moment, "stopped"
    with pytest.raises(WorkerStartError, match=r"stopped before it was healthy.*container (exited|stopped) \(exit 2\)"):
        await worker.join()
    assert worker.state is WorkerState.FAILED
    assert (await sub.next(1)).task_name == worker.name
    assert _left(fleet) == []


async def test_health_deadline_removes_the_container(standin_image):
    fleet = f"t-{uuid.uuid4().hex[:8]}"
    runtime = ContainerRuntime(LocalRunner())
    # "loading weights" for 60 s; the join gives up after 2 s
    worker = InferenceWorker(runtime, _spec(standin_image, env={"FAKE_VLLM_LOAD_S": "60"},
                                            start_timeout_s=2), fleet=fleet)
    with pytest.raises(WorkerStartError, match="not healthy after 2 s"):
        await worker.join()
    assert worker.state is WorkerState.FAILED
    assert _left(fleet) == []


async def test_join_over_ssh(standin_image):
    """The same launch over a real OpenSSH sshd on loopback (sharing this machine's image
    store, so the stand-in image is there): env values travel on stdin over SSH."""
    pytest.importorskip("paramiko")
    from flowmesh_sdk.remote.ssh import SshRunner, SshTarget
    from flowmesh_sdk.testing.sshd import LoopbackSshd

    fleet = f"t-{uuid.uuid4().hex[:8]}"
    with LoopbackSshd("127.0.0.7", own_storage=False) as sshd:
        runner = SshRunner(SshTarget(sshd.host, sshd.port, sshd.user, sshd.client_key_path,
                                     sshd.host_public_key))
        try:
            worker = InferenceWorker(ContainerRuntime(runner),
                                     _spec(standin_image, env={"FAKE_GPUS": "2"}), fleet=fleet)
            ep = await worker.join()
            assert worker.tensor_parallel == 2 and worker.instance_id == runner.label
            assert (await ep.complete("over ssh")).text == "ok:over ssh"
            await worker.leave(timeout_s=10)
        finally:
            await runner.close()
    assert _left(fleet) == []
