"""Images on a pool's instances: pulls within the registry budget (one per image per
instance, however many tasks ask at once), in-use counts, and a bounded disk: when an
instance's image cache crosses its high-water mark, least-recently-used images that no
sandbox uses are removed until it is back under the low-water mark.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from .. import clock
from ..control.events import EventKind
from ..errors import ImageNotFoundError
from ..images import ImageInfo, PullBudget
from ..observe.tracing import traced
from .instance import CachedImage, ManagedInstance

LOW_WATER = 0.8   # evict down to this share of the budget


class InstanceImages:
    def __init__(self, budget: PullBudget, cache_bytes: int, *,
                 authfile_on: Callable[[ManagedInstance, str], Awaitable[str | None]],
                 publish: Callable[..., None]) -> None:
        self.budget = budget
        self.cache_bytes = cache_bytes
        self.authfile_on = authfile_on   # (instance, registry) -> auth file path there
        self.publish = publish

    async def ensure(self, mi: ManagedInstance, info: ImageInfo) -> CachedImage:
        """Make ``info`` present on ``mi``; concurrent callers share one pull."""
        cached = mi.images.get(info.digest)
        if cached is not None:
            cached.last_used = clock.monotonic()
            return cached
        fut = mi.pulls.get(info.digest)
        if fut is None:
            fut = mi.pulls[info.digest] = asyncio.ensure_future(self._pull(mi, info))
            fut.add_done_callback(lambda _f: mi.pulls.pop(info.digest, None))
        return await asyncio.shield(fut)

    @traced("flowmesh.image.pull", lambda _self, mi, info: {"instance": mi.id, "image": info.image})
    async def _pull(self, mi: ManagedInstance, info: ImageInfo) -> CachedImage:
        t0 = clock.monotonic()
        pulled = False
        if info.registry is None:
            if not mi.runtime.runner.on_this_host:
                raise ImageNotFoundError(info.image, "localhost/ images exist only in this host's "
                                                     "store; push it to a registry for remote instances")
        else:
            authfile = await self.authfile_on(mi, info.registry)
            pulled = await self.budget.run(
                info.registry, f"pull {info.image} on {mi.id}",
                lambda: mi.runtime.pull(info.run_ref, tls_verify=not info.insecure, authfile=authfile),
                pull=True)
            if pulled:  # not when the machine's store already had it
                self.publish(EventKind.IMAGE_PULLED, instance_id=mi.id,
                             detail=f"{info.run_ref} (image size {info.size} bytes) in "
                                    f"{clock.monotonic() - t0:.2f} s")
        cached = mi.images[info.digest] = CachedImage(info, clock.monotonic(), fetched=pulled)
        await self.evict(mi, keep=info.digest)
        return cached

    def acquire(self, mi: ManagedInstance, digest: str) -> None:
        cached = mi.images.get(digest)
        if cached is not None:
            cached.in_use += 1
            cached.last_used = clock.monotonic()

    def release(self, mi: ManagedInstance | None, digest: str) -> None:
        cached = mi.images.get(digest) if mi is not None else None
        if cached is not None and cached.in_use > 0:
            cached.in_use -= 1
            cached.last_used = clock.monotonic()

    async def evict(self, mi: ManagedInstance, *, keep: str = "") -> list[str]:
        """Above the high-water mark, remove LRU images no sandbox uses."""
        if mi.cache_bytes() <= self.cache_bytes:
            return []
        removed: list[str] = []
        for cached in sorted(mi.images.values(), key=lambda c: c.last_used):
            if mi.cache_bytes() <= self.cache_bytes * LOW_WATER:
                break
            info = cached.info
            if cached.in_use or info.digest in mi.wanted or info.digest == keep or info.registry is None:
                continue  # in use, wanted by a sandbox being made, just pulled, or built here
            if await mi.runtime.remove_image(info.run_ref):
                mi.images.pop(info.digest, None)
                removed.append(info.digest)
                self.publish(EventKind.IMAGE_EVICTED, instance_id=mi.id,
                             detail=f"{info.run_ref} ({info.size} bytes)")
        return removed
