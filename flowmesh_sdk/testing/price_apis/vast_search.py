""":class:`VastSearchEmulator` -- a TEST FIXTURE emulating Vast.ai's offer search
``POST /api/v0/bundles/`` (JSON query of ``{field: {op: value}}`` filters with ``order``,
``type`` = ``on-demand`` | ``bid``, ``limit``; ``Authorization: Bearer KEY``) answering
``{"offers": [...]}`` with the fields the real search returns (``id``, ``gpu_name``,
``num_gpus``, ``gpu_ram``/``gpu_total_ram`` in MB, ``cpu_cores_effective``, ``cpu_ram``
in MB, ``dph_total``, ``min_bid``, ``reliability2``, ``geolocation``, ...).  Source:
``vast-ai/vast-python`` ``vast.py`` ``search__offers`` and its sample output
``search.json``.

A TEST FIXTURE: see :mod:`flowmesh_sdk.testing.price_apis`."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from .base import Answer, _Emulator, _one

__all__ = ["VastSearchEmulator", "vast_offer"]


def vast_offer(offer_id: int, gpu_name: str, num_gpus: int, gpu_ram_mb: int, dph_total: float, min_bid: float,
               *, cpu_cores_effective: float = 16.0, cpu_ram_mb: int = 64_000, reliability: float = 0.99,
               geolocation: str = "Texas, US", verified: bool = True, rentable: bool = True) -> dict[str, Any]:
    """One offer in the shape of Vast.ai's search results (a subset of its ~80 fields)."""
    return {"id": offer_id, "ask_contract_id": offer_id, "machine_id": 10_000 + offer_id, "gpu_name": gpu_name,
            "num_gpus": num_gpus, "gpu_ram": gpu_ram_mb, "gpu_total_ram": gpu_ram_mb * num_gpus,
            "cpu_cores": int(cpu_cores_effective * 2), "cpu_cores_effective": cpu_cores_effective,
            "cpu_ram": cpu_ram_mb, "cpu_arch": "amd64", "dph_base": round(dph_total * 0.98, 6),
            "dph_total": dph_total, "min_bid": min_bid, "reliability": reliability, "reliability2": reliability,
            "geolocation": geolocation, "verification": "verified" if verified else "unverified",
            "verified": verified, "rentable": rentable, "rented": False, "external": False,
            "disk_space": 500.0, "inet_down": 900.0, "inet_up": 800.0, "gpu_mem_bw": 3000.0,
            "total_flops": 80.0, "cuda_max_good": 12.4, "is_bid": False}


class VastSearchEmulator(_Emulator):
    """A TEST FIXTURE emulating Vast.ai's ``/api/v0/bundles/`` offer search (see module doc)."""

    name = "vast-search"
    _OPS = {"eq": lambda a, b: a == b, "neq": lambda a, b: a != b, "gt": lambda a, b: a > b,
            "gte": lambda a, b: a >= b, "lt": lambda a, b: a < b, "lte": lambda a, b: a <= b,
            "in": lambda a, b: a in b, "notin": lambda a, b: a not in b}

    def __init__(self, offers: Sequence[dict[str, Any]] = (), api_key: str | None = "test-vast-key") -> None:
        super().__init__()
        self.offers = list(offers)
        self.api_key = api_key

    def answer(self, method: str, path: str, query: Mapping[str, list[str]], headers: Mapping[str, str],
               body: bytes, *, raw_query: str) -> Answer:
        if path.rstrip("/") != "/api/v0/bundles":
            return 404, {"success": False, "error": "not_found", "msg": f"{method} {path}"}, {}
        if self.api_key is not None:
            auth = headers.get("authorization", "")
            key = auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else _one(query, "api_key")
            if key != self.api_key:
                return 401, {"success": False, "error": "invalid_api_key", "msg": "Invalid user key"}, {}
        try:
            if method == "POST":
                q = json.loads(body or b"{}")
            else:
                q = json.loads(_one(query, "q") or "{}")
        except ValueError:
            return 400, {"success": False, "error": "invalid_request", "msg": "query is not JSON"}, {}
        kind = q.pop("type", "on-demand")
        if kind not in ("on-demand", "bid", "reserved"):
            return 400, {"success": False, "error": "invalid_request", "msg": f"type {kind!r}"}, {}
        order = q.pop("order", [])
        limit = q.pop("limit", None)
        q.pop("allocated_storage", None)
        q.pop("disable_bundling", None)
        hits = []
        for offer in self.offers:
            ok = True
            for fname, cond in q.items():
                if not isinstance(cond, dict):
                    return 400, {"success": False, "error": "invalid_request", "msg": f"bad filter {fname!r}"}, {}
                for op, want in cond.items():
                    fn = self._OPS.get(op)
                    if fn is None:
                        return 400, {"success": False, "error": "invalid_request", "msg": f"bad operator {op!r}"}, {}
                    if fname not in offer or not fn(offer[fname], want):
                        ok = False
            if ok:
                hits.append({**offer, "is_bid": kind == "bid"})
        for fname, direction in reversed(order or []):
            hits.sort(key=lambda o: o.get(fname, 0), reverse=direction == "desc")
        if limit is not None:
            hits = hits[:int(limit)]
        return 200, {"offers": hits}, {}
