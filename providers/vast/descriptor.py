"""What the core knows of Vast.ai (see :mod:`flowmesh_sdk.descriptor`).

Vast.ai publishes no API rate limit; the client's buckets (:mod:`.client`: 1 create/s,
burst 5, one instance per create) are an assumption.  Its "spot" market is interruptible
and bid-priced, on hosts of their own ``reliability``: ``spot_market="bid"`` (the bidder's
hazard is the host's, plus being outbid; see :mod:`flowmesh_sdk.bidder.cost`).  Billing: a
60-second minimum is assumed.  Price data spells it ``vastai``.
"""

from flowmesh_sdk.descriptor import ProviderDescriptor, ProviderProfile, Setting

from .client import RATES

DESCRIPTOR = ProviderDescriptor(
    name="vast",
    provider="flowmesh_providers.vast.provider:VastProvider",
    aliases=("vastai",),
    profile=ProviderProfile("vast", RATES, max_batch=1, spot_market="bid",
                            rates_source="assumption: Vast.ai publishes no API rate limit "
                                         "(1 create/s, burst 5 assumed)"),
    prices="flowmesh_providers.vast.prices:fetch_prices",
    snapshot="flowmesh_providers.vast:catalog.csv",
    settings=(Setting("providers.vast.api_key", ("VAST_API_KEY",), secret=True, help="Vast.ai API key"),),
    emulator="flowmesh_sdk.testing.vast:VastEmulator",
    conformance="flowmesh_providers.vast.conformance:environment",
)
