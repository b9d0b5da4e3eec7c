"""The ARM emulator's wire pieces: its routes, error bodies, timestamps and long-running
operations (ARM's ``Azure-AsyncOperation`` protocol)."""

from __future__ import annotations

import datetime as _dt
import re
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from ..httpserver import json_response

__all__ = ["Op", "ROUTES", "arm_error", "now_iso", "resource_not_found"]


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


def resource_not_found(kind: str, name: str, rg: str) -> web.Response:
    """ARM's 404 for a resource of ``kind`` (``Microsoft.Compute/virtualMachines``) not in ``rg``."""
    return arm_error(404, "ResourceNotFound", f"The Resource '{kind}/{name}' under resource group '{rg}' was not "
                                              "found.")


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat().replace("+00:00", "Z")


ROUTES = [
    ("subs", re.compile(r"^/subscriptions$", re.I)),
    ("sub", re.compile(r"^/subscriptions/([^/]+)$", re.I)),
    ("tenants", re.compile(r"^/tenants$", re.I)),
    ("imagevers", re.compile(r"^/subscriptions/([^/]+)/providers/microsoft\.compute/locations/([^/]+)/publishers/"
                             r"([^/]+)/artifacttypes/vmimage/offers/([^/]+)/skus/([^/]+)/versions$", re.I)),
    ("imagever", re.compile(r"^/subscriptions/([^/]+)/providers/microsoft\.compute/locations/([^/]+)/publishers/"
                            r"([^/]+)/artifacttypes/vmimage/offers/([^/]+)/skus/([^/]+)/versions/([^/]+)$", re.I)),
    ("deployment", re.compile(r"^/subscriptions/([^/]+)/resourcegroups/([^/]+)/providers/microsoft\.resources/"
                              r"deployments/([^/]+)$", re.I)),
    ("deploymentop", re.compile(r"^/subscriptions/([^/]+)/resourcegroups/([^/]+)/providers/microsoft\.resources/"
                                r"deployments/([^/]+)/operationstatuses/([^/]+)$", re.I)),
    ("rgs", re.compile(r"^/subscriptions/([^/]+)/resourcegroups$", re.I)),
    ("allvms", re.compile(r"^/subscriptions/([^/]+)/providers/microsoft\.compute/virtualmachines$", re.I)),
    ("rg", re.compile(r"^/subscriptions/([^/]+)/resourcegroups/([^/]+)$", re.I)),
    ("skus", re.compile(r"^/subscriptions/([^/]+)/providers/microsoft\.compute/skus$", re.I)),
    ("op", re.compile(r"^/subscriptions/([^/]+)/providers/microsoft\.(?:compute|network)/locations/([^/]+)/"
                      r"(?:operations|operationresults)/([^/]+)$", re.I)),
    ("vms", re.compile(r"^/subscriptions/([^/]+)/resourcegroups/([^/]+)/providers/microsoft\.compute/"
                       r"virtualmachines$", re.I)),
    ("vm", re.compile(r"^/subscriptions/([^/]+)/resourcegroups/([^/]+)/providers/microsoft\.compute/"
                      r"virtualmachines/([^/]+)$", re.I)),
    ("vnets", re.compile(r"^/subscriptions/([^/]+)/resourcegroups/([^/]+)/providers/microsoft\.network/"
                         r"virtualnetworks$", re.I)),
    ("vnet", re.compile(r"^/subscriptions/([^/]+)/resourcegroups/([^/]+)/providers/microsoft\.network/"
                        r"virtualnetworks/([^/]+)$", re.I)),
    ("nics", re.compile(r"^/subscriptions/([^/]+)/resourcegroups/([^/]+)/providers/microsoft\.network/"
                        r"networkinterfaces$", re.I)),
    ("nic", re.compile(r"^/subscriptions/([^/]+)/resourcegroups/([^/]+)/providers/microsoft\.network/"
                       r"networkinterfaces/([^/]+)$", re.I)),
]
