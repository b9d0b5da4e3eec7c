"""A Harbor environment on a FlowMesh sandbox (extra ``[harbor]``; Harbor needs Python >= 3.12).

Harbor takes a third-party environment as an import path (``module.path:ClassName``) in
its ``--env`` option or a trial/job config's ``environment.import_path``, with its
keyword arguments in ``environment.kwargs`` (``harbor jobs start --ek key=value``,
``harbor trials start --environment-kwarg key=value``; values parsed as JSON):

    harbor trials start -p ./my-task -a oracle \\
        --env flowmesh_sdk.integrations.harbor:FlowMeshEnvironment \\
        --environment-kwarg 'pool={"name": "harbor", "instance": {"cpus": 8, "memory_gb": 16},
                                   "sandboxes_per_instance": 8}'

Each trial's environment is one sandbox of the pool (``pool``: a registered pool's name
or a mapping of ``PoolSpec`` fields, :mod:`._pools`), taken at ``start`` and destroyed at
``stop``; a pool this module made from a mapping goes with its fleet when Harbor's run (its
``asyncio.run``) ends.  The image is the task's ``[environment].docker_image``, or the ``FROM`` of an
``environment/Dockerfile`` that only names a base image (``FROM``, ``WORKDIR``, ``ENV``):
FlowMesh runs prebuilt images on its instances, so a Dockerfile that builds (``RUN``,
``COPY``...) is refused with the fix (build and push it, set ``docker_image``).  The
task's cpus and memory size the sandbox; its network mode maps to the sandbox's network
(``no-network``: none, ``public``: all, ``allowlist``: IP addresses and CIDR ranges), fixed
for the sandbox's life.  ``exec`` runs through ``/bin/sh`` (as root, or ``su`` to another
``user``); a command past its timeout is killed with its process tree and raises
:class:`~flowmesh_sdk.errors.SandboxTimeout`.
"""

from __future__ import annotations

import asyncio
import logging
import posixpath
import shlex
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from . import require

require("harbor.environments.base", package="harbor", extra="harbor")

from harbor.environments.base import BaseEnvironment, ExecResult  # noqa: E402
from harbor.environments.capabilities import (  # noqa: E402
    EnvironmentCapabilities, EnvironmentResourceCapabilities)
from harbor.models.task.config import NetworkMode, NetworkPolicy  # noqa: E402

from ..errors import SandboxTimeout, SpecError  # noqa: E402
from ..specs import SandboxSpec  # noqa: E402
from ._pools import (PoolHandle, SandboxLease, close_with_running_loop, resolve_pool,  # noqa: E402
                     sandbox_spec_from_config)

__all__ = ["FlowMeshEnvironment"]

log = logging.getLogger("flowmesh.integrations.harbor")
_NO_TIMEOUT_S = 7 * 86400.0
_DOCKERFILE_KEPT = ("FROM", "WORKDIR", "ENV")


def base_image(dockerfile: Path) -> tuple[str, str | None, dict[str, str]]:
    """(image, workdir, env) of a Dockerfile that only names a base image, else SpecError."""
    text = dockerfile.read_text().replace("\\\n", " ")
    image: str | None = None
    workdir: str | None = None
    env: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        try:
            args = [a for a in shlex.split(rest) if not a.startswith("--platform")]
        except ValueError as exc:   # an unterminated quote
            raise SpecError("environment/Dockerfile", f"{line!r}: {exc}") from exc
        word = word.upper()
        if word not in _DOCKERFILE_KEPT or (word == "FROM" and (image is not None or len(args) != 1)):
            raise SpecError("environment/Dockerfile", f"{line!r}: FlowMesh runs prebuilt images, so the "
                            "Dockerfile may only name one base image (FROM IMAGE, WORKDIR, ENV); build and push "
                            "it (podman build -t REGISTRY/NAME . && podman push ...) and set "
                            "[environment].docker_image in task.toml")
        if word == "FROM":
            image = args[0]
        elif word == "WORKDIR":
            workdir = posixpath.join(workdir or "/", rest.strip())
        else:
            if not args or ("=" in args[0] and not all("=" in a for a in args)):
                raise SpecError("environment/Dockerfile", f"{line!r}: ENV takes KEY=VALUE ... or KEY VALUE")
            pairs = [a.split("=", 1) for a in args] if "=" in args[0] else [[args[0], " ".join(args[1:])]]
            env.update({k: v for k, v in pairs})
    if image is None:
        raise SpecError("environment/Dockerfile", "has no FROM line")
    return image, workdir, env


def sandbox_network(policy: NetworkPolicy) -> bool | tuple[str, ...]:
    """Harbor's network policy as ``SandboxSpec.network``."""
    if policy.network_mode == NetworkMode.NO_NETWORK:
        return False
    if policy.network_mode == NetworkMode.PUBLIC:
        return True
    entries = tuple(h if "/" in h else f"{h}/32" for h in policy.allowed_hosts)
    return entries or False


class FlowMeshEnvironment(BaseEnvironment):
    """Harbor's ``BaseEnvironment`` on one sandbox of a FlowMesh pool.

    Keyword arguments (``environment.kwargs``): ``pool`` (required), ``tenant``
    (default ``"default"``) and ``sandbox`` (more ``SandboxSpec`` fields: ``pids``,
    ``env``, ``kernel``, ``timeout_s``...; ``image``, ``cpus``, ``memory_gb``, ``network``
    and ``workdir`` come from the task: its workdir is where a command without ``cwd``
    runs, made at start)."""

    def __init__(self, *args: Any, pool: str | Mapping[str, Any] | None = None, tenant: str = "default",
                 sandbox: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        if pool is None:
            raise SpecError("environment.kwargs.pool", "is required: a registered pool's name or a mapping of "
                                                       "PoolSpec fields (--ek 'pool={\"name\": ...}')")
        for key in ("image", "cpus", "memory_gb", "network", "workdir"):
            if key in (sandbox or {}):
                raise SpecError(f"environment.kwargs.sandbox.{key}", "comes from the task's [environment]")
        self._pool_ref, self._tenant, self._extra = pool, tenant, dict(sandbox or {})
        self._image: str = ""
        self._workdir: str | None = None
        self._image_env: dict[str, str] = {}
        self._handle: PoolHandle | None = None
        self._lease: SandboxLease | None = None
        super().__init__(*args, **kwargs)

    @staticmethod
    def type() -> str:
        return "flowmesh"

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        return EnvironmentCapabilities(disable_internet=True, network_allowlist=True,
                                       network_allowlist_ipv4_addresses=True, network_allowlist_ipv4_cidrs=True)

    @classmethod
    def resource_capabilities(cls) -> EnvironmentResourceCapabilities:
        return EnvironmentResourceCapabilities(cpu_limit=True, memory_limit=True, fractional_cpus=True)

    def _validate_definition(self) -> None:
        image = self.task_env_config.docker_image
        dockerfile = self.environment_dir / "Dockerfile"
        if image:
            self._image = image
        elif dockerfile.is_file():
            self._image, self._workdir, self._image_env = base_image(dockerfile)
        else:
            raise SpecError("[environment].docker_image", f"is not set and {dockerfile} does not exist: "
                                                          "give the task's prebuilt image")

    def _spec(self, handle: PoolHandle) -> SandboxSpec:
        base = handle.pool.default_sandbox(self._image)
        cpus, memory_mb = self._effective_cpus, self._effective_memory_mb
        extra = {**self._extra, "env": {**self._image_env, **self._extra.get("env", {})}}
        return sandbox_spec_from_config(
            {**extra, "cpus": float(cpus) if cpus else base.cpus,
             "memory_gb": memory_mb / 1024 if memory_mb else base.memory_gb,
             "network": sandbox_network(self.network_policy)},
            image=self._image, field="environment.kwargs.sandbox")

    @property
    def _cwd(self) -> str:
        """Where a command without ``cwd`` runs: the task's workdir, else the Dockerfile's."""
        return self.task_env_config.workdir or self._workdir or "/"

    @property
    def lease(self) -> SandboxLease:
        if self._lease is None or self._lease.closed:
            raise SpecError("environment", "is not started (or was stopped): call start first")
        return self._lease

    async def start(self, force_build: bool) -> None:
        if self._handle is None:           # a mapping's fleet starts here, off Harbor's loop
            self._handle = await asyncio.to_thread(resolve_pool, self._pool_ref, field="environment.kwargs.pool")
            if not isinstance(self._pool_ref, str):
                close_with_running_loop()  # the fleet goes when Harbor's asyncio.run (its job) ends
        self._lease = await self._handle.open(self._spec(self._handle), tenant=self._tenant)
        log.info("%s: sandbox %s of pool %s", self.session_id, self._lease.sandbox.name, self._handle.name)
        if self._cwd != "/":               # made, as a Dockerfile's WORKDIR is
            await self.lease.bridge.hop(self.lease.sandbox.exec(f"mkdir -p {shlex.quote(self._cwd)}", cwd="/"))
        await self.ensure_dirs(self._mount_targets(writable_only=True))
        await self._upload_environment_dir_after_start()

    async def stop(self, delete: bool) -> None:
        """Destroy the sandbox (FlowMesh sandboxes do not outlive their trial, whatever ``delete`` says)."""
        lease, self._lease = self._lease, None
        if lease is not None:
            await lease.close()

    async def exec(self, command: str, cwd: str | None = None, env: dict[str, str] | None = None,
                   timeout_sec: int | None = None, user: str | int | None = None) -> ExecResult:
        lease, who = self.lease, self._resolve_user(user)
        if who not in (None, "root", 0, "0"):
            command = f"exec su -s /bin/sh {shlex.quote(str(who))} -c {shlex.quote(command)}"
        timeout = float(timeout_sec) if timeout_sec else _NO_TIMEOUT_S
        r = await lease.bridge.hop(lease.sandbox.exec(command, cwd=cwd or self._cwd, env=self._merge_env(env),
                                                      timeout_s=timeout))
        if r.timed_out:
            raise SandboxTimeout(f"{lease.sandbox.name}: command timed out after {timeout_sec} seconds "
                                 f"(its processes were killed): {command[:200]!r}")
        return ExecResult(stdout=r.stdout, stderr=r.stderr, return_code=r.exit_code)

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        data, mode = await asyncio.to_thread(_read, Path(source_path))
        await self.lease.bridge.hop(self.lease.sandbox.write_file(target_path, data, mode=mode))

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        await self.lease.bridge.hop(self.lease.sandbox.upload(str(source_dir), target_dir))

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        data = await self.lease.bridge.hop(self.lease.sandbox.read_file(source_path))
        await asyncio.to_thread(_write, Path(target_path), data)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        """Copy ``source_dir``'s contents into ``target_dir`` (files there are overwritten)."""
        with tempfile.TemporaryDirectory(prefix="flowmesh-harbor-") as tmp:
            await self.lease.bridge.hop(self.lease.sandbox.download(source_dir, tmp))
            base = posixpath.basename(source_dir.rstrip("/")) or "."
            await asyncio.to_thread(shutil.copytree, Path(tmp) / base, Path(target_dir), dirs_exist_ok=True)


def _read(path: Path) -> tuple[bytes, int]:
    return path.read_bytes(), path.stat().st_mode & 0o7777


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
