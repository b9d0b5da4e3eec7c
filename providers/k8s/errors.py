"""Kubernetes API errors mapped onto the SDK's error tree.

The official client raises ``kubernetes.client.exceptions.ApiException`` with ``status``,
``reason``, ``headers`` and ``body``; the body of a failed call is a ``v1 Status``
(``{"kind": "Status", "status": "Failure", "message", "reason", "details", "code"}``:
kubernetes.io/docs/reference/using-api/api-concepts/#responses).  A connection the API server
never answered comes as a urllib3 error (``MaxRetryError``, ``ProtocolError``) with the
client's own retries switched off (:mod:`.config`).  :func:`map_api_error` is raised
``from`` the library's exception; the Status ``reason`` (or the HTTP status) is ``err.code``.

Decisions:

* 403 whose message says ``exceeded quota`` (the ResourceQuota admission plugin:
  ``pods "X" is forbidden: exceeded quota: Q, requested: ..., used: ..., limited: ...``)
  -> ``QuotaError``: the namespace is full, the pool fails over to the next offer;
* 429 (API Priority and Fairness, or the server's max-in-flight) -> ``ThrottledError`` with
  the ``Retry-After`` the server sent;
* 401, and 403 otherwise (RBAC) -> ``AuthError`` naming the context;
* 404 -> ``NotFoundError``; 409 ``AlreadyExists`` -> ``ProviderError`` with code
  ``AlreadyExists`` (the launch reads it as its own earlier create: idempotency);
* 5xx, 0 (the client's "no answer") and connection errors -> ``ProviderUnavailableError``;
* anything else (400 ``BadRequest``, 422 ``Invalid``) -> a plain ``ProviderError``.
"""

from __future__ import annotations

import json
from typing import Any

from flowmesh_sdk.errors import (AuthError, FlowMeshError, NotFoundError, ProviderError, ProviderUnavailableError,
                                 QuotaError, ThrottledError)

PROVIDER = "k8s"


def status_of(exc: Any) -> tuple[int, str, str]:
    """(HTTP status, Status reason, Status message) of an ``ApiException``."""
    status = int(getattr(exc, "status", 0) or 0)
    reason, message = str(getattr(exc, "reason", "") or ""), ""
    try:
        body = json.loads(getattr(exc, "body", None) or "")
    except (TypeError, ValueError):
        body = None
    if isinstance(body, dict):
        reason = str(body.get("reason") or reason)
        message = str(body.get("message") or "")
    return status, reason, message[:500]


def map_api_error(exc: Any, *, where: str, context: str) -> FlowMeshError:
    status, reason, message = status_of(exc)
    text = f"{where} in context {context!r}: HTTP {status} {reason}" + (f": {message}" if message else "")
    if status == 429:
        headers = getattr(exc, "headers", None) or {}
        retry = headers.get("Retry-After") if hasattr(headers, "get") else None
        try:
            after = float(retry) if retry is not None else None
        except ValueError:
            after = None
        return ThrottledError(text, provider=PROVIDER, code=reason or "TooManyRequests", retry_after_s=after)
    if status == 403 and "exceeded quota" in message:
        return QuotaError(text, provider=PROVIDER, code="ExceededQuota")
    if status in (401, 403):
        return AuthError(f"{text}; check the credentials of context {context!r} in your kubeconfig "
                         "(KUBECONFIG, ~/.kube/config) and its RBAC rights on pods in the namespace",
                         provider=PROVIDER, code=reason or str(status))
    if status == 404:
        return NotFoundError(text, provider=PROVIDER, code=reason or "NotFound")
    if status == 0 or status >= 500:
        return ProviderUnavailableError(text, provider=PROVIDER, code=reason or str(status))
    return ProviderError(text, provider=PROVIDER, code=reason or str(status))


def unreachable(exc: BaseException, *, where: str, context: str, server: str) -> ProviderUnavailableError:
    return ProviderUnavailableError(f"{where}: the API server of context {context!r} at {server} did not answer: "
                                    f"{type(exc).__name__}", provider=PROVIDER, code="EndpointUnreachable")


__all__ = ["PROVIDER", "map_api_error", "status_of", "unreachable"]
