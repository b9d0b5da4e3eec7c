"""The container runtime (podman or docker CLI) driven through any :class:`Runner`.

It only manages containers: create with limits (detached, or attached with its first
shell channel: :meth:`ContainerRuntime.start`), open a shell channel, one-off exec,
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

Beside this module: :mod:`.runtime_config` (the settings, the probe's findings, the
hardening constants), :mod:`.runtime_args` (the pure flag builders, :func:`pull_error`),
:mod:`.runtime_probe` (the probe's script and what its output means),
:mod:`.runtime_images` (:class:`RuntimeImages`, the image operations: a component each
:class:`ContainerRuntime` makes per use as ``image_ops`` and forwards its image methods
to) and :mod:`.runtime_network` (:class:`SandboxNetwork`, the network rules, made per use
as ``network``); the names of the first two are importable from here too.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from .. import timers
from ..errors import ContainerRuntimeError, ImageNotFoundError, RuntimeMissingError, SpecError
from ..specs import SandboxSpec
from .attached import AttachedChannel
from .runner import Channel, CommandResult, Runner
# the records, constants and pure flag builders live in sibling modules; their old names here
from .runtime_args import gvisor_run_args, pull_error, runtime_flags, ulimit_flags
from .runtime_config import (ATTACHED_PID1, ATTACHED_UP, DEFAULT_USERNS_MAP, GVISOR_BASE_TASKS, GVISOR_HINT,
                             GVISOR_TASKS_PER_PROCESS, IDLE_PID1, INSTALL_HINT, LINK_LOCAL, SANDBOX_CAPABILITIES,
                             SHM_ARGS, ContainerInfo, RuntimeConfig, RuntimeInfo, metadata_networks)
from .runtime_images import RuntimeImages
from .runtime_network import NetworkRules, SandboxNetwork
from .runtime_probe import probe_script, read_probe

__all__ = ["DEFAULT_USERNS_MAP", "GVISOR_BASE_TASKS", "GVISOR_HINT", "GVISOR_TASKS_PER_PROCESS", "IDLE_PID1",
           "INSTALL_HINT", "LINK_LOCAL", "SANDBOX_CAPABILITIES", "SHM_ARGS", "ContainerInfo", "ContainerRuntime",
           "RuntimeConfig", "RuntimeImages", "RuntimeInfo", "gvisor_run_args", "metadata_networks", "pull_error",
           "runtime_flags", "ulimit_flags"]


@dataclass(frozen=True, slots=True)
class _Launch:
    """A sandbox container's ``run`` command line, and its network's rules to apply."""

    binary: str
    argv: list[str]
    net: NetworkRules


class ContainerRuntime:
    def __init__(self, runner: Runner, config: RuntimeConfig | None = None) -> None:
        self.runner = runner
        self.config = config or RuntimeConfig()
        self._info: RuntimeInfo | None = None
        self._removals: list[tuple[list[str], asyncio.Future[None]]] = []   # waiting for the next rm
        self._remover: asyncio.Future[None] | None = None

    @property
    def image_ops(self) -> RuntimeImages:
        """The image operations; they call back into this runtime's (possibly overridden)
        probe.  Made per use, not kept: kept, they would hold this runtime in a reference
        cycle, which only the collector's full passes free (issue 29)."""
        return RuntimeImages(self.runner, self.config, self.probe, self._run)

    @property
    def network(self) -> SandboxNetwork:
        """A sandbox's network rules: checked before its container starts, applied before
        any of its commands runs.  Made per use, as :attr:`image_ops` is."""
        return SandboxNetwork(self.runner, self.config, self.probe, self._run)

    # ---- detection -------------------------------------------------------------
    async def probe(self) -> RuntimeInfo:
        """What the machine's runtime is and allows (cached): one round trip, a script that
        finds the binary, asks its version and reads the host facts the flags depend on."""
        if self._info is not None:
            return self._info
        cfg = self.config
        wanted = ["podman", "docker"] if cfg.binary == "auto" else [cfg.binary]
        out = (await self._sh(probe_script(wanted, disk=cfg.disk_limit_mb is not None))).text()
        self._info = read_probe(out, cfg, wanted, self.runner.label)
        return self._info

    # ---- images (RuntimeImages does the work) ---------------------------------
    async def image_inspect(self, image: str) -> tuple[str, str] | None:
        """``(digest, image id)`` of an image in this machine's store, None when absent
        (:meth:`RuntimeImages.image_inspect`)."""
        return await self.image_ops.image_inspect(image)

    async def pull(self, ref: str, *, tls_verify: bool = True, authfile: str | None = None) -> bool:
        """Pull ``ref``; False when it is already here (:meth:`RuntimeImages.pull`)."""
        return await self.image_ops.pull(ref, tls_verify=tls_verify, authfile=authfile)

    async def commit_and_push(self, container: str, local: str, remote: str, *,
                              tls_verify: bool = True) -> str:
        """Snapshot ``container`` to ``remote``; the pushed digest (:meth:`RuntimeImages.commit_and_push`)."""
        return await self.image_ops.commit_and_push(container, local, remote, tls_verify=tls_verify)

    async def remove_image(self, ref: str) -> bool:
        """Untag ``ref``; False if a container uses it (:meth:`RuntimeImages.remove_image`)."""
        return await self.image_ops.remove_image(ref)

    # ---- containers ------------------------------------------------------------
    async def create(self, name: str, spec: SandboxSpec, labels: Mapping[str, str], *,
                     image: str | None = None) -> str:
        """Start a sandbox container that idles until commands arrive; returns its id.
        ``image`` (a pinned reference or image id) overrides ``spec.image``."""
        launch = await self._launch(name, spec, labels, image, attached=False)
        res = await self._run(launch.argv, check=False)
        if not res.ok:
            await self._remove_failed(launch, name)
            raise self._start_error(spec, res.describe(), res.stderr.decode("utf-8", "replace"))
        cid = res.text().strip().splitlines()[-1]
        try:
            await self.network.apply(cid, launch.net)
        except BaseException:
            await self.remove([cid])
            raise
        return cid

    async def start(self, name: str, spec: SandboxSpec, labels: Mapping[str, str], *,
                    image: str | None = None) -> tuple[str, Channel | None]:
        """:meth:`create`, with the container's first shell channel open: the container runs
        attached (``run -i``), and its PID 1 hands the container's stdio to ``/bin/sh``
        before it idles (``ATTACHED_PID1``).  One runtime process starts a sandbox and its
        first channel, where :meth:`create` and :meth:`open_shell` take two.  Returns the
        container's name (what every other call here takes, as an id) and that channel, an
        :class:`~flowmesh_sdk.remote.attached.AttachedChannel`: its shell's end reads as the
        end of the stream; closing it leaves the container running.  A runtime whose
        container is the instance itself returns no channel (``None``)."""
        launch = await self._launch(name, spec, labels, image, attached=True)
        chan = await self.runner.open_channel(launch.argv)
        try:
            try:
                async with timers.timeout(self.config.command_timeout_s):
                    first = await chan.readline()
            except TimeoutError:
                raise ContainerRuntimeError(f"a container on {self.runner.label} did not start within "
                                            f"{self.config.command_timeout_s:g} s: {chan.stderr_tail()}") from None
            if first != ATTACHED_UP:
                err = await chan.last_words()
                raise self._start_error(spec, f"`{launch.binary} run -i ... {name}` ended: {err}", err)
            await self.network.apply(name, launch.net)
        except BaseException:
            await chan.kill()
            await self._remove_failed(launch, name)
            raise
        return name, AttachedChannel(chan)

    async def _launch(self, name: str, spec: SandboxSpec, labels: Mapping[str, str], image: str | None, *,
                      attached: bool) -> _Launch:
        """The ``run`` command line of a sandbox container, and what its network needs
        once it runs (checked here, before anything starts)."""
        info = await self.probe()
        if "\x00" in spec.workdir:
            raise SpecError("sandbox.workdir", f"must not contain NUL bytes, got {spec.workdir!r}")
        net = await self.network.rules(spec, info)
        run_flags, pids = list(info.run_flags), spec.pids
        if spec.kernel == "gvisor":
            if info.binary != "podman":
                raise RuntimeMissingError(f"kernel='gvisor' needs podman on {self.runner.label}, which runs "
                                          f"{info.binary}")
            if not info.runsc:
                raise RuntimeMissingError(f"kernel='gvisor' needs gVisor's runsc on {self.runner.label}, where "
                                          f"it is not installed: {GVISOR_HINT}")
            run_flags, pids = gvisor_run_args(run_flags, spec.pids)
        # attached: the client holds the container's stdio (not proxying its own signals,
        # and nothing the shell says kept in a container log); detached: `run -d`
        mode = ["-i", "--sig-proxy=false", "--log-driver", "none"] if attached else ["-d"]
        argv = [info.binary, "run", *mode, "--name", name, *run_flags, *info.sandbox_flags,
                "--cpus", f"{spec.cpus:g}", "--memory", f"{spec.memory_mib}m",
                "--memory-swap", f"{spec.memory_mib}m", "--pids-limit", str(pids),
                "--workdir", spec.workdir]
        if not spec.network:
            argv += ["--network", "none"]
        for host, addrs in sorted(net.hosts.items()):
            argv += ["--add-host", f"{host}:{addrs[0]}"]
        for k, v in sorted(labels.items()):
            argv += ["--label", f"{k}={v}"]
        argv += ["--entrypoint", "/bin/sh", image or spec.image, "-c", ATTACHED_PID1 if attached else IDLE_PID1]
        return _Launch(info.binary, argv, net)

    async def _remove_failed(self, launch: _Launch, name: str) -> None:
        """A start can fail after creating the container (a workdir the image lacks, an OCI
        runtime error): remove it by name rather than leave it until drain."""
        await self._run([launch.binary, "rm", "-f", "-t", "0", "--ignore", name], check=False)

    def _start_error(self, spec: SandboxSpec, what: str, stderr: str) -> Exception:
        if "image not known" in stderr or "manifest unknown" in stderr or "pull access denied" in stderr:
            return ImageNotFoundError(spec.image, what)
        hint = ""
        if "session key" in stderr and "quota" in stderr:
            hint = (" (the kernel's key quota of the sandboxes' uid is full: each container's init takes a "
                    "session keyring, the sandboxes of one uid map share one uid, and a uid other than root "
                    "may hold kernel.keys.maxkeys keys, 200 by default; raise it on the machine, e.g. "
                    "`sysctl -w kernel.keys.maxkeys=20000 kernel.keys.maxbytes=2000000`)")
        return ContainerRuntimeError(f"could not start a container on {self.runner.label}: {what}{hint}")

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

