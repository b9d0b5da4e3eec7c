"""What each provider's control plane allows, for estimating how long launching takes
and what a spot interruption is expected to cost.

A :class:`~flowmesh_sdk.descriptor.ProviderProfile` holds the launch API's rate limits as
token buckets (the provider client's own, one copy), the most instances one launch call
may ask for, the time from an accepted launch to a reachable instance, the billing minimum
and the spot market.  Each provider's profile is in its descriptor
(``providers/<name>/descriptor.py``), with the published sources of its figures; the boot
time and the interruption rates are *assumptions* (no provider publishes them as a number)
and say so -- the fleet simulator is meant to replace them with measured distributions.
Every figure can be overridden by building a profile with :func:`dataclasses.replace`.
"""

from __future__ import annotations

from .. import backends
from ..descriptor import (BOOT_ASSUMPTION, DEFAULT_SPOT_MONTHLY_INTERRUPTION, HOURS_PER_MONTH, Bucket,
                          ProviderProfile, unlimited_profile)


def profile(provider: str) -> ProviderProfile:
    """The profile of a provider; a provider without one gets defaults with no rate
    limit, and its ``rates_source`` says so."""
    found = backends.find(provider)
    return found.launch_profile if found is not None else unlimited_profile(provider)


__all__ = ["BOOT_ASSUMPTION", "Bucket", "DEFAULT_SPOT_MONTHLY_INTERRUPTION", "HOURS_PER_MONTH", "ProviderProfile",
           "profile"]
