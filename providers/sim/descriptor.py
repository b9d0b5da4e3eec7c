"""What the core knows of ``sim``, a simulated cloud on virtual time (see
:mod:`flowmesh_sdk.descriptor`; the simulator engine that drives it is
:mod:`flowmesh_sdk.sim`): not in the price catalog (a simulated cloud brings its own,
:func:`flowmesh_sdk.sim.cloud.sim_catalog`), no real API to rate-limit."""

from flowmesh_sdk.descriptor import ProviderDescriptor

DESCRIPTOR = ProviderDescriptor(name="sim", provider="flowmesh_providers.sim.provider:SimProvider")
