"""What the core knows of Azure (see :mod:`flowmesh_sdk.descriptor`).

Launch rates are the Azure client's (:mod:`.client`): one PUT per VM, 200 at 10/s, inside
"Request limits and throttling", Azure Resource Manager docs
(https://learn.microsoft.com/azure/azure-resource-manager/management/request-limits-and-throttling:
subscription writes, bucket 200, refill 10/s, the regional token-bucket limits in force
since 2024); the Compute resource provider's per-minute policies are not modelled.
Billing: a 60-second minimum is assumed.  Spot: 10 % a month assumed (the portal shows
eviction-rate buckets).  Arm: a "p" among the size's feature letters marks Ampere Altra
(D4ps_v5, E8pds_v5; "Azure virtual machine sizes naming conventions", Microsoft Learn).
"""

from flowmesh_sdk.descriptor import ProviderDescriptor, ProviderProfile, Setting

from .client import RATES
from .provider import MAX_BATCH

DESCRIPTOR = ProviderDescriptor(
    name="azure",
    provider="flowmesh_providers.azure.provider:AzureProvider",
    arm_types=r"^Standard_[A-Z]+\d+[a-z]*p[a-z]*_",
    profile=ProviderProfile("azure", RATES, max_batch=MAX_BATCH,
                            rates_source="learn.microsoft.com azure-resource-manager request-limits-and-throttling "
                                         "(subscription writes: bucket 200, 10/s)"),
    prices="flowmesh_providers.azure.prices:fetch_prices",
    snapshot="flowmesh_providers.azure:catalog.csv",
    settings=(
        Setting("providers.azure.subscription_id", ("AZURE_SUBSCRIPTION_ID",), help="Azure subscription"),
        Setting("providers.azure.base_url", ("FLOWMESH_AZURE_ENDPOINT",), help="Azure Resource Manager endpoint"),
    ),
    emulator="flowmesh_sdk.testing.azure:AzureEmulator",
    conformance="flowmesh_providers.azure.conformance:environment",
)
