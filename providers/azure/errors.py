"""Azure Resource Manager errors mapped onto the SDK's error tree.

Every call (and every long-running operation, whose failure azure-core raises as an
``HttpResponseError`` carrying the operation's ``error``) goes through :func:`map_http_error`;
the caller raises the result ``from`` the azure-core exception, so the cloud's error stays
chained.  The ARM error ``code`` is kept as ``err.code``.

Sources (read 2026-12-01): "Resolve errors for SKU not available"
(https://learn.microsoft.com/azure/azure-resource-manager/troubleshooting/error-sku-not-available),
"Troubleshoot allocation failures"
(https://learn.microsoft.com/troubleshoot/azure/virtual-machines/windows/allocation-failure),
"Resolve errors for resource quotas"
(https://learn.microsoft.com/azure/azure-resource-manager/troubleshooting/error-resource-quota),
"Understand how Azure Resource Manager throttles requests"
(https://learn.microsoft.com/azure/azure-resource-manager/management/request-limits-and-throttling):
a throttled request answers 429 with ``Retry-After``.

Decisions:

* ``SkuNotAvailable``, ``AllocationFailed``, ``ZonalAllocationFailed`` and the
  ``Overconstrained*AllocationRequest`` codes are capacity: another size, zone or region
  may launch (for spot VMs Azure answers a shortage with ``SkuNotAvailable`` too, and
  ``SpotPriceGreaterThanProvidedMaxPrice`` when the market is above the max price: "Error
  messages for Azure Spot Virtual Machines",
  https://learn.microsoft.com/azure/virtual-machines/error-codes-spot);
* ``QuotaExceeded`` and ``OperationNotAllowed`` whose message speaks of a quota (ARM uses
  that code for "Operation could not be completed as it results in exceeding approved
  ... Cores quota") are quota; other ``OperationNotAllowed`` is a plain ``ProviderError``;
* 401 and ``AuthorizationFailed``/``InvalidAuthenticationToken*``/``LinkedAuthorizationFailed``
  (403) are ``AuthError``; ``SubscriptionNotFound`` / ``InvalidSubscriptionId`` are
  ``NotFoundError`` naming the subscription; ``ResourceNotFound``/``NotFound`` are
  ``NotFoundError``;
* 429 is ``ThrottledError`` with the server's ``Retry-After``; 5xx without a known code is
  ``ProviderUnavailableError``; codes not in the table are plain ``ProviderError``.
"""

from __future__ import annotations

from typing import Any, cast

from flowmesh_sdk.errors import (AuthError, CapacityError, FlowMeshError, NotFoundError, ProviderError,
                                 ProviderUnavailableError, QuotaError, SpecError, ThrottledError)

PROVIDER = "azure"

ERROR_TABLE: dict[str, type[FlowMeshError]] = {
    # capacity: try the next offer
    "SkuNotAvailable": CapacityError,
    "AllocationFailed": CapacityError,
    "ZonalAllocationFailed": CapacityError,
    "OverconstrainedAllocationRequest": CapacityError,
    "OverconstrainedZonalAllocationRequest": CapacityError,
    "SpotPriceGreaterThanProvidedMaxPrice": CapacityError,
    # quota: try another region / provider
    "QuotaExceeded": QuotaError,
    "ResourceQuotaExceeded": QuotaError,
    "SubscriptionQuotaExceeded": QuotaError,
    # throttled
    "TooManyRequests": ThrottledError,
    "RetryableError": ThrottledError,
    # auth
    "AuthorizationFailed": AuthError,
    "AuthenticationFailed": AuthError,
    "InvalidAuthenticationToken": AuthError,
    "InvalidAuthenticationTokenTenant": AuthError,
    "ExpiredAuthenticationToken": AuthError,
    "LinkedAuthorizationFailed": AuthError,
    # not found
    "SubscriptionNotFound": NotFoundError,
    "InvalidSubscriptionId": NotFoundError,
    "ResourceGroupNotFound": NotFoundError,
    "ResourceNotFound": NotFoundError,
    "NotFound": NotFoundError,
    # bad input
    "InvalidParameter": SpecError,
    "InvalidRequestFormat": SpecError,
    "InvalidTemplate": SpecError,
    "BadRequest": SpecError,
    "MissingApiVersionParameter": SpecError,
}

_AUTH_HINT = ("Azure refused the credentials: DefaultAzureCredential looks for AZURE_CLIENT_ID / "
              "AZURE_TENANT_ID / AZURE_CLIENT_SECRET (or a managed identity, or `az login`); the principal "
              "needs the Virtual Machine Contributor and Network Contributor roles on the resource group "
              "(docs/providers/azure.md)")


def error_code(exc: Any) -> str:
    err = getattr(exc, "error", None)
    code = getattr(err, "code", None) if err is not None else None
    return str(code or "")


def _retry_after(exc: Any) -> float | None:
    response = getattr(exc, "response", None)
    value = response.headers.get("Retry-After") if response is not None else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def map_http_error(exc: Any, *, subscription: str, where: str) -> FlowMeshError:
    """An azure-core ``HttpResponseError`` from a call on ``where``."""
    status = int(getattr(exc, "status_code", 0) or 0)
    code = error_code(exc)
    err = getattr(exc, "error", None)
    message = str(getattr(err, "message", "") or getattr(exc, "message", "") or exc)
    text = f"{where}: {message}"
    cls = ERROR_TABLE.get(code)
    if code == "OperationNotAllowed" and "quota" in message.lower():
        cls = QuotaError
    if cls is NotFoundError and code in ("SubscriptionNotFound", "InvalidSubscriptionId"):
        return NotFoundError(f"subscription {subscription!r} was not found (or this credential may not see it): "
                             f"{message}; check AzureProvider(subscription_id=...) or AZURE_SUBSCRIPTION_ID",
                             provider=PROVIDER, code=code)
    if status == 401 or cls is AuthError:
        return AuthError(f"{text}; {_AUTH_HINT}", provider=PROVIDER, code=code or str(status))
    if status == 429 and cls is None:
        cls, code = ThrottledError, code or "429"
    if cls is None and status == 404:
        cls = NotFoundError
    if cls is ThrottledError:
        return ThrottledError(text, provider=PROVIDER, code=code, retry_after_s=_retry_after(exc))
    if cls is SpecError:
        return SpecError("launch", text, code=code, provider=PROVIDER)
    if cls is not None:
        # the table's classes other than SpecError (handled above) are ProviderErrors, which take provider= and code=
        return cast("type[ProviderError]", cls)(text, provider=PROVIDER, code=code or str(status))
    if status >= 500:
        return ProviderUnavailableError(text, provider=PROVIDER, code=code or str(status))
    return ProviderError(text, provider=PROVIDER, code=code or (str(status) if status else type(exc).__name__))


def unreachable(exc: BaseException, *, endpoint: str | None) -> ProviderUnavailableError:
    return ProviderUnavailableError(f"Azure Resource Manager at {endpoint or 'management.azure.com'} did not "
                                    f"answer: {type(exc).__name__}", provider=PROVIDER, code="EndpointUnreachable")


def missing_credentials(exc: BaseException) -> AuthError:
    return AuthError(f"no Azure credential was available ({type(exc).__name__}); {_AUTH_HINT}", provider=PROVIDER,
                     code="CredentialUnavailable")


__all__ = ["ERROR_TABLE", "PROVIDER", "error_code", "map_http_error", "missing_credentials", "unreachable"]
