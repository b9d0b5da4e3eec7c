"""Images at dispatch: resolve before anything is launched, pin by digest, pull within
a per-registry budget.

* :class:`ImageInfo` is what a pool gets back from resolution: the digest and the exact
  reference the runtime runs (``registry/repo@sha256:...``), so a tag that moves mid-run
  cannot mix two images in one RL step, plus the layers and their sizes (for locality
  and the disk budget).
* :class:`LocalStoreResolver` answers for ``localhost/...`` images, which live only in
  this host's container store (built here, never pulled).
* :class:`RegistryResolver` answers for everything else through the OCI registry client,
  with a per-tag TTL cache, single-flight lookups and the :class:`PullBudget`.
* :class:`DefaultResolver` routes between the two.
"""

from __future__ import annotations

import abc
import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from . import clock
from .backoff import retry_async
from .control.backend import ControlBackend
from .errors import ImageNotFoundError, RegistryUnavailableError, ThrottledError
from .registry.client import RegistryClient
from .registry.reference import ImageRef
from .remote.runtime import ContainerRuntime

log = logging.getLogger("flowmesh.images")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class LayerInfo:
    digest: str
    size: int


@dataclass(frozen=True, slots=True)
class ImageInfo:
    image: str                      # as the user wrote it
    digest: str                     # manifest digest (registry) or image id (local store)
    run_ref: str                    # what the runtime pulls and runs
    registry: str | None = None     # None: this host's store only
    insecure: bool = False          # a loopback registry: plain HTTP, --tls-verify=false
    layers: tuple[LayerInfo, ...] = ()

    @property
    def size(self) -> int:
        return sum(layer.size for layer in self.layers)


class ImageResolver(abc.ABC):
    @abc.abstractmethod
    async def resolve(self, image: str, *, arch: str = "x86_64") -> ImageInfo:
        """Resolve ``image`` for instances of ``arch``; ImageNotFoundError when it does not exist."""


# ---- the pull budget ------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class PullPolicy:
    """Per-registry limits: a token bucket on registry requests and pulls, a cap on
    concurrent pulls, and bounded retries with exponential backoff and jitter for a
    throttled (429) or unavailable registry (honouring ``Retry-After``)."""

    rate_per_s: float = 20.0
    burst: int = 40
    max_concurrent_pulls: int = 4
    attempts: int = 5
    backoff_s: float = 0.5
    backoff_max_s: float = 30.0


RetryHook = Callable[[str, int, BaseException, float], None]


class PullBudget:
    def __init__(self, control: ControlBackend, policy: PullPolicy | None = None,
                 on_retry: RetryHook | None = None) -> None:
        self.control = control
        self.policy = policy or PullPolicy()
        self.on_retry = on_retry

    async def run(self, registry: str, what: str, fn: Callable[[], Awaitable[T]], *,
                  pull: bool = False) -> T:
        """Run ``fn`` within ``registry``'s budget, retrying throttling and outages."""
        p = self.policy
        bucket = self.control.rate_limiter(f"registry:{registry}", p.rate_per_s, p.burst)
        sem = self.control.semaphore(f"registry:{registry}:pulls", p.max_concurrent_pulls) if pull else None

        def before_sleep(attempt: int, exc: BaseException, wait: float) -> None:
            log.warning("%s: attempt %d failed (%s); retrying in %.1f s", what, attempt, exc, wait)
            if self.on_retry is not None:
                self.on_retry(what, attempt, exc, wait)

        async def once() -> T:
            if sem is not None:
                await sem.acquire()
            try:
                await bucket.acquire()
                return await fn()
            finally:
                if sem is not None:
                    sem.release()

        return await retry_async(once, attempts=p.attempts, base_s=p.backoff_s, cap_s=p.backoff_max_s,
                                 retry_on=(ThrottledError, RegistryUnavailableError),
                                 before_sleep=before_sleep)


# ---- resolvers --------------------------------------------------------------------------

class _Cache:
    """Per-image TTL cache with single-flight lookups.  An entry past its TTL is dropped
    when a later one is stored: a coordinator that resolves a new image for every task (a
    SWE-style batch) holds the images of the last ``ttl_s``, not every one it ever saw."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        # oldest first: each entry is (re)stored at the end, and all share one TTL
        self._hits: OrderedDict[str, tuple[ImageInfo, float]] = OrderedDict()
        self._inflight: dict[str, asyncio.Future[ImageInfo]] = {}

    async def get(self, image: str, fetch: Callable[[], Awaitable[ImageInfo]]) -> ImageInfo:
        """``image`` is the cache key (a reference, plus the platform where it matters)."""
        hit = self._hits.get(image)
        if hit is not None and clock.monotonic() - hit[1] < self.ttl_s:
            return hit[0]
        fut = self._inflight.get(image)
        if fut is None:
            fut = self._inflight[image] = asyncio.ensure_future(fetch())
            fut.add_done_callback(lambda f: self._done(image, f))
        return await asyncio.shield(fut)

    def _done(self, image: str, fut: asyncio.Future[ImageInfo]) -> None:
        self._inflight.pop(image, None)
        hits = self._hits
        hits.pop(image, None)
        if fut.cancelled() or fut.exception() is not None:
            return
        now = clock.monotonic()
        while hits and now - next(iter(hits.values()))[1] >= self.ttl_s:
            hits.popitem(last=False)
        hits[image] = (fut.result(), now)

    def forget(self, image: str) -> None:
        self._hits.pop(image, None)


class LocalStoreResolver(ImageResolver):
    """``localhost/...`` images: present in this host's store, or not at all."""

    def __init__(self, runtime: ContainerRuntime, *, ttl_s: float = 30.0) -> None:
        self.runtime = runtime
        self._cache = _Cache(ttl_s)

    async def resolve(self, image: str, *, arch: str = "x86_64") -> ImageInfo:
        return await self._cache.get(image, lambda: self._fetch(image))

    async def _fetch(self, image: str) -> ImageInfo:
        found = await self.runtime.image_inspect(image)
        if found is None:
            raise ImageNotFoundError(image, f"not in the local store of {self.runtime.runner.label} "
                                            "(localhost/ images are built here, never pulled)")
        digest, image_id = found
        return ImageInfo(image=image, digest=digest, run_ref=image_id)


class RegistryResolver(ImageResolver):
    """Images in an OCI registry, resolved to the platform manifest digest."""

    def __init__(self, client: RegistryClient, budget: PullBudget, *, ttl_s: float = 30.0) -> None:
        self.client = client
        self.budget = budget
        self._cache = _Cache(ttl_s)

    async def resolve(self, image: str, *, arch: str = "x86_64") -> ImageInfo:
        return await self._cache.get(f"{image} {arch}", lambda: self._fetch(image, arch))

    async def _fetch(self, image: str, arch: str) -> ImageInfo:
        ref = ImageRef.parse(image)
        res = await self.budget.run(ref.registry, f"resolve {image}",
                                    lambda: self.client.resolve(ref, arch=arch))
        return ImageInfo(image=image, digest=res.digest, run_ref=res.pinned, registry=ref.registry,
                         insecure=ref.loopback,
                         layers=tuple(LayerInfo(layer.digest, layer.size) for layer in res.layers))


class DefaultResolver(ImageResolver):
    """``localhost/...`` -> this host's store; anything else -> its registry."""

    def __init__(self, local: ImageResolver, registry: ImageResolver | None) -> None:
        self.local = local
        self.registry = registry

    async def resolve(self, image: str, *, arch: str = "x86_64") -> ImageInfo:
        if image.startswith("localhost/") or self.registry is None:
            return await self.local.resolve(image, arch=arch)
        return await self.registry.resolve(image, arch=arch)
