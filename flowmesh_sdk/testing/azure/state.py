"""The ARM emulator's state and what its handlers share: long-running operations (made,
completed when due), the resource-group check and a VM's removal with its NICs."""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from aiohttp import web

from ..cloudinit import CloudInitHosts
from ..httpserver import json_response
from .wire import Op, arm_error

__all__ = ["ArmState", "DEFAULT_SIZES", "SUBSCRIPTION"]

SUBSCRIPTION = "00000000-0000-4000-8000-00000000f10e"
# (name, vCPUs, memory GB, GPUs)
DEFAULT_SIZES: tuple[tuple[str, int, float, int], ...] = (
    ("Standard_D2s_v5", 2, 8.0, 0),
    ("Standard_D4s_v5", 4, 16.0, 0),
    ("Standard_D8s_v5", 8, 32.0, 0),
    ("Standard_F2s_v2", 2, 4.0, 0),
    ("Standard_NC4as_T4_v3", 4, 28.0, 1),
)


class ArmState:
    """The emulator's state: its settings, resources, switches and call log, behind one lock,
    and what every handler part shares (:class:`~flowmesh_sdk.testing.azure.AzureEmulator`
    owns one and hands it to its parts).  ``url`` gives the emulator's base URL (an
    operation's ``Azure-AsyncOperation`` link names it)."""

    def __init__(self, url: Callable[[], str], *, subscription: str = SUBSCRIPTION,
                 locations: Sequence[str] = ("eastus",), sizes: Sequence[tuple[str, int, float, int]] = DEFAULT_SIZES,
                 token: str | None = None, first_host: int = 120, **sshd_kwargs: Any) -> None:
        self.url = url
        self.subscription = subscription
        self.locations = tuple(locations)
        self.sizes = tuple(sizes)
        self.token = token or f"emulator-{uuid.uuid4().hex}"
        self.hosts = CloudInitHosts(first_host=first_host, **sshd_kwargs)
        self.lock = threading.Lock()
        self.groups: dict[str, dict[str, Any]] = {}
        self.vms: dict[tuple[str, str], dict[str, Any]] = {}        # (rg, name lower) -> VM
        self.custom: dict[str, str] = {}                             # vmId -> customData (never returned)
        self.nics: dict[tuple[str, str], dict[str, Any]] = {}
        self.vnets: dict[tuple[str, str], dict[str, Any]] = {}
        self.ops: dict[str, Op] = {}
        self.ip = itertools.count(4)
        self.exhausted: list[tuple[str | None, str]] = []            # (size or None, how)
        self.core_quota: dict[str, int] = {}
        self.faults: list[list[Any]] = []                            # [kind, method, status, code, times]
        self.op_delay: dict[str, float | None] = {}
        self.deny = False
        self.calls: list[tuple[str, str]] = []                       # (kind, method)

    def tick(self) -> None:
        now = time.monotonic()
        for op in self.ops.values():
            if op.due(now):
                try:
                    op.error = op.apply()
                except Exception as exc:  # a bug in the emulator fails the operation, visibly
                    op.error = {"code": "InternalServerError", "message": f"emulator error: {exc!r}"}
                op.status = "Failed" if op.error else "Succeeded"

    def lro(self, request: web.Request, location: str, kind: str, apply: Any, status: int,
             body: Any) -> web.Response:
        delay = self.op_delay.get(kind, 0.0)
        op = Op(uuid.uuid4().hex, location, None if delay is None else time.monotonic() + delay, apply)
        self.ops[op.id] = op
        namespace = "Microsoft.Network" if kind in ("vnet", "nic") else "Microsoft.Compute"   # the operation's owner
        base = f"{self.url()}/subscriptions/{self.subscription}/providers/{namespace}/locations/{location}"
        api = request.query["api-version"]
        headers = {"Azure-AsyncOperation": f"{base}/operations/{op.id}?api-version={api}"}
        if request.method == "DELETE":
            headers["Location"] = f"{base}/operationResults/{op.id}?api-version={api}"
        return json_response(status, body, headers) if body is not None else web.Response(status=status,
                                                                                        headers=headers)

    def need_rg(self, rg: str) -> web.Response | None:
        if rg.lower() not in self.groups:
            return arm_error(404, "ResourceGroupNotFound", f"Resource group '{rg}' could not be found.")
        return None

    def remove_vm(self, key: tuple[str, str]) -> None:
        vm = self.vms.pop(key, None)
        if vm is None:
            return
        for ref in vm["properties"].get("networkProfile", {}).get("networkInterfaces") or []:
            nic_key = (key[0], ref["id"].rsplit("/", 1)[-1].lower())
            if str((ref.get("properties") or {}).get("deleteOption") or "Detach").lower() == "delete":
                self.nics.pop(nic_key, None)
            elif nic_key in self.nics:
                self.nics[nic_key]["properties"].pop("virtualMachine", None)
        self.custom.pop(vm["properties"]["vmId"], None)
