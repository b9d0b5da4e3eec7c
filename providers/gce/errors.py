"""Compute Engine errors mapped onto the SDK's error tree.

Compute Engine reports a failure in one of two places, and both are mapped here:

* **the HTTP answer** to a call (``google.api_core.exceptions.GoogleAPICallError``: its
  HTTP ``code`` and the ``reason`` of each entry of ``error.errors``) --
  :func:`map_api_error`;
* **the operation** a mutating call returns, once it is ``DONE``: ``Operation.error.errors[]``
  with a ``code`` such as ``ZONE_RESOURCE_POOL_EXHAUSTED`` or ``QUOTA_EXCEEDED`` --
  :func:`map_operation_error`.

The caller raises the result ``from`` the library's exception (an operation error has no
exception of its own: the operation's id and its error entries are in the message), so
the cloud's error stays chained.  The reason or code is kept as ``err.code``.

Sources (read 2026-12-01): "Troubleshooting bulk VM creation"
(https://cloud.google.com/compute/docs/troubleshooting/troubleshooting-bulk-vm-creation):
a bulk request that does not start answers HTTP 400 ``invalid``, 403 ``quotaExceeded``,
403 ``rateLimitExceeded`` (more than 20 requests a second, or more than 10 bulk
operations at once) or 503 ``insufficientCapacity``; one that starts and then fails leaves
``QUOTA_EXCEEDED`` or ``ZONE_RESOURCE_POOL_EXHAUSTED`` in the operation's errors.
"Compute Engine rate quotas" (https://cloud.google.com/compute/api-quota): a rate quota
exceeded is a 403 with reason ``rateLimitExceeded``.  "Troubleshooting resource
availability errors" (https://cloud.google.com/compute/docs/troubleshooting/troubleshooting-resource-availability):
``ZONE_RESOURCE_POOL_EXHAUSTED`` (and ``_WITH_DETAILS``) mean the zone has no room for
this shape now, unrelated to quota; another zone, region or shape may.

Decisions:

* a quota error keeps its scope in the message (``Quota 'CPUS' exceeded. Limit: 24.0 in
  region us-central1.``), and its region as ``err.scope`` when the message names one, so
  the user sees what to ask for;
* 403 is ``AuthError`` unless its reason is a quota or rate reason (Compute Engine answers
  both with 403); 401 is always ``AuthError``; a 404 on the project itself (a wrong
  project id, or one this credential may not see) is ``NotFoundError`` naming the project;
* ``UNSUPPORTED_OPERATION`` / ``unsupported`` for a shape in a zone and
  ``RESOURCE_NOT_READY`` are capacity (another offer may launch); every 5xx that is not
  ``insufficientCapacity`` is ``ProviderUnavailableError`` (retried with backoff); every
  code not in the tables is a plain ``ProviderError`` (the SDK does not guess).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, cast

from flowmesh_sdk.errors import (AuthError, CapacityError, FlowMeshError, NotFoundError, ProviderError,
                                 ProviderUnavailableError, QuotaError, SpecError, ThrottledError)

PROVIDER = "gce"

# Reasons in the HTTP error body (error.errors[].reason) and codes in Operation.error.errors[].code.
ERROR_TABLE: dict[str, type[FlowMeshError]] = {
    # capacity: try the next offer
    "ZONE_RESOURCE_POOL_EXHAUSTED": CapacityError,
    "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS": CapacityError,
    "RESOURCE_POOL_EXHAUSTED": CapacityError,
    "insufficientCapacity": CapacityError,
    "resourcePoolExhausted": CapacityError,
    "UNSUPPORTED_OPERATION": CapacityError,
    "RESOURCE_NOT_READY": CapacityError,
    # quota: try another region / provider
    "QUOTA_EXCEEDED": QuotaError,
    "quotaExceeded": QuotaError,
    "RESOURCE_QUOTA_EXCEEDED": QuotaError,
    # throttled: back off, same call
    "rateLimitExceeded": ThrottledError,
    "userRateLimitExceeded": ThrottledError,
    "RATE_LIMIT_EXCEEDED": ThrottledError,
    # auth: stop, tell the user
    "forbidden": AuthError,
    "insufficientPermissions": AuthError,
    "accessNotConfigured": AuthError,
    "authError": AuthError,
    "PERMISSION_DENIED": AuthError,
    # not found
    "notFound": NotFoundError,
    "RESOURCE_NOT_FOUND": NotFoundError,
    # bad input: nothing was launched
    "invalid": SpecError,
    "badRequest": SpecError,
    "required": SpecError,
    "INVALID_FIELD_VALUE": SpecError,
    "INVALID_USAGE": SpecError,
}

_AUTH_HINT = ("Compute Engine refused the credentials: set up Application Default Credentials "
              "(`gcloud auth application-default login`, or GOOGLE_APPLICATION_CREDENTIALS=<service account "
              "key file>) for a principal with roles/compute.instanceAdmin.v1 (docs/providers/gce.md)")
_REGION_IN_QUOTA = re.compile(r"\bin region ([a-z]+-[a-z]+\d+)")


def _entries(exc: Any) -> list[Mapping[str, Any]]:
    return [e for e in (getattr(exc, "errors", None) or []) if isinstance(e, Mapping)]


def _cls_for(codes: Iterable[str]) -> tuple[type[FlowMeshError] | None, str]:
    for code in codes:
        cls = ERROR_TABLE.get(code)
        if cls is not None:
            return cls, code
    return None, ""


def _build(cls: type[FlowMeshError], message: str, code: str, *, field: str = "launch",
           retry_after_s: float | None = None) -> FlowMeshError:
    if cls is SpecError:
        return SpecError(field, message, code=code, provider=PROVIDER)
    if cls is ThrottledError:
        return ThrottledError(message, provider=PROVIDER, code=code, retry_after_s=retry_after_s)
    # the table's classes other than SpecError (handled above) are ProviderErrors, which take provider= and code=
    err = cast("type[ProviderError]", cls)(message, provider=PROVIDER, code=code)
    if isinstance(err, QuotaError):
        m = _REGION_IN_QUOTA.search(message)
        err.scope = m.group(1) if m else ""   # type: ignore[attr-defined]  # gce's own extra attribute on QuotaError
    return err


def map_api_error(exc: Any, *, project: str, where: str) -> FlowMeshError:
    """A ``GoogleAPICallError`` from a call on ``where`` (``zone us-central1-a``, ``project``)."""
    status = int(getattr(exc, "code", 0) or 0)
    message = str(getattr(exc, "message", "") or exc)
    reasons = [str(e.get("reason") or "") for e in _entries(exc)]
    cls, code = _cls_for(reasons)
    text = f"{where}: {message}"
    if status == 401 or (status == 403 and cls not in (QuotaError, ThrottledError)):
        return AuthError(f"{text}; {_AUTH_HINT}", provider=PROVIDER, code=code or str(status))
    if status == 404:
        if f"'projects/{project}'" in message:   # "The resource 'projects/X' was not found"
            return NotFoundError(f"project {project!r} was not found (or this credential may not see it): "
                                 f"{message}; check the project id given to GceProvider(project=...) or "
                                 "GOOGLE_CLOUD_PROJECT", provider=PROVIDER, code="projectNotFound")
        return NotFoundError(text, provider=PROVIDER, code=code or "notFound")
    if status == 429 and cls is None:
        cls, code = ThrottledError, "429"
    if cls is not None:
        return _build(cls, text, code)
    if status >= 500:
        return ProviderUnavailableError(text, provider=PROVIDER, code=str(status))
    return ProviderError(text, provider=PROVIDER, code=str(status) if status else type(exc).__name__)


def map_operation_error(op: Any, *, where: str) -> FlowMeshError:
    """A ``DONE`` operation with ``error``: the first entry the tables know decides the class."""
    entries = [(str(e.code or ""), str(e.message or "")) for e in op.error.errors]
    detail = "; ".join(f"{c}: {m}" for c, m in entries) or "no detail"
    text = f"{where}: operation {op.name} ({op.operation_type}) failed: {detail}"
    cls, code = _cls_for(c for c, _ in entries)
    if cls is None:
        first = entries[0][0] if entries else "OperationFailed"
        return ProviderError(text, provider=PROVIDER, code=first)
    return _build(cls, text, code)


def unreachable(exc: BaseException, *, endpoint: str | None) -> ProviderUnavailableError:
    where = endpoint or "compute.googleapis.com"
    return ProviderUnavailableError(f"Compute Engine at {where} did not answer: {type(exc).__name__}: {exc}",
                                    provider=PROVIDER, code="EndpointUnreachable")


def missing_credentials(exc: BaseException) -> AuthError:
    return AuthError(f"no Google credentials found ({type(exc).__name__}); {_AUTH_HINT}", provider=PROVIDER,
                     code="DefaultCredentialsError")


__all__ = ["ERROR_TABLE", "PROVIDER", "map_api_error", "map_operation_error", "missing_credentials",
           "unreachable"]
