"""All FlowMesh's core knows of ``acme`` (see :mod:`flowmesh_sdk.descriptor`)."""

from flowmesh_sdk.descriptor import ApiRate, ProviderDescriptor, ProviderProfile, Setting

RATES = (ApiRate("launch", rate_per_s=5.0, burst=20), ApiRate("terminate", rate_per_s=5.0, burst=20))

DESCRIPTOR = ProviderDescriptor(
    name="acme",
    provider="flowmesh_acme.provider:AcmeProvider",
    aliases=("acmecloud",),
    arm_types=r"^acme\.arm\.",
    registry_hosts=(r"^registry\.([a-z0-9-]+)\.acme\.test$",),
    profile=ProviderProfile("acme", RATES, max_batch=8, boot_s=5.0, billing_min_s=300.0,
                            rates_source="made up for the tests"),
    snapshot="flowmesh_acme:catalog.csv",
    settings=(Setting("providers.acme.state_dir", ("FLOWMESH_ACME_STATE",),
                      help="where the acme cloud keeps its machines"),),
    metadata_networks=("192.0.2.254/32",),
    conformance="flowmesh_acme.conformance:environment",
)
