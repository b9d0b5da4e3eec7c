"""The HTTP side of the local registry: one request on loopback (no proxies), the
``WWW-Authenticate`` challenge parser, and :class:`RegistryHTTP`, the part of
:class:`~flowmesh_sdk.registry.local.LocalRegistry` that speaks the registry API
(``request``, ``catalog``, ``tags``) with Basic or token auth, on the registry's shared
:class:`~.localbase.RegistryState`."""

from __future__ import annotations

import base64
import json
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, Mapping

from .localbase import LocalRegistryError, RegistryState


@dataclass(frozen=True)
class RegistryResponse:
    status: int
    headers: Mapping[str, str]   # lower-cased names
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


# No proxies from the environment: everything here is on 127.0.0.1.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _http(method: str, url: str, headers: Mapping[str, str] | None = None,
          data: bytes | None = None, timeout: float = 30.0) -> RegistryResponse:
    req = urllib.request.Request(url, data=data, method=method, headers=dict(headers or {}))
    try:
        with _OPENER.open(req, timeout=timeout) as resp:
            return RegistryResponse(resp.status, {k.lower(): v for k, v in resp.headers.items()},
                                    resp.read())
    except urllib.error.HTTPError as exc:
        with exc:
            body = exc.read()
        return RegistryResponse(exc.code, {k.lower(): v for k, v in exc.headers.items()}, body)


def parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    """``Bearer realm="x",service="y"`` -> ("bearer", {"realm": "x", "service": "y"})."""
    scheme, _, rest = header.strip().partition(" ")
    params = {k.lower(): v for k, v in re.findall(r'(\w+)="([^"]*)"', rest)}
    return scheme.lower(), params


class RegistryHTTP:
    """A LocalRegistry's HTTP API (the URL, auth mode and credentials read from ``state``)."""

    def __init__(self, state: RegistryState) -> None:
        self.state = state

    def _token(self, challenge: dict[str, str], credentials: bool) -> str | None:
        query = {"service": challenge.get("service", "")}
        if challenge.get("scope"):
            query["scope"] = challenge["scope"]
        headers = {}
        if credentials and self.state.username:
            query["account"] = self.state.username
            headers["Authorization"] = self._basic()
        url = challenge["realm"] + "?" + urllib.parse.urlencode(query)
        resp = _http("GET", url, headers)
        if resp.status != 200:
            return None
        body = resp.json()
        return body.get("token") or body.get("access_token")

    def _basic(self) -> str:
        raw = f"{self.state.username}:{self.state.password}".encode()
        return "Basic " + base64.b64encode(raw).decode()

    def request(self, method: str, path: str, *, headers: Mapping[str, str] | None = None,
                data: bytes | None = None, credentials: bool = True,
                timeout: float = 30.0) -> RegistryResponse:
        """One HTTP request to the registry (``path`` starts with ``/v2/``).

        With ``credentials`` it authenticates like a client would: Basic for htpasswd,
        the Bearer challenge and a token from the realm for token auth.
        """
        headers = dict(headers or {})
        url = self.state.url + path
        if self.state.auth == "htpasswd" and credentials:
            headers.setdefault("Authorization", self._basic())
        resp = _http(method, url, headers, data, timeout)
        if resp.status == 401 and self.state.auth == "token" and "authorization" not in {
                k.lower() for k in headers}:
            scheme, params = parse_challenge(resp.headers.get("www-authenticate", ""))
            if scheme == "bearer" and "realm" in params:
                token = self._token(params, credentials)
                if token:
                    headers["Authorization"] = f"Bearer {token}"
                    resp = _http(method, url, headers, data, timeout)
        return resp

    def catalog(self) -> list[str]:
        """The repositories in the registry (``GET /v2/_catalog``)."""
        repos: list[str] = []
        path: str | None = "/v2/_catalog?n=1000"   # distribution 2.8 refuses n > 1000
        while path:
            resp = self.request("GET", path)
            if resp.status != 200:
                raise LocalRegistryError(f"GET {path}: HTTP {resp.status}: {resp.body[:300]!r}")
            repos += resp.json().get("repositories") or []
            m = re.match(r'\s*<([^>]+)>;\s*rel="next"', resp.headers.get("link", ""))
            path = m.group(1) if m else None
        return repos

    def tags(self, name: str) -> list[str]:
        resp = self.request("GET", f"/v2/{name}/tags/list")
        if resp.status != 200:
            raise LocalRegistryError(f"GET /v2/{name}/tags/list: HTTP {resp.status}: {resp.body[:300]!r}")
        return list(resp.json().get("tags") or [])
