"""The container runtime's settings and what its probe finds: :class:`RuntimeConfig`,
:class:`RuntimeInfo`, :class:`ContainerInfo`, and the constants the sandbox hardening
uses (capabilities kept, the metadata networks blocked, the user-namespace map, gVisor's
task budget).  Re-exported from :mod:`.runtime`, where they were defined first.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from .. import backends
from ..errors import SpecError
from ..specs import check_number


INSTALL_HINT = ("install podman: `apt-get install -y podman runc` (Debian/Ubuntu) or "
                "`dnf install -y podman` (Fedora/RHEL); docker works too")

#: the line between the sections of the runtime probe's one script (``ContainerRuntime.probe``)
PROBE_SECTION = "--fm-probe--"

# PID 1 of every sandbox container: sleeps, and exits at once on SIGTERM.
IDLE_PID1 = 'trap "exit 0" TERM INT; while :; do sleep 86400 & wait $!; done'
#: what PID 1 of a container started attached (``ContainerRuntime.start``) writes first
ATTACHED_UP = b"__FM_UP__\n"
#: what it writes once the shell on the container's own stdio has ended
ATTACHED_GONE = b"__FM_GONE__\n"
# PID 1 of a container started attached: it hands the container's stdio to a shell (the
# first channel), keeps none of it itself, says when that shell has ended (the attach
# stream itself ends only with the container), and then is IDLE_PID1.
_UP, _GONE = ATTACHED_UP.decode().strip(), ATTACHED_GONE.decode().strip()
ATTACHED_PID1 = (f"exec 3<&0 4>&1 5>&2 </dev/null >/dev/null 2>&1; echo {_UP} >&4; "
                 f"{{ /bin/sh <&3 >&4 2>&5 3<&- 4>&- 5>&-; printf '\\n{_GONE}\\n' >&4; }} & "
                 f"exec 3<&- 4>&- 5>&-; {IDLE_PID1}")
_CAP_SYS_RESOURCE = 24
_USERNS_MAP = re.compile(r"[0-9]+:[0-9]+:[0-9]+")

#: what root in a sandbox keeps: own and chmod files it did not create (tar, pip, git
#: checkouts of other uids), override file modes, kill its own processes of any uid,
#: and switch uid/gid (su, apt's _apt sandbox).  Everything else (raw sockets, mknod,
#: chroot, setcap/setpcap, binding ports < 1024, audit, ...) is dropped.
SANDBOX_CAPABILITIES = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID")
#: cloud metadata services: link-local (most clouds'), and those each installed provider's
#: descriptor names beyond it (an IPv6 one, one outside link-local)
LINK_LOCAL = "169.254.0.0/16"


def metadata_networks() -> tuple[str, ...]:
    return (LINK_LOCAL, *(n for n in backends.metadata_networks() if n != LINK_LOCAL))


DEFAULT_USERNS_MAP = "0:100000:65536"
# A container's /dev/shm as a tmpfs that runc mounts inside it (podman's size and flags).
# podman 4.3's own /dev/shm is a mount on the host (userdata/shm); a container that is being
# created meanwhile, or started later in a user namespace, keeps a copy of that mount in its
# mount namespace, and `rm` of the first fails with EBUSY.  This one has no host side.
SHM_ARGS = ("--ipc", "none", "--tmpfs", "/dev/shm:rw,nosuid,nodev,noexec,size=65536k")
GVISOR_HINT = "install gVisor: `apt-get install -y runsc` (Debian/Ubuntu; setup.sh does)"
#: host tasks a gVisor sandbox holds (runsc's ptrace platform: a stub process per address
#: space, with a thread per sentry thread that used it), measured on this project's
#: machine: sentry and gofer idle at 45-55; about 8 more per process that lives; up to
#: about 50 per process while processes come and go (a fork bomb held to 32 processes by
#: RLIMIT_NPROC peaked at 1,636).  The host's pids limit is set above that, as a backstop:
#: the sandbox's own limit is gVisor's RLIMIT_NPROC (a sentry that cannot make a thread
#: panics, and the sandbox is lost)
GVISOR_BASE_TASKS = 64
GVISOR_TASKS_PER_PROCESS = 64


@dataclass(frozen=True, slots=True)
class RuntimeConfig:
    """How to drive the container runtime on one machine.

    ``binary``: ``auto`` (podman, else docker), ``podman`` or ``docker``.
    ``oci_runtime``: ``auto``, ``default`` (pass nothing) or a name such as ``runc``.
    ``ulimits``: None detects; a tuple such as ``("nofile=4096:4096",)`` forces.

    Sandbox hardening (applied by :meth:`ContainerRuntime.create` only, not to GPU workers):

    ``capabilities``: what a sandbox keeps after ``--cap-drop=all``; None leaves the
    runtime's default set (not recommended).
    ``no_new_privileges``: ``--security-opt no-new-privileges`` (setuid binaries do not elevate).
    ``userns``: ``auto`` detects (``--userns=auto`` with a ``containers`` subuid range,
    else the explicit map ``0:100000:65536`` when the runner is root); ``podman-auto``
    forces ``--userns=auto``; ``host`` maps nothing; ``"0:HOSTID:COUNT"`` forces that map.
    ``disk_limit_mb``: per-sandbox disk limit (None: none).
    ``block_metadata``: make ``metadata_networks`` unreachable inside sandboxes that have
    network; ``False`` only where no metadata service exists.
    ``snapshot_registry`` (``HOST[:PORT]``) and ``snapshot_repository``: where
    ``Sandbox.snapshot()`` pushes the images it commits (None: snapshot needs a registry
    argument).  A loopback registry is spoken to over plain HTTP.
    """

    binary: str = "auto"
    oci_runtime: str = "auto"
    ulimits: tuple[str, ...] | None = None
    extra_run_args: tuple[str, ...] = ()
    command_timeout_s: float = 120.0
    capabilities: tuple[str, ...] | None = SANDBOX_CAPABILITIES
    no_new_privileges: bool = True
    userns: str = "auto"
    disk_limit_mb: int | None = 10240
    block_metadata: bool = True
    metadata_networks: tuple[str, ...] = field(default_factory=metadata_networks)
    snapshot_registry: str | None = None
    snapshot_repository: str = "flowmesh/snapshots"

    def __post_init__(self) -> None:
        for name in ("ulimits", "extra_run_args", "capabilities", "metadata_networks"):
            val = getattr(self, name)
            if isinstance(val, str):
                raise SpecError(f"runtime.{name}", f"must be a tuple of strings, got the string {val!r}")
            if val is not None:
                object.__setattr__(self, name, tuple(val))
        for cap in self.capabilities or ():
            if not re.fullmatch(r"(CAP_)?[A-Z_]+", cap):
                raise SpecError("runtime.capabilities", f"not a capability name: {cap!r}")
        if self.userns not in ("auto", "podman-auto", "host") and not _USERNS_MAP.fullmatch(self.userns):
            raise SpecError("runtime.userns", "must be auto, podman-auto, host or CONTAINER:HOST:COUNT, "
                                              f"got {self.userns!r}")
        if self.snapshot_registry is not None and not re.fullmatch(
                r"[A-Za-z0-9.-]+(:[0-9]{1,5})?|\[[0-9a-fA-F:]+\](:[0-9]{1,5})?", self.snapshot_registry):
            raise SpecError("runtime.snapshot_registry", f"must be HOST or HOST:PORT, got {self.snapshot_registry!r}")
        if not re.fullmatch(r"[a-z0-9]+([._-][a-z0-9]+)*(/[a-z0-9]+([._-][a-z0-9]+)*)*", self.snapshot_repository):
            raise SpecError("runtime.snapshot_repository", "must be a lower-case repository path, got "
                                                           f"{self.snapshot_repository!r}")
        if self.disk_limit_mb is not None:
            check_number("runtime.disk_limit_mb", self.disk_limit_mb, lo=1, hi=1 << 30, integer=True)


@dataclass(frozen=True, slots=True)
class RuntimeInfo:
    """What the probe found.  ``run_flags`` make any container start on this host (GPU
    workers use them too); ``sandbox_flags`` are the hardening added to sandboxes only;
    ``userns`` names the mapping in use (``auto``, ``0:100000:65536``, or ``none``);
    ``disk_quota`` says whether the storage enforces ``--storage-opt size``;
    ``netns_tools`` whether ``nsenter`` and ``ip`` are there to block metadata addresses;
    ``nft`` whether ``nft`` is there to enforce egress allow-lists; ``runsc`` whether
    gVisor's runtime is there (``kernel="gvisor"``)."""

    binary: str
    version: str
    cgroups: str
    run_flags: tuple[str, ...]
    sandbox_flags: tuple[str, ...] = ()
    userns: str = "none"
    disk_quota: bool = False
    netns_tools: bool = False
    nft: bool = False
    runsc: bool = False


@dataclass(frozen=True, slots=True)
class ContainerInfo:
    id: str
    name: str
    image: str
    state: str
    labels: Mapping[str, str] = field(default_factory=dict)
