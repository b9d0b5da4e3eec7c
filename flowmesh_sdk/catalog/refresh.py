"""Live price refresh: run a provider's price adapter and keep its answer as a dated
catalog in the user's cache directory.

The adapters live with their providers (``providers/<name>/prices.py``) and each talks
only to its own provider's price API; the core finds each through its provider's
descriptor (``prices``, :mod:`flowmesh_sdk.backends`) and never imports a cloud SDK itself.  An adapter is an
async callable::

    async def fetch_prices(*, endpoint: str | None, regions: Sequence[str],
                           shapes: Sequence[CatalogRow]) -> list[CatalogRow]

``endpoint`` overrides the API's base URL (tests point it at the emulators in
:mod:`flowmesh_sdk.testing.price_apis`); ``regions`` narrows the query (empty: the
adapter's default regions); ``shapes`` are the provider's rows in the current catalog,
for the APIs that price components or single types and need to know which instance
types to price (GCE, Azure, Alibaba).

Throttling (``ThrottledError``, honouring ``Retry-After``) and outages
(``ProviderUnavailableError``) are retried here, from outside the adapter, with the
SDK's jittered exponential backoff (``attempts`` tries); any other error stops at once.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from .. import backends
from ..backoff import retry_async
from ..descriptor import load_ref
from ..errors import FlowMeshError, ProviderUnavailableError, SpecError, ThrottledError
from ..redaction import redact_url
from .loader import Catalog, cache_dir, write_csv
from .records import CatalogRow, canonical_provider

Adapter = Callable[..., Awaitable[list[CatalogRow]]]


@dataclass(frozen=True, slots=True)
class RefreshResult:
    provider: str
    path: Path
    rows: int
    priced: int
    regions: tuple[str, ...]
    fetched_at: str


def price_sources() -> dict[str, str]:
    """``{provider: "module:function"}`` of the installed price adapters."""
    return {n: d.prices for n, d in backends.descriptors().items() if d.prices is not None}


def load_adapter(provider: str) -> Adapter:
    name = canonical_provider(provider)
    found = price_sources()
    if name not in found:
        raise SpecError("provider", f"no price adapter for {provider!r}; installed: "
                                    f"{', '.join(sorted(found)) or 'none'} (catalog providers: "
                                    f"{', '.join(backends.catalog_providers())})")
    adapter: Adapter = load_ref(found[name], "provider")
    return adapter


async def refresh(provider: str, *, endpoint: str | None = None, regions: Sequence[str] = (),
                  cache: str | Path | None = None, adapter: Adapter | None = None, attempts: int = 4,
                  backoff_s: float = 0.5, backoff_max_s: float = 20.0) -> RefreshResult:
    """Fetch ``provider``'s live prices and write them to ``<cache>/<provider>.csv``.

    Rows the API returned without a price are kept (blank price); an answer with no row
    at all is an error and leaves the cached catalog as it was."""
    name = canonical_provider(provider)
    fetch = adapter or load_adapter(name)
    shapes = (list((await asyncio.to_thread(Catalog.load, [name], cache=cache, warn=False)).rows)
              if name in backends.catalog_providers() else [])
    rows = await retry_async(lambda: fetch(endpoint=endpoint, regions=tuple(regions), shapes=tuple(shapes)),
                             attempts=max(1, attempts), base_s=backoff_s, cap_s=backoff_max_s,
                             retry_on=(ThrottledError, ProviderUnavailableError))
    rows = [r for r in rows if r.provider == name]
    if not rows:
        where = f" at {redact_url(endpoint)}" if endpoint else ""
        raise FlowMeshError(f"the {name} price API{where} returned no instance prices"
                            + (f" for region(s) {', '.join(regions)}" if regions else "")
                            + "; the cached catalog is unchanged")
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    rows = [r if r.fetched_at else replace(r, fetched_at=stamp) for r in rows]
    folder = Path(cache) if cache is not None else cache_dir()
    path = await asyncio.to_thread(write_csv, folder / f"{name}.csv", rows)
    return RefreshResult(provider=name, path=path, rows=len(rows),
                         priced=sum(1 for r in rows if r.on_demand_per_hour is not None
                                    or r.spot_per_hour is not None),
                         regions=tuple(sorted({r.region for r in rows})), fetched_at=stamp)


__all__ = ["Adapter", "RefreshResult", "load_adapter", "price_sources", "refresh"]
