"""What the ARM emulator says about itself as a cloud, for ``az cloud register
--endpoint-resource-manager URL``: ARM's ``GET /metadata/endpoints`` (az 2.91 asks with
``api-version=2022-09-01`` and reads one cloud object: ``name``, ``resourceManager``,
``authentication.loginEndpoint`` / ``audiences`` / ``tenant`` / ``identityProvider``,
``suffixes``, ``vmImageAliasDoc``, ...; the field names are those of
management.azure.com/metadata/endpoints and of azure-cli-core's ``_arm_to_cli_mapper``),
and the VM image alias document ``az vm create --image ALIAS`` reads, served here so az
never fetches it from GitHub.  Every endpoint points back at the emulator; the login
endpoint is its AD FS-style authority (:mod:`.identity`)."""

from __future__ import annotations

from typing import Any

from .identity import AUTHORITY_PATH

__all__ = ["ALIAS_DOC_PATH", "CLOUD_NAME", "METADATA_PATH", "IMAGE_ALIASES", "alias_doc", "cloud_metadata"]

CLOUD_NAME = "FlowMeshEmulator"
METADATA_PATH = "/metadata/endpoints"
ALIAS_DOC_PATH = "/metadata/vm-image-aliases"

#: the aliases served (publisher, offer, sku of the Marketplace images az's own alias
#: document names for them)
IMAGE_ALIASES: dict[str, dict[str, str]] = {
    "Ubuntu2204": {"publisher": "Canonical", "offer": "0001-com-ubuntu-server-jammy", "sku": "22_04-lts-gen2",
                   "version": "latest", "architecture": "x64"},
    "Ubuntu2404": {"publisher": "Canonical", "offer": "ubuntu-24_04-lts", "sku": "server",
                   "version": "latest", "architecture": "x64"},
    "Debian12": {"publisher": "Debian", "offer": "debian-12", "sku": "12-gen2", "version": "latest",
                 "architecture": "x64"},
}


def cloud_metadata(url: str) -> dict[str, Any]:
    """The cloud object for an emulator at ``url`` (``https://127.0.0.1:PORT``)."""
    root = url.rstrip("/") + "/"
    return {
        "name": CLOUD_NAME,
        "portal": root,
        "resourceManager": root,
        "graph": f"{root}graph/",
        "graphAudience": f"{root}graph/",
        "gallery": f"{root}gallery/",
        "vmImageAliasDoc": url.rstrip("/") + ALIAS_DOC_PATH,
        "authentication": {"loginEndpoint": url.rstrip("/") + AUTHORITY_PATH, "audiences": [root],
                           "tenant": "adfs", "identityProvider": "ADFS"},
        "suffixes": {"storage": "storage.flowmesh.test", "keyVaultDns": "vault.flowmesh.test",
                     "acrLoginServer": "acr.flowmesh.test"},
    }


def alias_doc() -> dict[str, Any]:
    """The alias document in the shape az reads (``outputs.aliases.value.Linux``)."""
    return {"$schema": "https://schema.management.azure.com/schemas/2015-01-01/deploymentTemplate.json#",
            "contentVersion": "1.0.0.0", "parameters": {}, "variables": {}, "resources": [],
            "outputs": {"aliases": {"type": "object", "value": {"Linux": IMAGE_ALIASES, "Windows": {}}}}}
