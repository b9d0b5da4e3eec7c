"""The Compute Engine emulator's server: its switches, views and routes (the package
docstring says what it serves).  It owns one :class:`~.state.GceState` and the handler parts
made over it (:class:`~.reads.Reads`, :class:`~.operations.Operations`,
:class:`~.mutations.Mutations`), and routes each call to one of their methods."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from aiohttp import web

from ..cloudinit import CloudInitHosts
from ..httpserver import HttpServer
from .batch import serve_batch
from .mutations import Mutations
from .operations import Operations
from .reads import Reads
from .state import GceState
from .wire import DEFAULT_MACHINE_TYPES, Fault, error, error_body_of

__all__ = ["DEFAULT_MACHINE_TYPES", "GceEmulator"]


class GceEmulator(HttpServer):
    """A TEST FIXTURE: Compute Engine's REST API for the calls the ``gce`` provider makes."""

    name = "gce-emulator"

    def __init__(self, *, project: str = "flowmesh-test", zones: Sequence[str] = ("us-central1-a", "us-central1-b"),
                 machine_types: Sequence[tuple[str, int, int, str | None, int]] = DEFAULT_MACHINE_TYPES,
                 page_size: int = 500, wait_hold_s: float = 0.5, first_host: int = 60, port: int = 0,
                 **sshd_kwargs: Any) -> None:
        super().__init__(port=port)
        self.state = GceState(project=project, zones=zones, machine_types=machine_types, page_size=page_size,
                              wait_hold_s=wait_hold_s, first_host=first_host, **sshd_kwargs)
        self.reads = Reads(self.state)
        self.operations = Operations(self.state)
        self.mutations = Mutations(self.state, self.operations)

    # ---- settings (the state's) ----------------------------------------------------------
    @property
    def project(self) -> str:
        return self.state.project

    @property
    def zones(self) -> tuple[str, ...]:
        return self.state.zones

    @property
    def machine_types(self) -> tuple[tuple[str, int, int, str | None, int], ...]:
        return self.state.machine_types

    @property
    def page_size(self) -> int:
        return self.state.page_size

    @page_size.setter
    def page_size(self, value: int) -> None:
        self.state.page_size = value

    @property
    def wait_hold_s(self) -> float:
        return self.state.wait_hold_s

    @wait_hold_s.setter
    def wait_hold_s(self, value: float) -> None:
        self.state.wait_hold_s = value

    @property
    def hosts(self) -> CloudInitHosts:
        return self.state.hosts

    @property
    def calls(self) -> list[tuple[str, str]]:
        """Every call served, as ``(method name, path)``."""
        return self.state.calls

    def error_body(self, status: int, message: str) -> dict[str, Any]:
        return error_body_of(status, "backendError", message)

    # ---- switches --------------------------------------------------------------------
    def exhaust(self, zone: str | None = None, machine_type: str | None = None) -> None:
        """bulkInsert operations in ``zone`` (any) for ``machine_type`` (any) end in
        ``ZONE_RESOURCE_POOL_EXHAUSTED`` until :meth:`restore`."""
        with self.state.lock:
            self.state.exhausted.append((zone, machine_type))

    def restore(self) -> None:
        with self.state.lock:
            self.state.exhausted.clear()

    def set_cpu_quota(self, region: str, limit: int | None) -> None:
        """The project's ``CPUS`` quota in ``region`` (None: unlimited)."""
        with self.state.lock:
            if limit is None:
                self.state.cpu_quota.pop(region, None)
            else:
                self.state.cpu_quota[region] = limit

    def fail(self, method: str, status: int, reason: str, message: str | None = None, *,
             times: int | None = 1) -> None:
        """Answer the next ``times`` calls of ``method`` (bulkInsert, list, aggregatedList,
        get, delete, machineTypes, wait, operation) with an HTTP error."""
        with self.state.lock:
            self.state.faults.append(Fault(method, status, reason, message or f"injected: {reason}", times))

    def slow_operations(self, seconds: float | None, kinds: Sequence[str] = ("bulkInsert", "delete")) -> None:
        """Operations of ``kinds`` are done ``seconds`` after they start (None: never; 0: at once)."""
        with self.state.lock:
            for k in kinds:
                self.state.op_delay[k] = seconds

    def finish_operations(self) -> None:
        """Every pending operation is done now (a slow one, or one set never to finish)."""
        with self.state.lock:
            now = time.monotonic()
            for op in self.state.ops.values():
                if not op.applied:
                    op.done_at = now
            self.state.tick()

    def deny(self, on: bool = True) -> None:
        """Every call answers 403 (the credential lacks permission)."""
        with self.state.lock:
            self.state.deny = 403 if on else 0

    def clear(self) -> None:
        """Every switch back to normal."""
        with self.state.lock:
            self.state.exhausted.clear()
            self.state.cpu_quota.clear()
            self.state.faults.clear()
            self.state.op_delay.clear()
            self.state.deny = 0

    def delete_behind(self, instance_id: str) -> None:
        """Delete an instance behind the SDK's back (preempted, or a user's console click)."""
        with self.state.lock:
            self.state.instances.pop(str(instance_id), None)
        self.hosts.halt(str(instance_id))

    # ---- views -----------------------------------------------------------------------
    @property
    def instances(self) -> list[dict[str, Any]]:
        with self.state.lock:
            return [json.loads(json.dumps(i)) for i in self.state.instances.values()]

    def count(self, method: str) -> int:
        with self.state.lock:
            return sum(1 for m, _ in self.calls if m == method)

    def address(self, instance: Any) -> tuple[str, int]:
        """``SshMode.address_map``: boot the instance (once) from its ``user-data`` and
        ``ssh-keys`` metadata, and return its sshd's address."""
        iid = str(instance.id)
        vm = self.hosts.booted(iid)
        if vm is None:
            with self.state.lock:
                inst = self.state.instances.get(iid)
                items = {m["key"]: m["value"] for m in (inst or {}).get("metadata", {}).get("items", [])}
            if inst is None:
                raise RuntimeError(f"instance {iid} does not exist (deleted?)")
            extra = tuple(line.split(":", 1)[1] for line in items.get("ssh-keys", "").splitlines() if ":" in line)
            vm = self.hosts.boot(iid, items.get("user-data", ""), extra_authorized=extra)
        return vm.sshd.host, vm.sshd.port

    def provider(self, **kwargs: Any) -> Any:
        """A ``GceProvider`` pointed at this emulator (anonymous credentials); with
        ``ssh=True`` its runners reach the loopback hosts (``address_map``)."""
        from google.auth.credentials import AnonymousCredentials

        from flowmesh_providers.gce import GceProvider, SshMode
        ssh = kwargs.pop("ssh", None)
        if ssh is True:
            ssh = SshMode(address_map=self.address)
        kwargs.setdefault("zones", list(self.zones))
        return GceProvider(project=kwargs.pop("project", self.project), endpoint=self.url,
                           credentials=AnonymousCredentials(), ssh=ssh, **kwargs)

    def stop(self) -> None:
        super().stop()
        self.hosts.close()

    # ---- HTTP ------------------------------------------------------------------------
    def routes(self, app: web.Application) -> None:
        base = "/compute/v1/projects/{project}"
        r = app.router
        r.add_get(base, self.reads.project)
        r.add_get(base + "/zones", self.reads.zones)
        r.add_get(base + "/zones/{zone}", self.reads.zone_get)
        r.add_get(base + "/zones/{zone}/machineTypes", self.reads.machine_types)
        r.add_get(base + "/zones/{zone}/machineTypes/{name}", self.reads.machine_type_get)
        r.add_get(base + "/aggregated/machineTypes", self.reads.machine_types_aggregated)
        r.add_post(base + "/zones/{zone}/instances/bulkInsert", self.mutations.bulk_insert)
        r.add_post(base + "/zones/{zone}/instances", self.mutations.insert)
        r.add_get(base + "/global/images/family/{family}", self.reads.image_from_family)
        r.add_get(base + "/global/images/{image}", self.reads.image_get)
        r.add_get(base + "/zones/{zone}/instances", self.reads.instances_list)
        r.add_get(base + "/zones/{zone}/instances/{name}", self.reads.instance_get)
        r.add_delete(base + "/zones/{zone}/instances/{name}", self.mutations.delete)
        r.add_get(base + "/aggregated/instances", self.reads.instances_aggregated)
        r.add_get(base + "/zones/{zone}/operations", self.operations.operations)
        r.add_get(base + "/zones/{zone}/operations/{op}", self.operations.operation)
        r.add_post(base + "/zones/{zone}/operations/{op}/wait", self.operations.wait)
        r.add_post("/batch/compute/v1", self._batch)
        r.add_route("*", "/{tail:.*}", self._not_served)   # last: Google's JSON error body, never plain text

    async def _batch(self, request: web.Request) -> web.StreamResponse:
        """The batch endpoint: each part served by this emulator (:func:`.batch.serve_batch`)."""
        with self.state.lock:
            self.state.calls.append(("batch", request.path))
        return await serve_batch(self.url, request)

    async def _not_served(self, request: web.Request) -> web.StreamResponse:
        with self.state.lock:
            self.state.calls.append(("notServed", request.path))
        return error(404, "notFound", f"The emulator does not serve {request.method} {request.path} (a TEST "
                                       "FIXTURE of the calls the gce provider makes; docs/providers/gce.md)")
