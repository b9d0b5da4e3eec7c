"""What the core knows of Amazon EC2 (see :mod:`flowmesh_sdk.descriptor`).

Launch rates are the EC2 client's (:mod:`.client`, "Request throttling for the Amazon EC2
API", read 2026-11-30): RunInstances request bucket 5 / refill 2 per s, resource bucket
1000 instances / refill 2 per s.  Billing: Linux on-demand and spot per second with a
60-second minimum ("Amazon EC2 On-Demand Pricing", https://aws.amazon.com/ec2/pricing/on-demand/).
Spot: AWS's Spot Instance Advisor reports interruption frequency in buckets <5% .. >20% a
month (https://aws.amazon.com/ec2/spot/instance-advisor/); 10 % a month is assumed.
Arm: a "g" among the letters after the generation digit marks Graviton (c7g, m6gd, g5g,
r7gn; "Instance type naming conventions", Amazon EC2 docs).  Registry: ECR,
``<account>.dkr.ecr[-fips].<region>.amazonaws.com``.  Metadata: IMDS's IPv6 address
``fd00:ec2::254`` (the IPv4 one is link-local, blocked everywhere).
"""

from flowmesh_sdk.descriptor import ProviderDescriptor, ProviderProfile, Setting

from .client import DOC_THROTTLING, MAX_LAUNCH_BATCH, RATES

DESCRIPTOR = ProviderDescriptor(
    name="ec2",
    provider="flowmesh_providers.ec2.provider:Ec2Provider",
    aliases=("aws",),
    arm_types=r"^[a-z]+\d+[a-z]*g[a-z]*\.",
    registry_hosts=(r"^\d+\.dkr\.ecr(?:-fips)?\.([a-z0-9-]+)\.amazonaws\.com$",),
    profile=ProviderProfile("ec2", RATES, max_batch=MAX_LAUNCH_BATCH,
                            rates_source=DOC_THROTTLING.removeprefix("https://")),
    prices="flowmesh_providers.ec2.prices:fetch_prices",
    snapshot="flowmesh_providers.ec2:catalog.csv",
    settings=(
        Setting("providers.ec2.endpoint_url", ("FLOWMESH_EC2_ENDPOINT_URL",), help="EC2 API endpoint (moto, a proxy)"),
        Setting("providers.ec2.image_id", ("FLOWMESH_EC2_AMI",), help="the AMI instances boot"),
    ),
    metadata_networks=("fd00:ec2::254/128",),
    emulator="flowmesh_sdk.testing.moto:MotoEc2",
    conformance="flowmesh_providers.ec2.conformance:environment",
)
