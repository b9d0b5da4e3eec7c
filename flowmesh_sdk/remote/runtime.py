"""The container runtime (podman or docker CLI) driven through any :class:`Runner`.

It only manages containers: create with limits, open a shell channel, one-off exec,
remove, list by label, look up and pull images.  Host quirks are detected, not assumed:

* cgroups v1 with runc installed  -> ``--runtime runc`` (crun refuses hybrid cgroups);
* no CAP_SYS_RESOURCE             -> ``--ulimit`` at or below the hard limits, since the
  runtime's default rlimits would be refused.

Both can be forced through :class:`RuntimeConfig`.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from ..errors import (AuthError, ContainerRuntimeError, ImageNotFoundError, RegistryUnavailableError,
                      RuntimeMissingError, ThrottledError)
from ..specs import SandboxSpec
from .runner import Channel, CommandResult, Runner

INSTALL_HINT = ("install podman: `apt-get install -y podman runc` (Debian/Ubuntu) or "
                "`dnf install -y podman` (Fedora/RHEL); docker works too")

# PID 1 of every sandbox container: sleeps, and exits at once on SIGTERM.
_IDLE_PID1 = 'trap "exit 0" TERM INT; while :; do sleep 86400 & wait $!; done'
_CAP_SYS_RESOURCE = 24


@dataclass(frozen=True, slots=True)
class RuntimeConfig:
    """How to drive the container runtime on one machine.

    ``binary``: ``auto`` (podman, else docker), ``podman`` or ``docker``.
    ``oci_runtime``: ``auto``, ``default`` (pass nothing) or a name such as ``runc``.
    ``ulimits``: None detects; a tuple such as ``("nofile=4096:4096",)`` forces.
    """

    binary: str = "auto"
    oci_runtime: str = "auto"
    ulimits: tuple[str, ...] | None = None
    extra_run_args: tuple[str, ...] = ()
    command_timeout_s: float = 120.0


@dataclass(frozen=True, slots=True)
class RuntimeInfo:
    binary: str
    version: str
    cgroups: str
    run_flags: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ContainerInfo:
    id: str
    name: str
    image: str
    state: str
    labels: Mapping[str, str] = field(default_factory=dict)


class ContainerRuntime:
    def __init__(self, runner: Runner, config: RuntimeConfig | None = None) -> None:
        self.runner = runner
        self.config = config or RuntimeConfig()
        self._info: RuntimeInfo | None = None

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
            "command -v runc || true")
        lines = facts.text().split("\n")
        cap_hex, hard_nofile, cgroups = (lines + ["", "", ""])[:3]
        has_runc = len(lines) > 3 and lines[3].strip() != ""
        flags: list[str] = []
        if cfg.oci_runtime == "auto":
            if cgroups == "v1" and has_runc and binary == "podman":
                flags += ["--runtime", "runc"]
        elif cfg.oci_runtime != "default":
            flags += ["--runtime", cfg.oci_runtime]
        if cfg.ulimits is not None:
            for u in cfg.ulimits:
                flags += ["--ulimit", u]
        else:
            try:
                caps = int(cap_hex.strip(), 16)
            except ValueError:
                caps = -1
            if caps >= 0 and not caps >> _CAP_SYS_RESOURCE & 1:
                n = 4096
                if hard_nofile.strip().isdigit():
                    n = min(n, int(hard_nofile.strip()))
                flags += ["--ulimit", f"nofile={n}:{n}", "--ulimit", "nproc=4096:4096"]
        flags += list(cfg.extra_run_args)
        self._info = RuntimeInfo(binary, ver.text().strip(), cgroups, tuple(flags))
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
        return True

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
        argv = [info.binary, "run", "-d", "--name", name, *info.run_flags,
                "--cpus", f"{spec.cpus:g}", "--memory", f"{spec.memory_mib}m",
                "--memory-swap", f"{spec.memory_mib}m", "--pids-limit", str(spec.pids),
                "--workdir", spec.workdir]
        if not spec.network:
            argv += ["--network", "none"]
        for k, v in sorted(labels.items()):
            argv += ["--label", f"{k}={v}"]
        argv += ["--entrypoint", "/bin/sh", image or spec.image, "-c", _IDLE_PID1]
        res = await self._run(argv, check=False)
        if not res.ok:
            err = res.stderr.decode("utf-8", "replace")
            if "image not known" in err or "manifest unknown" in err or "pull access denied" in err:
                raise ImageNotFoundError(spec.image, res.describe())
            raise ContainerRuntimeError(f"could not start a container on {self.runner.label}: {res.describe()}")
        return res.text().strip().splitlines()[-1]

    async def open_shell(self, container: str) -> Channel:
        info = await self.probe()
        return await self.runner.open_channel([info.binary, "exec", "-i", container, "/bin/sh"])

    async def exec_once(self, container: str, argv: Sequence[str], *, input: bytes | None = None,
                        timeout_s: float | None = None) -> CommandResult:
        info = await self.probe()
        cmd = [info.binary, "exec"] + (["-i"] if input is not None else []) + [container, *argv]
        return await self.runner.run(cmd, timeout_s=timeout_s or self.config.command_timeout_s,
                                     input=input)

    async def remove(self, containers: Sequence[str]) -> None:
        """Force-remove containers (batched); a container already gone is not an error."""
        if not containers:
            return
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
