"""Alibaba Cloud ECS error codes mapped onto the SDK's error tree.

The ECS SDK (``alibabacloud-ecs20140526`` on ``alibabacloud-tea-openapi``) raises, for an
HTTP 4xx/5xx answer with a JSON body ``{"RequestId", "HostId", "Code", "Message"}``, a
``ClientException`` (4xx), ``ServerException`` (5xx) or ``ThrottlingException`` (when the
answer carries a throttling-time header), each with ``.code``, ``.message`` and
``.status_code``; anything that failed before an answer (refused connection, a body that
is not JSON) comes wrapped in ``UnretryableException`` (``.inner_exception``).  An HTTP
200 carrying a ``Code`` raises nothing (it is parsed as a success), so the driver checks
what it needs in every answer itself.  Every call goes through :func:`map_error`, and the
caller raises the result ``from`` the SDK's exception: the cloud's error stays chained as
``__cause__``; the ECS code is kept as ``err.code``.

Classes (see :mod:`flowmesh_sdk.errors`): ``CapacityError`` tries the next offer,
``QuotaError`` skips this (provider, region), ``ThrottledError`` backs off and retries the
same call, ``AuthError`` stops and names what to fix, ``NotFoundError`` means gone,
``SpecError`` is bad input (nothing was launched).

Sources for the codes (read 2026-12-01): the error-code tables of the ECS API reference
pages RunInstances, DescribeInstances and DeleteInstances
(help.aliyun.com/en/ecs/developer-reference/api-ecs-2014-05-26-runinstances and siblings),
and "API call throttling" (https://www.alibabacloud.com/help/doc-detail/437902.htm: a
throttled call fails with a ``Throttling`` code).  Decisions on the doubtful ones:

* out of stock (``OperationDenied.NoStock``, ``Zone.NotOnSale``,
  ``InvalidResourceType.NotSupported`` -- the type is not sold in that zone now --,
  ``ResourceNotAvailable``, ``InvalidInstanceType.ZoneNotSupported``) -> ``CapacityError``:
  another zone or type may launch;
* every ``QuotaExceed*`` / ``QuotaExceeded*`` code (``QuotaExceed.ElasticQuota``: no more
  vCPUs of this type for the account in the region; ``QuotaExceed.PostPaidInstance``, ...)
  -> ``QuotaError``;
* every ``Throttling*`` code (``Throttling``, ``Throttling.User``, ``Throttling.Api``),
  whatever the HTTP status (ECS answers 400; a gateway may answer 429), and any HTTP 429
  -> ``ThrottledError``; ``ServiceUnavailable`` too (back off, same call);
* ``InvalidAccessKeyId*``, ``SignatureDoesNotMatch``, ``IncompleteSignature``,
  ``InvalidSecurityToken*``, ``MissingAuthorization`` and every ``Forbidden*`` ->
  ``AuthError`` naming the credential variables;
* ``InternalError`` / every other 5xx -> ``ProviderUnavailableError``; a code not in the
  tables -> plain ``ProviderError`` (the SDK does not guess).
"""

from __future__ import annotations

from typing import Any, cast

from flowmesh_sdk.errors import (AuthError, CapacityError, FlowMeshError, NotFoundError, ProviderError,
                                 ProviderUnavailableError, QuotaError, SpecError, ThrottledError)

PROVIDER = "alibaba"
KEY_ID = "ALIBABA_CLOUD_ACCESS_KEY_ID"
KEY_SECRET = "ALIBABA_CLOUD_ACCESS_KEY_SECRET"

ERROR_TABLE: dict[str, type[FlowMeshError]] = {
    # capacity: try the next offer
    "OperationDenied.NoStock": CapacityError,
    "Zone.NotOnSale": CapacityError,
    "InvalidResourceType.NotSupported": CapacityError,
    "ResourceNotAvailable": CapacityError,
    "InvalidInstanceType.ZoneNotSupported": CapacityError,
    # throttled / unavailable: back off, same call
    "ServiceUnavailable": ThrottledError,
    "InternalError": ProviderUnavailableError,
    # not found
    "InvalidInstanceId.NotFound": NotFoundError,
    # bad input: nothing was launched
    "InvalidParameter": SpecError,
    "MissingParameter": SpecError,
    "InvalidImageId.NotFound": SpecError,
    "InvalidVSwitchId.NotFound": SpecError,
    "InvalidSecurityGroupId.NotFound": SpecError,
    "InvalidInstanceType.ValueNotSupported": SpecError,
    "InvalidInstanceType.NotFound": SpecError,
    "InvalidUserData.SizeExceeded": SpecError,
    "InvalidTagKey.Malformed": SpecError,
    "InvalidTagValue.Malformed": SpecError,
    "InvalidTag.Mismatch": SpecError,
    "IdempotentParameterMismatch": SpecError,
    "InvalidParameter.Amount": SpecError,
}
SPEC_FIELDS: dict[str, str] = {
    "InvalidImageId.NotFound": "alibaba.image_id",
    "InvalidVSwitchId.NotFound": "alibaba.vswitch_ids",
    "InvalidSecurityGroupId.NotFound": "alibaba.security_group_id",
    "InvalidInstanceType.ValueNotSupported": "launch.offer.instance_type",
    "InvalidInstanceType.NotFound": "launch.offer.instance_type",
    "InvalidUserData.SizeExceeded": "alibaba.ssh",
    "IdempotentParameterMismatch": "launch.request_id",
    "InvalidParameter.Amount": "launch.count",
}
_AUTH_PREFIXES = ("InvalidAccessKeyId", "SignatureDoesNotMatch", "IncompleteSignature", "InvalidSecurityToken",
                  "MissingAuthorization", "Forbidden", "InvalidCredentials", "NoPermission")
_AUTH_HINT = (f"check {KEY_ID} and {KEY_SECRET} (or the profile in ~/.alibabacloud/credentials.ini / "
              "~/.aliyun/config.json), and that the RAM user may call ECS (docs/providers/alibaba.md)")


def classify(code: str, status: int) -> type[FlowMeshError] | None:
    if code.startswith("Throttling") or status == 429:
        return ThrottledError
    if code.startswith(("QuotaExceed", "QuotaExceeded")):
        return QuotaError
    if code.startswith(_AUTH_PREFIXES) or status in (401,):
        return AuthError
    cls = ERROR_TABLE.get(code)
    if cls is not None:
        return cls
    if status >= 500:
        return ProviderUnavailableError
    return None


def _hint_for(code: str) -> str:
    if code.startswith("InvalidAccessKeyId"):
        return f"the access key id is not known to Alibaba Cloud: check {KEY_ID}"
    if code in ("SignatureDoesNotMatch", "IncompleteSignature"):
        return f"the secret does not match the access key id: check {KEY_SECRET}"
    if code.startswith("InvalidSecurityToken"):
        return "the STS token is invalid or expired: check ALIBABA_CLOUD_SECURITY_TOKEN"
    if code.startswith("Forbidden") or code == "NoPermission":
        return "the credentials are valid but not allowed this action: grant it in the RAM policy"
    return _AUTH_HINT


def map_error(exc: Any, *, where: str) -> FlowMeshError:
    """The SDK error for a Tea exception from an ECS call on ``where`` (``RunInstances in
    cn-hangzhou``); raise it ``from exc``.  Messages carry ECS's own message (never the
    request's parameters: user-data holds a host key) without the request id suffix."""
    inner = getattr(exc, "inner_exception", None)
    if inner is not None and not getattr(exc, "code", None):
        exc = inner
    code = str(getattr(exc, "code", "") or "")
    if code in ("None", "null"):
        code = ""
    status = int(getattr(exc, "status_code", 0) or 0)
    message = str(getattr(exc, "message", "") or "")
    message = message.split(" request id:")[0].removeprefix(f"code: {status}, ").strip()
    if not code and not status:
        return ProviderUnavailableError(f"{where}: ECS did not answer: {type(exc).__name__}: {exc}",
                                        provider=PROVIDER, code="EndpointUnreachable")
    text = f"{where}: {code or status}" + (f": {message}" if message else "")
    cls = classify(code, status)
    if cls is None:
        return ProviderError(text, provider=PROVIDER, code=code or str(status))
    if cls is SpecError:
        return SpecError(SPEC_FIELDS.get(code, "alibaba.request"), f"ECS refused {text}", code=code,
                         provider=PROVIDER)
    if cls is ThrottledError:
        retry_after = getattr(exc, "retry_after", None)
        return ThrottledError(text, provider=PROVIDER, code=code or str(status),
                              retry_after_s=float(retry_after) / 1000 if isinstance(retry_after, (int, float))
                              and retry_after > 0 else None)
    if cls is AuthError:
        return AuthError(f"{text}; {_hint_for(code)}", provider=PROVIDER, code=code or str(status))
    # the table's classes other than SpecError (handled above) are ProviderErrors, which take provider= and code=
    return cast("type[ProviderError]", cls)(text, provider=PROVIDER, code=code or str(status))


def missing_credentials() -> AuthError:
    return AuthError(f"no Alibaba Cloud credentials found: set {KEY_ID} and {KEY_SECRET} (and "
                     "ALIBABA_CLOUD_SECURITY_TOKEN for STS keys), or write a profile to "
                     "~/.alibabacloud/credentials.ini (ALIBABA_CLOUD_CREDENTIALS_FILE) or ~/.aliyun/config.json, "
                     "or pass AlibabaProvider(ram_role=True) on an ECS instance with a RAM role",
                     provider=PROVIDER, code="NoCredentials")


__all__ = ["ERROR_TABLE", "KEY_ID", "KEY_SECRET", "PROVIDER", "classify", "map_error", "missing_credentials"]
