"""Creating and destroying a pool's sandboxes on its instances, a component the pool
composes: a container from the task's pinned image (pulled first, once per instance:
:mod:`.images`), its channel open, labelled with the fleet, pool, instance, owner, task
and run; and, at the end, the container removed and its image's in-use count given
back."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping

from ..control.events import EventKind
from ..errors import ImageNotFoundError
from ..images import ImageInfo
from ..provider import LABEL_FLEET, LABEL_INSTANCE, LABEL_OWNER, LABEL_POOL, LABEL_RUN, LABEL_TASK
from ..remote.direct import InstanceRuntime
from ..sandbox import Sandbox
from ..specs import SandboxSpec
from .images import InstanceImages
from .instance import ManagedInstance
from .records import PoolContext


class Sandboxes:
    """One pool's sandboxes (see the module docstring).  ``instances``: the pool's
    instances now; ``publish``: the pool's events."""

    def __init__(self, ctx: PoolContext, pool: str, image_cache: InstanceImages, *,
                 instances: Callable[[], Mapping[str, ManagedInstance]], publish: Callable[..., None]) -> None:
        self.ctx = ctx
        self.pool = pool
        self.image_cache = image_cache
        self._instances = instances
        self._publish = publish

    async def close(self, sandbox: Sandbox | None) -> None:
        """Destroy ``sandbox`` (None: nothing) and give its image's in-use count back."""
        if sandbox is None:
            return
        try:
            await sandbox.close()
        finally:
            self.image_cache.release(self._instances().get(sandbox.instance_id), sandbox.image_id)
        self._publish(EventKind.SANDBOX_CLOSED, instance_id=sandbox.instance_id, detail=sandbox.name)

    async def new(self, mi: ManagedInstance, spec: SandboxSpec, info: ImageInfo, task_id: str) -> Sandbox:
        """A container from the pinned image on ``mi``, its channel open (the one it was
        started with, where the runtime gives one: :meth:`ContainerRuntime.start`)."""
        name = f"fm-{self.pool}-{secrets.token_hex(5)}"
        labels = {LABEL_FLEET: self.ctx.fleet, LABEL_POOL: self.pool, LABEL_INSTANCE: mi.id,
                  LABEL_OWNER: self.ctx.owner, LABEL_TASK: task_id, LABEL_RUN: self.ctx.run}
        # wanted from before its pull until its container holds it: eviction never takes an
        # image a sandbox on its way needs (another task's pull may cross the high-water mark)
        direct = isinstance(mi.runtime, InstanceRuntime)   # the instance is this sandbox's container
        mi.wanted[info.digest] = mi.wanted.get(info.digest, 0) + 1
        try:
            if not direct:
                await self.image_cache.ensure(mi, info)
            # a container that fails to start (a workdir the image lacks) is removed by the runtime
            try:
                cid, shell = await mi.runtime.start(name, spec, labels, image=info.run_ref)
            except ImageNotFoundError:
                # removed behind our back (a store shared with other pools): pull it again, once
                mi.images.pop(info.digest, None)
                await self.image_cache.ensure(mi, info)
                cid, shell = await mi.runtime.start(name, spec, labels, image=info.run_ref)
            if not direct:
                self.image_cache.acquire(mi, info.digest)
        finally:
            mi.wanted[info.digest] -= 1
            if not mi.wanted[info.digest]:
                del mi.wanted[info.digest]
        sb = Sandbox(mi.runtime, cid, name, spec, instance_id=mi.id, image_id=info.digest, shell=shell)
        try:
            await sb.start()
        except BaseException:
            self.image_cache.release(mi, info.digest)
            await sb.close()
            raise
        self._publish(EventKind.SANDBOX_READY, instance_id=mi.id, detail=name)
        return sb
