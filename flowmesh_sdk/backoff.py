"""Shared pieces of the retry policies: bounded retries with exponential backoff and
jitter that honours a server's ``Retry-After``, and the loopback test for hosts this
machine may talk to."""

from __future__ import annotations

import asyncio
import ipaddress
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

from .errors import ThrottledError

T = TypeVar("T")
SleepHook = Callable[[int, BaseException, float], None]   # (attempt, error, seconds to wait)


def backoff_delay(attempt: int, base_s: float, cap_s: float, exc: BaseException | None = None) -> float:
    """``base * 2**(attempt-1)`` capped at ``cap``, times a jitter in [0.5, 1), and at
    least the ``Retry-After`` a ThrottledError carried (capped too)."""
    delay = min(cap_s, base_s * 2 ** (attempt - 1)) * (0.5 + random.random() / 2)
    if isinstance(exc, ThrottledError) and exc.retry_after_s:
        delay = max(delay, min(exc.retry_after_s, cap_s))
    return delay


async def retry_async(fn: Callable[[], Awaitable[T]], *, attempts: int, base_s: float, cap_s: float,
                      retry_on: tuple[type[BaseException], ...],
                      before_sleep: SleepHook | None = None) -> T:
    """``await fn()``, again after a backoff when it raises one of ``retry_on``, at most
    ``attempts`` times in all; the last error is raised as it is.  (A plain loop: this
    sits on the hot path of every cloud call and image pull.)"""
    attempt = 1
    while True:
        try:
            return await fn()
        except retry_on as exc:
            if attempt >= attempts:
                raise
            wait = backoff_delay(attempt, base_s, cap_s, exc)
            if before_sleep is not None:
                before_sleep(attempt, exc, wait)
            await asyncio.sleep(wait)
            attempt += 1


def is_loopback_host(host: str) -> bool:
    """``localhost`` or an address in 127.0.0.0/8 (or ::1); brackets and a port are allowed."""
    if host.startswith("["):
        host = host[1:].split("]", 1)[0]
    elif host.count(":") == 1:
        host = host.rsplit(":", 1)[0]
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False

