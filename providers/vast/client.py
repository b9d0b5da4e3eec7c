"""The ``vastai`` SDK (``pip install vastai``; the ``vastai-sdk`` package the design names is
a deprecated shim that re-exports it), driven off the event loop.

Facts checked against the installed library (vastai 1.9.1, 2026-12-01) and what the
driver does about each:

* ``VastAI(api_key=..., server_url=URL, retry=N)``: ``retry`` is the number of *attempts*
  (``for i in range(retry)``), and the default 3 retries 429/502/503/504 and connection
  errors with sleeps inside the call.  The driver passes ``retry=1``: one attempt, no
  hidden retry; the provisioner owns retries (a 429 has no ``Retry-After`` there).
* Its calls are blocking ``requests`` calls: every one runs in the bounded thread pool of
  a :class:`~flowmesh_sdk.offloop.OffLoop` (``max_workers``), never on the loop.
* ``vastai.AsyncClient`` is not used: the issue notes it fetches a certificate from the
  public console when made, which fails offline.  ``VastAI`` talks only to ``server_url``
  (tests check that no connection leaves 127.0.0.0/8).
* Calls used: ``search_offers`` (``POST /api/v0/bundles/``), ``create_instance``
  (``PUT /api/v0/asks/{offer}/`` -> ``{"success": true, "new_contract": id}``),
  ``show_instances`` (``GET /api/v1/instances/`` paged by ``next_token``; rows need a
  numeric ``start_date`` and ``extra_env`` as pairs), ``show_instance``
  (``GET /api/v0/instances/{id}/``), ``destroy_instance`` (``DELETE
  /api/v0/instances/{id}/``, or the bulk ``DELETE /api/v0/instances/`` with
  ``instance_ids``) and ``label_instance``.

Rate limits: Vast.ai limits each endpoint per identity (key, user and client IP) as a
minimum interval between requests, sometimes with a short-burst allowance, and publishes no
figures ("Rate limits and errors", https://docs.vast.ai/api-reference/rate-limits-and-errors).
:data:`RATES` is an assumption (1 create/s, burst 5; 2 destroys/s; 1 list/s, burst 5), the
same as the simulator's profile, not a published limit.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from flowmesh_sdk import settings as _settings
from flowmesh_sdk.errors import FlowMeshError, ProviderError
from flowmesh_sdk.offloop import OffLoop
from flowmesh_sdk.provider import ApiRate
from flowmesh_sdk.redaction import redact_url

from .errors import PROVIDER, map_http_error, missing_key, unreachable

log = logging.getLogger("flowmesh.providers.vast")
T = TypeVar("T")
SERVER = "https://console.vast.ai"

RATES: tuple[ApiRate, ...] = (
    ApiRate("launch", rate_per_s=1.0, burst=5),
    ApiRate("terminate", rate_per_s=2.0, burst=5),
    ApiRate("describe", rate_per_s=1.0, burst=5),
    ApiRate("list", rate_per_s=1.0, burst=5),
)


class VastClient:
    """One ``VastAI`` object, made in a worker thread on first use and called in worker threads."""

    def __init__(self, *, api_key: str | None, server_url: str | None, max_workers: int = 4) -> None:
        self._api_key = api_key or _settings.value("providers.vast.api_key")
        self.server_url = (server_url or SERVER).rstrip("/")
        self.max_workers = max_workers
        self._calls = OffLoop("flowmesh-vast", max_workers, self._make,
                              closed_error=lambda: ProviderError("the vast provider is closed", provider=PROVIDER,
                                                                 code="Closed"),
                              close_client=lambda sdk: None)

    def __repr__(self) -> str:
        return f"VastClient(server_url={redact_url(self.server_url)!r}, max_workers={self.max_workers})"

    def _make(self, _key: None) -> Any:
        try:
            from vastai import VastAI
        except ImportError as exc:  # pragma: no cover - the dev extra installs it
            raise ProviderError("the vast provider needs the vastai package: pip install "
                                "'flowmesh-sdk[vast]'", provider=PROVIDER, code="MissingDependency") from exc
        try:
            return VastAI(api_key=self._api_key, server_url=self.server_url, retry=1, raw=True, quiet=True)
        except RuntimeError as exc:   # "No API key found"
            raise missing_key() from exc

    def _run(self, where: str, fn: Callable[[Any], T], creating: bool) -> T:
        import requests
        try:
            return fn(self._calls.client())
        except FlowMeshError:
            raise
        except requests.HTTPError as exc:
            raise map_http_error(exc, where=where, creating=creating) from exc
        except (requests.ConnectionError, requests.Timeout) as exc:
            raise unreachable(exc, where=where, server=self.server_url) from exc
        except (ValueError, KeyError, TypeError) as exc:   # an answer the library could not read
            raise ProviderError(f"{where}: unexpected answer from Vast.ai: {type(exc).__name__}: {exc}",
                                provider=PROVIDER, code="BadAnswer") from exc

    async def call(self, where: str, fn: Callable[[Any], T], *, creating: bool = False) -> T:
        """``fn(VastAI)`` in a worker thread, errors mapped (cause chained)."""
        log.debug("vast %s", where)
        return await self._calls.run(lambda: self._run(where, fn, creating))

    async def close(self) -> None:
        await self._calls.close()


__all__ = ["RATES", "SERVER", "VastClient"]
