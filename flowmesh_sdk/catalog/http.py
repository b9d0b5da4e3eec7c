"""What the REST price adapters share: mapping an HTTP answer onto the SDK's error tree,
and keeping pagination on the host that was asked (a ``NextPageLink`` pointing
elsewhere is refused, so credentials and trust never follow a link off the endpoint).
"""

from __future__ import annotations

import urllib.parse
from typing import Any

from ..errors import AuthError, ProviderError, ProviderUnavailableError, ThrottledError

MAX_PAGES = 2000          # a price listing longer than this is a loop, not a catalog
TIMEOUT_S = 60.0          # per request


async def request_json(client: Any, method: str, url: str, *, provider: str, api: str, where: str,
                       what: str = "", **kwargs: Any) -> Any:
    """One request to a price API through ``client`` (an ``httpx.AsyncClient``): an
    unreachable endpoint is ProviderUnavailableError (``EndpointUnreachable``), a non-2xx
    answer goes through :func:`raise_for_status`; returns the JSON body (None if not JSON)."""
    import httpx
    try:
        resp = await client.request(method, url, **kwargs)
    except httpx.HTTPError as exc:
        raise ProviderUnavailableError(f"{api} unreachable at {where}: {type(exc).__name__}",
                                       provider=provider, code="EndpointUnreachable") from exc
    try:
        body = resp.json()
    except ValueError:
        body = None
    raise_for_status(provider, resp.status_code, body, resp.headers, what=what)
    return body


def raise_for_status(provider: str, status: int, body: Any, headers: Any = None, what: str = "") -> None:
    """Raise the SDK error for a non-2xx answer of a price API."""
    if 200 <= status < 300:
        return
    detail = _detail(body)
    msg = f"price API {what + ' ' if what else ''}answered HTTP {status}" + (f": {detail}" if detail else "")
    if status == 429:
        retry = None
        if headers is not None:
            try:
                retry = float(headers.get("retry-after")) if headers.get("retry-after") else None
            except (TypeError, ValueError):
                retry = None
        raise ThrottledError(msg, provider=provider, code=str(status), retry_after_s=retry)
    if status in (401, 403):
        raise AuthError(msg, provider=provider, code=str(status))
    if status >= 500:
        raise ProviderUnavailableError(msg, provider=provider, code=str(status))
    raise ProviderError(msg, provider=provider, code=str(status))


def _detail(body: Any) -> str:
    if isinstance(body, dict):
        for key in ("message", "msg", "Message", "error"):
            value = body.get(key)
            if isinstance(value, dict):
                value = value.get("message") or value.get("Message") or value.get("Code")
            if value:
                return str(value)[:300]
        err = body.get("Error")
        if isinstance(err, dict):
            return str(err.get("Message") or err.get("Code") or "")[:300]
    return ""


def same_origin(url: str, base: str) -> bool:
    a, b = urllib.parse.urlsplit(url), urllib.parse.urlsplit(base)
    return (a.scheme, a.netloc.lower()) == (b.scheme, b.netloc.lower())


__all__ = ["MAX_PAGES", "TIMEOUT_S", "raise_for_status", "same_origin"]
