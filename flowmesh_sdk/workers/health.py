"""The inference worker's health check: ``GET /health`` then ``GET /v1/models``, with a deadline.

vLLM's OpenAI-compatible server only listens once the weights are loaded, and answers
``/health`` with 200 while its engine is alive; ``/v1/models`` lists the served model
name (vLLM docs, "OpenAI-Compatible Server").  A worker is healthy when both hold and
the model it was asked to serve is listed.

Between tries the wait grows from ``first_wait_s`` by doubling up to ``max_wait_s``
(bounded backoff), and never past the deadline.  ``alive`` is asked after each failed
try: when the container has exited there is no point waiting, and the check fails at
once with the reason.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httpx

from ..errors import SpecError
from .errors import WorkerStartError


@dataclass(frozen=True, slots=True)
class HealthReport:
    """How the check went: tries made, seconds waited, the models the server listed."""

    attempts: int
    waited_s: float
    models: tuple[str, ...]


async def probe_once(client: httpx.AsyncClient, base_url: str, model: str,
                     timeout_s: float) -> tuple[bool, str, tuple[str, ...]]:
    """One try: ``(healthy, what was seen, models listed)``."""
    try:
        r = await client.get(f"{base_url}/health", timeout=timeout_s)
        if r.status_code != 200:
            return False, f"/health answered {r.status_code}", ()
        r = await client.get(f"{base_url}/v1/models", timeout=timeout_s)
        if r.status_code != 200:
            return False, f"/v1/models answered {r.status_code}", ()
        data = r.json().get("data") or []
        models = tuple(str(m.get("id")) for m in data if isinstance(m, dict))
    except (httpx.HTTPError, ValueError, AttributeError) as exc:
        return False, f"{type(exc).__name__}: {exc}".strip(": "), ()
    if model not in models:
        return False, f"/v1/models lists {list(models)}, not {model!r}", models
    return True, "healthy", models


async def wait_until_healthy(client: httpx.AsyncClient, base_url: str, model: str, *,
                             timeout_s: float,
                             alive: Callable[[], Awaitable[str | None]] | None = None,
                             first_wait_s: float = 0.1, max_wait_s: float = 2.0,
                             what: str = "worker") -> HealthReport:
    """Wait until ``base_url`` is healthy and serves ``model``; WorkerStartError when
    ``alive()`` returns a reason (the server died) or at the deadline."""
    if timeout_s <= 0:
        raise SpecError("timeout_s", f"must be > 0, got {timeout_s!r}")
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    wait = first_wait_s
    attempts = 0
    seen = "no answer yet"
    while True:
        attempts += 1
        left = deadline - time.monotonic()
        ok, seen, models = await probe_once(client, base_url, model, max(0.05, min(5.0, left)))
        if ok:
            return HealthReport(attempts, time.monotonic() - t0, models)
        if alive is not None:
            dead = await alive()
            if dead:
                raise WorkerStartError(f"{what} at {base_url} stopped before it was healthy "
                                       f"(last answer: {seen}): {dead}")
        left = deadline - time.monotonic()
        if left <= 0:
            raise WorkerStartError(f"{what} at {base_url} was not healthy after {timeout_s:g} s "
                                   f"and {attempts} tries (last answer: {seen})")
        await asyncio.sleep(min(wait, left))
        wait = min(max_wait_s, wait * 2)
