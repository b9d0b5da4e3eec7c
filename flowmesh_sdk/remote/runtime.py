"""The container runtime (podman or docker CLI) driven through any :class:`Runner`.

It only manages containers: create with limits, open a shell channel, one-off exec,
remove, list by label, look up and pull images.  Host quirks are detected, not assumed:

* cgroups v1 with runc installed  -> ``--runtime runc`` (crun refuses hybrid cgroups);
* no CAP_SYS_RESOURCE             -> ``--ulimit`` at or below the hard limits, since the
  runtime's default rlimits would be refused.

Both can be forced through :class:`RuntimeConfig`.

Sandboxes run hostile code, so :meth:`ContainerRuntime.create` hardens every container
(docs/security.md says what each flag buys and what the host needs):

* ``--cap-drop=all`` plus the few capabilities root in a sandbox needs
  (``SANDBOX_CAPABILITIES``) and ``--security-opt no-new-privileges``;
* a user-namespace mapping where the host allows one: ``--userns=auto`` when
  ``/etc/subuid`` has a ``containers`` range (each container its own range), else an
  explicit ``--uidmap 0:100000:65536 --gidmap 0:100000:65536`` when the runner is root and
  the kernel allows user namespaces; otherwise none (root inside is then root on the host,
  still without the dropped capabilities);
* a disk limit: ``--storage-opt size=`` when the storage is overlay on xfs (project
  quota), and always ``--ulimit fsize=`` (no file a sandbox writes, its output included,
  can pass the limit);
* with an egress allow-list (``network=("host:port", "10.0.0.0/8", ...)``): an nftables
  output chain in the container's network namespace (``nsenter -n nft``, from the host)
  that accepts loopback, replies and the listed destinations and refuses the rest at once
  (TCP with a reset, the rest with an ICMP administratively-prohibited);
* with any network: routes of type ``unreachable`` for the cloud metadata addresses
  added inside the container's network namespace from the host (``nsenter -n ip route``)
  before the container is handed out; the sandbox has no CAP_NET_ADMIN to remove them.
  A host without ``nsenter`` and ``ip`` gets an error, not an open metadata server.

A sandbox with ``kernel="gvisor"`` runs under gVisor's ``runsc`` (``--runtime runsc``,
``--runtime-flag network=none``) with the same hardening flags; see :func:`gvisor_run_args`.
"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
from collections.abc import Mapping, Sequence
import logging
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from .. import backends
from ..errors import (AuthError, ContainerRuntimeError, ImageNotFoundError, RegistryUnavailableError,
                      RuntimeMissingError, SpecError, ThrottledError)
from ..specs import SandboxSpec, allow_list_host, check_number
from . import sparse
from .runner import Channel, CommandResult, Runner

INSTALL_HINT = ("install podman: `apt-get install -y podman runc` (Debian/Ubuntu) or "
                "`dnf install -y podman` (Fedora/RHEL); docker works too")

# PID 1 of every sandbox container: sleeps, and exits at once on SIGTERM.
IDLE_PID1 = 'trap "exit 0" TERM INT; while :; do sleep 86400 & wait $!; done'
_CAP_SYS_RESOURCE = 24
_USERNS_MAP = re.compile(r"[0-9]+:[0-9]+:[0-9]+")
log = logging.getLogger("flowmesh.remote.runtime")
# run by the instance's python3 on a committed user-namespaced snapshot (see layershift.py)
_LAYERSHIFT = (Path(__file__).parent / "layershift.py").read_text(encoding="utf-8")

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


def runtime_flags(oci_runtime: str, *, binary: str, cgroups_v2: bool, has_runc: bool) -> list[str]:
    """The ``--runtime`` flag every podman command that starts a container gets (``run``,
    and ``build`` for its RUN steps: imagebuild uses this too).  ``auto``: runc on
    cgroups v1 when it is installed, since crun (podman's first choice once installed)
    refuses hybrid cgroups; ``default``: nothing; anything else is passed as it is."""
    if oci_runtime == "auto":
        return ["--runtime", "runc"] if binary == "podman" and not cgroups_v2 and has_runc else []
    return [] if oci_runtime == "default" else ["--runtime", oci_runtime]


def gvisor_run_args(run_flags: Sequence[str], pids: int) -> tuple[list[str], int]:
    """``run_flags`` for a gVisor sandbox, and the host pids limit it gets.

    The probe's ``--runtime`` gives way to runsc with ``network=none``: gVisor serves only
    its own loopback (SandboxSpec refuses other networks under gVisor; docs/security.md
    says why).  The sandbox's ``pids`` limit is its processes; on the host, gVisor's
    sentry, gofer and per-process stubs are counted instead (:data:`GVISOR_TASKS_PER_PROCESS`),
    so the host limit is set above them and the agent applies ``pids`` inside, as
    RLIMIT_NPROC, which gVisor's kernel counts over the sandbox alone."""
    out: list[str] = []
    flags = list(run_flags)
    i = 0
    while i < len(flags):
        if flags[i] == "--runtime":
            i += 2
            continue
        if not flags[i].startswith("--runtime="):
            out.append(flags[i])
        i += 1
    return ["--runtime", "runsc", "--runtime-flag", "network=none", *out], \
        GVISOR_BASE_TASKS + GVISOR_TASKS_PER_PROCESS * pids


def ulimit_flags(cap_eff: int | None, hard_nofile: str) -> list[str]:
    """``--ulimit`` pins for a host without CAP_SYS_RESOURCE (``cap_eff``: the CapEff mask,
    None when unknown): the runtime cannot raise RLIMIT_NOFILE/NPROC to podman's
    defaults there, so nofile is pinned to at most the host's hard limit."""
    if cap_eff is None or cap_eff >> _CAP_SYS_RESOURCE & 1:
        return []
    n = 4096
    if hard_nofile.strip().isdigit():
        n = min(n, int(hard_nofile.strip()))
    return ["--ulimit", f"nofile={n}:{n}", "--ulimit", "nproc=4096:4096"]


class ContainerRuntime:
    def __init__(self, runner: Runner, config: RuntimeConfig | None = None) -> None:
        self.runner = runner
        self.config = config or RuntimeConfig()
        self._info: RuntimeInfo | None = None
        self._removals: list[tuple[list[str], asyncio.Future[None]]] = []   # waiting for the next rm
        self._remover: asyncio.Future[None] | None = None

    # ---- detection -------------------------------------------------------------
    async def probe(self) -> RuntimeInfo:
        if self._info is not None:
            return self._info
        cfg = self.config
        wanted = ["podman", "docker"] if cfg.binary == "auto" else [cfg.binary]
        found = await self._sh(" || ".join(f"command -v {shlex.quote(b)}" for b in wanted) + " || true")
        path = found.text().strip().splitlines()
        if not path:
            raise RuntimeMissingError(f"no container runtime ({' or '.join(wanted)}) on "
                                      f"{self.runner.label}: {INSTALL_HINT}")
        binary = path[0].rsplit("/", 1)[-1]
        ver = await self._run([binary, "version", "--format", "{{.Client.Version}}"], check=False)
        if not ver.ok:
            raise RuntimeMissingError(f"`{binary}` does not work on {self.runner.label} "
                                      f"({ver.describe()}); {INSTALL_HINT}")
        facts = await self._sh(
            "grep CapEff /proc/self/status | awk '{print $2}'; ulimit -Hn; "
            "[ -e /sys/fs/cgroup/cgroup.controllers ] && echo v2 || echo v1; "
            "command -v runc || echo; id -u; cat /proc/sys/user/max_user_namespaces 2>/dev/null || echo 0; "
            "grep -c '^containers:' /etc/subuid 2>/dev/null || true; "
            "command -v nsenter >/dev/null && command -v ip >/dev/null && echo netns || echo; "
            "command -v nft >/dev/null && echo nft || echo; "
            "command -v runsc >/dev/null && echo runsc || echo")
        lines = facts.text().split("\n")
        cap_hex, hard_nofile, cgroups, runc, uid, max_userns, subuid, netns, nft, runsc = (lines + [""] * 10)[:10]
        flags = runtime_flags(cfg.oci_runtime, binary=binary, cgroups_v2=cgroups == "v2",
                              has_runc=runc.strip() != "")
        if cfg.ulimits is not None:
            for u in cfg.ulimits:
                flags += ["--ulimit", u]
        else:
            try:
                caps: int | None = int(cap_hex.strip(), 16)
            except ValueError:
                caps = None
            flags += ulimit_flags(caps, hard_nofile)
        flags += list(cfg.extra_run_args)
        sandbox: list[str] = []
        if cfg.capabilities is not None:
            sandbox.append("--cap-drop=all")
            if cfg.capabilities:
                sandbox.append("--cap-add=" + ",".join(cfg.capabilities))
        if cfg.no_new_privileges:
            sandbox += ["--security-opt", "no-new-privileges"]
        userns = "none"
        if cfg.userns == "podman-auto" or (cfg.userns == "auto" and binary == "podman"
                                           and uid.strip() == "0" and subuid.strip() not in ("", "0")):
            sandbox.append("--userns=auto")
            userns = "auto"
        elif cfg.userns == "auto" and binary == "podman" and uid.strip() == "0" \
                and max_userns.strip().isdigit() and int(max_userns) > 0:
            userns = DEFAULT_USERNS_MAP
        elif _USERNS_MAP.fullmatch(cfg.userns):
            userns = cfg.userns
        if userns not in ("none", "auto"):
            sandbox += ["--uidmap", userns, "--gidmap", userns]
        sandbox += SHM_ARGS
        quota = False
        if cfg.disk_limit_mb is not None:
            if binary == "podman":
                st = await self._run([binary, "info", "--format",
                                      '{{.Store.GraphDriverName}} {{index .Store.GraphStatus "Backing Filesystem"}}'],
                                     check=False)
                quota = st.ok and st.text().split()[:2] == ["overlay", "xfs"]
            if quota:
                sandbox += ["--storage-opt", f"size={cfg.disk_limit_mb}m"]
            sandbox += ["--ulimit", f"fsize={cfg.disk_limit_mb << 20}"]
        self._info = RuntimeInfo(binary, ver.text().strip(), cgroups, tuple(flags), tuple(sandbox),
                                 userns, quota, netns.strip() == "netns", nft.strip() == "nft",
                                 runsc.strip() == "runsc")
        return self._info

    # ---- images ----------------------------------------------------------------
    async def image_inspect(self, image: str) -> tuple[str, str] | None:
        """``(digest, image id)`` of an image in this machine's store, None when absent.
        The digest is the manifest digest when known, else the image id."""
        info = await self.probe()
        res = await self._run([info.binary, "image", "inspect", "--format",
                               "{{.Digest}} {{.Id}}", image], check=False)
        if not res.ok:
            return None
        digest, _, ident = res.text().strip().partition(" ")
        ident = ident.removeprefix("sha256:")
        return (digest if digest.startswith("sha256:") else f"sha256:{ident}"), ident

    async def pull(self, ref: str, *, tls_verify: bool = True, authfile: str | None = None) -> bool:
        """Pull ``ref`` (normally ``repo@digest``); False (nothing done) when it is already here.

        Errors are the SDK's: ImageNotFoundError, AuthError, ThrottledError (429) and
        RegistryUnavailableError (down, or a layer that failed its digest check), so the
        pull budget can retry what is worth retrying."""
        if await self.image_inspect(ref) is not None:
            return False
        info = await self.probe()
        argv = [info.binary, "pull", "--quiet"]
        if not tls_verify:
            argv.append("--tls-verify=false")
        if authfile:
            argv += ["--authfile", authfile]
        res = await self._run(argv + [ref], check=False, timeout_s=max(self.config.command_timeout_s, 900.0))
        if not res.ok:
            raise pull_error(ref, self.runner.label, res)
        await self._dig_holes(ref)
        return True

    async def commit_and_push(self, container: str, local: str, remote: str, *,
                              tls_verify: bool = True) -> str:
        """Commit ``container``'s filesystem as ``local``, push it to ``remote``
        (``HOST/REPO:TAG``) and return the pushed manifest digest.  ``local`` is removed
        again (the image stays under its digest wherever it is pulled).  The image names
        the container's sparse files in a label, for :meth:`pull` to keep them sparse
        (``remote/sparse.py``)."""
        info = await self.probe()
        holes = await self._sparse_label(container)
        change = ["--change", f"LABEL {sparse.LABEL}={holes}"] if holes else []
        res = await self._run([info.binary, "commit", "--quiet", *change, container, local], check=False,
                              timeout_s=max(self.config.command_timeout_s, 900.0))
        if not res.ok:
            raise ContainerRuntimeError(f"could not commit {container} on {self.runner.label}: "
                                        f"{res.describe()}")
        if info.userns != "none":
            await self._shift_owners(container, local)
        script = ('d=$(mktemp) || exit 1; "$1" push --quiet --tls-verify="$2" --digestfile "$d" "$3" '
                  '"docker://$4" >&2 || { rm -f "$d"; exit 1; }; cat "$d"; rm -f "$d"')
        try:
            res = await self._run(["sh", "-c", script, "sh", info.binary, str(tls_verify).lower(), local, remote],
                                  check=False, timeout_s=max(self.config.command_timeout_s, 900.0))
        finally:
            await self._run([info.binary, "rmi", local], check=False)
        digest = res.text().strip()
        if not res.ok or not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
            raise RegistryUnavailableError(f"push of the snapshot of {container} to {remote} from "
                                           f"{self.runner.label} failed: {res.describe()}",
                                           provider=remote.split("/", 1)[0], code="PushFailed")
        return digest

    async def _sparse_label(self, container: str) -> str:
        """The label value naming ``container``'s sparse files: those of its writable layer
        (listed from the host) and those its image named; "" when none or not found."""
        info = await self.probe()
        res = await self._run([info.binary, "inspect", "--format",
                               "{{.GraphDriver.Data.UpperDir}}\n"
                               f'{{{{index .Config.Labels "{sparse.LABEL}"}}}}', container], check=False)
        upper, _, label = res.text().strip().partition("\n")
        found = b""
        if res.ok and upper.startswith("/"):
            scan = await self.runner.run(["sh", "-c", sparse.SCAN, "sh", upper],
                                         timeout_s=max(self.config.command_timeout_s, 900.0))
            found = b"" if scan.timed_out else scan.stdout     # what find could read
        return sparse.encode(sparse.sparse_paths(found), sparse.decode(label.strip()))

    async def _dig_holes(self, ref: str) -> None:
        """Make the files a pulled snapshot names in its label sparse again in this
        machine's store (podman wrote them in full); a failure leaves them as pulled."""
        info = await self.probe()
        res = await self._run([info.binary, "image", "inspect", "--format",
                               f'{{{{index .Labels "{sparse.LABEL}"}}}}\n'
                               "{{.GraphDriver.Data.UpperDir}}:{{.GraphDriver.Data.LowerDir}}", ref],
                              check=False)
        label, _, dirs = res.text().strip().partition("\n")
        paths = sparse.decode(label.strip())
        layers = [d for d in dirs.split(":") if d.startswith("/")]
        if not res.ok or not paths or not layers:
            return
        dug = await self.runner.run(["sh", "-c", sparse.DIG, "sh", *layers], input=b"\0".join(paths),
                                    timeout_s=max(self.config.command_timeout_s, 900.0))
        if not dug.ok:
            log.warning("the sparse files of %s stay written in full on %s: %s", ref,
                        self.runner.label, dug.describe())

    async def _shift_owners(self, container: str, local: str) -> None:
        """Store the container's own file owners in the committed image ``local`` (podman
        stores the host ids of a user-namespaced container's files; see ``layershift``)."""
        info = await self.probe()
        res = await self._run([info.binary, "inspect", "--format",
                               "{{json .HostConfig.IDMappings}}", container])
        try:
            maps = json.loads(res.text())
            uids, gids = ",".join(maps["UidMap"] or ()), ",".join(maps["GidMap"] or ())
        except (ValueError, KeyError, TypeError) as exc:
            raise ContainerRuntimeError(f"no id map for {container} on {self.runner.label}: "
                                        f"{res.text()[:200]!r}") from exc
        if not uids or not gids:
            return
        script = ('command -v python3 >/dev/null || { echo "snapshots of a sandbox under a user-namespace '
                  'map need python3 on the instance" >&2; exit 3; }; '
                  'd=$(mktemp -d) || exit 1; trap \'rm -rf "$d"\' EXIT; '
                  '"$1" save -q --format oci-dir --uncompressed -o "$d/img" "$2" >&2 || exit 1; '
                  'python3 - "$d/img" "$3" "$4" >&2 || exit 1; '
                  'tar -C "$d/img" -cf "$d/img.tar" . && "$1" rmi "$2" >/dev/null && '
                  '"$1" load -q -i "$d/img.tar" >&2')   # as oci-archive: named by its ref.name, $2
        res = await self.runner.run(["sh", "-c", script, "sh", info.binary, local, uids, gids],
                                    input=_LAYERSHIFT.encode(),
                                    timeout_s=max(self.config.command_timeout_s, 900.0))
        if not res.ok:
            await self._run([info.binary, "rmi", local], check=False)
            raise ContainerRuntimeError(f"could not store {container}'s file owners in its snapshot on "
                                        f"{self.runner.label}: {res.describe()}")

    async def remove_image(self, ref: str) -> bool:
        """Untag ``ref`` (the image goes when its last name does); False if a container uses it."""
        info = await self.probe()
        res = await self._run([info.binary, "rmi", ref], check=False)
        return res.ok

    # ---- containers ------------------------------------------------------------
    async def create(self, name: str, spec: SandboxSpec, labels: Mapping[str, str], *,
                     image: str | None = None) -> str:
        """Start a sandbox container that idles until commands arrive; returns its id.
        ``image`` (a pinned reference or image id) overrides ``spec.image``."""
        info = await self.probe()
        if "\x00" in spec.workdir:
            raise SpecError("sandbox.workdir", f"must not contain NUL bytes, got {spec.workdir!r}")
        allow = spec.network if isinstance(spec.network, tuple) else None
        block = bool(spec.network) and self.config.block_metadata and bool(self.config.metadata_networks)
        if block and not info.netns_tools:
            raise ContainerRuntimeError(
                f"a sandbox with network needs `nsenter` and `ip` on {self.runner.label} (and root) "
                "to make the cloud metadata address unreachable from it; install util-linux and iproute2, "
                "or set RuntimeConfig(block_metadata=False) where no metadata service exists")
        if allow is not None and not (info.netns_tools and info.nft):
            raise ContainerRuntimeError(
                f"a sandbox with an egress allow-list needs `nsenter` and `nft` on {self.runner.label} "
                "(and root) to enforce it; install util-linux and nftables (`apt-get install -y nftables`)")
        run_flags, pids = list(info.run_flags), spec.pids
        if spec.kernel == "gvisor":
            if info.binary != "podman":
                raise RuntimeMissingError(f"kernel='gvisor' needs podman on {self.runner.label}, which runs "
                                          f"{info.binary}")
            if not info.runsc:
                raise RuntimeMissingError(f"kernel='gvisor' needs gVisor's runsc on {self.runner.label}, where "
                                          f"it is not installed: {GVISOR_HINT}")
            run_flags, pids = gvisor_run_args(run_flags, spec.pids)
        hosts: dict[str, list[str]] = {}
        if allow is not None:
            hosts = await self._resolve([h for e in allow if (h := allow_list_host(e)) is not None])
        argv = [info.binary, "run", "-d", "--name", name, *run_flags, *info.sandbox_flags,
                "--cpus", f"{spec.cpus:g}", "--memory", f"{spec.memory_mib}m",
                "--memory-swap", f"{spec.memory_mib}m", "--pids-limit", str(pids),
                "--workdir", spec.workdir]
        if not spec.network:
            argv += ["--network", "none"]
        for host, addrs in sorted(hosts.items()):
            argv += ["--add-host", f"{host}:{addrs[0]}"]
        for k, v in sorted(labels.items()):
            argv += ["--label", f"{k}={v}"]
        argv += ["--entrypoint", "/bin/sh", image or spec.image, "-c", IDLE_PID1]
        res = await self._run(argv, check=False)
        if not res.ok:
            # `run -d` can fail after creating the container (a workdir the image lacks,
            # an OCI runtime error): remove it by name rather than leave it until drain.
            await self._run([info.binary, "rm", "-f", "-t", "0", "--ignore", name], check=False)
            err = res.stderr.decode("utf-8", "replace")
            if "image not known" in err or "manifest unknown" in err or "pull access denied" in err:
                raise ImageNotFoundError(spec.image, res.describe())
            raise ContainerRuntimeError(f"could not start a container on {self.runner.label}: {res.describe()}")
        cid = res.text().strip().splitlines()[-1]
        if block or allow is not None:
            try:
                if block:
                    await self._block_networks(cid)
                if allow is not None:
                    await self._allow_only(cid, allow, hosts)
            except BaseException:
                await self.remove([cid])
                raise
        return cid

    async def _resolve(self, names: Sequence[str]) -> dict[str, list[str]]:
        """Addresses of allow-list host names, resolved on the machine that runs the sandbox."""
        out: dict[str, list[str]] = {}
        for name in sorted(set(names)):
            res = await self._run(["getent", "ahosts", name], check=False)
            addrs: list[str] = []
            for line in res.text().splitlines():
                addr = line.split()[0] if line.split() else ""
                if addr and addr not in addrs:
                    addrs.append(addr)
            if not res.ok or not addrs:
                raise ContainerRuntimeError(f"the allow-list host {name} does not resolve on "
                                            f"{self.runner.label}: {res.describe()}")
            out[name] = sorted(addrs, key=lambda a: (":" in a, a))
        return out

    def egress_ruleset(self, allow: Sequence[str], hosts: Mapping[str, Sequence[str]]) -> str:
        """The nftables ruleset that lets a sandbox reach only ``allow`` (and never the
        metadata networks): loopback and replies pass, everything else is refused at once,
        TCP with a reset and the rest with an ICMP administratively-prohibited, IPv4 and
        IPv6 alike.  (Only ICMP for TCP would leave a connect waiting a second now and then:
        an ICMP error that arrives while ``connect()`` still holds its socket is only a soft
        error, and the connection fails at the SYN's retransmission.)"""
        rules = ['oifname "lo" accept', "ct state established,related accept"]
        for net in self.config.metadata_networks:
            fam = "ip6" if ":" in net else "ip"
            rules += _refuse(f"{fam} daddr {net} ")
        for entry in allow:
            if "/" in entry:
                fam = "ip6" if ":" in entry else "ip"
                rules.append(f"{fam} daddr {entry} accept")
                continue
            host, _, port = entry.rpartition(":")
            addrs = list(hosts.get(host, ())) if allow_list_host(entry) else [host.strip("[]")]
            for addr in addrs:
                fam = "ip6" if ":" in addr else "ip"
                rules += [f"{fam} daddr {addr} tcp dport {int(port)} accept",
                          f"{fam} daddr {addr} udp dport {int(port)} accept"]
        rules += _refuse("")
        body = "".join(f"    {r}\n" for r in rules)
        return ("table inet flowmesh_egress {\n  chain out {\n"
                "    type filter hook output priority 0; policy drop;\n" + body + "  }\n}\n")

    async def _allow_only(self, container: str, allow: Sequence[str],
                          hosts: Mapping[str, Sequence[str]]) -> None:
        """Enforce the egress allow-list inside the container's network namespace, from the
        host (the sandbox holds no CAP_NET_ADMIN to change it)."""
        info = await self.probe()
        script = ('pid=$("$1" inspect --format "{{.State.Pid}}" "$2") && [ "${pid:-0}" -gt 0 ] || '
                  '{ echo "no pid for $2" >&2; exit 1; }; exec nsenter -t "$pid" -n nft -f -')
        res = await self.runner.run(["sh", "-c", script, "sh", info.binary, container],
                                    timeout_s=self.config.command_timeout_s,
                                    input=self.egress_ruleset(allow, hosts).encode())
        if not res.ok:
            raise ContainerRuntimeError(f"could not apply the egress allow-list to {container} on "
                                        f"{self.runner.label}: {res.describe()}")

    async def _block_networks(self, container: str) -> None:
        """Make the metadata addresses unreachable inside the container's network namespace
        (from the host: the sandbox itself holds no CAP_NET_ADMIN to undo it)."""
        info = await self.probe()
        v4 = [n for n in self.config.metadata_networks if ":" not in n]
        v6 = [n for n in self.config.metadata_networks if ":" in n]
        script = ('pid=$("$1" inspect --format "{{.State.Pid}}" "$2") && [ "${pid:-0}" -gt 0 ] || '
                  '{ echo "no pid for $2" >&2; exit 1; }; shift 2; '
                  + "".join(f'nsenter -t "$pid" -n ip route add unreachable {shlex.quote(n)} || exit 1; '
                            for n in v4)
                  # IPv6 may be off in the namespace: then there is no v6 route to block
                  + "".join(f'nsenter -t "$pid" -n ip -6 route add unreachable {shlex.quote(n)} '
                            '2>/dev/null || true; ' for n in v6))
        res = await self._run(["sh", "-c", script, "sh", info.binary, container], check=False)
        if not res.ok:
            raise ContainerRuntimeError(f"could not block the metadata addresses in {container} on "
                                        f"{self.runner.label}: {res.describe()}")

    async def open_shell(self, container: str, argv: Sequence[str] = ("/bin/sh",)) -> Channel:
        """``argv`` (a shell) in the container, spoken to over its stdin and stdout."""
        info = await self.probe()
        return await self.runner.open_channel([info.binary, "exec", "-i", container, *argv])

    async def open_tty(self, container: str, argv: Sequence[str]) -> Channel:
        """``argv`` in the container on a pseudo-terminal of its own (``exec -i -t``): what
        it writes to the terminal, stdout and stderr alike, is the channel's stdout."""
        info = await self.probe()
        return await self.runner.open_channel([info.binary, "exec", "-i", "-t", container, *argv])

    async def exec_once(self, container: str, argv: Sequence[str], *, input: bytes | None = None,
                        timeout_s: float | None = None) -> CommandResult:
        info = await self.probe()
        cmd = [info.binary, "exec"] + (["-i"] if input is not None else []) + [container, *argv]
        return await self.runner.run(cmd, timeout_s=timeout_s or self.config.command_timeout_s,
                                     input=input)

    async def remove(self, containers: Sequence[str]) -> None:
        """Force-remove containers; a container already gone is not an error.  Calls that
        come while a removal runs wait and go together in the next one (one ``rm`` for a
        burst of sandboxes ending, not one process each); the removal happens even if the
        caller is cancelled."""
        if not containers:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())   # retrieved, if the caller left
        self._removals.append((list(containers), fut))
        if self._remover is None or self._remover.done():
            self._remover = asyncio.ensure_future(self._remove_batches())
        await asyncio.shield(fut)

    async def _remove_batches(self) -> None:
        while self._removals:
            batch, self._removals = self._removals, []
            try:
                await self._remove_now([c for cs, _ in batch for c in cs])
            except BaseException as exc:
                for _, f in batch:
                    if not f.done():
                        f.set_exception(exc)
                if not isinstance(exc, Exception):
                    raise
            else:
                for _, f in batch:
                    if not f.done():
                        f.set_result(None)

    async def _remove_now(self, containers: Sequence[str]) -> None:
        info = await self.probe()
        res = await self._run([info.binary, "rm", "-f", "-t", "0", "--ignore", *containers],
                              check=False)
        if not res.ok:
            raise ContainerRuntimeError(f"could not remove containers on {self.runner.label}: {res.describe()}")

    async def list(self, labels: Mapping[str, str] | None = None,
                   label_keys: Sequence[str] = ()) -> list[ContainerInfo]:
        info = await self.probe()
        argv = [info.binary, "ps", "-a", "--format", "json"]
        for k, v in (labels or {}).items():
            argv += ["--filter", f"label={k}={v}"]
        for k in label_keys:
            argv += ["--filter", f"label={k}"]
        res = await self._run(argv)
        rows = json.loads(res.stdout or b"[]") or []
        return [ContainerInfo(id=r.get("Id") or r.get("ID", ""),
                              name=(r.get("Names") or [""])[0] if isinstance(r.get("Names"), list)
                              else str(r.get("Names", "")),
                              image=r.get("Image", ""), state=str(r.get("State", "")),
                              labels=MappingProxyType(dict(r.get("Labels") or {})))
                for r in rows]

    # ---- helpers ---------------------------------------------------------------
    async def _sh(self, script: str) -> CommandResult:
        return await self._run(["sh", "-c", script])

    async def _run(self, argv: Sequence[str], *, check: bool = True,
                   timeout_s: float | None = None) -> CommandResult:
        res = await self.runner.run(argv, timeout_s=timeout_s or self.config.command_timeout_s)
        if check and not res.ok:
            raise ContainerRuntimeError(f"on {self.runner.label}: {res.describe()}")
        return res


def _refuse(match: str) -> list[str]:
    """nft rules that refuse what ``match`` selects at once: TCP with a reset, the rest with
    an ICMP administratively-prohibited (``icmpx``: ICMPv4 or ICMPv6 as the packet is)."""
    return [f"{match}meta l4proto tcp reject with tcp reset",
            f"{match}reject with icmpx type admin-prohibited"]


def pull_error(ref: str, where: str, res: CommandResult) -> Exception:
    """Map a failed ``pull`` to the SDK's error classes by what the runtime printed."""
    err = res.stderr.decode("utf-8", "replace")
    low = err.lower()
    registry = ref.split("/", 1)[0]
    msg = f"pull of {ref} on {where} failed: {res.describe()}"
    if "toomanyrequests" in low or "too many requests" in low:
        return ThrottledError(msg, provider=registry, code="TooManyRequests")
    if "unauthorized" in low or "authentication required" in low or "denied" in low:
        return AuthError(f"registry {registry} refused the pull of {ref}; log in with "
                         f"`podman login {registry}` ({res.describe()})", provider=registry,
                         code="Unauthorized")
    if "manifest unknown" in low or "name unknown" in low or "not found" in low:
        return ImageNotFoundError(ref, f"{where}: {res.describe()}")
    if "digest" in low and ("mismatch" in low or "did not match" in low):
        return RegistryUnavailableError(f"{msg} (a layer failed its digest check; not used)",
                                        provider=registry, code="DigestMismatch")
    return RegistryUnavailableError(msg, provider=registry, code="PullFailed")
