"""What each provider's control plane allows, for estimating how long launching takes
and what a spot interruption is expected to cost.

A :class:`ProviderProfile` holds the launch API's published rate limits as token
buckets, the most instances one launch call may ask for, the time from an accepted
launch to a reachable instance, and the spot interruption hazard.  Rate limits carry
their published source; the boot time and the interruption rates are *assumptions*
(no provider publishes them as a number) and say so -- the fleet simulator is meant to
replace them with measured distributions.  Every figure can be overridden by building a
profile with :func:`dataclasses.replace`.

Published limits used (read 2026-11-30):

* **ec2** -- "Request throttling for the Amazon EC2 API", EC2 Developer Guide,
  https://docs.aws.amazon.com/ec2/latest/devguide/ec2-api-throttling.html: RunInstances
  request bucket 5 / refill 2 per s, resource bucket 1000 instances / refill 2 per s.
  The same figures drive the EC2 provider's client-side buckets
  (``flowmesh_providers.ec2.client``); ``tests/test_catalog.py`` keeps the two equal.
* **gce** -- "Compute Engine rate quotas", https://cloud.google.com/compute/api-quota:
  quotas are per project per minute; the default "Queries" group allows 1,500
  requests/minute.  Modelled as a bucket of 1,500 refilled at 25/s, one instance per
  ``instances.insert`` call.
* **azure** -- "Request limits and throttling", Azure Resource Manager docs,
  https://learn.microsoft.com/azure/azure-resource-manager/management/request-limits-and-throttling:
  subscription writes, bucket 200, refill 10/s (the regional token-bucket limits in force
  since 2024).  One VM per PUT.  The Compute resource provider applies further per-minute
  policies ("Compute throttling limits") that are not modelled here.
* **alibaba** -- ECS ``RunInstances`` takes ``Amount`` 1 to 100 instances per call (API
  reference, https://help.aliyun.com/en/ecs/developer-reference/api-ecs-2014-05-26-runinstances);
  "API call throttling", https://www.alibabacloud.com/help/doc-detail/437902.htm: an
  account can create at most 5,000 instances per minute.  Modelled as a resource bucket
  of 5,000 refilled at 83.3/s.  The per-call QPS is shown only in the Quota Center
  console, so no request bucket is modelled.
* **vast** -- Vast.ai publishes no API rate limit.  Assumed: one instance per create
  call (the CLI's ``create instance`` takes one offer id), at most 1 call/s with a burst
  of 10.  This is an assumption, not a published figure.

Billing minimum: EC2 bills Linux on-demand and spot instances per second with a 60-second
minimum ("Amazon EC2 On-Demand Pricing", https://aws.amazon.com/ec2/pricing/on-demand/);
Compute Engine bills per second after the first minute ("VM instance pricing",
https://cloud.google.com/compute/vm-instance-pricing).  For Azure, Alibaba and Vast.ai the
same 60 s is assumed (:attr:`ProviderProfile.billing_min_s`; override per profile).

Spot interruptions: AWS's Spot Instance Advisor reports the "frequency of interruption"
(share of instances reclaimed in the trailing month) in buckets <5%, 5-10%, 10-15%,
15-20% and >20% (https://aws.amazon.com/ec2/spot/instance-advisor/); Azure's portal shows
the same kind of eviction-rate buckets.  The default here is 10% a month for every cloud's
spot market (hazard -ln(0.9)/730 per hour), an assumption to override per workload.  For
Vast.ai the host's own ``reliability`` is used instead (see :mod:`flowmesh_sdk.bidder.cost`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import SpecError

HOURS_PER_MONTH = 730.0
DEFAULT_SPOT_MONTHLY_INTERRUPTION = 0.10
BOOT_ASSUMPTION = ("assumption: ~45 s from an accepted launch to a reachable instance "
                   "(FlowMesh reports 30-60 s Vast.ai provisioning lag; MegaFlow ~1 min single-task startup)")


@dataclass(frozen=True, slots=True)
class Bucket:
    """A token bucket: ``capacity`` tokens, refilled at ``refill_per_s``.  ``per_instance``:
    one token per instance launched (a resource bucket), else one per call."""

    capacity: float
    refill_per_s: float
    per_instance: bool = False

    def __post_init__(self) -> None:
        if not self.capacity > 0 or not self.refill_per_s > 0:
            raise SpecError("bucket", f"capacity and refill must be > 0, got {self.capacity}, {self.refill_per_s}")


@dataclass(frozen=True, slots=True)
class ProviderProfile:
    provider: str
    buckets: tuple[Bucket, ...]
    max_batch: int
    boot_s: float = 45.0
    spot_monthly_interruption: float = DEFAULT_SPOT_MONTHLY_INTERRUPTION
    rates_source: str = ""
    boot_source: str = BOOT_ASSUMPTION
    billing_min_s: float = 60.0   # shortest billed period of one instance

    def __post_init__(self) -> None:
        if self.max_batch < 1:
            raise SpecError("max_batch", f"must be >= 1, got {self.max_batch}")
        if self.boot_s < 0:
            raise SpecError("boot_s", f"must be >= 0, got {self.boot_s}")
        if not 0 <= self.spot_monthly_interruption < 1:
            raise SpecError("spot_monthly_interruption", f"must be in [0, 1), got {self.spot_monthly_interruption}")

    @property
    def spot_hazard_per_hour(self) -> float:
        return -math.log(1.0 - self.spot_monthly_interruption) / HOURS_PER_MONTH


PROFILES: dict[str, ProviderProfile] = {
    "ec2": ProviderProfile(
        "ec2", (Bucket(5, 2.0), Bucket(1000, 2.0, per_instance=True)), max_batch=1000,
        rates_source="docs.aws.amazon.com/ec2/latest/devguide/ec2-api-throttling.html"),
    "gce": ProviderProfile(
        "gce", (Bucket(1500, 25.0),), max_batch=1,
        rates_source="cloud.google.com/compute/api-quota (1,500 requests/min per project)"),
    "azure": ProviderProfile(
        "azure", (Bucket(200, 10.0),), max_batch=1,
        rates_source="learn.microsoft.com azure-resource-manager request-limits-and-throttling "
                     "(subscription writes: bucket 200, 10/s)"),
    "alibaba": ProviderProfile(
        "alibaba", (Bucket(5000, 5000 / 60.0, per_instance=True),), max_batch=100,
        rates_source="alibabacloud.com/help/doc-detail/437902.htm (5,000 instances/min); "
                     "RunInstances Amount 1-100"),
    "vast": ProviderProfile(
        "vast", (Bucket(10, 1.0),), max_batch=1,
        rates_source="assumption: Vast.ai publishes no API rate limit (1 create/s, burst 10 assumed)"),
}


def profile(provider: str) -> ProviderProfile:
    """The profile of a catalog provider; a provider without one gets EC2-like defaults
    with no rate limit, and its ``rates_source`` says so."""
    found = PROFILES.get(provider)
    if found is not None:
        return found
    return ProviderProfile(provider, (Bucket(1e9, 1e9),), max_batch=1000,
                           rates_source=f"no profile for {provider!r}: launch rate not limited in this estimate")


__all__ = ["BOOT_ASSUMPTION", "Bucket", "DEFAULT_SPOT_MONTHLY_INTERRUPTION", "PROFILES", "ProviderProfile",
           "profile"]
