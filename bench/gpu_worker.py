#!/usr/bin/env python3
"""GPU worker bench: the training role's real TRL step, on the GPU when one is visible and
on the CPU, side by side.

It builds the same tiny randomly initialised Llama the tests train
(``flowmesh_sdk.testing.tiny_model``: hidden size ``--hidden``, 2 layers, a local
word-level tokenizer, nothing downloaded) and runs ``TrainingWorker`` in process mode on
this host -- the worker image's ``entrypoint.py train --recipe sft`` path, i.e.
``accelerate launch -m trl.scripts.sft`` -- for ``--steps`` optimiser steps of
``--batch`` samples, once per device: ``cpu`` always, ``gpu`` when
``torch.cuda.is_available()``.  Each run's final model goes to a throw-away local
content-addressed store, as the role does.

Samples/s is the trainer's own ``train_samples_per_second`` (steps x batch / the time
inside ``trainer.train()``), so start-up (imports, loading) is left out; the wall time
of the whole job is shown beside it.

The last line is exactly ``cpu_samples_per_s=<x> gpu_samples_per_s=<y> gpu_vs_cpu=<r>``
(``na`` where there is no GPU).

    python bench/gpu_worker.py [--steps 20] [--batch 8] [--hidden 32] [--devices auto|cpu|gpu]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

from flowmesh_sdk.cas import LocalDirStore
from flowmesh_sdk.remote.local import LocalRunner
from flowmesh_sdk.workers import TrainingSpec, TrainingWorker


def _cuda() -> bool:
    import torch
    return bool(torch.cuda.is_available())


async def run_one(device: str, lm, root: Path, steps: int, batch: int) -> dict[str, object]:
    from flowmesh_sdk.testing.tiny_model import OFFLINE_ENV

    env = {**OFFLINE_ENV, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    extra = ["--per_device_train_batch_size", str(batch), "--save_strategy", "no",
             "--logging_steps", str(steps), "--report_to", "none", "--disable_tqdm", "true"]
    if device == "cpu":
        extra += ["--use_cpu", "true"]
    else:
        env["CUDA_VISIBLE_DEVICES"] = "0"
    spec = TrainingSpec("sft", str(lm.model), str(lm.data), str(root / f"out-{device}"), max_steps=steps,
                        num_processes=1, python=sys.executable, env=env, extra_args=tuple(extra),
                        timeout_s=1800)
    worker = TrainingWorker(LocalRunner(), spec, store=LocalDirStore(root / "cas"))
    t0 = time.monotonic()
    result = await worker.run()
    wall = time.monotonic() - t0
    return {"device": device, "sps": result.metrics.get("train_samples_per_second"),
            "runtime": result.metrics.get("train_runtime"), "loss": result.metrics.get("train_loss"),
            "wall": wall, "final": result.final.digest if result.final else None}


async def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=20, help="optimiser steps per run (default 20)")
    ap.add_argument("--batch", type=int, default=8, help="samples per step (default 8)")
    ap.add_argument("--hidden", type=int, default=32, help="hidden size of the tiny model (default 32)")
    ap.add_argument("--devices", choices=["auto", "cpu", "gpu"], default="auto",
                    help="auto: cpu, and gpu when one is visible (default)")
    args = ap.parse_args(argv)
    try:
        import accelerate  # noqa: F401
        import trl  # noqa: F401
    except ImportError as exc:
        print(f"needs the train extra (pip install 'flowmesh-sdk[train]'): {exc}", file=sys.stderr)
        return 2
    from flowmesh_sdk.testing.tiny_model import build_tiny_lm

    cuda = _cuda()
    devices = {"auto": ["cpu"] + (["gpu"] if cuda else []), "cpu": ["cpu"], "gpu": ["gpu"]}[args.devices]
    if "gpu" in devices and not cuda:
        print("--devices gpu: torch sees no CUDA device", file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory(prefix="fm-bench-gpu-worker-") as tmp:
        root = Path(tmp)
        lm = build_tiny_lm(root, rows=max(64, args.steps * args.batch), hidden_size=args.hidden)
        print(f"model: tiny random Llama, hidden {args.hidden}, 2 layers, {lm.num_heads} heads; "
              f"{args.steps} steps x {args.batch} samples; torch.cuda.is_available()={cuda}", flush=True)
        for device in devices:
            rows.append(await run_one(device, lm, root, args.steps, args.batch))
    print(f"{'device':<7} {'samples/s':>10} {'train s':>9} {'job wall s':>11} {'loss':>7}  final checkpoint")
    for r in rows:
        print(f"{r['device']:<7} {r['sps'] or float('nan'):>10.1f} {r['runtime'] or float('nan'):>9.3f} "
              f"{r['wall']:>11.1f} {r['loss'] or float('nan'):>7.3f}  {str(r['final'])[:23]}")
    by = {r["device"]: r["sps"] for r in rows}
    cpu, gpu = by.get("cpu"), by.get("gpu")
    ratio = (gpu / cpu) if cpu and gpu else None
    if ratio is not None:
        print(f"gpu_vs_cpu = samples/s(gpu) / samples/s(cpu) = {ratio:.2f}")
    else:
        print("no GPU run: gpu_vs_cpu not measured" if cpu else "no CPU run: gpu_vs_cpu not measured")
    fmt = lambda v: "na" if v is None else f"{v:.1f}"  # noqa: E731
    print(f"cpu_samples_per_s={fmt(cpu)} gpu_samples_per_s={fmt(gpu)} "
          f"gpu_vs_cpu={'na' if ratio is None else f'{ratio:.2f}'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
