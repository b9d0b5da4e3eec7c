"""Shared pieces of the retry policies: exponential backoff with jitter that honours a
server's ``Retry-After``, and the loopback test for hosts this machine may talk to."""

from __future__ import annotations

import ipaddress
import random
from collections.abc import Callable

from tenacity import RetryCallState

from .errors import ThrottledError


def jittered_backoff(base_s: float, cap_s: float) -> Callable[[RetryCallState], float]:
    """A tenacity ``wait``: ``base * 2**(n-1)`` capped at ``cap``, times a jitter in
    [0.5, 1), and at least the ``Retry-After`` a ThrottledError carried (capped too)."""
    def wait(state: RetryCallState) -> float:
        delay = min(cap_s, base_s * 2 ** (state.attempt_number - 1)) * (0.5 + random.random() / 2)
        exc = state.outcome.exception() if state.outcome else None
        if isinstance(exc, ThrottledError) and exc.retry_after_s:
            delay = max(delay, min(exc.retry_after_s, cap_s))
        return delay
    return wait


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
