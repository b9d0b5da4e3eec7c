"""Image resolution at dispatch: a task whose image does not resolve fails before any
instance is launched or any slot is taken.

:class:`LocalStoreResolver` (the default) looks in this host's container store and pulls
once when the image is missing.  A registry-backed resolver implements the same
:class:`ImageResolver` interface.
"""

from __future__ import annotations

import abc
import asyncio
import time

from .remote.runtime import ContainerRuntime


class ImageResolver(abc.ABC):
    @abc.abstractmethod
    async def resolve(self, image: str) -> str:
        """The image's digest (``sha256:...``); ImageNotFoundError when it does not exist."""


class LocalStoreResolver(ImageResolver):
    """Resolves against this host's podman/docker store.

    Concurrent lookups of one image share a single call.  A hit younger than ``ttl_s`` is
    answered from memory; an older hit is answered from memory too while one refresh runs
    in the background (an image removed meanwhile still fails at container creation).
    """

    def __init__(self, runtime: ContainerRuntime, *, ttl_s: float = 30.0) -> None:
        self.runtime = runtime
        self.ttl_s = ttl_s
        self._cache: dict[str, tuple[str, float]] = {}
        self._inflight: dict[str, asyncio.Future[str]] = {}

    async def resolve(self, image: str) -> str:
        hit = self._cache.get(image)
        if hit is not None:
            if time.monotonic() - hit[1] >= self.ttl_s and image not in self._inflight:
                self._lookup(image).add_done_callback(_consume)
            return hit[0]
        return await asyncio.shield(self._lookup(image))

    def _lookup(self, image: str) -> asyncio.Future[str]:
        fut = self._inflight.get(image)
        if fut is None:
            fut = self._inflight[image] = asyncio.ensure_future(self._fetch(image))
            fut.add_done_callback(lambda _f: self._inflight.pop(image, None))
        return fut

    async def _fetch(self, image: str) -> str:
        try:
            digest = await self.runtime.ensure_image(image)
        except BaseException:
            self._cache.pop(image, None)
            raise
        self._cache[image] = (digest, time.monotonic())
        return digest


def _consume(fut: asyncio.Future[str]) -> None:
    if not fut.cancelled():
        fut.exception()  # a failed background refresh only drops the cache entry
