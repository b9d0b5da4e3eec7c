"""What the bidder is asked for: a :class:`Demand` ("N sandboxes of this size", or N GPU
workers serving a :class:`ModelSpec`), and the tenants' placement rules
(:class:`TenantAffinity`)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import cast

import numpy as np

from ..catalog.records import MARKETS, canonical_provider, gpu_key
from ..errors import SpecError
from ..specs import ARCHES, check_number

MODES = ("ephemeral", "persistent")
MARKET_CHOICES = (*MARKETS, "any")


def name_tuple(field_name: str, value: object) -> tuple[str, ...]:
    """``value`` as a tuple of non-empty strings; a bare string is refused (it would be
    split into one-character names)."""
    if isinstance(value, (str, bytes)):
        raise SpecError(field_name, f"must be a tuple of names, got the string {value!r}; "
                                    f"write ({value!r},)")
    try:   # anything tuple() takes; what it does not take raises TypeError, refused below
        items = tuple(cast("Iterable[object]", value))
    except TypeError:
        raise SpecError(field_name, f"must be a tuple of names, got {type(value).__name__}") from None
    names: list[str] = []
    for i, item in enumerate(items):
        if not isinstance(item, str) or not item.strip():
            raise SpecError(f"{field_name}[{i}]", f"must be a non-empty string, got {item!r}")
        names.append(item)
    return tuple(names)


def check_demand(value: object) -> None:
    """SpecError unless ``value`` is a :class:`Demand` (a bidder entry point was given
    something else)."""
    if not isinstance(value, Demand):
        raise SpecError("demand", f"must be a Demand, got {type(value).__name__}")


def check_caps(caps: object) -> None:
    if caps is None:
        return
    if not hasattr(caps, "items"):
        raise SpecError("caps", f"must be a mapping of catalog row key -> instances, got {type(caps).__name__}")
    for key, n in caps.items():
        check_number(f"caps[{key!r}]", n, lo=0, integer=True)


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A model a GPU worker serves: VRAM needed = weights + KV cache.

    ``params_b`` billions of parameters at ``bytes_per_param`` (2 for BF16/FP16, 1 for
    FP8/INT8); ``kv_cache_gb`` is the KV cache one worker holds for ``batch`` concurrent
    sequences.  ``weights`` names the weights for the locality term (an offer whose
    provider/region is listed in ``Demand.resident`` has them cached)."""

    params_b: float
    bytes_per_param: float = 2.0
    kv_cache_gb: float = 8.0
    batch: int = 32
    weights: str | None = None

    def __post_init__(self) -> None:
        check_number("model.params_b", self.params_b, lo=0, hi=100_000, lo_open=True)
        check_number("model.bytes_per_param", self.bytes_per_param, lo=0, hi=8, lo_open=True)
        check_number("model.kv_cache_gb", self.kv_cache_gb, lo=0, hi=1_000_000)
        check_number("model.batch", self.batch, lo=1, hi=1_000_000, integer=True)

    @property
    def weights_gb(self) -> float:
        return self.params_b * self.bytes_per_param

    @property
    def vram_gb(self) -> float:
        """GPU memory one worker needs: weights + KV cache."""
        return self.weights_gb + self.kv_cache_gb


@dataclass(frozen=True, slots=True)
class TenantAffinity:
    """Where a tenant's work may run: allowed providers and regions (empty: any)."""

    tenant: str
    providers: tuple[str, ...] = ()
    regions: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.tenant, str) or not self.tenant:
            raise SpecError("affinity.tenant", "must be a non-empty tenant name")
        object.__setattr__(self, "providers", tuple(canonical_provider(p)
                                                    for p in name_tuple("affinity.providers", self.providers)))
        object.__setattr__(self, "regions", name_tuple("affinity.regions", self.regions))

    def allows(self, provider: str, region: str) -> bool:
        return ((not self.providers or provider in self.providers)
                and (not self.regions or region in self.regions))


@dataclass(frozen=True, slots=True)
class Demand:
    """``count`` sandboxes (or GPU workers) of one size, and where and how they may run.

    * size: ``cpus``, ``memory_gb`` per sandbox; ``gpus`` (per worker), ``gpu_name``
      (a model such as ``H100``), ``model`` (VRAM and the GPU throughput model);
    * gates: ``arch`` (``None``: any), ``max_price`` ($/h per instance, listed price),
      ``providers`` / ``regions`` allow-lists (empty: any), ``tenant`` (see
      :class:`TenantAffinity`), ``market`` (``on-demand``, ``spot`` or ``any``);
    * workload: ``mode`` (``ephemeral``: one task per instance, a fresh instance each;
      ``persistent``: tasks packed onto warm instances), ``minutes`` per task,
      ``image_gb`` pulled per instance unless resident, ``resident`` (``provider``,
      ``provider/region`` or ``provider/region/type`` entries where the image or
      weights are already cached: the locality term), ``max_per_instance`` (at most this
      many tasks on one instance);
    * ``gpu_hosts``: let a CPU-only demand use GPU instances (off by default: the GPU
      would be paid for and idle, and marketplace GPU hosts state their CPU share only
      roughly -- the Vast.ai snapshot lists every host as 32 vCPU / 64 GB).
    """

    count: int = 1
    cpus: float = 8.0
    memory_gb: float = 16.0
    gpus: int = 0
    gpu_name: str | None = None
    model: ModelSpec | None = None
    arch: str | None = "x86_64"
    max_price: float | None = None
    providers: tuple[str, ...] = ()
    regions: tuple[str, ...] = ()
    tenant: str = "default"
    market: str = "on-demand"
    mode: str = "persistent"
    minutes: float = 60.0
    image_gb: float = 2.0
    resident: tuple[str, ...] = ()
    max_per_instance: int | None = None
    gpu_hosts: bool = False

    def __post_init__(self) -> None:
        check_number("demand.count", self.count, lo=1, hi=10_000_000, integer=True)
        check_number("demand.cpus", self.cpus, lo=0, hi=4096, lo_open=True)
        check_number("demand.memory_gb", self.memory_gb, lo=0, hi=65536, lo_open=True)
        check_number("demand.gpus", self.gpus, lo=0, hi=64, integer=True)
        if self.gpu_name is not None and (not isinstance(self.gpu_name, str) or not gpu_key(self.gpu_name)):
            raise SpecError("demand.gpu_name", f"must be a GPU model such as H100, got {self.gpu_name!r}")
        if self.gpu_name is not None and self.gpus == 0:
            object.__setattr__(self, "gpus", 1)
        if self.model is not None:
            if not isinstance(self.model, ModelSpec):
                raise SpecError("demand.model", "must be a ModelSpec")
            if self.gpus == 0:
                object.__setattr__(self, "gpus", 1)
        if self.arch is not None and self.arch not in ARCHES:
            raise SpecError("demand.arch", f"must be one of {', '.join(ARCHES)} or None (any); got {self.arch!r}")
        if self.max_price is not None:
            check_number("demand.max_price", self.max_price, lo=0, hi=1e6, lo_open=True)
        object.__setattr__(self, "providers", tuple(canonical_provider(p)
                                                    for p in name_tuple("demand.providers", self.providers)))
        object.__setattr__(self, "regions", name_tuple("demand.regions", self.regions))
        if not isinstance(self.tenant, str) or not self.tenant:
            raise SpecError("demand.tenant", "must be a non-empty tenant name")
        if self.market not in MARKET_CHOICES:
            raise SpecError("demand.market", f"must be one of {', '.join(MARKET_CHOICES)}; got {self.market!r}")
        if self.mode not in MODES:
            raise SpecError("demand.mode", f"must be one of {', '.join(MODES)}; got {self.mode!r}")
        check_number("demand.minutes", self.minutes, lo=0, hi=30 * 24 * 60, lo_open=True)
        check_number("demand.image_gb", self.image_gb, lo=0, hi=10_000)
        object.__setattr__(self, "resident", name_tuple("demand.resident", self.resident))
        if not isinstance(self.gpu_hosts, bool):
            raise SpecError("demand.gpu_hosts", f"must be true or false, got {self.gpu_hosts!r}")
        if self.max_per_instance is not None:
            check_number("demand.max_per_instance", self.max_per_instance, lo=1, hi=100_000, integer=True)

    @property
    def markets(self) -> tuple[str, ...]:
        return MARKETS if self.market == "any" else (self.market,)

    @property
    def hours(self) -> float:
        return self.minutes / 60.0

    def is_resident(self, provider: str, region: str, instance_type: str) -> bool:
        return any(entry in (provider, f"{provider}/{region}", f"{provider}/{region}/{instance_type}")
                   for entry in self.resident)

    def slots(self, cpus: float, memory_gb: float, gpus: int) -> int:
        """Sandboxes (or workers) of this size one instance of that shape holds; 0 when none.

        Ephemeral pools run one task per instance.  GPU workers get ``gpus`` whole GPUs each."""
        by_cpu = math.floor(cpus / self.cpus + 1e-9)
        by_mem = math.floor(memory_gb / self.memory_gb + 1e-9)
        fit = min(by_cpu, by_mem)
        if self.gpus:
            fit = min(fit, gpus // self.gpus)
        if self.mode == "ephemeral":
            fit = min(fit, 1)
        if self.max_per_instance is not None:
            fit = min(fit, self.max_per_instance)
        return max(fit, 0)

    def slots_of(self, cpus: np.ndarray, memory_gb: np.ndarray, gpus: np.ndarray) -> np.ndarray:
        """:meth:`slots` for arrays of shapes at once."""
        fit = np.minimum(np.floor(cpus / self.cpus + 1e-9), np.floor(memory_gb / self.memory_gb + 1e-9))
        if self.gpus:
            fit = np.minimum(fit, gpus // self.gpus)
        if self.mode == "ephemeral":
            fit = np.minimum(fit, 1)
        if self.max_per_instance is not None:
            fit = np.minimum(fit, self.max_per_instance)
        return np.maximum(fit, 0).astype(np.int64)


__all__ = ["Demand", "MARKET_CHOICES", "MODES", "ModelSpec", "TenantAffinity", "check_caps", "check_demand",
           "name_tuple"]
