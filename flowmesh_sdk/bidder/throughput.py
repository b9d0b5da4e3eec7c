"""T_eff: how much work one worker slot of an offer gets done per hour, and the startup
model it shares with the cost estimate.

CPU pools (sandboxes): a slot runs one task after another, each paying its start-up,
so ``T_eff = 3600 / (startup_s + minutes*60)`` sandboxes per hour per slot.  Every
slot gets the cores the sandbox asked for, so sandboxes do not run faster on bigger
machines; what differs between offers is start-up:

* ephemeral: every task boots a fresh instance (the provider profile's ``boot_s``) and
  pulls its image;
* persistent: the instance is warm; a task pulls the image only when the instance does
  not have it yet, counted once per slot here (the first task), plus the container
  start (``CONTAINER_START_S``, measured 0.29 s for ``podman run`` here, DESIGN.md).
* an image already resident on that provider/region (``Demand.resident``) is not pulled.

Pull time: ``image_gb * 8000 / bandwidth_mbps`` seconds, where an instance's registry
bandwidth is ``PULL_MBPS_PER_8_VCPU`` (100 Mbit/s) per 8 vCPUs, capped at
``PULL_MBPS_CAP`` (1 Gbit/s), and shared by the slots pulling at the same time.  These
are MegaFlow's figures (100 Mbit/s dedicated to each 8-vCPU instance; 1 Gbit/s shared
by the 50 tasks of a 208-core machine; shared/seeds/000, §2-3), used as the default
bandwidth model, not measured per instance type.

GPU workers: a decoding step reads all weights and the batch's KV cache from GPU memory
and does ``2 * params`` FLOPs per sequence, so one step takes
``max((W + KV) / (BW * ETA_BW), batch * 2 * P / (FLOPS * ETA_FLOPS))`` seconds and the
worker produces ``batch / step`` tokens per second (W: weight bytes, KV: KV-cache bytes,
BW and FLOPS: the worker's GPUs summed, from :mod:`flowmesh_sdk.catalog.gpus`).
``ETA_BW`` = 0.6 and ``ETA_FLOPS`` = 0.4 are assumed achievable fractions of peak (a
roofline estimate; the model ignores prefill, attention FLOPs and interconnect).
"""

from __future__ import annotations

from ..catalog.gpus import gpu_spec
from ..catalog.profiles import profile
from ..catalog.records import CatalogRow
from .demand import Demand

PULL_MBPS_PER_8_VCPU = 100.0
PULL_MBPS_CAP = 1000.0
CONTAINER_START_S = 0.29
ETA_BW = 0.6
ETA_FLOPS = 0.4


def instance_pull_mbps(vcpus: float) -> float:
    return min(PULL_MBPS_CAP, PULL_MBPS_PER_8_VCPU * max(1.0, vcpus / 8.0))


def pull_seconds(image_gb: float, vcpus: float, concurrent: int = 1) -> float:
    """Seconds to pull ``image_gb`` when ``concurrent`` pulls share the instance's link."""
    if image_gb <= 0:
        return 0.0
    return image_gb * 8000.0 / (instance_pull_mbps(vcpus) / max(1, concurrent))


def startup_seconds(row: CatalogRow, demand: Demand, slots: int) -> float:
    """Start-up one task pays on ``row`` before it runs (see the module docstring)."""
    resident = demand.is_resident(row.provider, row.region, row.instance_type)
    pull = 0.0 if resident else pull_seconds(demand.image_gb, row.cpus, concurrent=slots)
    if demand.mode == "ephemeral":
        return profile(row.provider).boot_s + pull + CONTAINER_START_S
    return pull + CONTAINER_START_S


def tokens_per_second(row: CatalogRow, demand: Demand) -> float | None:
    """Decode tokens/s of one GPU worker on ``row``; ``None`` when the GPU has no spec."""
    model = demand.model
    if model is None or not row.gpus:
        return None
    per_gpu_mem = row.gpu_memory_gb / row.gpus if row.gpu_memory_gb else None
    spec = gpu_spec(row.gpu_name, per_gpu_mem)
    if spec is None:
        return None
    g = demand.gpus
    bandwidth = g * spec.bandwidth_gbs * 1e9 * ETA_BW
    flops = g * spec.tflops * 1e12 * ETA_FLOPS
    weights = model.weights_gb * 1e9
    kv = model.kv_cache_gb * 1e9
    step = max((weights + kv) / bandwidth, model.batch * 2.0 * model.params_b * 1e9 / flops)
    return model.batch / step


def t_eff(row: CatalogRow, demand: Demand, slots: int) -> float | None:
    """Per-slot throughput: tokens/s for a model workload, else sandboxes/hour."""
    if demand.model is not None:
        return tokens_per_second(row, demand)
    return 3600.0 / (startup_seconds(row, demand, slots) + demand.minutes * 60.0)


__all__ = ["CONTAINER_START_S", "ETA_BW", "ETA_FLOPS", "PULL_MBPS_CAP", "PULL_MBPS_PER_8_VCPU",
           "instance_pull_mbps", "pull_seconds", "startup_seconds", "t_eff", "tokens_per_second"]
