"""A pool of sandboxes: :class:`PoolSpec`, its :class:`PoolMode`, and the
:class:`SandboxSize` from which the bidder chooses its instances."""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass, field

from ..errors import SpecError
from ..registry.reference import ImageRef
from .checks import ISOLATIONS, check_choice, check_name, check_number
from .infra import InfraEntry, parse_infra
from .instance import InstanceSpec
from .policy import PRESETS, Policy
from .sandbox import KERNELS, MIN_SANDBOX_CPUS, MIN_SANDBOX_MEMORY_GB, SandboxSpec


class PoolMode(str, enum.Enum):
    EPHEMERAL = "ephemeral"    # a fresh instance per task, terminated after it
    PERSISTENT = "persistent"  # warm instances, a fresh container per task
    AUTO = "auto"              # both, chosen per task by its isolation (strict | shared)


SPOT_CHOICES = ("never", "prefer", "only")   # never | prefer (on-demand fallback) | only


@dataclass(frozen=True, slots=True)
class SandboxSize:
    """What one sandbox needs, for a pool whose instance shape the bidder chooses: any
    offer that holds at least one such sandbox qualifies, and holds as many as fit."""

    cpus: float = 1.0
    memory_gb: float = 2.0
    gpus: int = 0

    def __post_init__(self) -> None:
        check_number("pool.sandbox_size.cpus", self.cpus, lo=MIN_SANDBOX_CPUS, hi=1024)
        check_number("pool.sandbox_size.memory_gb", self.memory_gb, lo=MIN_SANDBOX_MEMORY_GB, hi=32768)
        check_number("pool.sandbox_size.gpus", self.gpus, lo=0, hi=16, integer=True)


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """A pool of sandboxes: how it runs (``mode``), where it may run (``infra``, a search
    space over providers, regions and zones), on what (a fixed ``instance`` size with
    ``sandboxes_per_instance``, or a ``sandbox_size`` from which the bidder chooses the
    shape and the slots per instance), and what it may spend.  See docs/api.md."""

    name: str
    mode: PoolMode = PoolMode.PERSISTENT
    provider: str = "local"
    instance: InstanceSpec = field(default_factory=InstanceSpec)
    min_instances: int = 0
    max_instances: int | None = None   # None: 1, or (with concurrency) one instance per sandbox at most
    sandboxes_per_instance: int = 1
    idle_timeout_s: float = 300.0
    warm_per_image: int = 1
    warm_images: tuple[str, ...] = ()
    region: str | None = None
    image_cache_gb: float | None = None
    retry_infra_failures: int = 2   # re-dispatches of a Task whose instance is lost under it
    heartbeat_s: float | None = 10.0   # probe each machine this often; None: no heartbeat
    heartbeat_misses: int = 2          # probes in a row without an answer before it is given up
    # ---- where, on what, at what price (flowmesh_sdk.placement) ----
    infra: tuple[str, ...] = ()          # 'provider[/region[/zone]]' entries; (): (provider[/region],)
    policy: Policy | str = "balanced"    # a bidder Policy, or a preset: latency, cost, balanced (a Policy after)
    max_price: float | None = None       # $/h per instance (listed price)
    spot: str = "never"                  # never | prefer (on-demand fallback) | only
    budget_per_hour: float | None = None  # $/h the pool may burn at once
    budget_total: float | None = None     # $ the pool may spend in all
    sandbox_size: SandboxSize | None = None   # the bidder picks the instance shape and slots
    concurrency: int | None = None       # most sandboxes at once (default: max_instances x slots)
    isolation: str | None = None         # mode auto: the default isolation of a task
    kernel: str = "host"                 # gvisor: every sandbox of the pool runs under gVisor

    def __post_init__(self) -> None:
        check_name("pool.name", self.name)
        check_choice("pool.kernel", self.kernel, KERNELS)
        check_number("pool.retry_infra_failures", self.retry_infra_failures, lo=0, hi=100, integer=True)
        if self.heartbeat_s is not None:
            check_number("pool.heartbeat_s", self.heartbeat_s, lo=0.1, hi=3600)
        check_number("pool.heartbeat_misses", self.heartbeat_misses, lo=1, hi=100, integer=True)
        try:
            object.__setattr__(self, "mode", PoolMode(self.mode))
        except ValueError:
            raise SpecError("pool.mode", "must be one of ephemeral, persistent, auto; "
                                         f"got {self.mode!r}") from None
        if not isinstance(self.provider, str) or not self.provider:
            raise SpecError("pool.provider", f"must be a provider name, got {self.provider!r}")
        self._check_placement()
        if not isinstance(self.instance, InstanceSpec):
            raise SpecError("pool.instance", "must be an InstanceSpec")
        check_number("pool.min_instances", self.min_instances, lo=0, hi=100_000, integer=True)
        if self.concurrency is not None:
            check_number("pool.concurrency", self.concurrency, lo=1, hi=10_000_000, integer=True)
        max_instances = self.max_instances
        if max_instances is None:
            max_instances = min(100_000, self.concurrency or 1)
            object.__setattr__(self, "max_instances", max_instances)
        check_number("pool.max_instances", max_instances, lo=1, hi=100_000, integer=True)
        if self.min_instances > max_instances:
            raise SpecError("pool.min_instances",
                            f"must be <= pool.max_instances ({self.max_instances}), got {self.min_instances}")
        check_number("pool.sandboxes_per_instance", self.sandboxes_per_instance, lo=1, hi=1024, integer=True)
        check_number("pool.idle_timeout_s", self.idle_timeout_s, lo=0, hi=30 * 86400, lo_open=True)
        check_number("pool.warm_per_image", self.warm_per_image, lo=0,
                     hi=self.sandboxes_per_instance, integer=True)
        # warm_images (issue 12, defect 9): a tuple of image references, each parsed now; a
        # bare string is refused rather than split into one-character "images"
        if isinstance(self.warm_images, (str, bytes)):
            raise SpecError("pool.warm_images", f"must be a tuple of image references, got the string "
                                                f"{self.warm_images!r}; write warm_images=({self.warm_images!r},)")
        try:
            warm = tuple(self.warm_images)
        except TypeError:
            raise SpecError("pool.warm_images", "must be a tuple of image references, got "
                                                f"{type(self.warm_images).__name__}") from None
        for i, image in enumerate(warm):
            try:
                ImageRef.parse(image)
            except SpecError as exc:
                raise SpecError(f"pool.warm_images[{i}]", str(exc).removeprefix("image: ")) from exc
        object.__setattr__(self, "warm_images", warm)
        if self.image_cache_gb is not None:
            check_number("pool.image_cache_gb", self.image_cache_gb, lo=0, hi=self.instance.disk_gb,
                         lo_open=True)
        if self.mode is PoolMode.EPHEMERAL and self.min_instances:
            raise SpecError("pool.min_instances", "must be 0 for an ephemeral pool (no warm instances)")

    def _check_placement(self) -> None:
        entries = parse_infra("pool.infra", self.infra)
        if entries and (self.provider != "local" or self.region is not None):
            raise SpecError("pool.infra", "give the search space in infra, or one provider (and region), "
                                          "not both")
        if not entries:
            entries = (InfraEntry.parse("pool.provider", self.provider if self.region is None
                                        else f"{self.provider}/{self.region}"),)
        object.__setattr__(self, "infra", tuple(str(e) for e in entries))
        if isinstance(self.policy, str):
            if self.policy not in PRESETS:
                raise SpecError("pool.policy", f"must be a Policy or one of {', '.join(PRESETS)}; "
                                               f"got {self.policy!r}")
            object.__setattr__(self, "policy", PRESETS[self.policy])
        elif not isinstance(self.policy, Policy):
            raise SpecError("pool.policy", f"must be a Policy or one of {', '.join(PRESETS)}; "
                                           f"got {type(self.policy).__name__}")
        check_choice("pool.spot", self.spot, SPOT_CHOICES)
        for name in ("max_price", "budget_per_hour", "budget_total"):
            value = getattr(self, name)
            if value is not None:
                check_number(f"pool.{name}", value, lo=0, lo_open=True)
        if self.sandbox_size is not None and not isinstance(self.sandbox_size, SandboxSize):
            raise SpecError("pool.sandbox_size", "must be a SandboxSize(cpus=..., memory_gb=...), got "
                                                 f"{type(self.sandbox_size).__name__}")
        if self.isolation is not None:
            check_choice("pool.isolation", self.isolation, ISOLATIONS)
            if self.mode is not PoolMode.AUTO:
                raise SpecError("pool.isolation", "is the default of a mode='auto' pool; this pool's mode is "
                                                  f"{self.mode.value}")

    @property
    def search_space(self) -> tuple[InfraEntry, ...]:
        """The entries of ``infra``, parsed (once per distinct ``infra``: see :func:`_search_space`)."""
        return _search_space(self.infra)

    def infra_field(self, i: int) -> str:
        """The field an error about search-space entry ``i`` names: ``pool.infra[i]``, or
        ``pool.provider`` when the search space is the one ``provider`` (and ``region``) gave."""
        return "pool.provider" if self.provider != "local" or self.region is not None else f"pool.infra[{i}]"

    @property
    def slots_fixed(self) -> bool:
        """True when every instance holds ``sandboxes_per_instance`` (no ``sandbox_size``)."""
        return self.sandbox_size is None

    @property
    def default_isolation(self) -> str:
        if self.mode is PoolMode.EPHEMERAL:
            return "strict"
        if self.mode is PoolMode.PERSISTENT:
            return "shared"
        return self.isolation or "strict"

    @property
    def image_cache_bytes(self) -> int:
        """The disk an instance may fill with images: ``image_cache_gb``, else 80% of disk."""
        gb = self.image_cache_gb if self.image_cache_gb is not None else 0.8 * self.instance.disk_gb
        return int(gb * 1024 ** 3)

    def check_fits(self, sandbox: SandboxSpec) -> None:
        """Raise SpecError when a sandbox cannot fit this pool's instances (or its slots,
        when the bidder chooses the instances from ``sandbox_size``)."""
        size = self.sandbox_size
        if size is not None:
            if sandbox.cpus > size.cpus + 1e-9 or sandbox.memory_gb > size.memory_gb + 1e-9:
                raise SpecError("sandbox.cpus" if sandbox.cpus > size.cpus + 1e-9 else "sandbox.memory_gb",
                                f"{sandbox.cpus:g} cpus / {sandbox.memory_gb:g} GB exceeds the pool's sandbox "
                                f"size ({size.cpus:g} cpus / {size.memory_gb:g} GB)")
            return
        inst = self.instance
        if sandbox.cpus > inst.cpus:
            raise SpecError("sandbox.cpus", f"{sandbox.cpus:g} exceeds the pool's instance size "
                                            f"({inst.cpus} cpus)")
        slots = 1 if self.mode is PoolMode.EPHEMERAL else self.sandboxes_per_instance
        if sandbox.memory_gb * slots > inst.memory_gb + 1e-9:
            raise SpecError("sandbox.memory_gb",
                            f"{sandbox.memory_gb:g} GB x {slots} slots exceeds the pool's instance "
                            f"memory ({inst.memory_gb:g} GB)")


@functools.lru_cache(maxsize=256)
def _search_space(infra: tuple[str, ...]) -> tuple[InfraEntry, ...]:
    """A pool's infra, parsed: kept, not parsed again on each read of ``search_space`` (a
    frozen record with slots has no room for it, and a field would be a field of the API)."""
    return parse_infra("pool.infra", infra)
