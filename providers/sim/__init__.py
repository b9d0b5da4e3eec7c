"""The ``sim`` provider: a simulated cloud on virtual time, under the real control plane.

``run_scenario(cloud, workload, seed=...)`` plays a batch of tasks out through the real
fleet, pools, provisioner and pull budget on a :class:`SimProvider` in a
:class:`~.loop.VirtualTimeLoop`; see :mod:`.scenario`.
"""

from .cloud import SimCloud, SimInstanceType, ec2, unlimited
from .provider import SimProvider
from .scenario import SimResult, Workload, run_scenario

__all__ = ["SimCloud", "SimInstanceType", "SimProvider", "SimResult", "Workload", "ec2", "run_scenario",
           "unlimited"]
