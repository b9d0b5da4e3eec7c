"""The ARM bodies of an Azure launch: the checks that spend nothing (:func:`check_request`),
the VMs' deterministic names (:func:`vm_name`), the VNet made once per location
(:func:`vnet_body`) and each VM's ``virtualMachines.createOrUpdate`` body (:func:`vm_body`).
What they hold is described in :mod:`.provider` (``launch(request)``).
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Mapping
from typing import Any

from flowmesh_sdk.errors import SpecError
from flowmesh_sdk.provider import TAG_REQUEST, LaunchRequest
from flowmesh_sdk.tags import PlainTags

from .errors import PROVIDER

TAGS = PlainTags(max_key=512, max_value=256)
MAX_TAGS = 50
MAX_BATCH = 100
_TAG_NAME_BAD = re.compile(r"[<>%&\\?/]")
SUBNET = "flowmesh"                 # the subnet of the VNet made per location


def vm_name(request_id: str, k: int) -> str:
    """The deterministic name of the ``k``-th VM of a launch request."""
    return f"fm-{hashlib.sha256(request_id.encode()).hexdigest()[:12]}-{k}"


def check_request(request: LaunchRequest, locations: tuple[str, ...]) -> dict[str, str]:
    """The tags of a launch request (as Azure gets them), or SpecError naming what is wrong."""
    offer = request.offer
    if offer.provider != PROVIDER:
        raise SpecError("launch.offer", f"an offer of provider {offer.provider!r} was given to azure")
    if offer.region not in locations:
        raise SpecError("launch.offer.region", f"{offer.region!r} is not one of this provider's locations "
                                               f"{list(locations)}")
    if request.count > MAX_BATCH:
        raise SpecError("launch.count", f"at most {MAX_BATCH} per launch call, got {request.count}")
    tags = TAGS.encode_launch({**request.tags, TAG_REQUEST: request.request_id}, limit=MAX_TAGS,
                              cloud="Azure", per="resource")
    bad = [k for k in tags if _TAG_NAME_BAD.search(k)]
    if bad:
        raise SpecError("launch.tags", f"Azure tag names may not contain < > % & \\ ? /; got {bad}")
    return tags


def vnet_body(location: str) -> dict[str, Any]:
    """The VNet ``flowmesh-<location>`` with its one subnet."""
    return {"location": location, "tags": {"flowmesh:managed": "true"},
            "properties": {"addressSpace": {"addressPrefixes": ["10.20.0.0/16"]},
                           "subnets": [{"name": SUBNET, "properties": {"addressPrefix": "10.20.0.0/20"}}]}}


def vm_body(name: str, request: LaunchRequest, tags: Mapping[str, str], subnet: str, *, image: Mapping[str, str],
            admin_username: str, public_address: bool, custom_data: str | None,
            fleet_public: str | None) -> dict[str, Any]:
    """One VM's body: its NIC (and, with ``public_address``, a public IP) made by the VM itself,
    NIC, IP and OS disk deleted with it; ``custom_data`` (SSH mode's cloud-config) as
    ``osProfile.customData`` and ``fleet_public`` in ``admin_username``'s authorized keys."""
    offer = request.offer
    ref = ({"id": image["id"]} if "id" in image else
           {k: image[k] for k in ("publisher", "offer", "sku", "version") if k in image})
    ipconf: dict[str, Any] = {"name": "ipconfig1", "properties": {"subnet": {"id": subnet}, "primary": True}}
    if public_address:
        ipconf["properties"]["publicIPAddressConfiguration"] = {
            "name": f"{name}-ip", "properties": {"deleteOption": "Delete"}, "sku": {"name": "Standard"}}
    linux: dict[str, Any] = {"disablePasswordAuthentication": True}
    if fleet_public:
        linux["ssh"] = {"publicKeys": [{"path": f"/home/{admin_username}/.ssh/authorized_keys",
                                        "keyData": fleet_public}]}
    os_profile: dict[str, Any] = {"computerName": name, "adminUsername": admin_username,
                                  "linuxConfiguration": linux}
    if custom_data is not None:
        os_profile["customData"] = base64.b64encode(custom_data.encode()).decode()
    props: dict[str, Any] = {
        "hardwareProfile": {"vmSize": offer.instance_type},
        "storageProfile": {"imageReference": ref,
                           "osDisk": {"createOption": "FromImage", "deleteOption": "Delete",
                                      "diskSizeGB": request.spec.disk_gb,
                                      "managedDisk": {"storageAccountType": "Premium_LRS"}}},
        "osProfile": os_profile,
        "networkProfile": {"networkApiVersion": "2022-11-01", "networkInterfaceConfigurations": [
            {"name": f"{name}-nic", "properties": {"primary": True, "deleteOption": "Delete",
                                                   "ipConfigurations": [ipconf]}}]},
    }
    if offer.spot:
        props.update({"priority": "Spot", "evictionPolicy": "Delete", "billingProfile": {"maxPrice": -1}})
    return {"location": offer.region, "tags": dict(tags), "properties": props}


__all__ = ["MAX_BATCH", "MAX_TAGS", "TAGS", "check_request", "vm_body", "vm_name", "vnet_body"]
