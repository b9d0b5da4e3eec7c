"""The Compute Engine emulator's read calls: zones, machine types, images, the project,
and instances listed, aggregated and got."""

from __future__ import annotations

import json
import zlib
from typing import Any

from aiohttp import web

from ..httpserver import json_response
from .state import GceState
from .wire import API, error, matches, parse_filter


class Reads:
    """The read handlers (``get``/``list``/``aggregatedList`` of each resource served)."""

    def __init__(self, state: GceState) -> None:
        self.state = state

    def _filtered(self, request: web.Request, zone: str | None) -> list[dict[str, Any]] | web.Response:
        try:
            tokens = parse_filter(request.query.get("filter", ""))
        except ValueError as exc:
            return error(400, "invalid", str(exc))
        with self.state.lock:
            return [json.loads(json.dumps(i)) for i in self.state.instances.values()
                    if (zone is None or i["_zone"] == zone) and matches(tokens, i)]

    def _machine_type(self, zone: str, n: int) -> dict[str, Any]:
        name, cpus, mem, acc, count = self.state.machine_types[n]
        return {"kind": "compute#machineType", "id": str(1000 + n), "name": name, "guestCpus": cpus,
                "memoryMb": mem, "zone": zone, "isSharedCpu": False,
                "description": f"{cpus} vCPUs, {mem / 1024:g} GB RAM",
                "selfLink": f"{API}/projects/{self.state.project}/zones/{zone}/machineTypes/{name}",
                **({"accelerators": [{"guestAcceleratorType": acc, "guestAcceleratorCount": count}]}
                   if acc else {})}

    def _zone(self, zone: str) -> dict[str, Any]:
        region = zone.rsplit("-", 1)[0]
        return {"kind": "compute#zone", "id": str(2000 + self.state.zones.index(zone)), "name": zone, "status": "UP",
                "description": zone, "region": f"{API}/projects/{self.state.project}/regions/{region}",
                "selfLink": f"{API}/projects/{self.state.project}/zones/{zone}", "availableCpuPlatforms": []}

    async def zones(self, request: web.Request) -> web.StreamResponse:
        """``zones.list``: the emulator's zones, paged."""
        if (err := self.state.gate(request, "zonesList")) is not None:
            return err
        return self.state.paged(request, "compute#zoneList", [self._zone(z) for z in self.state.zones],
                           selfLink=f"{API}/projects/{self.state.project}/zones")

    async def zone_get(self, request: web.Request) -> web.StreamResponse:
        if (err := self.state.gate(request, "zonesGet")) is not None:
            return err
        return json_response(200, self._zone(request.match_info["zone"]))

    async def machine_type_get(self, request: web.Request) -> web.StreamResponse:
        if (err := self.state.gate(request, "machineTypesGet")) is not None:
            return err
        zone, name = request.match_info["zone"], request.match_info["name"]
        n = next((i for i, m in enumerate(self.state.machine_types) if m[0] == name), None)
        if n is None:
            return error(404, "notFound", f"The resource 'projects/{self.state.project}/zones/{zone}/machineTypes/"
                                           f"{name}' was not found")
        return json_response(200, self._machine_type(zone, n))

    async def machine_types_aggregated(self, request: web.Request) -> web.StreamResponse:
        """``machineTypes.aggregatedList``: every zone's machine types (one page)."""
        if (err := self.state.gate(request, "machineTypesAggregated")) is not None:
            return err
        kinds = range(len(self.state.machine_types))
        items = {f"zones/{z}": {"machineTypes": [self._machine_type(z, n) for n in kinds]}
                 for z in self.state.zones}
        return json_response(200, {"kind": "compute#machineTypeAggregatedList", "items": items,
                                   "id": f"projects/{self.state.project}/aggregated/machineTypes",
                                   "selfLink": f"{API}/projects/{self.state.project}/aggregated/machineTypes"})

    async def machine_types(self, request: web.Request) -> web.StreamResponse:
        if (err := self.state.gate(request, "machineTypes")) is not None:
            return err
        zone = request.match_info["zone"]
        return self.state.paged(request, "compute#machineTypeList",
                           [self._machine_type(zone, n) for n in range(len(self.state.machine_types))])

    async def instances_list(self, request: web.Request) -> web.StreamResponse:
        if (err := self.state.gate(request, "list")) is not None:
            return err
        found = self._filtered(request, request.match_info["zone"])
        if isinstance(found, web.Response):
            return found
        return self.state.paged(request, "compute#instanceList", [self.state.public(i) for i in found])

    async def instances_aggregated(self, request: web.Request) -> web.StreamResponse:
        if (err := self.state.gate(request, "aggregatedList")) is not None:
            return err
        found = self._filtered(request, None)
        if isinstance(found, web.Response):
            return found
        page, nxt = self.state.page(request, found)
        items: dict[str, Any] = {f"zones/{z}": {"warning": {"code": "NO_RESULTS_ON_PAGE",
                                                            "message": "There are no results for scope"}}
                                 for z in self.state.zones}
        for inst in page:
            scope = items.setdefault(f"zones/{inst['_zone']}", {})
            scope.pop("warning", None)
            scope.setdefault("instances", []).append(self.state.public(inst))
        body: dict[str, Any] = {"kind": "compute#instanceAggregatedList", "items": items,
                                "id": f"projects/{self.state.project}/aggregated/instances"}
        if nxt:
            body["nextPageToken"] = nxt
        return json_response(200, body)

    async def instance_get(self, request: web.Request) -> web.StreamResponse:
        if (err := self.state.gate(request, "get")) is not None:
            return err
        zone, name = request.match_info["zone"], request.match_info["name"]
        with self.state.lock:
            inst = self.state.by_name(zone, name)
            if inst is None:
                return error(404, "notFound", f"The resource 'projects/{self.state.project}/zones/{zone}/instances/"
                                               f"{name}' was not found")
            return json_response(200, self.state.public(inst))

    def _image(self, project: str, name: str, family: str) -> dict[str, Any]:
        """An image record of this emulator (a fixture's, not one of Google's): every family
        resolves to one image named ``<family>-v20261201``."""
        return {"kind": "compute#image", "id": str(zlib.crc32(f"{project}/{name}".encode())), "name": name,
                "family": family, "status": "READY", "diskSizeGb": "10", "architecture": "X86_64",
                "selfLink": f"{API}/projects/{project}/global/images/{name}"}

    async def project(self, request: web.Request) -> web.StreamResponse:
        """``projects.get`` (gcloud asks it on create): the project, its common metadata and
        its CPUS quota per region where one is set (:meth:`set_cpu_quota`)."""
        if (err := self.state.gate(request, "projectsGet")) is not None:
            return err
        with self.state.lock:
            quotas = [{"metric": "CPUS", "limit": float(limit), "region": region,
                       "usage": float(sum(int(i["_cpus"]) for i in self.state.instances.values()
                                          if i["_zone"].startswith(region + "-")))}
                      for region, limit in sorted(self.state.cpu_quota.items())]
        return json_response(200, {
            "kind": "compute#project", "id": str(zlib.crc32(self.state.project.encode())), "name": self.state.project,
            "commonInstanceMetadata": {"kind": "compute#metadata", "fingerprint": "Zm0tZW11", "items": []},
            "quotas": quotas, "selfLink": f"{API}/projects/{self.state.project}"})

    async def image_from_family(self, request: web.Request) -> web.StreamResponse:
        """``images.getFromFamily`` of any project (public images live in others: debian-cloud)."""
        with self.state.lock:
            self.state.calls.append(("imagesGetFromFamily", request.path))
        family = request.match_info["family"]
        return json_response(200, self._image(request.match_info["project"], f"{family}-v20261201", family))

    async def image_get(self, request: web.Request) -> web.StreamResponse:
        with self.state.lock:
            self.state.calls.append(("imagesGet", request.path))
        name = request.match_info["image"]
        return json_response(200, self._image(request.match_info["project"], name, name.rsplit("-v", 1)[0]))
