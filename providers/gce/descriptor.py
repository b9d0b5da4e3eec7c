"""What the core knows of Google Compute Engine (see :mod:`flowmesh_sdk.descriptor`).

Launch rates are the GCE client's (:mod:`.client`; one ``instances.bulkInsert`` a second,
burst 10, up to 1,000 instances each), well inside "Compute Engine rate quotas"
(https://cloud.google.com/compute/api-quota: 1,500 requests/minute per project for the
default "Queries" group).  Billing: per second after the first minute ("VM instance
pricing", https://cloud.google.com/compute/vm-instance-pricing).  Spot: 10 % a month
assumed.  Arm: the Tau T2A, C4A and N4A series ("Arm VMs on Compute", Google Cloud docs).
Registry: Artifact Registry, ``<region>-docker.pkg.dev``.  Price data spells it ``gcp``.
"""

from flowmesh_sdk.descriptor import ProviderDescriptor, ProviderProfile, Setting

from .client import MAX_LAUNCH_BATCH, RATES

DESCRIPTOR = ProviderDescriptor(
    name="gce",
    provider="flowmesh_providers.gce.provider:GceProvider",
    aliases=("gcp",),
    arm_types=r"^(t2a|c4a|n4a)-",
    registry_hosts=(r"^([a-z0-9-]+)-docker\.pkg\.dev$",),
    profile=ProviderProfile("gce", RATES, max_batch=MAX_LAUNCH_BATCH,
                            rates_source="the GCE client's buckets (1 bulkInsert/s, burst 10), inside "
                                         "cloud.google.com/compute/api-quota (1,500 requests/min per project)"),
    prices="flowmesh_providers.gce.prices:fetch_prices",
    snapshot="flowmesh_providers.gce:catalog.csv",
    settings=(
        Setting("providers.gce.project", ("FLOWMESH_GCE_PROJECT", "GOOGLE_CLOUD_PROJECT"), help="GCP project"),
        Setting("providers.gce.endpoint", ("FLOWMESH_GCE_ENDPOINT",), help="Compute Engine API endpoint"),
        Setting("providers.gce.api_key", ("FLOWMESH_GCE_API_KEY", "GOOGLE_API_KEY"), secret=True,
                help="Cloud Billing Catalog API key (live prices)"),
    ),
    emulator="flowmesh_sdk.testing.gce:GceEmulator",
    conformance="flowmesh_providers.gce.conformance:environment",
)
