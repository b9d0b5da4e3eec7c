"""What a provider declares to the core: one :class:`ProviderDescriptor` per provider
package, exported through the entry-point group ``flowmesh_sdk.providers``.

The core names no cloud.  Everything it needs to know of one -- the names it goes by, how
its instance types mark Arm, where its image registries live, how fast its API lets
instances be launched and how long they take to boot, how it bills, what its spot market
is like, where its prices come from, the settings it reads, its metadata addresses -- is in
the provider's descriptor, next to the provider's code (``providers/<name>/descriptor.py``).
:mod:`flowmesh_sdk.backends` finds the installed descriptors; the catalog, the bidder, the
placement, the settings and the sandbox firewall read them there.

The records here sit at the bottom of the house (beside :mod:`.specs`): a descriptor
module imports this module only, so reading every installed descriptor imports no cloud
SDK and no provider code.  References to code (the provider class, the price adapter,
the emulator, the conformance environment) are ``"module:attribute"`` strings, imported
when first used.
"""

from __future__ import annotations

import importlib
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from .errors import SpecError

HOURS_PER_MONTH = 730.0
DEFAULT_SPOT_MONTHLY_INTERRUPTION = 0.10
BOOT_ASSUMPTION = ("assumption: ~45 s from an accepted launch to a reachable instance "
                   "(FlowMesh reports 30-60 s provisioning lag on its marketplace backend; MegaFlow ~1 min "
                   "single-task startup)")
SPOT_MARKETS = ("reclaim", "bid")


@dataclass(frozen=True, slots=True)
class ApiRate:
    """A published API limit, enforced client-side by a token bucket per provider, region
    and API: ``burst`` tokens, refilled at ``rate_per_s``.  ``per_instance``: one token per
    instance asked for (a resource bucket) rather than one per call."""

    api: str                      # "launch", "describe", "terminate", "list"
    rate_per_s: float
    burst: float
    per_instance: bool = False


@dataclass(frozen=True, slots=True)
class Bucket:
    """A token bucket: ``capacity`` tokens, refilled at ``refill_per_s``.  ``per_instance``:
    one token per instance launched (a resource bucket), else one per call."""

    capacity: float
    refill_per_s: float
    per_instance: bool = False

    def __post_init__(self) -> None:
        if not self.capacity > 0 or not self.refill_per_s > 0:
            raise SpecError("bucket", f"capacity and refill must be > 0, got {self.capacity}, {self.refill_per_s}")


@dataclass(frozen=True, slots=True)
class ProviderProfile:
    """How a provider's control plane launches and bills: the API rates the provider's
    client keeps to (:attr:`rates`, one copy: the provider's ``Capabilities.rates`` are
    these), the most instances one launch call asks for, the time from an accepted launch
    to a reachable instance, the shortest billed period, and the spot market.

    ``spot_market``: ``"reclaim"`` -- the cloud takes spot capacity back at the hazard of
    :attr:`spot_monthly_interruption`; ``"bid"`` -- an interruptible market priced by bids
    on hosts of their own reliability (Vast.ai): the hazard is the host's and being outbid.
    Boot time and interruption rates are assumptions unless a source says otherwise; every
    figure can be overridden with :func:`dataclasses.replace`."""

    provider: str
    rates: tuple[ApiRate, ...] = ()
    max_batch: int = 1
    boot_s: float = 45.0
    spot_monthly_interruption: float = DEFAULT_SPOT_MONTHLY_INTERRUPTION
    rates_source: str = ""
    boot_source: str = BOOT_ASSUMPTION
    billing_min_s: float = 60.0   # shortest billed period of one instance
    spot_market: Literal["reclaim", "bid"] = "reclaim"

    def __post_init__(self) -> None:
        if self.max_batch < 1:
            raise SpecError("max_batch", f"must be >= 1, got {self.max_batch}")
        if self.boot_s < 0:
            raise SpecError("boot_s", f"must be >= 0, got {self.boot_s}")
        if not 0 <= self.spot_monthly_interruption < 1:
            raise SpecError("spot_monthly_interruption", f"must be in [0, 1), got {self.spot_monthly_interruption}")
        if self.spot_market not in SPOT_MARKETS:
            raise SpecError("spot_market", f"must be one of {', '.join(SPOT_MARKETS)}, got {self.spot_market!r}")

    @property
    def buckets(self) -> tuple[Bucket, ...]:
        """The launch API's buckets (what the estimate plays launches through); none when
        the provider declares no launch rate."""
        return tuple(Bucket(r.burst, r.rate_per_s, r.per_instance) for r in self.rates if r.api == "launch")

    @property
    def spot_hazard_per_hour(self) -> float:
        return -math.log(1.0 - self.spot_monthly_interruption) / HOURS_PER_MONTH


@dataclass(frozen=True, slots=True)
class Setting:
    key: str                              # dotted name, as in the config file
    env: tuple[str, ...]                  # environment variables, the first one set wins
    kind: type = str                      # str, float, int or bool
    default: Callable[[], Any] | None = None
    secret: bool = False                  # the whole value (a URL's password is always hidden: see Resolved.safe)
    help: str = ""


def unlimited_profile(provider: str) -> ProviderProfile:
    """The profile of a provider that declares none: no launch rate limit, and it says so."""
    return ProviderProfile(provider, max_batch=1000,
                           rates_source=f"no profile for {provider!r}: launch rate not limited in this estimate")


_REF = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")        # module:attribute
_FILE_REF = re.compile(r"^[A-Za-z_][\w.]*:[\w.-]+$")         # package:file
_NAME = re.compile(r"^[a-z][a-z0-9]*$")


@dataclass(frozen=True, slots=True)
class ProviderDescriptor:
    """One provider, as the core knows it.

    ``name``: the name pools, ``infra`` entries and catalog rows use (lowercase letters and
    digits).  ``provider``: ``"module:Class"`` of the :class:`~flowmesh_sdk.provider.Provider`.
    ``aliases``: other spellings accepted where names are read (the shared price data's
    ``aws``, ``gcp``).  ``arm_types``: a regular expression matching the instance types
    that are Arm by the cloud's naming convention (catalog rows without an ``arch``).
    ``registry_hosts``: regular expressions of the cloud's image-registry hosts, group 1
    the region (G_loc, registry locality).  ``profile``: see :class:`ProviderProfile`.
    ``prices``: ``"module:function"`` of the live price adapter (``flowmesh catalog
    refresh``).  ``snapshot``: ``"package:file"`` of the shipped price catalog (CSV, the
    format of ``flowmesh_sdk/catalog/data/README.md``); a provider with none is not in the
    catalog (its machines are free, or priced by their marketplace).  ``settings``: the
    settings its code reads (``providers.<name>.*``).  ``metadata_networks``: addresses of
    the cloud's instance-metadata service, which every sandbox's firewall blocks.
    ``emulator``: ``"module:Class"`` of the local emulator tests use.  ``conformance``:
    ``"module:function"`` of its environment for the provider conformance suite
    (:mod:`flowmesh_sdk.testing.conformance`)."""

    name: str
    provider: str
    aliases: tuple[str, ...] = ()
    arm_types: str | None = None
    registry_hosts: tuple[str, ...] = ()
    profile: ProviderProfile | None = None
    prices: str | None = None
    snapshot: str | None = None
    settings: tuple[Setting, ...] = ()
    metadata_networks: tuple[str, ...] = ()
    emulator: str | None = None
    conformance: str | None = None
    _compiled: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        where = f"provider descriptor {self.name!r}"
        if not _NAME.fullmatch(self.name):
            raise SpecError(f"{where}.name", "must be lowercase letters and digits, starting with a letter")
        for f in ("provider", "prices", "snapshot", "emulator", "conformance"):
            ref = getattr(self, f)
            rx, form = (_FILE_REF, "package:file") if f == "snapshot" else (_REF, "module:attribute")
            if ref is not None and not rx.fullmatch(ref):
                raise SpecError(f"{where}.{f}", f"must be '{form}', got {ref!r}")
        for a in self.aliases:
            if not _NAME.fullmatch(a) or a == self.name:
                raise SpecError(f"{where}.aliases", f"must be other lowercase names, got {a!r}")
        if self.profile is not None and self.profile.provider != self.name:
            raise SpecError(f"{where}.profile", f"is the profile of {self.profile.provider!r}")
        for s in self.settings:
            if not s.key.startswith(f"providers.{self.name}."):
                raise SpecError(f"{where}.settings", f"{s.key!r} must be under providers.{self.name}.")
        try:
            self._compiled["arm"] = re.compile(self.arm_types, re.I) if self.arm_types else None
            self._compiled["registry"] = tuple(re.compile(p) for p in self.registry_hosts)
        except re.error as exc:
            raise SpecError(f"{where}.arm_types/registry_hosts", f"not a regular expression: {exc}") from exc

    def is_arm(self, instance_type: str) -> bool:
        rx = self._compiled["arm"]
        return rx is not None and rx.match(instance_type) is not None

    def registry_region(self, host: str) -> str | None:
        """The region of one of this cloud's registry hosts (None: not one of its hosts)."""
        for rx in self._compiled["registry"]:
            m = rx.match(host)
            if m:
                return m.group(1)
        return None

    @property
    def launch_profile(self) -> ProviderProfile:
        """The profile, or one with no rate limit that says so."""
        return self.profile if self.profile is not None else unlimited_profile(self.name)


def load_ref(ref: str, field_name: str) -> Any:
    """The object a ``"module:attribute"`` reference names."""
    module, _, attr = ref.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise SpecError(field_name, f"{ref!r} cannot be loaded: {type(exc).__name__}: {exc}") from exc


__all__ = ["ApiRate", "BOOT_ASSUMPTION", "Bucket", "DEFAULT_SPOT_MONTHLY_INTERRUPTION", "HOURS_PER_MONTH",
           "ProviderDescriptor", "ProviderProfile", "SPOT_MARKETS", "Setting", "load_ref",
           "unlimited_profile"]
