"""EC2 error codes mapped onto the SDK's error tree.

Every call the driver makes goes through :func:`map_client_error` (for a botocore
``ClientError``), :func:`missing_credentials` or :func:`endpoint_unreachable`, and the
caller raises the result ``from`` the botocore exception, so the cloud's error stays
chained as ``__cause__``.  The EC2 code is kept as ``err.code``.

What a caller does with each class (see :mod:`flowmesh_sdk.errors`): ``CapacityError``
tries the next offer, ``QuotaError`` skips this (provider, region), ``ThrottledError``
backs off and retries the same call, ``AuthError`` stops and tells the user,
``NotFoundError`` means the instance is gone, ``SpecError`` is bad input (nothing was
launched).

Sources for the codes: "Error codes for the Amazon EC2 API"
(https://docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html): client
errors come with HTTP 4xx; ``InsufficientInstanceCapacity``, ``InsufficientHostCapacity``,
``InsufficientReservedInstanceCapacity``, ``RequestLimitExceeded``, ``Unavailable`` and
``ServiceUnavailable`` are listed as *server* errors (HTTP 5xx; ``RequestLimitExceeded``
is 503 in botocore's own retry table, ``_retry.json``).

Decisions on the doubtful ones:

* ``InsufficientReservedInstanceCapacity`` -> ``CapacityError``, not ``QuotaError``.
  AWS lists it with the other ``Insufficient*Capacity`` server errors ("Not enough
  available Reserved Instances to satisfy your minimum request ... wait for additional
  capacity"): it is a shortage of capacity in one place right now, which another offer
  (type, zone) can avoid; no quota increase fixes it.
* ``SpotMaxPriceTooLow`` -> ``CapacityError``: the spot market for this offer is above
  our maximum price now (the driver sets none, so the maximum is the on-demand price);
  the next offer -- on-demand, or another type -- may launch.
* ``Unsupported`` -> ``CapacityError``: EC2 returns it when the instance type is not
  offered in the requested Availability Zone ("Your requested instance type (X) is not
  supported in your requested Availability Zone (Y)"); another offer may be fine.
* ``InsufficientFreeAddressesInSubnet`` -> ``CapacityError``: the subnet is full; the
  next offer (another zone/subnet or region) may launch.
* ``Unavailable`` / ``ServiceUnavailable`` -> ``ThrottledError``: the server is
  overloaded; AWS's remedy is the same as for throttling (back off, retry the same call).
* ``InvalidInstanceID.Malformed`` -> ``NotFoundError``: an id that is not even
  well-formed names no instance.  (The driver filters malformed ids out before calling,
  so this only surfaces if EC2 disagrees with its pattern.)
* ``IdempotentParameterMismatch`` -> ``SpecError`` on ``launch.request_id``: the same
  request id (EC2 ``ClientToken``) was used for a different launch -- a caller bug.
* ``InternalError`` / ``InternalFailure`` -> ``ProviderUnavailableError`` (EC2's side
  failed; retried with backoff); every code not in the table -> plain ``ProviderError``
  (the SDK does not guess).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from flowmesh_sdk.errors import (AuthError, CapacityError, FlowMeshError, NotFoundError, ProviderError,
                                 ProviderUnavailableError, QuotaError, SpecError, ThrottledError)

if TYPE_CHECKING:  # botocore is imported lazily (it is an optional extra)
    from botocore.exceptions import ClientError

PROVIDER = "ec2"

# code -> SDK class.  Keep in step with the module docstring.
ERROR_TABLE: dict[str, type[FlowMeshError]] = {
    # capacity: try the next offer
    "InsufficientInstanceCapacity": CapacityError,
    "InsufficientHostCapacity": CapacityError,
    "InsufficientReservedInstanceCapacity": CapacityError,
    "InsufficientCapacity": CapacityError,
    "InsufficientVolumeCapacity": CapacityError,
    "InsufficientFreeAddressesInSubnet": CapacityError,
    "SpotMaxPriceTooLow": CapacityError,
    "Unsupported": CapacityError,
    # quota: try another region / provider
    "InstanceLimitExceeded": QuotaError,
    "VcpuLimitExceeded": QuotaError,
    "MaxSpotInstanceCountExceeded": QuotaError,
    "VolumeLimitExceeded": QuotaError,
    # throttled: back off, same call
    "RequestLimitExceeded": ThrottledError,
    "Throttling": ThrottledError,
    "ThrottlingException": ThrottledError,
    "Unavailable": ThrottledError,
    "ServiceUnavailable": ThrottledError,
    # EC2's side failed: back off, same call
    "InternalError": ProviderUnavailableError,
    "InternalFailure": ProviderUnavailableError,
    # auth: stop, tell the user
    "AuthFailure": AuthError,
    "UnauthorizedOperation": AuthError,
    "InvalidClientTokenId": AuthError,
    "SignatureDoesNotMatch": AuthError,
    "OptInRequired": AuthError,
    "PendingVerification": AuthError,
    "Blocked": AuthError,
    # not found
    "InvalidInstanceID.NotFound": NotFoundError,
    "InvalidInstanceID.Malformed": NotFoundError,
    # bad input: nothing was launched
    "InvalidParameterValue": SpecError,
    "InvalidParameterCombination": SpecError,
    "InvalidParameter": SpecError,
    "MissingParameter": SpecError,
    "InvalidAMIID.NotFound": SpecError,
    "InvalidAMIID.Malformed": SpecError,
    "InvalidAMIID.Unavailable": SpecError,
    "InvalidInstanceType": SpecError,
    "InvalidSubnetID.NotFound": SpecError,
    "InvalidGroup.NotFound": SpecError,
    "InvalidKeyPair.NotFound": SpecError,
    "InvalidBlockDeviceMapping": SpecError,
    "IdempotentParameterMismatch": SpecError,
}

# For SpecError: which field of the user's input the code points at.
SPEC_FIELDS: dict[str, str] = {
    "InvalidAMIID.NotFound": "ec2.image_id",
    "InvalidAMIID.Malformed": "ec2.image_id",
    "InvalidAMIID.Unavailable": "ec2.image_id",
    "InvalidInstanceType": "launch.offer.instance_type",
    "InvalidSubnetID.NotFound": "ec2.subnet_id",
    "InvalidGroup.NotFound": "ec2.security_group_ids",
    "InvalidKeyPair.NotFound": "ec2.key_name",
    "InvalidBlockDeviceMapping": "instance.disk_gb",
    "IdempotentParameterMismatch": "launch.request_id",
}

# What to tell the user for each auth code (the SDK's AuthError says what to fix).
_AUTH_HINTS: dict[str, str] = {
    "AuthFailure": "AWS could not validate the credentials: check AWS_ACCESS_KEY_ID / "
                   "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) and the system clock",
    "InvalidClientTokenId": "the access key id is not known to AWS: check AWS_ACCESS_KEY_ID "
                            "(or the key in AWS_PROFILE)",
    "SignatureDoesNotMatch": "the secret key does not match the access key id: check "
                             "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) and the system clock",
    "UnauthorizedOperation": "the credentials are valid but not allowed this action: grant it "
                             "in the IAM policy of the user or role",
    "OptInRequired": "the account is not subscribed to EC2 (or to this region): opt in first",
    "PendingVerification": "the account is still being verified by AWS",
    "Blocked": "the account is blocked: contact AWS Support",
}

_MISSING_CREDENTIALS = (
    "no AWS credentials found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
    "(and AWS_SESSION_TOKEN for temporary keys), or AWS_PROFILE naming a profile in "
    "~/.aws/credentials, or run on an instance with an IAM instance role")


def error_code(exc: Any) -> str:
    """The EC2 error code of a botocore ClientError ("" when there is none)."""
    err = (getattr(exc, "response", None) or {}).get("Error") or {}
    return str(err.get("Code") or "")


def _retry_after(exc: Any) -> float | None:
    headers = ((getattr(exc, "response", None) or {}).get("ResponseMetadata") or {}).get("HTTPHeaders") or {}
    value = headers.get("retry-after")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def map_client_error(exc: ClientError, *, region: str, operation: str | None = None) -> FlowMeshError:
    """The SDK error for a botocore ``ClientError``; raise it ``from exc``.

    The EC2 code is kept as ``.code`` (on every class, SpecError included); the message
    names the operation and region and carries EC2's own message (which never holds
    credentials or request parameters such as user data)."""
    code = error_code(exc)
    err = (getattr(exc, "response", None) or {}).get("Error") or {}
    message = str(err.get("Message") or "").strip() or code or "unknown error"
    op = operation or getattr(exc, "operation_name", "") or "call"
    where = f"{op} in {region}"
    cls = ERROR_TABLE.get(code, ProviderError)
    out: FlowMeshError
    if cls is SpecError:
        field = SPEC_FIELDS.get(code, "ec2.request")
        out = SpecError(field, f"EC2 refused {where}: {message} ({code})", code=code,
                        provider=PROVIDER)
    elif cls is ThrottledError:
        out = ThrottledError(f"{where}: {message}", provider=PROVIDER, code=code,
                             retry_after_s=_retry_after(exc))
    elif cls is AuthError:
        hint = _AUTH_HINTS.get(code, "check the AWS credentials")
        out = AuthError(f"{where}: {message}; {hint}", provider=PROVIDER, code=code)
    else:
        assert issubclass(cls, ProviderError)
        out = cls(f"{where}: {message}", provider=PROVIDER, code=code)
    return out


def missing_credentials(exc: BaseException, *, region: str) -> AuthError:
    """botocore found no (or half) credentials: say what to set.  Names variables, never values."""
    partial = type(exc).__name__ == "PartialCredentialsError"
    what = ("incomplete AWS credentials (" + str(exc) + "): " if partial else "") + _MISSING_CREDENTIALS
    return AuthError(f"{region}: {what}", provider=PROVIDER,
                     code="PartialCredentials" if partial else "NoCredentials")


def endpoint_unreachable(exc: BaseException, *, region: str, endpoint: str | None) -> ProviderError:
    """The EC2 endpoint did not answer (DNS, refused, timeout): retried from outside."""
    target = endpoint or f"the EC2 endpoint of {region}"
    return ProviderUnavailableError(f"{region}: could not reach {target}: {type(exc).__name__}",
                         provider=PROVIDER, code="EndpointUnreachable")


_QUOTED = re.compile(r"'([^']*)'")
_INSTANCE_ID = re.compile(r"\bi-[0-9a-f]{8,17}\b")


def missing_instance_ids(message: str) -> set[str]:
    """The ids an ``InvalidInstanceID.NotFound`` message names.

    EC2 writes ``The instance ID 'i-1a2b3c4d' does not exist`` or, for several,
    ``The instance IDs 'i-1, i-2' do not exist``."""
    found: set[str] = set()
    for quoted in _QUOTED.findall(message):
        found.update(_INSTANCE_ID.findall(quoted))
    return found or set(_INSTANCE_ID.findall(message))


__all__ = ["ERROR_TABLE", "SPEC_FIELDS", "endpoint_unreachable", "error_code", "map_client_error",
           "missing_credentials", "missing_instance_ids"]
