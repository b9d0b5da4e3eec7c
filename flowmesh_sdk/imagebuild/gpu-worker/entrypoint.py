#!/usr/bin/env python3
"""FlowMesh GPU worker entrypoint: serve a model with vLLM or train it with TRL.

Standard library only. It checks the arguments, works out the parallelism from
the GPUs the container can see, and then *execs* the real command, so that
the command becomes PID 1's program and gets the container's signals itself.

    entrypoint.py serve --model M [--tensor-parallel auto|N] [--tensor-parallel-fit]
                        [--num-heads H] [--host 0.0.0.0] [--port 8000] [--max-model-len N]
                        [--gpu-memory-utilization F] [--served-model-name NAME]
                        [--dry-run] [-- EXTRA VLLM ARGS...]
        -> vllm serve M --host ... --port ... --tensor-parallel-size N ...

    entrypoint.py train --recipe sft|dpo|grpo --model M --dataset PATH --output DIR
                        [--max-steps N] [--num-processes auto|N]
                        [--reward-funcs F [F ...]] [--use-vllm]
                        [--dry-run] [-- EXTRA TRL ARGS...]
        -> accelerate launch --num_processes N --num_machines 1 [--multi_gpu]
               --dynamo_backend no -m trl.scripts.<recipe>
               --model_name_or_path M --dataset_name PATH --output_dir DIR ...

    entrypoint.py health [--port N]
        exit 0 when the vLLM server answers GET /health (always 0 in a training
        container); the image's HEALTHCHECK runs this.

"auto" means the number of visible GPUs: the entries of CUDA_VISIBLE_DEVICES
when it is set (CUDA ignores everything from the first invalid entry on, for
example "-1"), otherwise the "GPU n:" lines of ``nvidia-smi -L``.
``--tensor-parallel-fit`` (with auto) picks instead the largest power of two
that is at most the visible GPUs and divides ``--num-heads`` when given
(:func:`fit_tensor_parallel`); the FlowMesh SDK's inference role uses it, so
this file holds the one copy of that rule.

``--dry-run`` prints the exact argv (shell-quoted, on one line) to stdout and
exits 0 without running it. A bad argument exits 2 with an argparse-style
message that names the argument and the allowed values.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from typing import Mapping, Sequence

PROG = "entrypoint.py"
DEFAULT_PORT = 8000
DEFAULT_HOST = "0.0.0.0"
#: train --recipe NAME -> the TRL module that ``accelerate launch -m`` runs
#: (the same scripts that ``trl sft|dpo|grpo`` wraps)
RECIPES = {"sft": "trl.scripts.sft", "dpo": "trl.scripts.dpo", "grpo": "trl.scripts.grpo"}
#: written before exec so that ``health`` knows what the container is doing
STATE_FILE = os.environ.get("FLOWMESH_WORKER_STATE", "/tmp/flowmesh-worker.json")


# --------------------------------------------------------------------------- #
# GPUs
# --------------------------------------------------------------------------- #

class GpuCount:
    """How many GPUs are visible, and how that was found out (for messages)."""

    def __init__(self, count: int | None, source: str) -> None:
        self.count = count
        self.source = source


def visible_gpus(env: Mapping[str, str] | None = None) -> GpuCount:
    env = os.environ if env is None else env
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        n = 0
        for item in cvd.split(","):
            item = item.strip()
            if not item or item.startswith("-"):
                break  # CUDA stops at the first invalid entry
            n += 1
        return GpuCount(n, f"CUDA_VISIBLE_DEVICES={cvd!r}")
    smi = shutil.which("nvidia-smi", path=env.get("PATH", os.defpath))
    if not smi:
        return GpuCount(None, "CUDA_VISIBLE_DEVICES is unset and nvidia-smi is not on PATH")
    try:
        res = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return GpuCount(None, f"nvidia-smi -L failed: {exc}")
    if res.returncode != 0:
        why = (res.stderr or res.stdout).strip().splitlines()[:1] or [f"exit {res.returncode}"]
        return GpuCount(None, f"nvidia-smi -L failed: {why[0]}")
    n = sum(1 for ln in res.stdout.splitlines() if ln.startswith("GPU "))
    return GpuCount(n, "nvidia-smi -L")


def fit_tensor_parallel(gpus: int, num_heads: int | None = None) -> int:
    """The largest power of two that is at most ``gpus`` and divides ``num_heads``
    (when given); 0 when ``gpus`` < 1.

    vLLM shards the attention heads across the tensor-parallel ranks, so the size
    must divide the head count; a power of two keeps the shards even for the
    hidden and vocabulary sizes too.  GPUs beyond the chosen size stay unused.
    """
    if gpus < 1:
        return 0
    tp = 1
    while tp * 2 <= gpus and (num_heads is None or num_heads % (tp * 2) == 0):
        tp *= 2
    return tp


# --------------------------------------------------------------------------- #
# argument types
# --------------------------------------------------------------------------- #

def _int_in(value: str, lo: int, hi: int | None, allowed: str) -> int:
    """``value`` as an integer in [lo, hi]; an argparse error naming what is allowed."""
    try:
        n = int(value)
    except ValueError:
        n = lo - 1
    if n < lo or (hi is not None and n > hi):
        raise argparse.ArgumentTypeError(f"invalid value {value!r} (allowed: {allowed})")
    return n


def _auto_or_positive(value: str) -> str | int:
    if value.strip().lower() == "auto":
        return "auto"
    return _int_in(value, 1, None, "auto or a positive integer")


def _positive_int(value: str) -> int:
    return _int_in(value, 1, None, "a positive integer")


def _port(value: str) -> int:
    return _int_in(value, 1, 65535, "1 to 65535")


def _fraction(value: str) -> float:
    try:
        f = float(value)
    except ValueError:
        f = -1.0
    if not 0.0 < f <= 1.0:
        raise argparse.ArgumentTypeError(
            f"invalid value {value!r} (allowed: a number greater than 0 and at most 1)")
    return f


def _nonempty(value: str) -> str:
    if not value.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return value


# --------------------------------------------------------------------------- #
# parser
# --------------------------------------------------------------------------- #

def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="FlowMesh GPU worker: serve a model with vLLM or train it with TRL. "
                    "Arguments after a lone '--' go to vllm/trl unchanged.")
    sub = parser.add_subparsers(dest="command", metavar="{serve,train,health}")
    sub.required = True

    serve = sub.add_parser("serve", prog=f"{PROG} serve",
                           help="exec `vllm serve` (OpenAI-compatible API, /health, /v1/models)")
    serve.add_argument("--model", required=True, type=_nonempty,
                       help="Hugging Face model id or local path")
    serve.add_argument("--tensor-parallel", type=_auto_or_positive, default="auto",
                       metavar="auto|N",
                       help="tensor-parallel size; auto (default) = number of visible GPUs")
    serve.add_argument("--tensor-parallel-fit", action="store_true",
                       help="with auto: the largest power of two that is at most the visible "
                            "GPUs and divides --num-heads, instead of all visible GPUs")
    serve.add_argument("--num-heads", type=_positive_int, metavar="H",
                       help="the model's attention heads; the tensor-parallel size must divide it")
    serve.add_argument("--host", default=DEFAULT_HOST, type=_nonempty,
                       help=f"bind address (default {DEFAULT_HOST})")
    serve.add_argument("--port", type=_port, default=DEFAULT_PORT,
                       help=f"port (default {DEFAULT_PORT})")
    serve.add_argument("--max-model-len", type=_positive_int, metavar="N",
                       help="context length to allocate KV cache for")
    serve.add_argument("--gpu-memory-utilization", type=_fraction, metavar="F",
                       help="fraction of each GPU's memory vLLM may use, in (0, 1]")
    serve.add_argument("--served-model-name", type=_nonempty, metavar="NAME",
                       help="model name in the API (default: --model)")
    serve.add_argument("--dry-run", action="store_true",
                       help="print the command instead of running it")

    train = sub.add_parser("train", prog=f"{PROG} train",
                           help="exec `accelerate launch -m trl.scripts.<recipe>`")
    train.add_argument("--recipe", required=True, choices=list(RECIPES),
                       help="TRL trainer")
    train.add_argument("--model", required=True, type=_nonempty,
                       help="Hugging Face model id or local path")
    train.add_argument("--dataset", required=True, type=_nonempty, metavar="PATH",
                       help="a folder of .jsonl/.json/.parquet/.csv files (or a Hub dataset id)")
    train.add_argument("--output", required=True, type=_nonempty, metavar="DIR",
                       help="where checkpoints and the final model go")
    train.add_argument("--max-steps", type=_positive_int, metavar="N",
                       help="stop after N optimiser steps")
    train.add_argument("--num-processes", type=_auto_or_positive, default="auto",
                       metavar="auto|N",
                       help="training processes, one per GPU; auto (default) = visible GPUs")
    train.add_argument("--reward-funcs", nargs="+", metavar="F",
                       help="grpo only (required there): reward functions, names from "
                            "trl.rewards (e.g. accuracy_reward) or dotted paths")
    train.add_argument("--use-vllm", action="store_true",
                       help="grpo only: generate with vLLM colocated on the training GPUs")
    train.add_argument("--dry-run", action="store_true",
                       help="print the command instead of running it")

    health = sub.add_parser("health", prog=f"{PROG} health",
                            help="exit 0 if the server answers GET /health")
    health.add_argument("--port", type=_port, default=None,
                        help=f"port (default: the one serve used, else {DEFAULT_PORT})")
    health.add_argument("--timeout", type=float, default=5.0, help="seconds (default 5)")
    return parser, {"serve": serve, "train": train, "health": health}


# --------------------------------------------------------------------------- #
# commands
# --------------------------------------------------------------------------- #

def _divisors(n: int, limit: int | None = None) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0 and (limit is None or d <= limit)]


def _fmt(values: Sequence[int]) -> str:
    return ", ".join(str(v) for v in values)


def _resolve_parallel(p: argparse.ArgumentParser, flag: str, value: str | int,
                      gpus: GpuCount) -> int:
    if value == "auto":
        if gpus.count is None:
            p.error(f"argument {flag}: auto cannot count the GPUs ({gpus.source}); "
                    f"pass {flag} N")
        if gpus.count == 0:
            p.error(f"argument {flag}: auto found no visible GPU ({gpus.source})")
        return gpus.count
    assert isinstance(value, int)
    if gpus.count is not None and value > gpus.count:
        p.error(f"argument {flag}: {value} is more than the {gpus.count} visible GPU(s) "
                f"({gpus.source}); allowed: auto or 1 to {gpus.count}")
    return value


def serve_argv(p: argparse.ArgumentParser, args: argparse.Namespace, extra: list[str],
               env: Mapping[str, str] | None = None) -> list[str]:
    gpus = visible_gpus(env)
    if args.tensor_parallel_fit and args.tensor_parallel != "auto":
        p.error(f"argument --tensor-parallel-fit: only allowed with --tensor-parallel auto, "
                f"not {args.tensor_parallel}")
    tp = _resolve_parallel(p, "--tensor-parallel", args.tensor_parallel, gpus)
    if args.tensor_parallel_fit:
        tp = fit_tensor_parallel(tp, args.num_heads)
    if args.num_heads is not None and args.num_heads % tp:
        allowed = _divisors(args.num_heads, gpus.count)
        how = (f"auto resolved to {tp} ({gpus.source}), which"
               if args.tensor_parallel == "auto" else f"{tp}")
        p.error(f"argument --tensor-parallel: {how} does not divide --num-heads "
                f"{args.num_heads}; allowed: {_fmt(allowed)}")
    argv = ["vllm", "serve", args.model, "--host", args.host, "--port", str(args.port),
            "--tensor-parallel-size", str(tp)]
    if args.max_model_len is not None:
        argv += ["--max-model-len", str(args.max_model_len)]
    if args.gpu_memory_utilization is not None:
        argv += ["--gpu-memory-utilization", repr(args.gpu_memory_utilization)]
    if args.served_model_name is not None:
        argv += ["--served-model-name", args.served_model_name]
    return argv + extra


def _looks_local(path: str) -> bool:
    return path.startswith(("/", "./", "../", "~")) or path in (".", "..")


def train_argv(p: argparse.ArgumentParser, args: argparse.Namespace, extra: list[str],
               env: Mapping[str, str] | None = None) -> list[str]:
    if args.recipe == "grpo" and not args.reward_funcs:
        p.error("argument --reward-funcs: required with --recipe grpo "
                "(e.g. --reward-funcs accuracy_reward)")
    if args.recipe != "grpo":
        if args.reward_funcs:
            p.error(f"argument --reward-funcs: only allowed with --recipe grpo, "
                    f"not {args.recipe}")
        if args.use_vllm:
            p.error(f"argument --use-vllm: only allowed with --recipe grpo, not {args.recipe}")
    dataset = os.path.expanduser(args.dataset)
    if os.path.isfile(dataset):
        p.error(f"argument --dataset: {args.dataset} is a file; pass the folder that holds it "
                "(datasets.load_dataset reads a folder of .jsonl/.json/.parquet/.csv files)")
    if _looks_local(args.dataset) and not os.path.isdir(dataset):
        p.error(f"argument --dataset: {args.dataset} does not exist")
    n = _resolve_parallel(p, "--num-processes", args.num_processes, visible_gpus(env))
    argv = ["accelerate", "launch", "--num_processes", str(n), "--num_machines", "1"]
    if n > 1:
        argv.append("--multi_gpu")
    argv += ["--dynamo_backend", "no", "-m", RECIPES[args.recipe],
             "--model_name_or_path", args.model, "--dataset_name", dataset,
             "--output_dir", args.output]
    if args.max_steps is not None:
        argv += ["--max_steps", str(args.max_steps)]
    if args.recipe == "grpo":
        argv += ["--reward_funcs", *args.reward_funcs]
        if args.use_vllm:
            argv += ["--use_vllm", "--vllm_mode", "colocate"]
    return argv + extra


def _write_state(state: dict) -> None:
    try:
        with open(STATE_FILE, "w", encoding="utf-8") as fh:
            json.dump(state, fh)
    except OSError:
        pass  # health then falls back to the default port


def health(args: argparse.Namespace) -> int:
    state: dict = {}
    try:
        with open(STATE_FILE, encoding="utf-8") as fh:
            state = json.load(fh)
    except (OSError, ValueError):
        pass
    if state.get("mode") == "train":
        return 0  # no server to ask; the container's exit status tells how training went
    port = args.port or state.get("port") or DEFAULT_PORT
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=args.timeout) as r:
            return 0 if r.status == 200 else 1
    except (urllib.error.URLError, OSError, ValueError) as exc:
        print(f"{PROG} health: http://127.0.0.1:{port}/health: {exc}", file=sys.stderr)
        return 1


def _exec(argv: list[str], dry_run: bool, state: dict) -> int:
    if dry_run:
        print(shlex.join(argv), flush=True)
        return 0
    _write_state(state)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvp(argv[0], argv)
    except FileNotFoundError:
        print(f"{PROG}: error: {argv[0]} not found on PATH", file=sys.stderr)
        return 127
    except OSError as exc:
        print(f"{PROG}: error: cannot run {argv[0]}: {exc}", file=sys.stderr)
        return 126
    return 0  # not reached


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    parser, subs = build_parser()
    args = parser.parse_args(argv)
    if args.command == "health":
        if extra:
            subs["health"].error("arguments after '--' are not allowed with health")
        return health(args)
    if args.command == "serve":
        cmd = serve_argv(subs["serve"], args, extra)
        return _exec(cmd, args.dry_run, {"mode": "serve", "port": args.port})
    cmd = train_argv(subs["train"], args, extra)
    return _exec(cmd, args.dry_run, {"mode": "train", "recipe": args.recipe})


if __name__ == "__main__":
    sys.exit(main())
