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
hardening constants), :mod:`.runtime_args` (the pure flag builders, :func:`pull_error`)
and :mod:`.runtime_images` (:class:`RuntimeImages`, the image operations: a component each
:class:`ContainerRuntime` makes per use as ``image_ops`` and forwards its image methods
to); their names are importable from here too.
"""

from __future__ import annotations

import asyncio
import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from ..errors import ContainerRuntimeError, ImageNotFoundError, RuntimeMissingError, SpecError
from ..specs import SandboxSpec, allow_list_host
from .attached import AttachedChannel
from .runner import Channel, CommandResult, Runner
# the records, constants and pure flag builders live in sibling modules; their old names here
from .runtime_args import _refuse, gvisor_run_args, pull_error, runtime_flags, ulimit_flags
from .runtime_config import (_USERNS_MAP, ATTACHED_PID1, ATTACHED_UP, DEFAULT_USERNS_MAP, GVISOR_BASE_TASKS,
                             GVISOR_HINT, GVISOR_TASKS_PER_PROCESS, IDLE_PID1, INSTALL_HINT, LINK_LOCAL,
                             PROBE_SECTION, SANDBOX_CAPABILITIES, SHM_ARGS, ContainerInfo, RuntimeConfig,
                             RuntimeInfo, metadata_networks)
from .runtime_images import RuntimeImages

__all__ = ["DEFAULT_USERNS_MAP", "GVISOR_BASE_TASKS", "GVISOR_HINT", "GVISOR_TASKS_PER_PROCESS", "IDLE_PID1",
           "INSTALL_HINT", "LINK_LOCAL", "SANDBOX_CAPABILITIES", "SHM_ARGS", "ContainerInfo", "ContainerRuntime",
           "RuntimeConfig", "RuntimeImages", "RuntimeInfo", "gvisor_run_args", "metadata_networks", "pull_error",
           "runtime_flags", "ulimit_flags"]


@dataclass(frozen=True, slots=True)
class _Launch:
    """A sandbox container's ``run`` command line, and its network's rules to apply."""

    binary: str
    argv: list[str]
    block: bool                          # the metadata networks made unreachable
    allow: tuple[str, ...] | None        # the egress allow-list, if any
    hosts: Mapping[str, Sequence[str]]   # its host names, resolved


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

    # ---- detection -------------------------------------------------------------
    async def probe(self) -> RuntimeInfo:
        """What the machine's runtime is and allows (cached): one round trip, a script that
        finds the binary, asks its version and reads the host facts the flags depend on."""
        if self._info is not None:
            return self._info
        cfg = self.config
        wanted = ["podman", "docker"] if cfg.binary == "auto" else [cfg.binary]
        out = (await self._sh(_probe_script(wanted, disk=cfg.disk_limit_mb is not None))).text()
        found, _, rest = out.partition("\n")
        if not found.strip():
            raise RuntimeMissingError(f"no container runtime ({' or '.join(wanted)}) on "
                                      f"{self.runner.label}: {INSTALL_HINT}")
        binary = found.strip().rsplit("/", 1)[-1]
        version, _, rest = rest.partition("\n")
        if version == "!":   # `version` failed: what it said follows
            raise RuntimeMissingError(f"`{binary}` does not work on {self.runner.label} (`{binary} version` "
                                      f"failed: {rest.strip()[-500:] or 'no output'}); {INSTALL_HINT}")
        facts, _, disk = rest.partition(f"{PROBE_SECTION}\n")[2].partition(f"{PROBE_SECTION}\n")
        lines = facts.split("\n")
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
            quota = binary == "podman" and disk.split()[:2] == ["overlay", "xfs"]
            if quota:
                sandbox += ["--storage-opt", f"size={cfg.disk_limit_mb}m"]
            sandbox += ["--ulimit", f"fsize={cfg.disk_limit_mb << 20}"]
        self._info = RuntimeInfo(binary, version.strip(), cgroups, tuple(flags), tuple(sandbox),
                                 userns, quota, netns.strip() == "netns", nft.strip() == "nft",
                                 runsc.strip() == "runsc")
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
            await self._confine(cid, launch)
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
                async with asyncio.timeout(self.config.command_timeout_s):
                    first = await chan.readline()
            except TimeoutError:
                raise ContainerRuntimeError(f"a container on {self.runner.label} did not start within "
                                            f"{self.config.command_timeout_s:g} s: {chan.stderr_tail()}") from None
            if first != ATTACHED_UP:
                err = await chan.last_words()
                raise self._start_error(spec, f"`{launch.binary} run -i ... {name}` ended: {err}", err)
            await self._confine(name, launch)
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
        # attached: the client holds the container's stdio (not proxying its own signals,
        # and nothing the shell says kept in a container log); detached: `run -d`
        mode = ["-i", "--sig-proxy=false", "--log-driver", "none"] if attached else ["-d"]
        argv = [info.binary, "run", *mode, "--name", name, *run_flags, *info.sandbox_flags,
                "--cpus", f"{spec.cpus:g}", "--memory", f"{spec.memory_mib}m",
                "--memory-swap", f"{spec.memory_mib}m", "--pids-limit", str(pids),
                "--workdir", spec.workdir]
        if not spec.network:
            argv += ["--network", "none"]
        for host, addrs in sorted(hosts.items()):
            argv += ["--add-host", f"{host}:{addrs[0]}"]
        for k, v in sorted(labels.items()):
            argv += ["--label", f"{k}={v}"]
        argv += ["--entrypoint", "/bin/sh", image or spec.image, "-c", ATTACHED_PID1 if attached else IDLE_PID1]
        return _Launch(info.binary, argv, block, allow, hosts)

    async def _remove_failed(self, launch: _Launch, name: str) -> None:
        """A start can fail after creating the container (a workdir the image lacks, an OCI
        runtime error): remove it by name rather than leave it until drain."""
        await self._run([launch.binary, "rm", "-f", "-t", "0", "--ignore", name], check=False)

    async def _confine(self, container: str, launch: _Launch) -> None:
        """The network rules of a started container (none without network), applied
        before any command of the sandbox's runs."""
        if launch.block:
            await self._block_networks(container)
        if launch.allow is not None:
            await self._allow_only(container, launch.allow, launch.hosts)

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


def _probe_script(wanted: Sequence[str], *, disk: bool) -> str:
    """The runtime probe's script (:meth:`ContainerRuntime.probe`).  It prints the first of
    ``wanted`` found (nothing more when none is), then its version (or ``!`` and what
    ``version`` said when it failed), then after a :data:`PROBE_SECTION` line the host facts,
    one a line, and with ``disk`` after another the storage driver and its filesystem (a
    podman disk quota needs overlay on xfs)."""
    find = " || ".join(f"command -v {shlex.quote(b)}" for b in wanted)
    version = """"$p" version --format '{{.Client.Version}}'"""
    script = (f'p=$({find}) || exit 0; echo "$p"; '
              f'v=$({version} 2>/dev/null) && echo "$v" || {{ echo "!"; {version} 2>&1 | tail -n 5; exit 0; }}; '
              f"echo {PROBE_SECTION}; "
              "grep CapEff /proc/self/status | awk '{print $2}'; ulimit -Hn; "
              "[ -e /sys/fs/cgroup/cgroup.controllers ] && echo v2 || echo v1; "
              "command -v runc || echo; id -u; cat /proc/sys/user/max_user_namespaces 2>/dev/null || echo 0; "
              "grep -c '^containers:' /etc/subuid 2>/dev/null || true; "
              "command -v nsenter >/dev/null && command -v ip >/dev/null && echo netns || echo; "
              "command -v nft >/dev/null && echo nft || echo; "
              "command -v runsc >/dev/null && echo runsc || echo")
    if disk:
        script += (f'; echo {PROBE_SECTION}; [ "${{p##*/}}" = podman ] && "$p" info --format '
                   """'{{.Store.GraphDriverName}} {{index .Store.GraphStatus "Backing Filesystem"}}' """
                   "2>/dev/null || true")
    return script
