"""The ``sim`` provider: a simulated cloud on virtual time, under the real control plane.

Its offers are shapes; a fleet over it prices them from the cloud's catalog
(:meth:`SimCloud.catalog`; :func:`sim_fleet` and :func:`sim_clouds_fleet` pass it).
``run_scenario(cloud, workload, seed=...)`` plays a batch of tasks out through the real
fleet, pools, provisioner and pull budget on a :class:`SimProvider` in a
:class:`~.loop.VirtualTimeLoop`; see :mod:`.scenario`.
"""

from .cloud import SimCloud, SimInstanceType, ec2, sim_catalog, unlimited
from .provider import SimProvider
from .scenario import SimResult, Workload, run_scenario, sim_clouds_fleet, sim_fleet

__all__ = ["SimCloud", "SimInstanceType", "SimProvider", "SimResult", "Workload", "ec2", "run_scenario",
           "sim_catalog", "sim_clouds_fleet", "sim_fleet", "unlimited"]
