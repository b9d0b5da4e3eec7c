"""Live Vast.ai offers from Vast.ai's offer search.

``POST https://console.vast.ai/api/v0/bundles/`` with a JSON query, as the official CLI
sends it (``vast-ai/vast-python``, ``vast.py`` ``search__offers``, read 2026-11-30): the
CLI's default filters ``verified``, ``external = false``, ``rentable``, ``rented =
false``, an ``order`` and ``type`` (``on-demand``, or ``bid`` for interruptible
instances), ``limit``; the answer is ``{"offers": [...]}``.  The API key, when
``VAST_API_KEY`` is set, goes in ``Authorization: Bearer``.

Every offer is one machine, so each becomes its own row with ``available`` = 1 and the
offer id in ``zone`` (``offer-<id>``): ``instance_type`` is ``<num_gpus>x-<gpu_name>``,
``region`` the host's ``geolocation``, vCPUs ``cpu_cores_effective`` (the share rented
with the GPUs), memory ``cpu_ram`` (MB) and GPU memory ``gpu_total_ram`` (MB) in GiB,
on-demand price ``dph_total`` (GPU + storage per hour), the interruptible market's
``min_bid`` as the spot price, ``reliability2`` as the reliability the bidder turns into
an expected interruption cost.  ``regions`` keeps offers whose geolocation ends with one
of them (a country code such as ``US``, or a full location string).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

import httpx

from flowmesh_sdk import settings as _settings
from flowmesh_sdk.catalog.http import TIMEOUT_S, request_json
from flowmesh_sdk.catalog.records import CatalogRow
from flowmesh_sdk.errors import ProviderError

PROVIDER = "vast"
ENDPOINT = "https://console.vast.ai"
KEY_VAR = "VAST_API_KEY"
LIMIT = 1000
BASE_QUERY = {"verified": {"eq": True}, "external": {"eq": False}, "rentable": {"eq": True},
              "rented": {"eq": False}}


async def _search(client: httpx.AsyncClient, base: str, kind: str, headers: dict[str, str]) -> list[dict[str, Any]]:
    query = {**BASE_QUERY, "order": [["dph_total", "asc"]], "type": kind, "limit": LIMIT}
    body = await request_json(client, "POST", f"{base}/api/v0/bundles/", json=query, headers=headers,
                              provider=PROVIDER, api="Vast.ai search", where=base, what=f"(search {kind})")
    if not isinstance(body, dict) or not isinstance(body.get("offers"), list):
        raise ProviderError(f"Vast.ai search ({kind}) answered without offers", provider=PROVIDER)
    return body["offers"]


def _region_ok(geo: str, regions: Sequence[str]) -> bool:
    return not regions or any(geo == r or geo.rstrip().endswith(f", {r}") or geo.endswith(r) for r in regions)


def row_from_offer(offer: dict[str, Any], min_bid: float | None, fetched_at: str) -> CatalogRow | None:
    try:
        gpus = int(offer.get("num_gpus") or 0)
        cpus = float(offer.get("cpu_cores_effective") or offer.get("cpu_cores") or 0)
        memory = float(offer.get("cpu_ram") or 0) / 1024.0
        price = float(offer["dph_total"])
    except (KeyError, TypeError, ValueError):
        return None
    if cpus <= 0 or memory <= 0 or price <= 0:
        return None
    gpu_name = str(offer.get("gpu_name") or "") or None
    gpu_mem = float(offer.get("gpu_total_ram") or 0) / 1024.0
    rel = offer.get("reliability2", offer.get("reliability"))
    reliability = float(rel) if isinstance(rel, (int, float)) and 0 < rel <= 1 else None
    kind = f"{gpus}x-{(gpu_name or 'cpu').replace(' ', '_')}"
    return CatalogRow(provider=PROVIDER, region=str(offer.get("geolocation") or "unknown"),
                      zone=f"offer-{offer.get('id')}", instance_type=kind, cpus=cpus, memory_gb=round(memory, 3),
                      on_demand_per_hour=price, spot_per_hour=min_bid if min_bid and min_bid > 0 else None,
                      gpus=gpus, gpu_name=gpu_name if gpus else None,
                      gpu_memory_gb=round(gpu_mem, 2) if gpus and gpu_mem > 0 else None,
                      arch="arm64" if str(offer.get("cpu_arch", "")).lower() in ("arm64", "aarch64") else "x86_64",
                      source=f"Vast.ai offer search /api/v0/bundles (offer {offer.get('id')}, machine "
                             f"{offer.get('machine_id')})",
                      fetched_at=fetched_at, reliability=reliability, available=1)


async def fetch_prices(*, endpoint: str | None = None, regions: Sequence[str] = (),
                       shapes: Sequence[CatalogRow] = ()) -> list[CatalogRow]:
    """Live on-demand and interruptible (minimum bid) $/h of the rentable Vast.ai offers."""
    base = (endpoint or ENDPOINT).rstrip("/")
    key = _settings.value("providers.vast.api_key")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    async with httpx.AsyncClient(timeout=TIMEOUT_S, follow_redirects=False) as client:
        on_demand = await _search(client, base, "on-demand", headers)
        bids = await _search(client, base, "bid", headers)
    min_bid = {o.get("id"): o.get("min_bid") for o in bids}
    rows = []
    for offer in on_demand:
        if not _region_ok(str(offer.get("geolocation") or ""), regions):
            continue
        bid = min_bid.get(offer.get("id"), offer.get("min_bid"))
        row = row_from_offer(offer, float(bid) if isinstance(bid, (int, float)) else None, stamp)
        if row is not None:
            rows.append(row)
    return rows


__all__ = ["BASE_QUERY", "ENDPOINT", "KEY_VAR", "fetch_prices", "row_from_offer"]
