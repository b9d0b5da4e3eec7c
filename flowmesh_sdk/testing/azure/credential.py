"""A TEST FIXTURE credential for the ARM emulator: one fixed bearer token."""

from __future__ import annotations

import time
from typing import Any

__all__ = ["StaticTokenCredential"]


class StaticTokenCredential:
    """A credential that presents one fixed bearer token (for the emulator only)."""

    def __init__(self, token: str) -> None:
        self._token = token

    def __repr__(self) -> str:
        return "StaticTokenCredential(<token>)"

    def get_token(self, *scopes: str, **kwargs: Any) -> Any:
        from azure.core.credentials import AccessToken
        return AccessToken(self._token, int(time.time()) + 3600)

    def get_token_info(self, *scopes: str, options: Any = None) -> Any:
        from azure.core.credentials import AccessTokenInfo
        return AccessTokenInfo(self._token, int(time.time()) + 3600)

    def close(self) -> None:
        return None
