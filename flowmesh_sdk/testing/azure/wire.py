"""The ARM emulator's wire pieces: its routes, error bodies, timestamps and long-running
operations (ARM's ``Azure-AsyncOperation`` protocol)."""

from __future__ import annotations

import datetime as _dt
import re
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from ..httpserver import json_response

__all__ = ["Op", "ROUTES", "arm_error", "now_iso"]


@dataclass
class Op:
    id: str
    location: str
    done_at: float | None
    apply: Any
    status: str = "InProgress"
    error: dict[str, str] | None = None

    def due(self, now: float) -> bool:
        return self.status == "InProgress" and self.done_at is not None and now >= self.done_at


def arm_error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return json_response(status, {"error": {"code": code, "message": message}}, headers)


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat().replace("+00:00", "Z")


ROUTES = [
    ("rg", re.compile(r"^/subscriptions/([^/]+)/resourcegroups/([^/]+)$", re.I)),
    ("skus", re.compile(r"^/subscriptions/([^/]+)/providers/microsoft\.compute/skus$", re.I)),
    ("op", re.compile(r"^/subscriptions/([^/]+)/providers/microsoft\.(?:compute|network)/locations/([^/]+)/"
                      r"(?:operations|operationresults)/([^/]+)$", re.I)),
    ("vms", re.compile(r"^/subscriptions/([^/]+)/resourcegroups/([^/]+)/providers/microsoft\.compute/"
                       r"virtualmachines$", re.I)),
    ("vm", re.compile(r"^/subscriptions/([^/]+)/resourcegroups/([^/]+)/providers/microsoft\.compute/"
                      r"virtualmachines/([^/]+)$", re.I)),
    ("vnet", re.compile(r"^/subscriptions/([^/]+)/resourcegroups/([^/]+)/providers/microsoft\.network/"
                        r"virtualnetworks/([^/]+)$", re.I)),
    ("nic", re.compile(r"^/subscriptions/([^/]+)/resourcegroups/([^/]+)/providers/microsoft\.network/"
                       r"networkinterfaces/([^/]+)$", re.I)),
]
