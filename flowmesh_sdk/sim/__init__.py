"""The simulator engine: a batch of tasks played out through the REAL fleet, pools,
provisioner, pull budget and control plane on a simulated cloud, on virtual time.

- :mod:`.cloud`: what a simulated cloud is like (types, boot times, API limits, capacity,
  spot interruptions, network) and its price catalog;
- :mod:`.loop`: the virtual-time event loop (the one clock reads it, :mod:`flowmesh_sdk.clock`);
- :mod:`.scenario`: one run (``run_scenario``, ``sim_fleet``, ``sim_clouds_fleet``), on the
  ``sim`` provider (``flowmesh_providers.sim``), which it loads through its descriptor;
- :mod:`.sweep`: ``flowmesh cost simulate`` (MegaFlow's experiment).
"""

from .cloud import GBIT, SimCloud, SimInstanceType, sim_catalog, unlimited
from .scenario import SimResult, Workload, run_scenario, sim_clouds_fleet, sim_fleet

__all__ = ["GBIT", "SimCloud", "SimInstanceType", "SimResult", "Workload", "run_scenario", "sim_catalog",
           "sim_clouds_fleet", "sim_fleet", "unlimited"]
