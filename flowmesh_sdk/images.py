"""Image resolution at dispatch: a task whose image does not resolve fails before any
instance is launched or any slot is taken.

:class:`LocalStoreResolver` (the default) looks in this host's container store and pulls
once when the image is missing.  A registry-backed resolver implements the same
:class:`ImageResolver` interface.
"""

from __future__ import annotations

import abc
import time

from .remote.runtime import ContainerRuntime


class ImageResolver(abc.ABC):
    @abc.abstractmethod
    async def resolve(self, image: str) -> str:
        """The image's digest (``sha256:...``); ImageNotFoundError when it does not exist."""


class LocalStoreResolver(ImageResolver):
    """Resolves against this host's podman/docker store; caches hits for ``ttl_s``."""

    def __init__(self, runtime: ContainerRuntime, *, ttl_s: float = 30.0) -> None:
        self.runtime = runtime
        self.ttl_s = ttl_s
        self._cache: dict[str, tuple[str, float]] = {}

    async def resolve(self, image: str) -> str:
        hit = self._cache.get(image)
        if hit and time.monotonic() - hit[1] < self.ttl_s:
            return hit[0]
        digest = await self.runtime.ensure_image(image)
        self._cache[image] = (digest, time.monotonic())
        return digest
