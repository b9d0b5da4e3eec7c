"""What the core knows of ``local``, this machine (see :mod:`flowmesh_sdk.descriptor`):
free, not in the price catalog, no API to rate-limit."""

from flowmesh_sdk.descriptor import ProviderDescriptor

DESCRIPTOR = ProviderDescriptor(name="local", provider="flowmesh_providers.local.provider:LocalProvider",
                                conformance="flowmesh_providers.local.conformance:environment")
