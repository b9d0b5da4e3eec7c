"""One container: :class:`SandboxSpec`, and its network policy (none, all, or an allow-list)."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..errors import SpecError
from ..registry.reference import ImageRef
from .checks import check_choice, check_number, frozen_env

# What the container runtime accepts: podman refuses a CFS quota under 1 ms of its 100 ms
# period ("CPU cfs quota cannot be less than 1ms"), i.e. cpus < 0.01; Docker refuses a
# memory limit under 6 MB ("Minimum memory limit allowed is 6MB"), and a sandbox must
# start on either.
MIN_SANDBOX_CPUS = 0.01
MIN_SANDBOX_MEMORY_GB = 6 / 1024
#: what serves a sandbox's system calls: the instance's kernel (runc), or gVisor's (runsc)
KERNELS = ("host", "gvisor")


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
