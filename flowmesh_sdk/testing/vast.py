"""A TEST FIXTURE emulating the Vast.ai REST API on 127.0.0.1 for the ``vast`` provider and
users' offline tests.  It is not Vast.ai: it answers the calls the ``vastai`` SDK makes for
the provider, in Vast's shapes, and the real ``VastAI`` client is pointed at it::

    with VastEmulator() as vast:
        provider = vast.provider(ssh=True)    # VastProvider(server_url=vast.url, api_key=...)

Wire facts (checked against vastai 1.9.1): search ``POST /api/v0/bundles/`` with a JSON
query (from :class:`~flowmesh_sdk.testing.price_apis.VastSearchEmulator`; a rented ask is
no longer listed); create ``PUT /api/v0/asks/{id}/`` answering ``{"success": true,
"new_contract": id}``; list ``GET /api/v1/instances/`` paged by ``next_token`` (``limit``,
``after_token``; rows carry a numeric ``start_date`` and ``extra_env`` as a list of pairs);
show ``GET /api/v0/instances/{id}/`` (``{"instances": row}``); label ``PUT
/api/v0/instances/{id}/``; destroy ``DELETE /api/v0/instances/{id}/`` or the bulk ``DELETE
/api/v0/instances/`` with ``instance_ids``.  Errors are plain HTTP errors with the reason in
the body (``{"success": false, "error", "msg"}``), and a rate-limited call answers 429 with
the text ``API requests too frequent`` and no ``Retry-After``
(docs.vast.ai/api-reference/rate-limits-and-errors).

Each instance can be a real machine: :meth:`address` (``SshMode(address_map=...)``) boots it
once from the ``#cloud-config`` its ``onstart`` carries (what that script installs) as a
loopback sshd host; destroying it stops that sshd.

Switches: :meth:`rate_limit` (the next N calls answer 429), :meth:`gone` (an ask disappears
between search and create: create answers ``no_such_ask``), :meth:`outbid` (an
interruptible instance is stopped: ``actual_status`` ``exited``, ``intended_status``
``stopped``), :meth:`fail_after_create` (the next create makes the instance, then answers
500: a half-made instance), :meth:`deny` (401).
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any

from .cloudinit import CloudInitHosts
from .price_apis import VastSearchEmulator, vast_offer
from .price_apis.base import Answer

__all__ = ["DEFAULT_OFFERS", "VastEmulator"]

DEFAULT_OFFERS: tuple[dict[str, Any], ...] = (
    vast_offer(5001, "RTX 4090", 1, 24_564, 0.35, 0.18, reliability=0.995, geolocation="Texas, US"),
    vast_offer(5002, "RTX 4090", 1, 24_564, 0.42, 0.20, reliability=0.97, geolocation="Quebec, CA"),
    vast_offer(5003, "A100 SXM4", 1, 81_920, 1.10, 0.60, reliability=0.999, geolocation="Oregon, US"),
    vast_offer(5004, "RTX 3090", 1, 24_576, 0.22, 0.10, reliability=0.90, geolocation="Poland, PL"),
    vast_offer(5005, "H100 SXM", 2, 81_559, 4.20, 2.40, cpu_cores_effective=32.0, cpu_ram_mb=256_000,
               reliability=0.995, geolocation="Texas, US"),
)


def _text(status: int, text: str) -> tuple[int, Any, dict[str, str]]:
    return status, text, {"Content-Type": "text/plain"}


class VastEmulator(VastSearchEmulator):
    """A TEST FIXTURE: the Vast.ai API for the calls the ``vast`` provider makes (module doc)."""

    name = "vast-emulator"

    def __init__(self, offers: Sequence[dict[str, Any]] = DEFAULT_OFFERS, api_key: str = "test-vast-key", *,
                 page_size: int = 25, first_host: int = 160, **sshd_kwargs: Any) -> None:
        super().__init__([dict(o) for o in offers], api_key=api_key)
        self.page_size = page_size
        # an instance is a container: no runtime on it (the fleet must not nest sandboxes there)
        self.hosts = CloudInitHosts(first_host=first_host, without_runtime=True, **sshd_kwargs)
        self._state = threading.Lock()
        self._instances: dict[int, dict[str, Any]] = {}
        self._ids = itertools.count(9_000_001)
        self._rate_limited = 0
        self._fail_after_create = 0
        self.calls: list[tuple[str, str]] = []

    # ---- switches --------------------------------------------------------------------
    def rate_limit(self, times: int = 1) -> None:
        with self._state:
            self._rate_limited += times

    def gone(self, offer_id: int) -> None:
        """The ask is rented by someone else: it leaves the search, and create refuses it."""
        with self._state:
            for o in self.offers:
                if o["id"] == offer_id:
                    o["rented"] = True
                    o["_taken"] = True

    def outbid(self, instance_id: int | str) -> None:
        """An interruptible instance was outbid: stopped, still billed for storage."""
        with self._state:
            row = self._instances[int(instance_id)]
            row.update(actual_status="exited", intended_status="stopped", cur_state="stopped")

    def fail_after_create(self, times: int = 1) -> None:
        with self._state:
            self._fail_after_create += times

    def add_offer(self, offer: dict[str, Any]) -> None:
        with self._state:
            self.offers.append(dict(offer))

    def count(self, what: str) -> int:
        with self._state:
            return sum(1 for w, _ in self.calls if w == what)

    @property
    def instances(self) -> list[dict[str, Any]]:
        with self._state:
            return [json.loads(json.dumps(r)) for r in self._instances.values()]

    def address(self, instance: Any) -> tuple[str, int]:
        """``SshMode.address_map``: boot the instance (once) from its onstart's cloud-config."""
        from flowmesh_providers.vast.provider import cloud_config_of
        iid = str(instance.id)
        vm = self.hosts.booted(iid)
        if vm is None:
            with self._state:
                row = self._instances.get(int(iid))
                onstart = row.get("onstart") if row else None
            if row is None:
                raise RuntimeError(f"instance {iid} does not exist (destroyed?)")
            vm = self.hosts.boot(iid, cloud_config_of(onstart) or "")
        return vm.sshd.host, vm.sshd.port

    def provider(self, **kwargs: Any) -> Any:
        from flowmesh_providers.vast import SshMode, VastProvider
        ssh = kwargs.pop("ssh", None)
        if ssh is True:
            ssh = SshMode(address_map=self.address)
        kwargs.setdefault("api_key", self.api_key)
        return VastProvider(server_url=self.url, ssh=ssh, **kwargs)

    def stop(self) -> None:
        super().stop()
        self.hosts.close()

    # ---- HTTP ------------------------------------------------------------------------
    def answer(self, method: str, path: str, query: Mapping[str, list[str]], headers: Mapping[str, str],
               body: bytes, *, raw_query: str) -> Answer:
        auth = headers.get("authorization", "")
        key = auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else None
        with self._state:
            self.calls.append((self._what(method, path), path))
            if self._rate_limited > 0:
                self._rate_limited -= 1
                return _text(429, "API requests too frequent: endpoint threshold=2.0")
        if key != self.api_key:
            return 401, {"success": False, "error": "invalid_user_key", "msg": "Invalid user key"}, {}
        if path.rstrip("/") == "/api/v0/bundles":
            return super().answer(method, path, query, headers, body, raw_query=raw_query)
        try:
            payload = json.loads(body) if body else {}
        except ValueError:
            return 400, {"success": False, "error": "invalid_request", "msg": "the body is not JSON"}, {}
        with self._state:
            if m := re.fullmatch(r"/api/v0/asks/(\d+)/?", path):
                if method == "PUT":
                    return self._create(int(m.group(1)), payload)
            elif path.rstrip("/") == "/api/v1/instances" and method == "GET":
                return self._list(query)
            elif m := re.fullmatch(r"/api/v0/instances/(\d+)/?", path):
                iid = int(m.group(1))
                if method == "GET":
                    row = self._instances.get(iid)
                    return 200, {"instances": self._public(row) if row else None}, {}
                if method == "DELETE":
                    return self._destroy([iid])
                if method == "PUT" and "label" in payload:
                    if iid not in self._instances:
                        return 404, {"success": False, "error": "no_such_instance", "msg": f"instance {iid}"}, {}
                    self._instances[iid]["label"] = str(payload["label"])
                    return 200, {"success": True}, {}
            elif path.rstrip("/") == "/api/v0/instances" and method == "DELETE":
                return self._destroy([int(i) for i in payload.get("instance_ids") or []])
        return 404, {"success": False, "error": "not_found", "msg": f"{method} {path}"}, {}

    @staticmethod
    def _what(method: str, path: str) -> str:
        if "/bundles" in path:
            return "search"
        if "/asks/" in path:
            return "create"
        if method == "DELETE":
            return "destroy"
        if path.startswith("/api/v1/instances"):
            return "list"
        return "show" if method == "GET" else "update"

    @staticmethod
    def _public(row: Mapping[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in row.items() if not k.startswith("_")}

    def _create(self, ask: int, payload: Mapping[str, Any]) -> tuple[int, Any, dict[str, str]]:
        offer = next((o for o in self.offers if o["id"] == ask), None)
        if offer is None or offer.get("rented"):
            return 400, {"success": False, "error": "no_such_ask",
                         "msg": f"Instance type by id {ask} is not available."}, {}
        if not payload.get("image"):
            return 400, {"success": False, "error": "invalid_args", "msg": "image is required"}, {}
        price = payload.get("price")
        if price is not None and float(price) < float(offer["min_bid"]):
            return 400, {"success": False, "error": "bid_too_low",
                         "msg": f"bid {price} is below the minimum bid {offer['min_bid']}"}, {}
        label = payload.get("label")
        if label is not None and len(str(label)) > 1024:
            return 400, {"success": False, "error": "invalid_args", "msg": "label too long"}, {}
        iid = next(self._ids)
        offer["rented"] = True
        env = payload.get("env") or {}
        self._instances[iid] = {
            "id": iid, "machine_id": offer["machine_id"], "ask_contract_id": ask, "label": label,
            "image_uuid": payload["image"], "onstart": payload.get("onstart"), "disk_space": payload.get("disk"),
            "extra_env": [[k, v] for k, v in env.items()], "start_date": time.time(),
            "actual_status": "running", "intended_status": "running", "cur_state": "running",
            "is_bid": price is not None, "bid_price": float(price) if price is not None else None,
            "dph_total": float(price) if price is not None else offer["dph_total"],
            "gpu_name": offer["gpu_name"], "num_gpus": offer["num_gpus"], "gpu_ram": offer["gpu_ram"],
            "cpu_cores_effective": offer["cpu_cores_effective"], "cpu_ram": offer["cpu_ram"],
            "geolocation": offer["geolocation"], "reliability2": offer["reliability2"],
            "ssh_host": f"ssh{iid % 9}.vast.ai", "ssh_port": 20000 + iid % 10000,
            "public_ipaddr": f"203.0.113.{iid % 250 + 1}",
            "ports": {"22/tcp": [{"HostIp": "0.0.0.0", "HostPort": str(40000 + iid % 10000)}]},
            "runtype": payload.get("runtype")}
        if self._fail_after_create > 0:
            self._fail_after_create -= 1
            return 500, {"success": False, "error": "server_error", "msg": "internal error after create"}, {}
        return 200, {"success": True, "new_contract": iid}, {}

    def _list(self, query: Mapping[str, list[str]]) -> tuple[int, Any, dict[str, str]]:
        def arg(name: str, default: Any) -> Any:
            raw = query[name][0] if query.get(name) else None
            if raw is None:
                return default
            return json.loads(urllib.parse.unquote_plus(raw)) if raw[:1] in "[{0123456789\"" else raw
        limit = min(int(arg("limit", 25)), self.page_size)
        after = arg("after_token", None)
        rows = sorted(self._instances.values(), key=lambda r: r["id"])
        if after is not None:
            rows = [r for r in rows if r["id"] > int(after)]
        page = rows[:limit]
        out: dict[str, Any] = {"instances": [self._public(r) for r in page], "total_instances": len(self._instances)}
        if len(rows) > limit:
            out["next_token"] = str(page[-1]["id"])
        return 200, out, {}

    def _destroy(self, ids: list[int]) -> tuple[int, Any, dict[str, str]]:
        if not ids:
            return 400, {"success": False, "error": "invalid_args", "msg": "no instance ids"}, {}
        for iid in ids:
            row = self._instances.pop(iid, None)
            if row is not None:
                for o in self.offers:   # the machine is rentable again (unless someone else took it)
                    if o["id"] == row["ask_contract_id"] and not o.get("_taken"):
                        o["rented"] = False
                self.hosts.halt_soon(str(iid))
        return 200, {"success": True}, {}
