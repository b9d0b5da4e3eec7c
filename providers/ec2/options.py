"""What an :class:`~.provider.Ec2Provider` is built with: its constructor's options, checked
once into a frozen record (:class:`Ec2Options`), each bad value a ``SpecError`` naming the
field (``ec2.regions``, ``ec2.image_id[...]``, ``ec2.ssh.*``, ...).

``ssh`` is normalized here, once: ``True`` becomes the default :class:`SshMode`, ``False``
and ``None`` no SSH mode, so the rest of the provider sees an SshMode or None.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from flowmesh_sdk import settings as _settings
from flowmesh_sdk.errors import SpecError
from flowmesh_sdk.provider import Instance
from flowmesh_sdk.redaction import redact_url
from flowmesh_sdk.remote.injection import SshMode as _SshMode
from flowmesh_sdk.remote.runner import Runner

DEFAULT_REGION = "us-east-1"
ENV_ENDPOINT = "FLOWMESH_EC2_ENDPOINT_URL"
ENV_AMI = "FLOWMESH_EC2_AMI"
# The families offers() describes by default (DescribeInstanceTypes ``instance-type``
# filter values, wildcards allowed): current general purpose, compute and memory families
# (Intel, AMD, Graviton) and the GPU families.  Shapes only; which of them can be launched
# at what price is the catalog's business.  ``Ec2Provider(instance_types=...)`` replaces
# the list (``("*",)``: every type the region has, several hundred).
DEFAULT_INSTANCE_TYPES: tuple[str, ...] = (
    "c5.*", "c6a.*", "c6i.*", "c7a.*", "c7i.*", "c7g.*",
    "m5.*", "m6a.*", "m6i.*", "m7a.*", "m7i.*", "m7g.*",
    "r5.*", "r6a.*", "r6i.*", "r7i.*", "r7g.*",
    "g4ad.*", "g4dn.*", "g5.*", "g5g.*", "g6.*", "g6e.*", "gr6.*", "g7.*", "g7e.*",
    "p3dn.*", "p4d.*", "p4de.*", "p5.*", "p5en.*", "p6-b200.*", "p6-b300.*",
)
_TYPE_PATTERN = re.compile(r"^[a-z0-9*?][a-z0-9.*?-]{0,63}$")
_REGION = re.compile(r"^[a-z]{2}(?:-[a-z]+)+-\d+$")

RunnerFactory = Callable[[Instance], Runner]


class SshMode(_SshMode):
    """:class:`flowmesh_sdk.remote.injection.SshMode` for EC2 (errors name ``ec2.ssh.*``).

    ``address="public"`` makes launch wait, up to 120 s, until EC2 has assigned public IPs;
    ``imds_hop_limit`` is the IMDSv2 PUT response hop limit (1: processes in containers
    cannot reach the metadata service, so cannot read the user-data; raise it only if
    containers must use the instance role).  ``address_map``: a test hook
    (``flowmesh_sdk.testing.cloudinit``)."""

    __slots__ = ()
    field_prefix = "ec2.ssh"


def trust_id(instance_id: str) -> str:
    """How an EC2 instance's injected host key is named in the trust record."""
    return f"ec2:{instance_id}"


def _default_regions() -> list[str]:
    return [os.environ.get("AWS_DEFAULT_REGION") or os.environ.get("AWS_REGION") or DEFAULT_REGION]


def _regions(regions: str | Sequence[str] | None) -> tuple[str, ...]:
    if regions is None:
        regions = _default_regions()
    elif isinstance(regions, str):
        regions = [regions]
    regs: list[str] = []
    for r in regions:
        if not isinstance(r, str) or not _REGION.match(r):
            raise SpecError("ec2.regions", f"must be AWS region names like 'us-east-1', got {r!r}")
        if r not in regs:
            regs.append(r)
    if not regs:
        raise SpecError("ec2.regions", "must name at least one region")
    return tuple(regs)


def _endpoint(endpoint_url: str | None) -> str | None:
    endpoint_url = endpoint_url if endpoint_url is not None else _settings.value("providers.ec2.endpoint_url")
    if endpoint_url is not None and not re.match(r"^https?://[^/\s]+", str(endpoint_url)):
        raise SpecError("ec2.endpoint_url", f"must be an http(s) URL, got {redact_url(str(endpoint_url))!r}")
    return endpoint_url


def _image_ids(image_id: str | Mapping[str, str] | None) -> dict[str, str] | str | None:
    if image_id is None:
        image_id = _settings.value("providers.ec2.image_id")
    if isinstance(image_id, Mapping):
        images = {}
        for reg, ami in image_id.items():
            if not isinstance(ami, str) or not ami.strip():
                raise SpecError(f"ec2.image_id[{reg!r}]", f"must be an AMI id, got {ami!r}")
            images[str(reg)] = ami.strip()
        return images
    if image_id is not None:
        if not isinstance(image_id, str) or not image_id.strip():
            raise SpecError("ec2.image_id", f"must be an AMI id like 'ami-0abc...', got {image_id!r}")
        return image_id.strip()
    return None


def _instance_types(instance_types: str | Sequence[str] | None) -> tuple[str, ...]:
    if instance_types is None:
        instance_types = DEFAULT_INSTANCE_TYPES
    elif isinstance(instance_types, str):
        instance_types = (instance_types,)
    patterns = tuple(dict.fromkeys(instance_types))
    bad = [t for t in patterns if not isinstance(t, str) or not _TYPE_PATTERN.match(t)]
    if bad or not patterns:
        raise SpecError("ec2.instance_types", "must be EC2 instance types or DescribeInstanceTypes "
                                              f"wildcards like 'c7i.*' or 'm6i.2xlarge', got {bad or patterns!r}")
    return patterns


@dataclass(frozen=True, slots=True)
class Ec2Options:
    """An :class:`~.provider.Ec2Provider`'s options, checked (build one with :meth:`build`).

    ``image_ids`` is one AMI id, a mapping region -> AMI id, or None (none configured);
    ``ssh`` an SshMode or None.  ``session_kwargs`` and ``user_data`` are left out of the
    record's repr (credentials, setup scripts)."""

    regions: tuple[str, ...]
    endpoint_url: str | None = None
    image_ids: dict[str, str] | str | None = None
    subnet_id: str | None = None
    security_group_ids: tuple[str, ...] = ()
    key_name: str | None = None
    user_data: str | None = field(default=None, repr=False)
    iam_instance_profile: str | None = None
    max_workers: int = 8
    runner_factory: RunnerFactory | None = None
    session_kwargs: Mapping[str, Any] | None = field(default=None, repr=False)
    partial_ok: bool = False
    instance_types: tuple[str, ...] = DEFAULT_INSTANCE_TYPES
    ssh: _SshMode | None = None

    @classmethod
    def build(cls, *, regions: str | Sequence[str] | None = None, endpoint_url: str | None = None,
              image_id: str | Mapping[str, str] | None = None, subnet_id: str | None = None,
              security_group_ids: str | Sequence[str] = (), key_name: str | None = None,
              user_data: str | None = None, iam_instance_profile: str | None = None,
              max_workers: int = 8, runner_factory: RunnerFactory | None = None,
              session_kwargs: Mapping[str, Any] | None = None, partial_ok: bool = False,
              instance_types: str | Sequence[str] | None = None,
              ssh: _SshMode | bool | None = None) -> Ec2Options:
        """The checked record of :class:`~.provider.Ec2Provider`'s keyword arguments (the same
        names and defaults); ``regions``, ``endpoint_url`` and ``image_id`` fall back to the
        environment and the settings when None."""
        regs = _regions(regions)
        endpoint = _endpoint(endpoint_url)
        images = _image_ids(image_id)
        if isinstance(security_group_ids, str):
            security_group_ids = (security_group_ids,)
        if isinstance(max_workers, bool) or not isinstance(max_workers, int) or not 1 <= max_workers <= 256:
            raise SpecError("ec2.max_workers", f"must be an integer in [1, 256], got {max_workers!r}")
        if runner_factory is not None and not callable(runner_factory):
            raise SpecError("ec2.runner_factory", "must be a callable Instance -> Runner")
        mode = SshMode.coerce(ssh, "ec2.ssh")
        if mode is not None and user_data is not None:
            raise SpecError("ec2.user_data", "cannot be combined with ssh=: in SSH mode the provider writes "
                                             "the user-data itself (the instance's host key and the fleet's "
                                             "client key); put other setup in the AMI or the bootstrap steps")
        if mode is not None and runner_factory is not None:
            raise SpecError("ec2.runner_factory", "cannot be combined with ssh=: SSH mode makes the runners")
        return cls(regions=regs, endpoint_url=endpoint, image_ids=images, subnet_id=subnet_id,
                   security_group_ids=tuple(security_group_ids), key_name=key_name, user_data=user_data,
                   iam_instance_profile=iam_instance_profile, max_workers=max_workers,
                   runner_factory=runner_factory, session_kwargs=session_kwargs, partial_ok=bool(partial_ok),
                   instance_types=_instance_types(instance_types), ssh=mode)

    def image_for(self, region: str) -> str:
        """The AMI to launch in ``region``; SpecError naming ``ec2.image_id`` when none is set."""
        ids = self.image_ids
        ami = ids.get(region) if isinstance(ids, dict) else ids
        if not ami:
            raise SpecError("ec2.image_id",
                            f"no AMI configured for region {region}: pass Ec2Provider(image_id='ami-...') "
                            f"(or a mapping region -> AMI id), or set {ENV_AMI}")
        return ami


__all__ = ["DEFAULT_INSTANCE_TYPES", "DEFAULT_REGION", "ENV_AMI", "ENV_ENDPOINT", "Ec2Options", "RunnerFactory",
           "SshMode", "trust_id"]
