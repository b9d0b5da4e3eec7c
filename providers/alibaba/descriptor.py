"""What the core knows of Alibaba Cloud ECS (see :mod:`flowmesh_sdk.descriptor`).

Launch rates are the ECS client's (:mod:`.client`): ``RunInstances`` takes ``Amount`` 1 to
100 (API reference, https://help.aliyun.com/en/ecs/developer-reference/api-ecs-2014-05-26-runinstances),
and "API call throttling" (https://www.alibabacloud.com/help/doc-detail/437902.htm) allows
an account at most 5,000 new instances a minute; the per-call QPS is shown only in the
Quota Center console, so the client's 1 call/s, burst 10 is an assumption.  Billing: a
60-second minimum is assumed.  Spot: 10 % a month assumed.  Arm: the "y" families (g8y,
c8y, r8y) are Yitian 710.  Registry: ``registry[-vpc].<region>.aliyuncs.com``.
Metadata: ``100.100.100.200``.  Price data spells it ``ecs`` or ``aliyun``.
"""

from flowmesh_sdk.descriptor import ProviderDescriptor, ProviderProfile, Setting

from .client import MAX_LAUNCH_BATCH, RATES

DESCRIPTOR = ProviderDescriptor(
    name="alibaba",
    provider="flowmesh_providers.alibaba.provider:AlibabaProvider",
    aliases=("ecs", "aliyun"),
    arm_types=r"^ecs\.[a-z]+\d+y\.",
    registry_hosts=(r"^registry(?:-vpc)?\.([a-z0-9-]+)\.aliyuncs\.com$",),
    profile=ProviderProfile("alibaba", RATES, max_batch=MAX_LAUNCH_BATCH,
                            rates_source="alibabacloud.com/help/doc-detail/437902.htm (5,000 instances/min); "
                                         "RunInstances Amount 1-100; 1 call/s, burst 10 assumed"),
    prices="flowmesh_providers.alibaba.prices:fetch_prices",
    snapshot="flowmesh_providers.alibaba:catalog.csv",
    settings=(
        Setting("providers.alibaba.endpoint", ("FLOWMESH_ALIBABA_ENDPOINT",), help="ECS API endpoint"),
        Setting("providers.alibaba.access_key_id", ("ALIBABA_CLOUD_ACCESS_KEY_ID",), secret=True),
        Setting("providers.alibaba.access_key_secret", ("ALIBABA_CLOUD_ACCESS_KEY_SECRET",), secret=True),
    ),
    metadata_networks=("100.100.100.200/32",),
    emulator="flowmesh_sdk.testing.ecs:EcsEmulator",
    conformance="flowmesh_providers.alibaba.conformance:environment",
)
