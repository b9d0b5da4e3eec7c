"""Vast.ai errors mapped onto the SDK's error tree.

The ``vastai`` SDK calls ``raise_for_status()`` on every answer, so a failed call raises
``requests.HTTPError`` carrying the response; the body is JSON ``{"success": false,
"error": "...", "msg": "..."}`` on most endpoints and plain text on some (a rate-limited
call answers HTTP 429 with ``API requests too frequent`` and no ``Retry-After``).  Source:
"Rate limits and errors", https://docs.vast.ai/api-reference/rate-limits-and-errors (read
2026-12-01).  :func:`map_http_error` is raised ``from`` the library's exception; the Vast
``error`` string (or the HTTP status) is kept as ``err.code``.

Decisions: 429 -> ``ThrottledError`` with no retry-after (the provisioner's backoff decides);
401/403 -> ``AuthError`` naming ``VAST_API_KEY``; on create, an offer that is gone or taken
(``no_such_ask``, HTTP 404/410) or a bid under the market (``bid_too_low``) ->
``CapacityError`` (the next offer); ``insufficient_credit`` -> ``QuotaError`` (no rental
anywhere on the account until it is topped up); 404 elsewhere -> ``NotFoundError``; 5xx and
no answer -> ``ProviderUnavailableError``; anything else a plain ``ProviderError``.
"""

from __future__ import annotations

import json
from typing import Any

from flowmesh_sdk.errors import (AuthError, CapacityError, FlowMeshError, NotFoundError, ProviderError,
                                 ProviderUnavailableError, QuotaError, ThrottledError)

PROVIDER = "vast"
KEY_VAR = "VAST_API_KEY"
CAPACITY_CODES = ("no_such_ask", "bid_too_low", "ask_not_available", "machine_unavailable")
QUOTA_CODES = ("insufficient_credit", "insufficient_funds", "balance_too_low")


def _body(resp: Any) -> tuple[str, str]:
    """(error code, message) from a Vast answer (JSON or plain text); never the request."""
    text = ""
    try:
        text = resp.text or ""
        data = json.loads(text)
    except (ValueError, AttributeError):
        return "", text.strip()[:300]
    if not isinstance(data, dict):
        return "", text.strip()[:300]
    return str(data.get("error") or ""), str(data.get("msg") or data.get("message") or "")[:300]


def map_http_error(exc: Any, *, where: str, creating: bool = False) -> FlowMeshError:
    resp = getattr(exc, "response", None)
    status = int(getattr(resp, "status_code", 0) or 0)
    code, message = _body(resp) if resp is not None else ("", "")
    text = f"{where}: HTTP {status}" + (f" {code}" if code else "") + (f": {message}" if message else "")
    if status == 429:
        return ThrottledError(text + " (Vast.ai sends no Retry-After: backing off)", provider=PROVIDER,
                              code=code or "429", retry_after_s=None)
    if status in (401, 403):
        return AuthError(f"{text}; check {KEY_VAR} (an API key from the Vast.ai console with instance "
                         "read/write permissions)", provider=PROVIDER, code=code or str(status))
    if code in QUOTA_CODES:
        return QuotaError(text, provider=PROVIDER, code=code)
    if creating and (code in CAPACITY_CODES or status in (404, 410)):
        return CapacityError(text, provider=PROVIDER, code=code or str(status))
    if status == 404:
        return NotFoundError(text, provider=PROVIDER, code=code or "404")
    if status >= 500:
        return ProviderUnavailableError(text, provider=PROVIDER, code=code or str(status))
    return ProviderError(text, provider=PROVIDER, code=code or str(status) or type(exc).__name__)


def unreachable(exc: BaseException, *, where: str, server: str) -> ProviderUnavailableError:
    return ProviderUnavailableError(f"{where}: Vast.ai at {server} did not answer: {type(exc).__name__}",
                                    provider=PROVIDER, code="EndpointUnreachable")


def missing_key() -> AuthError:
    return AuthError(f"no Vast.ai API key: set {KEY_VAR} (or pass VastProvider(api_key=...), or save it to "
                     "~/.config/vastai/vast_api_key)", provider=PROVIDER, code="NoApiKey")


__all__ = ["KEY_VAR", "PROVIDER", "map_http_error", "missing_key", "unreachable"]
