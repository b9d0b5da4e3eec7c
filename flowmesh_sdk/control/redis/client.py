"""The one connection to Redis a coordinator uses: the ``redis`` package imported lazily
(the ``[redis]`` extra), its own retries switched off, calls sent in order as one
pipeline at a time (what is asked while one is in flight goes in the next), and retried
only by :func:`flowmesh_sdk.backoff.retry_async`.

A Redis restart loses the server's script cache: a ``NOSCRIPT`` reply reloads every
script and sends the call again once.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...backoff import retry_async
from ...errors import ControlPlaneUnavailableError, FlowMeshError, SpecError
from ...redaction import redact_url

log = logging.getLogger("flowmesh.control.redis")

EXTRA_HINT = "the Redis control backend needs the redis package: pip install 'flowmesh-sdk[redis]'"


def import_redis() -> Any:
    """``redis.asyncio``, or a clear error naming the extra."""
    try:
        import redis.asyncio as aioredis
    except ImportError as exc:   # pragma: no cover - the extra is installed in dev
        raise FlowMeshError(EXTRA_HINT) from exc
    return aioredis


def check_url(url: object) -> str:
    if not isinstance(url, str) or urllib.parse.urlsplit(url).scheme not in ("redis", "rediss", "unix"):
        shown = repr(redact_url(url)) if isinstance(url, str) else type(url).__name__
        raise SpecError("state", f"must be a redis://host:port[/db] URL (FLOWMESH_STATE), got {shown}")
    return url


_Call = tuple[str, tuple[Any, ...], dict[str, Any], "asyncio.Future[Any]"]


@dataclass(frozen=True, slots=True)
class RetrySettings:
    """The SDK's one retry loop around every Redis call: ``attempts`` in all, backoff from
    ``base_s`` doubling to ``cap_s`` (the default rides out a Redis restart of ~5 s)."""

    attempts: int = 10
    base_s: float = 0.05
    cap_s: float = 1.0


class RedisClient:
    """Scripts by name, plain commands, both batched into one pipeline per loop tick."""

    def __init__(self, url: str, scripts: Mapping[str, str], *, retry: RetrySettings | None = None,
                 socket_timeout_s: float = 5.0) -> None:
        self.url = check_url(url)
        self.retry = retry or RetrySettings()
        aioredis = import_redis()
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        self._errors: tuple[type[BaseException], ...] = (
            aioredis.ConnectionError, aioredis.TimeoutError, OSError, asyncio.TimeoutError)
        self._noscript = __import__("redis.exceptions", fromlist=["NoScriptError"]).NoScriptError
        self._busy = __import__("redis.exceptions", fromlist=["BusyLoadingError"]).BusyLoadingError
        self.redis = aioredis.Redis.from_url(
            url, retry=Retry(NoBackoff(), 0), retry_on_timeout=False, socket_timeout=socket_timeout_s,
            socket_connect_timeout=min(2.0, socket_timeout_s), health_check_interval=0)
        self._scripts = dict(scripts)
        self._sha = {name: hashlib.sha1(src.encode()).hexdigest() for name, src in self._scripts.items()}
        self._pending: list[_Call] = []
        self._sender: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"RedisClient({redact_url(self.url)!r})"

    def unavailable(self, exc: BaseException, what: str = "") -> ControlPlaneUnavailableError:
        return ControlPlaneUnavailableError(
            f"the control state at {redact_url(self.url)} cannot be reached{f' ({what})' if what else ''}: "
            f"{type(exc).__name__}: {exc}", url=redact_url(self.url))

    # ---- calls -------------------------------------------------------------------
    async def script(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run script ``name`` (atomic on the server), retried by the SDK's retry loop."""
        return await self._retried("evalsha", (name, len(keys), *keys, *args))

    async def command(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """One plain command (``xadd``, ``hgetall`` ...), batched and retried the same way."""
        return await self._retried(method, args, kwargs)

    async def direct(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """A command on a connection of its own (a blocking read must not hold up a batch)."""
        async def once() -> Any:
            try:
                return await getattr(self.redis, method)(*args, **kwargs)
            except self._errors as exc:
                raise self.unavailable(exc) from exc
        return await retry_async(once, attempts=self.retry.attempts, base_s=self.retry.base_s,
                                 cap_s=self.retry.cap_s, retry_on=(ControlPlaneUnavailableError,),
                                 before_sleep=self._log_retry)

    async def _retried(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None) -> Any:
        def once() -> asyncio.Future[Any]:
            return self._submit(method, args, kwargs or {})
        return await retry_async(once, attempts=self.retry.attempts, base_s=self.retry.base_s,
                                 cap_s=self.retry.cap_s, retry_on=(ControlPlaneUnavailableError,),
                                 before_sleep=self._log_retry)

    def _log_retry(self, attempt: int, exc: BaseException, wait: float) -> None:
        log.warning("redis %s: attempt %d failed (%s); retrying in %.2f s", redact_url(self.url), attempt, exc, wait)

    def _submit(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        self._pending.append((method, args, kwargs, fut))
        if self._sender is None or self._sender.done():
            self._sender = asyncio.ensure_future(self._pump())
        return fut

    async def _pump(self) -> None:
        """One pipeline in flight at a time: what is asked meanwhile goes in the next one
        (calls reach Redis in the order they were made; the busier, the bigger the batch)."""
        await asyncio.sleep(0)   # let the rest of this loop tick join the first batch
        while self._pending:
            batch, self._pending = self._pending, []
            await self._send(batch)

    def _queue(self, pipe: Any, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if method == "evalsha":
            pipe.evalsha(self._sha[args[0]], *args[1:])
        else:
            getattr(pipe, method)(*args, **kwargs)

    async def _send(self, batch: list[_Call]) -> None:
        try:
            results = await self._execute(batch)
            missing = [i for i, r in enumerate(results) if isinstance(r, self._noscript)]
            if missing:   # the server lost its script cache (a restart): load and send again
                await self.load_scripts()
                again = await self._execute([batch[i] for i in missing])
                for i, r in zip(missing, again):
                    results[i] = r
        except self._errors as exc:
            err = self.unavailable(exc)
            err.__cause__ = exc
            for *_, fut in batch:
                if not fut.done():
                    fut.set_exception(err)
            return
        except BaseException as exc:   # cancelled at shutdown, or a bug: never leave a caller hanging
            for *_, fut in batch:
                if not fut.done():
                    fut.set_exception(exc if isinstance(exc, Exception) else ControlPlaneUnavailableError(
                        f"redis call to {redact_url(self.url)} abandoned", url=redact_url(self.url)))
            raise
        for (method, args, _, fut), r in zip(batch, results):
            if fut.done():
                continue
            if isinstance(r, self._busy):
                fut.set_exception(self.unavailable(r, "loading its data"))
            elif isinstance(r, BaseException):
                name = args[0] if method == "evalsha" else method
                fut.set_exception(FlowMeshError(f"redis {name} at {redact_url(self.url)} failed: {r}"))
            else:
                fut.set_result(r)

    async def _execute(self, batch: list[_Call]) -> list[Any]:
        pipe = self.redis.pipeline(transaction=False)
        for method, args, kwargs, _ in batch:
            self._queue(pipe, method, args, kwargs)
        return list(await pipe.execute(raise_on_error=False))

    async def load_scripts(self) -> None:
        for src in self._scripts.values():
            await self.redis.script_load(src)

    async def ping(self, attempts: int = 3) -> None:
        """Reach the server (a few tries), load the scripts; a clear error naming the URL."""
        async def once() -> None:
            try:
                await self.redis.ping()
                await self.load_scripts()
            except self._errors as exc:
                raise self.unavailable(exc, "is redis-server running there?") from exc
        await retry_async(once, attempts=attempts, base_s=0.1, cap_s=0.5,
                          retry_on=(ControlPlaneUnavailableError,))

    async def close(self) -> None:
        if self._sender is not None:
            await asyncio.gather(self._sender, return_exceptions=True)
        await self.redis.aclose()
