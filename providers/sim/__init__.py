"""The ``sim`` provider: a simulated cloud on virtual time, under the real control plane.

Its offers are shapes; a fleet over it prices them from the cloud's catalog
(:meth:`SimCloud.catalog`).  The engine that plays a batch out on it -- the cloud model,
the virtual-time loop, ``run_scenario``, ``sim_fleet``, the ``cost simulate`` sweep -- is
:mod:`flowmesh_sdk.sim`; the names below that live there are re-exported here for one
release (they were ``flowmesh_providers.sim.*`` before).
"""

from flowmesh_sdk.sim.cloud import SimCloud, SimInstanceType, sim_catalog, unlimited
from flowmesh_sdk.sim.scenario import SimResult, Workload, run_scenario, sim_clouds_fleet, sim_fleet

from .presets import ec2
from .provider import SimProvider

__all__ = ["SimCloud", "SimInstanceType", "SimProvider", "SimResult", "Workload", "ec2", "run_scenario",
           "sim_catalog", "sim_clouds_fleet", "sim_fleet", "unlimited"]
