"""Blocking client libraries called off the event loop.

The cloud SDKs (boto3, google-cloud-compute, azure-mgmt-*, vastai) make blocking HTTP
calls.  A provider's client composes one :class:`OffLoop`: its library clients are made
on first use, in a worker thread (making one may read files or fetch credentials), and
every call runs in a bounded pool of ``max_workers`` threads, so nothing blocks the event
loop and a burst of calls cannot start more threads than that.  ``close()`` closes the
clients (best effort) and the pool; a call after it raises the provider's own error.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

T = TypeVar("T")


def _close(client: Any) -> None:
    close = getattr(client, "close", None)
    if close is not None:
        close()


class OffLoop:
    """Lazily made clients (one per key: a region, a service) and the pool that calls them."""

    def __init__(self, name: str, max_workers: int, make: Callable[[Any], Any], *,
                 closed_error: Callable[[], BaseException],
                 close_client: Callable[[Any], None] = _close) -> None:
        self.name = name
        self.max_workers = max_workers
        self._make = make
        self._closed_error = closed_error
        self._close_client = close_client
        self._clients: dict[Hashable, Any] = {}
        self._lock = threading.Lock()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def client(self, key: Hashable = None) -> Any:
        """The client for ``key``, made once (call it from a worker thread)."""
        with self._lock:
            found = self._clients.get(key)
            if found is None:
                found = self._clients[key] = self._make(key)
            return found

    async def run(self, fn: Callable[[], T]) -> T:
        """``fn()`` in the pool."""
        if self._closed:
            raise self._closed_error()
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=self.max_workers,
                                                               thread_name_prefix=self.name)
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn)

    async def close(self) -> None:
        self._closed = True
        pool, self._pool = self._pool, None
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for c in clients:
            try:
                self._close_client(c)
            except Exception:  # noqa: BLE001 - best effort
                pass
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


__all__ = ["OffLoop"]
