"""The SWE-ReX deployment on a FlowMesh pool: :class:`FlowMeshDeployment` (SWE-ReX's
``AbstractDeployment``) takes a sandbox of the pool at ``start()`` and hands out a
:class:`~._swerex_runtime.FlowMeshRuntime` on it.  Re-exported by (and described in)
:mod:`flowmesh_sdk.integrations.swerex`."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from . import require

require("swerex", package="swe-rex", extra="swerex")

from swerex.deployment.abstract import AbstractDeployment  # noqa: E402
from swerex.deployment.hooks.abstract import CombinedDeploymentHook, DeploymentHook  # noqa: E402
from swerex.exceptions import DeploymentNotStartedError, SwerexException  # noqa: E402
from swerex.runtime.abstract import IsAliveResponse  # noqa: E402

from ..errors import FlowMeshError, SpecError  # noqa: E402
from ..sandbox import Sandbox  # noqa: E402
from ..specs import SandboxSpec  # noqa: E402
from ._swerex_runtime import FlowMeshRuntime, log  # noqa: E402

__all__ = ["FlowMeshDeployment"]


class FlowMeshDeployment(AbstractDeployment):
    """A SWE-ReX deployment whose runtime is a sandbox of a FlowMesh pool.

    ``pool`` is a pool of a :class:`~flowmesh_sdk.Fleet` (persistent pools hand out warm
    containers); give ``spec`` (a :class:`~flowmesh_sdk.SandboxSpec`) or ``image`` (the
    pool's ``default_sandbox(image)``).  ``start()`` takes a sandbox, ``stop()`` closes
    the runtime's sessions and destroys the sandbox (idempotent)."""

    def __init__(self, pool: Any, *, image: str | None = None, spec: SandboxSpec | None = None,
                 tenant: str = "default", name: str = "swerex", logger: logging.Logger | None = None) -> None:
        if not callable(getattr(pool, "sandbox", None)):
            raise SpecError("pool", f"must be a FlowMesh pool (fleet.pool(...)), got {type(pool).__name__}")
        if (image is None) == (spec is None):
            raise SpecError("image", "give exactly one of image= or spec=")
        self.pool = pool
        self.spec = spec
        self.image = image
        self.tenant = tenant
        self.name = name
        self.logger = logger or log
        self._hooks = CombinedDeploymentHook()
        self._stack: contextlib.AsyncExitStack | None = None
        self._runtime: FlowMeshRuntime | None = None

    def __repr__(self) -> str:
        image = self.image if self.spec is None else self.spec.image   # __init__: exactly one of the two
        return f"FlowMeshDeployment(pool={getattr(self.pool, 'name', '?')}, image={image})"

    def add_hook(self, hook: DeploymentHook) -> None:
        self._hooks.add_hook(hook)

    @property
    def sandbox(self) -> Sandbox:
        return self.runtime.sandbox

    async def start(self, *args: Any, **kwargs: Any) -> None:
        if self._runtime is not None:
            return
        self._hooks.on_custom_step("Taking a FlowMesh sandbox")
        stack = contextlib.AsyncExitStack()
        try:
            cm = (self.pool.sandbox(self.spec, tenant=self.tenant, name=self.name) if self.spec is not None
                  else self.pool.sandbox(image=self.image, tenant=self.tenant, name=self.name))
            sb = await stack.enter_async_context(cm)
        except FlowMeshError as exc:
            await stack.aclose()
            raise SwerexException(f"could not start a FlowMesh sandbox: {exc}") from exc
        self._stack = stack
        self._runtime = FlowMeshRuntime(sb, logger=self.logger)
        self.logger.info("started %s in pool %s", sb.name, getattr(self.pool, "name", "?"))

    async def stop(self, *args: Any, **kwargs: Any) -> None:
        runtime, self._runtime = self._runtime, None
        stack, self._stack = self._stack, None
        if runtime is not None:
            await runtime.close()
        if stack is not None:
            with contextlib.suppress(FlowMeshError):   # a lost sandbox is gone already
                await stack.aclose()

    async def is_alive(self, *, timeout: float | None = None) -> IsAliveResponse:
        if self._runtime is None:
            raise DeploymentNotStartedError()
        return await self._runtime.is_alive(timeout=timeout)

    @property
    def runtime(self) -> FlowMeshRuntime:
        if self._runtime is None:
            raise DeploymentNotStartedError()
        return self._runtime

    def __del__(self) -> None:
        # AbstractDeployment.__del__ schedules stop() on whatever loop is current; a
        # sandbox belongs to its own loop, so only warn about one left open.
        if getattr(self, "_runtime", None) is not None:
            log.warning("FlowMeshDeployment garbage-collected without stop(); its sandbox is "
                        "destroyed when its pool drains")
