"""The ARM emulator's token service, for clients that log in themselves (``az login
--service-principal``): an AD FS-style authority at ``/adfs``, the kind Azure Stack Hub
uses, so MSAL reads its OpenID configuration from the emulator and never asks
``login.microsoftonline.com`` for instance discovery (MSAL skips that for an authority
whose tenant is ``adfs``).

Served: ``GET /adfs/.well-known/openid-configuration`` and ``POST /adfs/oauth2/token``
with ``grant_type=client_credentials`` and the service principal's ``client_id`` and
``client_secret`` (form fields, as MSAL sends them).  The token is the emulator's one bearer
token.  Errors are OAuth 2.0 error bodies (RFC 6749 section 5.2: ``invalid_client``,
``unsupported_grant_type``, ``invalid_request``).
"""

from __future__ import annotations

import hmac
import secrets
import time
from dataclasses import dataclass, field

from aiohttp import web

from ..httpserver import json_response

__all__ = ["AUTHORITY_PATH", "TENANT", "Directory"]

AUTHORITY_PATH = "/adfs"
#: the directory's tenant id: a GUID, so ``az login --tenant`` takes it as it is (a name
#: would be resolved through ``{authority}/{name}/v2.0/.well-known/openid-configuration``)
TENANT = "00000000-0000-4000-8000-0000000adf50"


def _oauth_error(status: int, error: str, description: str) -> web.Response:
    return json_response(status, {"error": error, "error_description": description})


@dataclass
class Directory:
    """One service principal and the token it is given."""

    token: str
    client_id: str = field(default_factory=lambda: f"flowmesh-test-{secrets.token_hex(4)}")
    client_secret: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    tenant_id: str = TENANT
    issued: int = 0

    def __repr__(self) -> str:
        return f"Directory(client_id={self.client_id!r}, <secret>)"

    @staticmethod
    def serves(path: str) -> bool:
        return path.lower().startswith(AUTHORITY_PATH + "/")

    async def handle(self, request: web.Request, base_url: str) -> web.Response:
        path = request.path.rstrip("/").lower()
        authority = base_url + AUTHORITY_PATH
        if request.method == "GET" and path == AUTHORITY_PATH + "/.well-known/openid-configuration":
            return json_response(200, {
                "issuer": authority, "authorization_endpoint": f"{authority}/oauth2/authorize",
                "token_endpoint": f"{authority}/oauth2/token", "device_authorization_endpoint":
                f"{authority}/oauth2/devicecode", "grant_types_supported": ["client_credentials"],
                "token_endpoint_auth_methods_supported": ["client_secret_post"]})
        if path == AUTHORITY_PATH + "/oauth2/token":
            if request.method != "POST":
                return _oauth_error(405, "invalid_request", f"{request.method} is not allowed: POST the token request")
            form = await request.post()
            grant = str(form.get("grant_type", ""))
            if grant != "client_credentials":
                return _oauth_error(400, "unsupported_grant_type",
                                    f"grant_type {grant!r} is not supported here: only client_credentials")
            given_id, given_secret = str(form.get("client_id", "")), str(form.get("client_secret", ""))
            if given_id != self.client_id or not hmac.compare_digest(given_secret, self.client_secret):
                return _oauth_error(401, "invalid_client",
                                    f"MSIS9607: The client {given_id!r} is unknown or its secret is wrong.")
            self.issued += 1
            return json_response(200, {"token_type": "Bearer", "expires_in": 3600,
                                       "expires_on": int(time.time()) + 3600, "access_token": self.token,
                                       "resource": str(form.get("resource") or form.get("scope") or "")})
        return _oauth_error(404, "invalid_request", f"{request.method} {request.path} is not served by this authority")
