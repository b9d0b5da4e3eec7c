"""Per-GPU memory, memory bandwidth and dense 16-bit tensor throughput, for the bidder's
GPU throughput model (:mod:`flowmesh_sdk.bidder.throughput`).

Every figure is the vendor's published peak for one GPU, *dense* (NVIDIA datasheets
quote tensor FLOPS "with sparsity", twice the dense figure; the dense half is used here
because LLM inference does not run 2:4-sparse weights).  Sources below.  The H100, A100,
L4 and L40S figures were cross-checked on 2026-11-30 against copies of NVIDIA's tables
(the vendor pages cannot be reached from here; the copies are named); the A10, T4, V100,
RTX 4090 and RTX 3090 figures are as the cited documents state them and were *not*
re-checked in that session:

* H100 SXM / PCIe / NVL, H200: NVIDIA H100 and H200 datasheets,
  https://www.nvidia.com/en-us/data-center/h100/ and https://www.nvidia.com/en-us/data-center/h200/
  (H100 SXM: 80 GB, 3.35 TB/s, BF16 1,979 TFLOPS sparse; PCIe: 80 GB, 2.0 TB/s, 1,513
  sparse; NVL: 94 GB, 3.9 TB/s, 1,671 sparse; H200: 141 GB, 4.8 TB/s, 1,979 sparse);
  cross-checked: glennklockwood.com/garden/processors/h100 (989.4 dense BF16, 3.35 TB/s).
* A100 40 GB / 80 GB: NVIDIA A100 datasheet,
  https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf
  (BF16 312 TFLOPS dense; 1,555 GB/s for 40 GB, 2,039 GB/s for 80 GB SXM);
  cross-checked: glennklockwood.com/garden/processors/A100.
* L4: https://www.nvidia.com/en-us/data-center/l4/ (24 GB, 300 GB/s, BF16 242 TFLOPS sparse).
* L40S: https://www.nvidia.com/en-us/data-center/l40s/ (48 GB, 864 GB/s, BF16 362.05 dense /
  733 sparse); cross-checked in a vendor listing of the NVIDIA table (mullet.se product 355414).
* A10 (and AWS's A10G, for which AWS publishes no FLOPS; the A10's figures are used as an
  approximation): https://www.nvidia.com/en-us/data-center/products/a10-gpu/ (24 GB, 600 GB/s,
  BF16 125 dense / 250 sparse).
* T4: https://www.nvidia.com/en-us/data-center/tesla-t4/ (16 GB, 320 GB/s, 65 TFLOPS FP16
  mixed precision; no BF16).
* V100 SXM2: https://www.nvidia.com/en-us/data-center/v100/ (16 or 32 GB, 900 GB/s, 125
  tensor TFLOPS).
* RTX 4090: NVIDIA Ada Lovelace architecture whitepaper (v1.0), table "GeForce RTX 4090"
  (24 GB, 1,008 GB/s, FP16/BF16 tensor with FP32 accumulate 165.2 dense).
* RTX 3090: NVIDIA Ampere GA102 architecture whitepaper (v2), table "GeForce RTX 3090"
  (24 GB, 936 GB/s, FP16 tensor with FP32 accumulate 71 dense).

A GPU not listed here (B200, RTX 5090, MI25, ...) has no throughput model: a GPU demand
with a model workload excludes it at the ``gpu_spec`` gate and says so, rather than guess.
"""

from __future__ import annotations

from dataclasses import dataclass

from .records import gpu_key


@dataclass(frozen=True, slots=True)
class GpuSpec:
    model: str                 # normalised key (records.gpu_key)
    memory_gb: float           # per GPU
    bandwidth_gbs: float       # memory bandwidth, GB/s
    tflops: float              # dense 16-bit tensor TFLOPS
    source: str


_H100 = "NVIDIA H100 datasheet, nvidia.com/en-us/data-center/h100"
_A100 = "NVIDIA A100 datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf)"

GPU_SPECS: dict[str, GpuSpec] = {s.model: s for s in (
    GpuSpec("h100", 80, 3350, 989.5, _H100 + " (SXM)"),
    GpuSpec("h100sxm", 80, 3350, 989.5, _H100 + " (SXM)"),
    GpuSpec("h100pcie", 80, 2000, 756.5, _H100 + " (PCIe)"),
    GpuSpec("h100nvl", 94, 3900, 835.5, _H100 + " (NVL)"),
    GpuSpec("h200", 141, 4800, 989.5, "NVIDIA H200 datasheet, nvidia.com/en-us/data-center/h200"),
    GpuSpec("a100", 40, 1555, 312, _A100 + " (40 GB)"),
    GpuSpec("a10080", 80, 2039, 312, _A100 + " (80 GB SXM)"),
    GpuSpec("l4", 24, 300, 121, "NVIDIA L4 datasheet, nvidia.com/en-us/data-center/l4"),
    GpuSpec("l40s", 48, 864, 362.05, "NVIDIA L40S datasheet, nvidia.com/en-us/data-center/l40s"),
    GpuSpec("a10", 24, 600, 125, "NVIDIA A10 datasheet, nvidia.com/en-us/data-center/products/a10-gpu"),
    GpuSpec("a10g", 24, 600, 125, "approximated by the NVIDIA A10 datasheet (no FLOPS are published for the A10G)"),
    GpuSpec("t4", 16, 320, 65, "NVIDIA T4 datasheet, nvidia.com/en-us/data-center/tesla-t4 (FP16 mixed)"),
    GpuSpec("v100", 32, 900, 125, "NVIDIA V100 datasheet, nvidia.com/en-us/data-center/v100 (SXM2)"),
    GpuSpec("rtx4090", 24, 1008, 165.2, "NVIDIA Ada Lovelace architecture whitepaper v1.0"),
    GpuSpec("rtx3090", 24, 936, 71, "NVIDIA Ampere GA102 architecture whitepaper v2"),
)}


def gpu_spec(name: str | None, memory_per_gpu_gb: float | None = None) -> GpuSpec | None:
    """The spec of a GPU named as any catalog spells it, or ``None`` when unknown.

    An A100 with more than 60 GB per GPU is the 80 GB part (faster memory)."""
    key = gpu_key(name)
    if key is None:
        return None
    if key == "a100" and memory_per_gpu_gb is not None and memory_per_gpu_gb > 60:
        key = "a10080"
    return GPU_SPECS.get(key)


__all__ = ["GPU_SPECS", "GpuSpec", "gpu_spec"]
