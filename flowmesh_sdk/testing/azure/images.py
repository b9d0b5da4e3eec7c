"""The ARM emulator's Marketplace VM images: ``virtualMachineImages`` list (of a sku's
versions, ``$orderby=name desc`` and ``$top`` as az asks to resolve ``latest``) and get (of
one version), for the images of :data:`.metadata.IMAGE_ALIASES`, whose publisher, offer and
sku are those az's alias document names.  Each has one version of the emulator's own
(e.g. ``22.04.202612010``), Linux, x64, Hyper-V generation V2.  Anything else is
ARM's 404 for an artifact that does not exist."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ..httpserver import json_response
from .metadata import IMAGE_ALIASES
from .wire import arm_error

__all__ = ["image_versions", "image_version"]

_VERSION_OF = {"0001-com-ubuntu-server-jammy": "22.04.202612010", "ubuntu-24_04-lts": "24.04.202612010",
               "debian-12": "0.20261201.1"}   # by offer


def _known(publisher: str, offer: str, sku: str) -> str | None:
    """The version of a served image, or None."""
    for ref in IMAGE_ALIASES.values():
        if (ref["publisher"].lower(), ref["offer"].lower(), ref["sku"].lower()) == (
                publisher.lower(), offer.lower(), sku.lower()):
            return _VERSION_OF.get(ref["offer"], "1.0.20261201")
    return None


def _resource(subscription: str, location: str, publisher: str, offer: str, sku: str, version: str,
              expand: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": version, "location": location,
        "id": f"/Subscriptions/{subscription}/Providers/Microsoft.Compute/Locations/{location}/Publishers/"
              f"{publisher}/ArtifactTypes/VMImage/Offers/{offer}/Skus/{sku}/Versions/{version}"}
    if expand:
        out["properties"] = {"hyperVGeneration": "V2", "architecture": "x64", "dataDiskImages": [],
                             "osDiskImage": {"operatingSystem": "Linux", "sizeInGb": 30},
                             "automaticOSUpgradeProperties": {"automaticOSUpgradeSupported": False},
                             "disallowed": {"vmDiskType": "Unmanaged"}}
    return out


def _not_found() -> web.Response:
    return arm_error(404, "NotFound", "Artifact: VMImage was not found.")


def image_versions(request: web.Request, subscription: str, location: str, publisher: str, offer: str,
                   sku: str) -> web.Response:
    version = _known(publisher, offer, sku)
    if version is None:
        return _not_found()
    return json_response(200, [_resource(subscription, location, publisher, offer, sku, version,
                                         "$expand" in request.query)])


def image_version(request: web.Request, subscription: str, location: str, publisher: str, offer: str,
                  sku: str, version: str) -> web.Response:
    served = _known(publisher, offer, sku)
    if served is None or version not in (served, "latest"):
        return _not_found()
    return json_response(200, _resource(subscription, location, publisher, offer, sku, served, True))
