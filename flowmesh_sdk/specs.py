"""Typed, validated records that cross every boundary of the SDK.

Bad input raises :class:`~flowmesh_sdk.errors.SpecError` naming the field, the value
given and the allowed range, at construction time.
"""

from __future__ import annotations

import enum
import ipaddress
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from .errors import SpecError
from .registry.reference import ImageRef

# validated with fullmatch: ``re.match`` with ``$`` lets a trailing newline through
_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,39}", re.ASCII)
_TENANT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@:+-]{0,127}", re.ASCII)
ARCHES = ("x86_64", "arm64")
# What the container runtime accepts: podman refuses a CFS quota under 1 ms of its 100 ms
# period ("CPU cfs quota cannot be less than 1ms"), i.e. cpus < 0.01; Docker refuses a
# memory limit under 6 MB ("Minimum memory limit allowed is 6MB"), and a sandbox must
# start on either.
MIN_SANDBOX_CPUS = 0.01
MIN_SANDBOX_MEMORY_GB = 6 / 1024


def check_number(field_name: str, value: object, *, lo: float, hi: float | None = None,
                 lo_open: bool = False, integer: bool = False) -> None:
    """Raise SpecError unless ``value`` is a number in the allowed range."""
    kind = "an integer" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            integer and not isinstance(value, int)):
        raise SpecError(field_name, f"must be {kind}, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise SpecError(field_name, f"must be finite, got {value!r}")
    low_ok = value > lo if lo_open else value >= lo
    if not low_ok or (hi is not None and value > hi):
        bracket = "(" if lo_open else "["
        upper = f"{hi:g}]" if hi is not None else "inf)"
        raise SpecError(field_name, f"must be in {bracket}{lo:g}, {upper}, got {value!r}")


def check_choice(field_name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise SpecError(field_name, f"must be one of {', '.join(allowed)}; got {value!r}")


def check_name(field_name: str, value: object) -> None:
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise SpecError(field_name, "must be 1-40 chars of lowercase letters, digits and '-', "
                                    f"starting with a letter or digit; got {value!r}")


def frozen_env(field_name: str, env: Mapping[str, str] | None) -> Mapping[str, str]:
    """Validate an environment mapping and return a read-only copy."""
    if env is None:
        env = {}
    if not isinstance(env, Mapping):
        raise SpecError(field_name, f"must be a mapping of NAME -> value (e.g. {{'PATH': '/bin'}}), "
                                    f"got {type(env).__name__}")
    out: dict[str, str] = {}
    for key, val in env.items():
        if not isinstance(key, str) or not _ENV_KEY.fullmatch(key):
            raise SpecError(f"{field_name}[{key!r}]",
                            "keys must match [A-Za-z_][A-Za-z0-9_]*")
        if not isinstance(val, str) or "\x00" in val:
            raise SpecError(f"{field_name}[{key}]", "values must be strings without NUL bytes")
        out[key] = val
    return MappingProxyType(out)


@dataclass(frozen=True, slots=True)
class InstanceSpec:
    """The size of one machine (a VM, a marketplace box, or a slice of this host)."""

    cpus: int = 8
    memory_gb: float = 16.0
    gpus: int = 0
    gpu_name: str | None = None
    disk_gb: int = 100
    arch: str = "x86_64"

    def __post_init__(self) -> None:
        check_number("instance.cpus", self.cpus, lo=1, hi=1024, integer=True)
        check_number("instance.memory_gb", self.memory_gb, lo=0, hi=32768, lo_open=True)
        check_number("instance.gpus", self.gpus, lo=0, hi=16, integer=True)
        check_number("instance.disk_gb", self.disk_gb, lo=1, hi=65536, integer=True)
        check_choice("instance.arch", self.arch, ARCHES)
        if self.gpu_name is not None and (not isinstance(self.gpu_name, str) or not self.gpu_name.strip()
                                          or not self.gpu_name.isprintable()):
            raise SpecError("instance.gpu_name", f"must be a GPU model name such as 'H100', got {self.gpu_name!r}")
        if self.gpu_name is not None and self.gpus == 0:
            raise SpecError("instance.gpu_name", "set only when instance.gpus >= 1")


_HOSTNAME = re.compile(r"(?=.{1,253}$)([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*")


def network_policy(value: object) -> bool | tuple[str, ...]:
    """``SandboxSpec.network`` in its canonical form: False (none), True (all) or a sorted
    tuple of allow-list entries (``IP:PORT``, ``[IPv6]:PORT``, ``HOSTNAME:PORT``, CIDR)."""
    field_ = "sandbox.network"
    if isinstance(value, bool):
        return value
    if value == "none":
        return False
    if value == "all":
        return True
    if isinstance(value, str) or not isinstance(value, (tuple, list, frozenset, set)):
        raise SpecError(field_, '"none", "all" or a tuple of "host:port" / CIDR entries, '
                                f"got {value!r}")
    entries = {_network_entry(e) for e in value}
    return tuple(sorted(entries)) if entries else False


def _network_entry(entry: object) -> str:
    field_ = "sandbox.network"
    if not isinstance(entry, str) or not entry or not entry.isprintable() or " " in entry:
        raise SpecError(field_, f"an entry must be a 'host:port' or CIDR string, got {entry!r}")
    if "/" in entry:
        try:
            return str(ipaddress.ip_network(entry, strict=False))
        except ValueError as exc:
            raise SpecError(field_, f"{entry!r} is not a CIDR network ({exc})") from None
    host, sep, port = entry.rpartition(":")
    if not sep or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise SpecError(field_, f"{entry!r} needs a port (host:port, [v6]:port) or a /prefix")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        name = host.lower().rstrip(".")
        if not _HOSTNAME.fullmatch(name):
            raise SpecError(field_, f"{entry!r}: {host!r} is neither an IP address nor a host name") from None
        return f"{name}:{int(port)}"
    return f"[{ip}]:{int(port)}" if ip.version == 6 else f"{ip}:{int(port)}"


def allow_list_host(entry: str) -> str | None:
    """The host name a canonical allow-list entry names (``name:port``), or None for an
    address (``1.2.3.4:80``, ``[::1]:443``) or a network (``10.0.0.0/8``)."""
    if "/" in entry or entry.startswith("["):
        return None
    host = entry.rpartition(":")[0]
    return None if re.fullmatch(r"[0-9.]+", host) else host


@dataclass(frozen=True, slots=True)
class SandboxSpec:
    """One container: image, limits, and defaults for the commands run in it.

    ``network`` is ``"none"`` by default (the container has only ``lo``); ``"all"`` gives
    it the runtime's bridge network; a tuple of ``"host:port"`` / ``"[v6]:port"`` / CIDR
    (``"10.0.0.0/8"``, any port) entries allows only those destinations, enforced by the
    host inside the container's network namespace.  ``False``/``True`` mean none/all and
    are what ``network`` holds for those two; an allow-list is held sorted and
    de-duplicated.  The cloud metadata address is unreachable in every case.
    ``timeout_s`` is the default per-command timeout of :meth:`Sandbox.exec`.
    ``env`` values are kept out of ``repr`` (they may hold secrets).
    ``kernel``: ``"host"`` (the default: the container runtime the host probe chose, runc,
    sharing the instance's kernel) or ``"gvisor"`` (gVisor's ``runsc``: the sandbox's
    system calls are served by gVisor's user-space kernel, not the host's; network must be
    none).  docs/security.md says what each buys and costs.
    """

    image: str
    cpus: float = 1.0
    memory_gb: float = 2.0
    pids: int = 1024
    network: bool | str | tuple[str, ...] = False
    env: Mapping[str, str] = field(default_factory=dict, repr=False)
    workdir: str = "/"
    timeout_s: float = 600.0
    kernel: str = "host"

    def __post_init__(self) -> None:
        try:
            ImageRef.parse(self.image)
        except SpecError as exc:
            raise SpecError("sandbox.image", str(exc).removeprefix("image: ")) from None
        check_number("sandbox.cpus", self.cpus, lo=MIN_SANDBOX_CPUS, hi=1024)
        check_number("sandbox.memory_gb", self.memory_gb, lo=0, hi=32768)
        if self.memory_gb < MIN_SANDBOX_MEMORY_GB:
            raise SpecError("sandbox.memory_gb", f"must be at least 6 MiB ({MIN_SANDBOX_MEMORY_GB:.6f} GB, "
                                                 f"the container runtime's minimum), got {self.memory_gb!r}")
        check_number("sandbox.pids", self.pids, lo=8, hi=4_194_304, integer=True)
        check_number("sandbox.timeout_s", self.timeout_s, lo=0, hi=7 * 86400, lo_open=True)
        object.__setattr__(self, "network", network_policy(self.network))
        if (not isinstance(self.workdir, str) or not self.workdir.startswith("/")
                or "\x00" in self.workdir or len(self.workdir) > 4096):
            raise SpecError("sandbox.workdir", "must be an absolute path (starting with /, no NUL bytes, "
                                               f"at most 4096 chars), got {self.workdir!r}")
        object.__setattr__(self, "env", frozen_env("sandbox.env", self.env))
        check_choice("sandbox.kernel", self.kernel, KERNELS)
        if self.kernel == "gvisor" and self.network:
            raise SpecError("sandbox.network", "must be none (False) for kernel='gvisor': gVisor's own network "
                                               "stack does not start with Debian's runsc on recent kernels "
                                               "(google/gvisor#10704), and its host-network mode would run "
                                               "gVisor as host root; see docs/security.md")

    @property
    def memory_mib(self) -> int:
        return max(4, int(self.memory_gb * 1024))


class PoolMode(str, enum.Enum):
    EPHEMERAL = "ephemeral"    # a fresh instance per task, terminated after it
    PERSISTENT = "persistent"  # warm instances, a fresh container per task
    AUTO = "auto"              # both, chosen per task by its isolation (strict | shared)


#: what serves a sandbox's system calls: the instance's kernel (runc), or gVisor's (runsc)
KERNELS = ("host", "gvisor")
ISOLATIONS = ("strict", "shared")   # strict: a fresh instance; shared: a fresh container on a warm one
SPOT_CHOICES = ("never", "prefer", "only")


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
    policy: object = "balanced"          # a bidder Policy, or a preset: latency, cost, balanced
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
        if self.max_instances is None:
            object.__setattr__(self, "max_instances", min(100_000, self.concurrency or 1))
        check_number("pool.max_instances", self.max_instances, lo=1, hi=100_000, integer=True)
        if self.min_instances > self.max_instances:
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
        from .placement.infra import InfraEntry, parse_infra

        entries = parse_infra("pool.infra", self.infra)
        if entries and (self.provider != "local" or self.region is not None):
            raise SpecError("pool.infra", "give the search space in infra, or one provider (and region), "
                                          "not both")
        if not entries:
            entries = (InfraEntry.parse("pool.provider", self.provider if self.region is None
                                        else f"{self.provider}/{self.region}"),)
        object.__setattr__(self, "infra", tuple(str(e) for e in entries))
        from .bidder.policy import PRESETS, Policy

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
    def search_space(self) -> tuple:   # tuple[InfraEntry, ...]
        from .placement.infra import parse_infra

        return parse_infra("pool.infra", self.infra)

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


@dataclass(frozen=True, slots=True)
class ExecResult:
    """The outcome of one command in a sandbox.

    ``stdout``/``stderr`` are decoded UTF-8 (invalid bytes replaced).  When a stream
    exceeded the cap, it holds the first bytes followed by a marker line and its
    ``*_truncated`` flag is set; ``*_bytes`` is the full size the command wrote.
    """

    exit_code: int
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    stdout_bytes: int = 0
    stderr_bytes: int = 0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


@dataclass(frozen=True, slots=True)
class Offer:
    """One purchasable instance shape: provider x region x type x (spot|on-demand)."""

    provider: str
    region: str
    instance_type: str
    cpus: int
    memory_gb: float
    # $/h of one instance.  A cloud provider reports shapes only (None): the fleet prices
    # them from the catalog, the one source of prices.  A provider whose machines cost the
    # SDK nothing (``Capabilities.free``: this host, the user's own machines) says 0.0.
    price_per_hour: float | None = None
    gpus: int = 0
    gpu_name: str | None = None
    zone: str | None = None
    spot: bool = False
    arch: str = "x86_64"
    # From the price catalog (flowmesh_sdk.catalog.CatalogRow.offer): total GPU memory,
    # where the price came from, and when it was fetched (ISO date); empty when unknown.
    gpu_memory_gb: float | None = None
    source: str = ""
    fetched_at: str | None = None
    # A marketplace machine (Vast.ai): its offer id to rent and the host's reliability in
    # (0, 1]; ``available``: how many of this offer can be had now (None: not limited).
    offer_id: str | None = None
    reliability: float | None = None
    available: int | None = None

    def __post_init__(self) -> None:
        if self.price_per_hour is not None:
            check_number("offer.price_per_hour", self.price_per_hour, lo=0)
        if self.reliability is not None:
            check_number("offer.reliability", self.reliability, lo=0, hi=1, lo_open=True)
        if self.available is not None:
            check_number("offer.available", self.available, lo=0, integer=True)

    @property
    def key(self) -> str:
        """``provider/region[/zone]/type[ spot]``: how decisions and events name an offer."""
        where = f"{self.region}/{self.zone}" if self.zone else self.region
        return f"{self.provider}/{where}/{self.instance_type}{' spot' if self.spot else ''}"

    def fits(self, spec: InstanceSpec) -> bool:
        return (self.cpus >= spec.cpus and self.memory_gb + 1e-9 >= spec.memory_gb
                and self.gpus >= spec.gpus and self.arch == spec.arch
                and (spec.gpu_name is None
                     or (self.gpu_name or "").lower() == spec.gpu_name.lower()))


@dataclass(frozen=True, slots=True)
class Task:
    """A declarative unit of work for :meth:`Pool.map`: files in, one command, result out."""

    name: str
    sandbox: SandboxSpec
    command: str
    files: Mapping[str, bytes] = field(default_factory=dict, repr=False)
    timeout_s: float | None = None
    tenant: str = "default"
    # result reuse (flowmesh_sdk.reuse): a deterministic task, or one pinned by a seed, may be
    # answered from the content-addressed store; anything else always runs
    deterministic: bool = False
    seed: int | None = None
    # a mode="auto" pool: strict (a fresh instance) or shared (a fresh container on a warm
    # instance); None: the pool's default.  Not part of the task's identity.
    isolation: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or not self.name.isprintable():
            raise SpecError("task.name", f"must be a non-empty string of printable characters, got {self.name!r}")
        if not isinstance(self.sandbox, SandboxSpec):
            raise SpecError("task.sandbox", "must be a SandboxSpec (e.g. pool.default_sandbox(image) or "
                                            f"SandboxSpec(image=...)), got {self.sandbox!r}")
        if not isinstance(self.tenant, str) or not _TENANT.fullmatch(self.tenant):
            raise SpecError("task.tenant", "must be a tenant name: 1-128 of A-Z a-z 0-9 . _ @ : + -, "
                                           f"starting with a letter or digit; got {self.tenant!r}")
        if not isinstance(self.deterministic, bool):
            raise SpecError("task.deterministic", f"must be true or false, got {self.deterministic!r}")
        if self.seed is not None:
            check_number("task.seed", self.seed, lo=0, hi=2 ** 63 - 1, integer=True)
        if self.isolation is not None:
            check_choice("task.isolation", self.isolation, ISOLATIONS)
        if not isinstance(self.command, str) or not self.command.strip():
            raise SpecError("task.command", "must be a non-empty shell command")
        if "\x00" in self.command:
            raise SpecError("task.command", "must not contain NUL bytes (a shell command is a C string)")
        if self.timeout_s is not None:
            check_number("task.timeout_s", self.timeout_s, lo=0, hi=7 * 86400, lo_open=True)
        if not isinstance(self.files, Mapping):
            raise SpecError("task.files", f"must be a mapping of absolute path -> bytes, got "
                                          f"{type(self.files).__name__}")
        for path, data in dict(self.files).items():
            if not isinstance(path, str) or not path.startswith("/") or "\x00" in path:
                raise SpecError(f"task.files[{path!r}]", "paths must be absolute, without NUL bytes")
            if not isinstance(data, (bytes, bytearray)):
                raise SpecError(f"task.files[{path!r}]", "contents must be bytes")
        object.__setattr__(self, "files", MappingProxyType(dict(self.files)))


@dataclass(frozen=True, slots=True)
class PhaseTimings:
    """Seconds a task spent in each phase (MegaFlow's breakdown)."""

    queued: float = 0.0
    scheduling: float = 0.0
    env_startup: float = 0.0
    execution: float = 0.0
    teardown: float = 0.0

    @property
    def total(self) -> float:
        return self.queued + self.scheduling + self.env_startup + self.execution + self.teardown


@dataclass(frozen=True, slots=True)
class BootstrapStep:
    """One step of bringing an instance up.  ``changed`` is False when the step found
    things already so (a second bootstrap of the same machine changes nothing)."""

    name: str
    seconds: float
    changed: bool
    detail: str = ""


@dataclass(frozen=True, slots=True)
class BootstrapReport:
    """The steps an instance went through before it was READY, in order, timed."""

    instance_id: str
    steps: tuple[BootstrapStep, ...]

    @property
    def total_s(self) -> float:
        return sum(s.seconds for s in self.steps)

    @property
    def changed(self) -> bool:
        return any(s.changed for s in self.steps)

    def summary(self) -> str:
        """One line: ``reach 0.01s, runtime 0.20s (podman 4.3.1), ...``."""
        return ", ".join(f"{s.name} {s.seconds:.2f}s" + (f" ({s.detail})" if s.detail else "")
                         for s in self.steps)


class ReuseKind(str, enum.Enum):
    """How the reuse layer (flowmesh_sdk.reuse) answered one request."""

    EXECUTED = "executed"   # this request ran the work (and published it, when allowed)
    HIT = "hit"             # answered from the content-addressed store; nothing ran
    JOINED = "joined"       # the same work was in flight; this request shared that run
    BYPASSED = "bypassed"   # not eligible for reuse (not deterministic, no seed): it just ran


@dataclass(frozen=True, slots=True)
class Provenance:
    """Where a result came from: the run that first computed it.

    A reused result carries the provenance of the run that computed it, not of the request
    that got it (that request's own record is its lineage entry in the reuse layer)."""

    h_task: str                 # the exact identity of the work (flowmesh_sdk.identity)
    h_exec: str                 # its execution signature
    result_digest: str          # content digest of the stored result record
    task_id: str                # the run that computed it
    tenant: str                 # who asked for that run
    workflow: str | None        # which workflow asked, if any
    fleet: str
    pool: str
    instance_id: str | None
    host: str                   # the machine of the process that published it
    computed_at: float          # wall-clock seconds when it was published
    compute_s: float            # sandbox seconds that run took (what a reuse saves)
    published: bool = True      # False: shared with requests in flight only, not stored


class InfraFailure(str, enum.Enum):
    """Why the infrastructure, not the task's own command, ended a task (docs/api.md).
    A task whose command ran to its end (any exit code, or its timeout) has none."""

    PREEMPTED = "preempted"                # its spot instance was reclaimed by the cloud
    INSTANCE_LOST = "instance_lost"        # its machine went away (heartbeat, reconcile, node or pod gone)
    IMAGE_PULL = "image_pull"              # its image did not resolve or could not be pulled
    CAPACITY = "capacity"                  # no capacity, or a cloud or tenant quota exhausted
    BUDGET = "budget"                      # a launch for it would have exceeded a budget
    COORDINATOR_LOST = "coordinator_lost"  # (shared fleet) the coordinators running it died, past its retries
    SANDBOX_START = "sandbox_start"        # its sandbox (or the machine under it) did not start
    POOL_CLOSED = "pool_closed"            # the pool was draining
    PROVIDER = "provider"                  # a provider call failed otherwise (refused credential, API down)

    @property
    def retried(self) -> bool:
        """Whether a pool dispatches a task again after this (``retry_infra_failures``)."""
        return self in (InfraFailure.PREEMPTED, InfraFailure.INSTANCE_LOST, InfraFailure.COORDINATOR_LOST)


@dataclass(frozen=True, slots=True)
class TaskResult:
    task_id: str
    name: str
    pool: str
    result: ExecResult | None
    phases: PhaseTimings
    error: str | None = None
    instance_id: str | None = None
    image_digest: str | None = None   # the image the task ran, pinned
    reuse: ReuseKind | None = None    # set when the task went through the reuse layer
    provenance: Provenance | None = None
    infra_failure: InfraFailure | None = None   # set when the infrastructure ended it (``error`` says how)
    attempts: int = 1                 # dispatches it took (0: answered without running, a reuse hit)
    cost: float = 0.0                 # $: its share of its instances' cost while it held them (docs/cost-model.md)
    run: str = ""                     # the fleet's run id (Fleet(run=...))

    @property
    def ok(self) -> bool:
        return self.error is None and self.result is not None and self.result.ok
