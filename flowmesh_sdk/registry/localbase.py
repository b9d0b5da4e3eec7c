"""What the parts of :class:`~flowmesh_sdk.registry.local.LocalRegistry` share: its errors,
the protocol of token mode's token server, and :class:`RegistryState` -- the one record a
LocalRegistry hands to each of its parts (:mod:`.localproc`, :mod:`.localhttp`,
:mod:`.accesslog`), which hold it rather than inherit from it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from flowmesh_sdk.errors import FlowMeshError


class LocalRegistryError(FlowMeshError, RuntimeError):
    """The local registry could not be started or did not do what was asked."""


class RegistryNotInstalled(LocalRegistryError):
    """``docker-registry`` is not installed."""


class TokenIssuer(Protocol):
    """What token mode needs of its token server (``testing.tokenserver.TokenServer`` is one)."""

    service: str
    issuer: str

    @property
    def realm(self) -> str: ...

    @property
    def cert_path(self) -> Path: ...

    def start(self) -> Any: ...

    def stop(self) -> None: ...


class RegistryState:
    """What the parts of a :class:`~flowmesh_sdk.registry.local.LocalRegistry` share -- one
    record, handed to each part (its process, HTTP API and access log): what it was given
    (``auth``, the binary, the startup timeout), what ``start`` found (the port, the
    directories, the credentials, the token server), and the properties read from it."""

    def __init__(self, *, auth: str | None, username: str | None, password: str | None,
                 binary: str | None, startup_timeout: float) -> None:
        self.auth = auth
        self.username = username
        self.password = password
        self.binary = binary                    # the docker-registry asked for (None: the installed one)
        self.startup_timeout = startup_timeout
        self.token_server: TokenIssuer | None = None
        self.bound_port: int | None = None      # while running
        self.work: Path | None = None           # config, logs, htpasswd, auth file (removed on stop)
        self.storage: Path | None = None        # the blobs

    # ---- properties ------------------------------------------------------- #

    @property
    def port(self) -> int:
        if self.bound_port is None:
            raise LocalRegistryError("the registry is not running")
        return self.bound_port

    @property
    def host(self) -> str:
        """``127.0.0.1:PORT`` -- the registry part of an image reference."""
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    @property
    def storage_dir(self) -> Path:
        if self.storage is None:
            raise LocalRegistryError("the registry is not running")
        return self.storage

    @property
    def workdir(self) -> Path:
        """Config, logs, htpasswd, auth file (removed on stop)."""
        if self.work is None:
            raise LocalRegistryError("the registry is not running")
        return self.work

    @property
    def access_log_path(self) -> Path:
        return self.workdir / "access.log"

    @property
    def log_path(self) -> Path:
        """distribution's own log (JSON lines)."""
        return self.workdir / "registry.log"

    @property
    def authfile(self) -> Path | None:
        """A containers-auth.json with the credentials (``podman --authfile``); None if anonymous."""
        if self.auth is None:
            return None
        return self.workdir / "auth.json"
