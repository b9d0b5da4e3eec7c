"""The embedded default registry: a real OCI registry on 127.0.0.1 (Debian's ``docker-registry``).

What the ``local`` provider pulls from when no other registry is named (the main job
pushes every task image here), and what the tests use.  It needs only the base install:
the standard library, ``docker-registry`` and ``podman``.

``LocalRegistry`` starts ``docker-registry serve CONFIG`` (distribution v2.8) on a free
loopback port with its storage in a temporary (or given) directory, optionally behind
authentication, and stops it again::

    async with LocalRegistry(auth="htpasswd") as reg:
        ref = reg.push("localhost/flowmesh/busybox:1", "flowmesh/busybox:1")
        # podman pull --tls-verify=false --authfile reg.authfile <ref>
        blob_gets = reg.blob_gets()            # from the registry's access log

or, without a loop, ``reg = LocalRegistry(); reg.start(); ...; reg.stop()`` (also a
plain ``with`` block).

Authentication modes (``auth=``):

- ``None``: anonymous, everything allowed;
- ``"htpasswd"``: HTTP Basic with a generated user and password.  distribution only reads
  bcrypt entries; they are made with ``htpasswd -B`` (Debian's ``apache2-utils``), and
  without it the registry provisions its own
  user ``docker`` with a random password, read back from its log.  distribution 2.8
  serves Basic auth over plain HTTP (its docs only *recommend* TLS), so no TLS here;
- ``"token"``: the Docker token flow against a token server started alongside, made by the
  ``token_server=`` factory (``flowmesh_sdk.testing.tokenserver.TokenServer``, which needs
  the ``testing`` extra; ``anonymous_pull=`` decides whether a client without credentials
  may pull).  The registry itself never imports it, so the base install stays enough.

Everything listens on 127.0.0.1 only; podman reaches it with ``--tls-verify=false``.
The password is never part of a repr, an exception or a podman command line (podman gets
an ``--authfile``).

The parts live beside this module (:mod:`.localbase`: errors and the shared state;
:mod:`.localproc`: the process; :mod:`.localhttp`: the HTTP API; :mod:`.accesslog`: the
access log); a LocalRegistry holds one of each (composed, not inherited) and forwards to
them.  Every name they had here is re-exported.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import subprocess
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from flowmesh_sdk.errors import SpecError

# (the public names below that this module does not use are re-exported: they were defined here)
from .accesslog import AccessLogEntry, AccessLogReader, parse_access_log  # noqa: F401
from .localbase import LocalRegistryError, RegistryNotInstalled, RegistryState, TokenIssuer
from .localhttp import RegistryHTTP, RegistryResponse, parse_challenge  # noqa: F401
from .localproc import RegistryProcess, _free_port, _PortTaken

__all__ = ["LocalRegistry", "AccessLogEntry", "RegistryResponse", "LocalRegistryError",
           "RegistryNotInstalled", "TokenIssuer"]

_AUTH_MODES = (None, "htpasswd", "token")
_DEFAULT_USER = "flowmesh"
_PROVISIONED_USER = "docker"  # what distribution provisions when the htpasswd file is missing


# --------------------------------------------------------------------------- #
# The registry
# --------------------------------------------------------------------------- #


class LocalRegistry:
    """``docker-registry serve`` on 127.0.0.1 (see the module docstring).

    ``storage_dir``: where the blobs go (kept on stop); default a temporary directory
    (removed on stop).  ``auth``: ``None``, ``"htpasswd"`` or ``"token"``.  ``username`` /
    ``password``: the credentials to create (generated when not given).
    ``anonymous_pull`` (token mode): a client without credentials may pull.
    ``token_header`` (token mode): how tokens name their key -- ``"x5c"``, ``"kid"``, ``"jwk"``.
    ``token_server`` (token mode): makes the token server, called with ``users``,
    ``anonymous_pull``, ``header`` and ``key_dir`` (``testing.tokenserver.TokenServer``).

    It is made of parts, each holding the one :class:`~.localbase.RegistryState` they share:
    ``process`` (:class:`~.localproc.RegistryProcess`: the ``docker-registry`` process),
    ``http`` (:class:`~.localhttp.RegistryHTTP`: the registry API) and ``log``
    (:class:`~.accesslog.AccessLogReader`: the access log); its methods below forward to them.
    """

    def __init__(self, storage_dir: str | os.PathLike[str] | None = None, *,
                 auth: str | None = None,
                 username: str | None = None,
                 password: str | None = None,
                 anonymous_pull: bool = False,
                 token_header: str = "x5c",
                 token_server: Callable[..., TokenIssuer] | None = None,
                 port: int | None = None,
                 binary: str | None = None,
                 podman: str | None = None,
                 startup_timeout: float = 20.0) -> None:
        if auth not in _AUTH_MODES:
            raise SpecError("auth", f"must be one of {_AUTH_MODES}, not {auth!r}")
        if anonymous_pull and auth != "token":
            raise SpecError("anonymous_pull", "is for auth='token' (htpasswd guards every request)")
        if token_header not in ("x5c", "kid", "jwk"):
            raise SpecError("token_header", f"must be 'x5c', 'kid' or 'jwk', not {token_header!r}")
        if (auth == "token") != (token_server is not None):
            raise SpecError("token_server", "is needed with auth='token' and only then: a factory "
                            "such as flowmesh_sdk.testing.tokenserver.TokenServer")
        self._explicit_credentials = username is not None or password is not None
        self._storage_arg = Path(storage_dir) if storage_dir is not None else None
        self.anonymous_pull = anonymous_pull
        self.token_header = token_header
        self._port_arg = port
        self._podman_arg = podman
        self._token_factory = token_server
        self.pushed: dict[str, str] = {}   # reference -> manifest digest, for every push()
        self.state = RegistryState(auth=auth, username=username if auth else None,
                                   password=password if auth else None, binary=binary,
                                   startup_timeout=startup_timeout)
        self.process = RegistryProcess(self.state)
        self.http = RegistryHTTP(self.state)
        self.log = AccessLogReader(self.state)

    def __repr__(self) -> str:
        where = self.host if self.state.bound_port else "stopped"
        user = f", username={self.username!r}" if self.auth else ""
        return f"LocalRegistry({where}, auth={self.auth!r}{user}, storage_dir={str(self.state.storage)!r})"

    # ---- what the parts hold, read (and the settings, written) here ------- #

    @property
    def auth(self) -> str | None:
        return self.state.auth

    @auth.setter
    def auth(self, value: str | None) -> None:
        self.state.auth = value

    @property
    def startup_timeout(self) -> float:
        return self.state.startup_timeout

    @startup_timeout.setter
    def startup_timeout(self, value: float) -> None:
        self.state.startup_timeout = value

    @property
    def token_server(self) -> TokenIssuer | None:
        return self.state.token_server

    @property
    def running(self) -> bool:
        return self.process.running

    @property
    def port(self) -> int:
        return self.state.port

    @property
    def host(self) -> str:
        """``127.0.0.1:PORT`` -- the registry part of an image reference."""
        return self.state.host

    @property
    def url(self) -> str:
        return self.state.url

    @property
    def username(self) -> str | None:
        return self.state.username

    @property
    def password(self) -> str | None:
        return self.state.password

    @property
    def storage_dir(self) -> Path:
        return self.state.storage_dir

    @property
    def workdir(self) -> Path:
        """Config, logs, htpasswd, auth file (removed on stop)."""
        return self.state.workdir

    @property
    def access_log_path(self) -> Path:
        return self.state.access_log_path

    @property
    def log_path(self) -> Path:
        """distribution's own log (JSON lines)."""
        return self.state.log_path

    @property
    def authfile(self) -> Path | None:
        """A containers-auth.json with the credentials (``podman --authfile``); None if anonymous."""
        return self.state.authfile

    # ---- the process ------------------------------------------------------ #

    def _binary(self) -> str:
        """The ``docker-registry`` to run (:class:`RegistryNotInstalled` without one)."""
        return self.process.binary()

    def start(self) -> "LocalRegistry":
        if self.running:
            return self
        binary = self.process.binary()
        st = self.state
        st.work = Path(tempfile.mkdtemp(prefix="flowmesh-registry-"))
        try:
            if self._storage_arg is not None:
                st.storage = self._storage_arg
            else:
                st.storage = st.work / "storage"
            st.storage.mkdir(parents=True, exist_ok=True)
            auth_config = self._prepare_auth()
            attempts = 1 if self._port_arg else 3
            for attempt in range(attempts):
                port = self._port_arg or _free_port()
                try:
                    self.process.launch(binary, port, auth_config)
                    break
                except _PortTaken:
                    if attempt == attempts - 1:
                        raise LocalRegistryError(f"127.0.0.1:{port} is already in use") from None
            if self.auth == "htpasswd" and st.password is None:
                self.process.read_provisioned_password()
            if self.auth is not None:
                self.process.write_authfile()
        except BaseException:
            self.stop()
            raise
        return self

    def _prepare_auth(self) -> dict[str, Any] | None:
        st = self.state
        if st.auth is None:
            return None
        if st.username is None:
            st.username = _DEFAULT_USER
        if st.auth == "token":
            if st.password is None:
                st.password = secrets.token_urlsafe(18)
            assert self._token_factory is not None   # checked in __init__
            server = self._token_factory(users={st.username: st.password},
                                         anonymous_pull=self.anonymous_pull,
                                         header=self.token_header,
                                         key_dir=st.workdir / "token")
            st.token_server = server
            server.start()
            return {"token": {"realm": server.realm,
                              "service": server.service,
                              "issuer": server.issuer,
                              "rootcertbundle": str(server.cert_path)}}
        # htpasswd
        path = st.workdir / "htpasswd"
        password = st.password or secrets.token_urlsafe(18)
        entry = _bcrypt_entry(st.username, password)
        if entry is None:
            if self._explicit_credentials:
                raise LocalRegistryError(
                    "htpasswd entries need bcrypt: apt-get install -y apache2-utils")
            # Let the registry provision its own user; the password is read from its log.
            st.username = _PROVISIONED_USER
        else:
            st.password = password
            path.write_text(entry + "\n")
            os.chmod(path, 0o600)
        return {"htpasswd": {"realm": "flowmesh-test-registry", "path": str(path)}}

    def stop(self) -> None:
        """Kill the registry (and the token server); remove the temporary directories."""
        self.process.stop()

    def __enter__(self) -> "LocalRegistry":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> "LocalRegistry":
        return await asyncio.to_thread(self.start)

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.stop)

    # ---- the HTTP API and the access log ---------------------------------- #

    def request(self, method: str, path: str, *, headers: Mapping[str, str] | None = None,
                data: bytes | None = None, credentials: bool = True,
                timeout: float = 30.0) -> RegistryResponse:
        """One HTTP request to the registry (``path`` starts with ``/v2/``), authenticated
        like a client would with ``credentials`` (see :meth:`RegistryHTTP.request`)."""
        return self.http.request(method, path, headers=headers, data=data, credentials=credentials,
                                 timeout=timeout)

    def catalog(self) -> list[str]:
        """The repositories in the registry (``GET /v2/_catalog``)."""
        return self.http.catalog()

    def tags(self, name: str) -> list[str]:
        return self.http.tags(name)

    def request_log(self) -> list[AccessLogEntry]:
        """The registry's access log so far, parsed (oldest first)."""
        return self.log.request_log()

    def wait_for_log(self, predicate: Callable[[list[AccessLogEntry]], bool],
                     timeout: float = 5.0) -> list[AccessLogEntry]:
        """The access log once ``predicate(entries)`` holds (see :meth:`AccessLogReader.wait_for_log`)."""
        return self.log.wait_for_log(predicate, timeout)

    def blob_gets(self, entries: Iterable[AccessLogEntry] | None = None) -> Counter[str]:
        """GETs of blobs by digest (any status) in the access log."""
        return self.log.blob_gets(entries)

    # ---- podman ----------------------------------------------------------- #

    def _podman(self) -> str:
        podman = self._podman_arg or shutil.which("podman")
        if podman is None:
            raise LocalRegistryError("podman is not installed: apt-get install -y podman")
        return podman

    def push(self, local_image: str, name_tag: str, *, timeout: float = 600.0,
             manifest_format: str | None = None) -> str:
        """Push a local podman image as ``HOST/name_tag``; returns that reference.

        Uses ``podman push --tls-verify=false [--authfile]`` straight to the destination,
        so no extra local tag is left behind.  The manifest digest goes to ``self.pushed``.
        """
        name_tag = name_tag.removeprefix(self.host + "/")
        if ":" not in name_tag.rsplit("/", 1)[-1] and "@" not in name_tag:
            name_tag += ":latest"
        ref = f"{self.host}/{name_tag}"
        digest_file = self.workdir / f"digest-{secrets.token_hex(4)}"
        cmd = [self._podman(), "push", "--tls-verify=false", "--quiet",
               "--digestfile", str(digest_file)]
        if manifest_format:
            cmd += ["--format", manifest_format]
        if self.authfile is not None:
            cmd += ["--authfile", str(self.authfile)]
        cmd += [local_image, f"docker://{ref}"]
        env = dict(os.environ)
        env["NO_PROXY"] = env["no_proxy"] = ",".join(
            filter(None, [env.get("NO_PROXY", ""), "127.0.0.1,localhost"]))
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            raise LocalRegistryError(f"podman push {local_image} -> {ref}: no result after {timeout:.0f}s") from None
        if proc.returncode != 0:
            raise LocalRegistryError(f"podman push {local_image} -> {ref} failed "
                                f"({proc.returncode}): {proc.stderr.strip()[-1500:]}")
        try:
            self.pushed[ref] = digest_file.read_text().strip()
            digest_file.unlink()
        except OSError:
            pass
        return ref

    async def apush(self, local_image: str, name_tag: str, **kwargs: Any) -> str:
        """``push`` in a worker thread."""
        return await asyncio.to_thread(self.push, local_image, name_tag, **kwargs)


def _bcrypt_entry(username: str, password: str) -> str | None:
    """``user:$2y$...`` for an htpasswd file, or None without ``htpasswd`` (apache2-utils)."""
    htpasswd = shutil.which("htpasswd")
    if htpasswd is None:
        return None
    # -i: the password from stdin, not the command line.  Cost 4: the registry checks
    # the hash on every request.
    proc = subprocess.run([htpasswd, "-niB", "-C", "4", username], input=password,
                          capture_output=True, text=True, timeout=30)
    if proc.returncode == 0 and proc.stdout.startswith(username + ":$2"):
        return proc.stdout.strip()
    return None
