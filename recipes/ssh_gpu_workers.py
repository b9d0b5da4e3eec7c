#!/usr/bin/env python3
"""GPU workers on your own machines, over SSH: vLLM inference endpoints and TRL training jobs.

Each machine named with ``--serve`` gets one inference worker: the worker image's
``entrypoint.py serve`` in a container with all its GPUs (CDI ``--device
nvidia.com/gpu=all`` under podman), the tensor-parallel size chosen by the image from the
GPUs it sees and ``--num-heads``, health-checked on ``/health`` and ``/v1/models``.  Its
endpoint is printed once it is READY.  Each machine named with ``--train`` runs one TRL
job (``entrypoint.py train``); its checkpoints go to a content-addressed store on this
machine (``--store``).

    python recipes/ssh_gpu_workers.py --inventory hosts.json --image REG/flowmesh/gpu-worker:TAG \\
        --model Qwen/Qwen2.5-7B-Instruct --num-heads 28 --serve all
    python recipes/ssh_gpu_workers.py --inventory hosts.json --image IMG --model M --num-heads 28 \\
        --serve box1 --train box2 --train-dataset /data/sft --train-output /data/out --dry-run --gpus 8

``--dry-run`` connects to nothing: for each machine it prints the role, the GPUs
(``--gpus N`` or ``--gpus box1=8,box2=4``: it cannot count them without connecting), the
tensor-parallel size and the exact commands -- the container ``run`` command (the
runtime's own host flags, such as ``--runtime runc``, are added when it probes the
machine) and the ``vllm serve`` / ``accelerate launch`` argv, which the REAL
``flowmesh_sdk/imagebuild/gpu-worker/entrypoint.py`` prints for that many GPUs.

Without ``--dry-run`` the inference workers stay up until Ctrl-C (or ``--serve-s``
seconds), then drain and stop; the training jobs are waited for (Ctrl-C stops them) and
their complete checkpoints published.  The exit status is 0 when every worker joined
and every job succeeded.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time

from flowmesh_sdk.imagebuild import GPU_WORKER_ENTRYPOINT

ENTRYPOINT = GPU_WORKER_ENTRYPOINT
FLEET = "ssh-gpu-workers"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="ssh_gpu_workers.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--inventory", required=True, metavar="PATH", help="the ssh provider's inventory (JSON)")
    p.add_argument("--ssh-config", metavar="PATH", default=None,
                   help="the ssh config file for host aliases, users, ports and jump hosts "
                        "(default: the user's, as ssh reads it)")
    p.add_argument("--image", required=True, help="the GPU worker image (flowmesh_sdk/imagebuild/gpu-worker), pushed to a "
                                                  "registry the machines can pull from")
    p.add_argument("--serve", default=None, metavar="HOSTS",
                   help="machines that serve (comma list of inventory names, or 'all'; default all "
                        "machines not training)")
    p.add_argument("--train", default="", metavar="HOSTS", help="machines that train (comma list)")
    p.add_argument("--model", required=True, help="model to serve (and to train, unless --train-model)")
    p.add_argument("--num-heads", type=int, metavar="H",
                   help="the model's num_attention_heads; the tensor-parallel size must divide it")
    p.add_argument("--served-model-name", metavar="NAME")
    p.add_argument("--max-model-len", type=int, metavar="N")
    p.add_argument("--gpu-devices", default="all", metavar="all|none|0,1",
                   help="GPUs each container gets (default all)")
    p.add_argument("--gpus", default=None, metavar="N|NAME=N,...",
                   help="--dry-run only: how many GPUs each machine has")
    p.add_argument("--publish-host", metavar="ADDR",
                   help="address the endpoint port is published on (default: the machine's inventory "
                        "address when it is an IP, else 0.0.0.0)")
    p.add_argument("--mount", action="append", default=[], metavar="SRC:DST",
                   help="a folder of the machine mounted read-only in every worker container, e.g. a "
                        "model store (repeatable)")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="environment for the worker containers (repeatable; values stay off command lines)")
    p.add_argument("--start-timeout-s", type=float, default=1800.0,
                   help="loading the weights and passing the health check (default 1800)")
    p.add_argument("--serve-s", type=float, default=None, metavar="S",
                   help="keep the endpoints up this long, then drain (default: until Ctrl-C)")
    p.add_argument("--train-recipe", default="sft", choices=["sft", "dpo", "grpo"])
    p.add_argument("--train-model", metavar="M", help="model to train (default --model)")
    p.add_argument("--train-dataset", metavar="DIR", help="dataset folder on the training machine")
    p.add_argument("--train-output", metavar="DIR", help="output folder on the training machine")
    p.add_argument("--max-steps", type=int, metavar="N")
    p.add_argument("--train-processes", type=int, metavar="N",
                   help="training processes (default: one per GPU the container sees)")
    p.add_argument("--reward-funcs", nargs="+", default=[], metavar="F", help="grpo only")
    p.add_argument("--train-args", default="", metavar="'ARGS'",
                   help="extra TRL arguments, one shell-quoted string")
    p.add_argument("--store", metavar="DIR", help="checkpoint store (default $FLOWMESH_HOME/cas)")
    p.add_argument("--dry-run", action="store_true", help="print the plan; connect to nothing")
    args = p.parse_args(argv)
    if args.train and not (args.train_dataset and args.train_output):
        p.error("--train needs --train-dataset DIR and --train-output DIR (folders on that machine)")
    for item in args.env:
        if "=" not in item:
            p.error(f"--env {item!r}: must be NAME=VALUE")
    for item in args.mount:
        if item.count(":") != 1:
            p.error(f"--mount {item!r}: must be SRC:DST (absolute paths)")
    return args


def _mounts(args: argparse.Namespace) -> tuple:
    from flowmesh_sdk.workers import Mount

    return tuple(Mount(*item.split(":")) for item in args.mount)


def _names(spec: str | None, hosts: list[str], what: str) -> list[str]:
    if not spec:
        return []
    names = hosts if spec == "all" else [s.strip() for s in spec.split(",") if s.strip()]
    unknown = [n for n in names if n not in hosts]
    if unknown:
        raise SystemExit(f"{what}: {', '.join(unknown)} not in the inventory ({', '.join(hosts)})")
    return names


def _gpu_counts(spec: str | None, names: list[str]) -> dict[str, int | None]:
    if spec is None:
        return {n: None for n in names}
    if spec.isdigit():
        return {n: int(spec) for n in names}
    out: dict[str, int | None] = {n: None for n in names}
    for part in spec.split(","):
        name, _, n = part.partition("=")
        if name.strip() not in out or not n.strip().isdigit():
            raise SystemExit(f"--gpus: {part!r} is not NAME=N for a machine in the plan")
        out[name.strip()] = int(n)
    return out


def _publish_host(host: str, override: str | None) -> str:
    if override:
        return override
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        return "0.0.0.0"


def entrypoint_dry_run(args: list[str], gpus: int | None) -> tuple[list[str] | None, str]:
    """The argv the REAL entrypoint prints for ``args`` on a machine with ``gpus`` GPUs."""
    if gpus is None:
        return None, "counted on the machine at launch; give --gpus N to see the exact argv here"
    env = {"PATH": "/nonexistent", "LANG": "C.UTF-8",
           "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(gpus))}
    res = subprocess.run([sys.executable, str(ENTRYPOINT), *args], capture_output=True, text=True,
                         env=env, timeout=60)
    if res.returncode != 0:
        return None, (res.stderr.strip().splitlines() or [f"exit {res.returncode}"])[-1]
    return shlex.split(res.stdout.strip().splitlines()[-1]), ""


def _why(err: str, gpus: int | None) -> str:
    return f"REFUSED: {err}" if gpus is not None else f"({err})"


def plan(args: argparse.Namespace, hosts, serve: list[str], train: list[str]) -> int:
    """Print what would run where; connect to nothing."""
    from flowmesh_sdk.remote.runtime import RuntimeInfo
    from flowmesh_sdk.workers import CONTAINER_PORT, InferenceSpec, TrainingSpec
    from flowmesh_sdk.workers.container import build_run_argv, worker_labels
    from flowmesh_sdk.workers.training import job_mounts

    info = RuntimeInfo("podman", "", "", ())
    env = dict(item.split("=", 1) for item in args.env)
    counts = _gpu_counts(args.gpus, serve + train)
    bad = 0
    from flowmesh_providers.ssh.provider import where

    for name in serve + train:
        h = where(hosts[name], ssh_config=args.ssh_config)   # an alias: its HostName, User and Port
        n = counts[name]
        gpu_text = (f"{n} GPU(s)" if n is not None
                    else "GPUs counted on the machine (give --gpus to plan the size)")
        labels = worker_labels("inference" if name in serve else "training", fleet=FLEET, instance_id=name)
        if name in serve:
            spec = InferenceSpec(args.model, args.image, num_heads=args.num_heads,
                                 served_model_name=args.served_model_name, max_model_len=args.max_model_len,
                                 gpus=args.gpu_devices, publish_host=_publish_host(h.host, args.publish_host),
                                 url_host=h.host, env=env, mounts=_mounts(args))
            inner, err = entrypoint_dry_run([*spec.serve_args(), "--dry-run"], n)
            tp = inner[inner.index("--tensor-parallel-size") + 1] if inner else "?"
            print(f"{name} ({h.user}@{h.host}:{h.port}): inference, {gpu_text} -> tensor-parallel {tp}")
            run = build_run_argv(info, spec.image, spec.serve_args(), name="fm-worker-inference-<id>",
                                 labels=labels, gpus=spec.gpus, mounts=spec.mounts, env_names=sorted(env),
                                 publish_host=spec.publish_host, container_port=CONTAINER_PORT)
            print(f"  container: {shlex.join(run)}")
            print(f"  worker:    {shlex.join(inner) if inner else _why(err, n)}")
            print(f"  endpoint:  http://{h.host}:<published port>/v1  model {spec.name_in_api}")
        else:
            with tempfile.TemporaryDirectory() as stand_in_dir:
                # the entrypoint checks that a dataset folder exists; it is on the remote
                # machine, so a local empty folder stands in and its path is put back after
                spec = TrainingSpec(args.train_recipe, args.train_model or args.model, args.train_dataset,
                                    args.train_output, image=args.image, max_steps=args.max_steps,
                                    num_processes=args.train_processes,
                                    reward_funcs=tuple(args.reward_funcs), gpus=args.gpu_devices, env=env,
                                    mounts=_mounts(args), extra_args=tuple(shlex.split(args.train_args)))
                local = [stand_in_dir if a == spec.dataset else a for a in spec.train_args()]
                extra = ["--", *spec.extra_args] if spec.extra_args else []
                inner, err = entrypoint_dry_run([*local, "--dry-run", *extra], n)
                inner = [spec.dataset if a == stand_in_dir else a for a in inner] if inner else None
            procs = inner[inner.index("--num_processes") + 1] if inner else "?"
            print(f"{name} ({h.user}@{h.host}:{h.port}): training ({spec.recipe}), {gpu_text} "
                  f"-> {procs} process(es)")
            run = build_run_argv(info, spec.image, [*spec.train_args(), *(["--", *spec.extra_args]
                                                                         if spec.extra_args else [])],
                                 name="fm-worker-training-<id>", labels=labels, gpus=spec.gpus,
                                 mounts=job_mounts(spec), env_names=sorted(env))
            print(f"  container: {shlex.join(run)}")
            print(f"  worker:    {shlex.join(inner) if inner else _why(err, n)}")
            print(f"  checkpoints -> {args.store or '$FLOWMESH_HOME/cas'}")
        bad += inner is None and n is not None
    print("(dry run: nothing was started; the runtime adds its host flags, e.g. --runtime runc, at launch)")
    return 1 if bad else 0


async def run(args: argparse.Namespace, provider, serve: list[str], train: list[str]) -> int:
    from flowmesh_sdk.cas import LocalDirStore
    from flowmesh_sdk.config import home_dir
    from flowmesh_sdk.control.events import EventBus
    from flowmesh_sdk.errors import FlowMeshError
    from flowmesh_sdk.provider import Instance, ProviderState
    from flowmesh_sdk.remote.runtime import ContainerRuntime
    from flowmesh_sdk.specs import InstanceSpec
    from flowmesh_sdk.workers import InferenceSpec, InferenceWorker, TrainingSpec, TrainingWorker

    env = dict(item.split("=", 1) for item in args.env)
    store = LocalDirStore(args.store or home_dir() / "cas")
    bus = EventBus()
    bus.on(lambda ev: print(f"  [{ev.kind.value}] {ev.task_name} {ev.detail}"[:300], flush=True))

    def runtime_for(name: str) -> ContainerRuntime:
        h = provider.hosts[name]
        # a whole machine: GPU hosts are used as they are, not carved into slices
        whole = Instance(id=f"gpu-{name}", provider="ssh", region="byo", instance_type="whole-machine",
                         spec=InstanceSpec(cpus=h.cpus, memory_gb=h.memory_gb, arch=h.arch),
                         state=ProviderState.RUNNING, tags={}, launched_at=time.time(), address=name)
        return ContainerRuntime(provider.runner(whole))

    inference = [InferenceWorker(runtime_for(n), InferenceSpec(
        args.model, args.image, num_heads=args.num_heads, served_model_name=args.served_model_name,
        max_model_len=args.max_model_len, gpus=args.gpu_devices,
        publish_host=_publish_host(provider.resolved(n).host, args.publish_host),
        url_host=provider.resolved(n).host,
        env=env, mounts=_mounts(args), start_timeout_s=args.start_timeout_s), fleet=FLEET, instance_id=n,
        bus=bus) for n in serve]
    training = [TrainingWorker(runtime_for(n), TrainingSpec(
        args.train_recipe, args.train_model or args.model, args.train_dataset, args.train_output,
        image=args.image, max_steps=args.max_steps, num_processes=args.train_processes,
        reward_funcs=tuple(args.reward_funcs),
        gpus=args.gpu_devices, env=env, mounts=_mounts(args), extra_args=tuple(shlex.split(args.train_args))),
        store=store, fleet=FLEET, instance_id=n, bus=bus) for n in train]

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    ok = True
    joined = await asyncio.gather(*(w.join() for w in inference), return_exceptions=True)
    for w, res in zip(inference, joined):
        if isinstance(res, BaseException):
            ok = False
            print(f"{w.instance_id}: inference worker did not join: {res}", flush=True)
        else:
            print(f"{w.instance_id}: endpoint {res.base_url}/v1  model {res.model}  "
                  f"tensor-parallel {res.tensor_parallel}", flush=True)
    started = await asyncio.gather(*(w.start() for w in training), return_exceptions=True)
    jobs = []
    for w, res in zip(training, started):
        if isinstance(res, BaseException):
            ok = False
            print(f"{w.instance_id}: training did not start: {res}", flush=True)
        else:
            print(f"{w.instance_id}: training {shlex.join(res)}", flush=True)
            jobs.append(w)

    async def finish(w: TrainingWorker) -> bool:
        waiter = asyncio.ensure_future(w.wait())
        stopper = asyncio.ensure_future(stop.wait())
        await asyncio.wait([waiter, stopper], return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        try:
            if not waiter.done():
                waiter.cancel()
                with contextlib.suppress(asyncio.CancelledError, FlowMeshError):
                    await waiter
                result = await w.stop()
            else:
                result = waiter.result()
        except FlowMeshError as exc:
            print(f"{w.instance_id}: training failed: {exc}", flush=True)
            return False
        for ck in (*result.checkpoints, *([result.final] if result.final else [])):
            print(f"{w.instance_id}: checkpoint {ck.name} -> {ck.digest} ({ck.files} files)", flush=True)
        return result.exit_code == 0

    results = await asyncio.gather(*(finish(w) for w in jobs))
    ok = ok and all(results)
    live = [w for w in inference if w.endpoint is not None]
    if live:
        print(f"serving; {'Ctrl-C to drain and stop' if args.serve_s is None else f'{args.serve_s:g} s'}",
              flush=True)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), args.serve_s)
        for w in live:
            report = await w.leave(timeout_s=60)
            print(f"{w.instance_id}: drained ({report.completed} answered, {report.abandoned} cut off)",
                  flush=True)
    await provider.close()
    return 0 if ok else 1


async def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from flowmesh_providers.ssh.inventory import load_inventory

    hosts = {h.name: h for h in load_inventory(args.inventory)}
    names = list(hosts)
    train = _names(args.train, names, "--train")
    serve = _names(args.serve, names, "--serve") if args.serve else [n for n in names if n not in train]
    both = sorted(set(serve) & set(train))
    if both:
        raise SystemExit(f"{', '.join(both)}: a machine either serves or trains (their GPUs are not shared)")
    if args.dry_run:
        return plan(args, hosts, serve, train)
    from flowmesh_providers.ssh import SshProvider

    return await run(args, SshProvider(list(hosts.values()), ssh_config=args.ssh_config), serve, train)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(asyncio.run(main(sys.argv[1:])))
