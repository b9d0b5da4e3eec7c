"""Simulated clouds modelled on a real one's published figures (the sim provider's presets)."""

from __future__ import annotations

from typing import Any

from flowmesh_sdk import backends
from flowmesh_sdk.sim.cloud import SimCloud, SimInstanceType


def ec2(types: tuple[SimInstanceType, ...], region: str = "us-east-1", **kw: Any) -> SimCloud:
    """EC2's published API limits (the ``ec2`` provider's table, read from its descriptor's
    launch profile, sourced there) with the given instance types; boot time and the rest
    are the assumptions of :class:`SimCloud`."""
    prof = backends.descriptor("ec2", "sim.cloud").launch_profile
    return SimCloud(name="ec2", region=region, types=types, rates=prof.rates, max_batch=prof.max_batch,
                    notes=(f"API limits: {prof.rates_source}",), **kw)
