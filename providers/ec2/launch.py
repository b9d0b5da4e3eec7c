"""Building EC2's ``RunInstances`` request for one launch request: the checks that spend
nothing (:func:`check_request`), the ``ClientToken`` (:func:`client_token`) and the
parameters (:func:`run_instances_params`).  What they hold is described in
:mod:`.provider` (``launch(request)``).
"""

from __future__ import annotations

import hashlib
from typing import Any

from flowmesh_sdk.errors import SpecError
from flowmesh_sdk.provider import TAG_POOL, TAG_REQUEST, LaunchRequest
from flowmesh_sdk.tags import PlainTags

from .errors import PROVIDER
from .options import Ec2Options
from .shapes import ImageInfo

MAX_TAGS = 50                      # EC2: 50 user tags per resource
TAGS = PlainTags(max_key=128, max_value=256)   # EC2 tag limits (keys 128, values 256 characters)


def client_token(request_id: str) -> str:
    """EC2's ClientToken: up to 64 ASCII characters; longer or non-ASCII ids are hashed."""
    if 0 < len(request_id) <= 64 and request_id.isascii() and request_id.isprintable():
        return request_id
    return "fm-" + hashlib.sha256(request_id.encode()).hexdigest()[:61]


def check_request(options: Ec2Options, request: LaunchRequest, max_batch: int) -> tuple[str, str, dict[str, str]]:
    """``(region, AMI id, tags)`` of a launch request, or SpecError naming what is wrong."""
    offer = request.offer
    if offer.provider != PROVIDER:
        raise SpecError("launch.offer", f"an offer of provider {offer.provider!r} was given to ec2")
    if offer.region not in options.regions:
        raise SpecError("launch.offer.region",
                        f"{offer.region!r} is not one of this provider's regions {list(options.regions)} "
                        "(an instance launched there could not be listed again)")
    if request.count > max_batch:
        raise SpecError("launch.count", f"at most {max_batch} per launch call, got {request.count}")
    ami = options.image_for(offer.region)
    tags = {str(k): str(v) for k, v in request.tags.items()}
    tags[TAG_REQUEST] = request.request_id
    tags.setdefault("Name", f"flowmesh-{tags.get(TAG_POOL) or 'instance'}")
    tags = TAGS.encode_launch(tags, limit=MAX_TAGS, cloud="EC2", per="resource")
    for k, v in tags.items():
        if not k or len(k) > 128 or k.lower().startswith("aws:") or len(v) > 256:
            raise SpecError(f"launch.tags[{k!r}]", "EC2 tag keys are 1-128 characters not starting with "
                                                   "'aws:', values at most 256 characters")
    return offer.region, ami, tags


def run_instances_params(options: Ec2Options, request: LaunchRequest, *, ami: str, tags: dict[str, str],
                         image: ImageInfo | None, injected_user_data: str | None = None) -> dict[str, Any]:
    """The keyword arguments of the one ``RunInstances`` call.  In SSH mode
    ``injected_user_data`` is the cloud-config carrying the injected keys (and IMDSv2 is
    required, hop limit ``ssh.imds_hop_limit``); else the configured ``user_data``, if any."""
    offer = request.offer
    tag_list = [{"Key": k, "Value": v} for k, v in tags.items()]
    params: dict[str, Any] = {
        "ImageId": ami,
        "InstanceType": offer.instance_type,
        "MinCount": 1 if options.partial_ok else request.count,
        "MaxCount": request.count,
        "ClientToken": client_token(request.request_id),
        "TagSpecifications": [{"ResourceType": "instance", "Tags": tag_list},
                              {"ResourceType": "volume", "Tags": tag_list}],
    }
    if image is not None and image.root_device:
        params["BlockDeviceMappings"] = [{"DeviceName": image.root_device,
                                          "Ebs": {"VolumeSize": request.spec.disk_gb, "VolumeType": "gp3",
                                                  "DeleteOnTermination": True}}]
    if options.ssh is not None:
        params["UserData"] = injected_user_data
        params["MetadataOptions"] = {"HttpTokens": "required", "HttpEndpoint": "enabled",
                                     "HttpPutResponseHopLimit": options.ssh.imds_hop_limit}
    elif options.user_data is not None:
        params["UserData"] = options.user_data   # botocore base64-encodes it
    if options.subnet_id:
        params["SubnetId"] = options.subnet_id
    if options.security_group_ids:
        params["SecurityGroupIds"] = list(options.security_group_ids)
    if options.key_name:
        params["KeyName"] = options.key_name
    if options.iam_instance_profile:
        prof = options.iam_instance_profile
        params["IamInstanceProfile"] = {"Arn": prof} if prof.startswith("arn:") else {"Name": prof}
    if offer.spot:
        params["InstanceMarketOptions"] = {
            "MarketType": "spot",
            "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}}
    if offer.zone:
        params["Placement"] = {"AvailabilityZone": offer.zone}
    return params


__all__ = ["MAX_TAGS", "TAGS", "check_request", "client_token", "run_instances_params"]
