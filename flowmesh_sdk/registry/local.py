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
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import weakref
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Protocol

from flowmesh_sdk.errors import FlowMeshError, SpecError

__all__ = ["LocalRegistry", "AccessLogEntry", "RegistryResponse", "LocalRegistryError",
           "RegistryNotInstalled", "TokenIssuer"]

_INSTALL_HINT = "apt-get install -y docker-registry"
_AUTH_MODES = (None, "htpasswd", "token")
_DEFAULT_USER = "flowmesh"
_PROVISIONED_USER = "docker"  # what distribution provisions when the htpasswd file is missing


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


# --------------------------------------------------------------------------- #
# Access log
# --------------------------------------------------------------------------- #

# gorilla/handlers' Apache "combined" format, which distribution writes to stdout:
# 127.0.0.1 - - [30/Nov/2026:03:02:16 +0000] "GET /v2/ HTTP/1.1" 401 87 "" "curl/7.88.1"
_COMBINED = re.compile(
    r'^(?P<remote>\S+) \S+ (?P<user>\S+) \[(?P<time>[^\]]+)\] '
    r'"(?P<method>\S+) (?P<path>\S+) (?P<proto>[^"]*)" (?P<status>\d{3}) (?P<size>\d+|-)'
    r'(?: "(?P<referer>[^"]*)" "(?P<agent>[^"]*)")?')

_V2_PATH = re.compile(r"^/v2/(?P<name>.+)/(?P<kind>manifests|blobs|tags)/(?P<ref>[^?]*)")


@dataclass(frozen=True)
class AccessLogEntry:
    """One line of the registry's access log."""

    method: str
    path: str          # with the query string, as sent
    status: int
    size: int
    user_agent: str
    remote: str
    raw: str

    @property
    def kind(self) -> str:
        """``base``, ``catalog``, ``manifest``, ``blob``, ``upload``, ``tags`` or ``other``."""
        path = self.path.split("?", 1)[0]
        if path in ("/v2", "/v2/"):
            return "base"
        if path == "/v2/_catalog":
            return "catalog"
        if "/blobs/uploads" in path:
            return "upload"
        m = _V2_PATH.match(path)
        if m:
            return {"manifests": "manifest", "blobs": "blob", "tags": "tags"}[m.group("kind")]
        return "other"

    @property
    def repository(self) -> str | None:
        m = _V2_PATH.match(self.path.split("?", 1)[0])
        return m.group("name") if m else None

    @property
    def reference(self) -> str | None:
        """The tag or digest of a manifest request, the digest of a blob request."""
        m = _V2_PATH.match(self.path.split("?", 1)[0])
        return m.group("ref") if m and m.group("kind") != "tags" else None


def parse_access_log(text: str) -> list[AccessLogEntry]:
    entries = []
    for line in text.splitlines():
        m = _COMBINED.match(line)
        if not m:
            continue
        size = m.group("size")
        entries.append(AccessLogEntry(
            method=m.group("method"), path=m.group("path"), status=int(m.group("status")),
            size=0 if size == "-" else int(size), user_agent=m.group("agent") or "",
            remote=m.group("remote"), raw=line))
    return entries


# --------------------------------------------------------------------------- #
# HTTP helper
# --------------------------------------------------------------------------- #


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


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kill_process(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
    except ProcessLookupError:
        pass


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
        self.auth = auth
        self._storage_arg = Path(storage_dir) if storage_dir is not None else None
        self._username = username if auth else None
        self._password = password if auth else None
        self.anonymous_pull = anonymous_pull
        self.token_header = token_header
        self._port_arg = port
        self._binary_arg = binary
        self._podman_arg = podman
        self.startup_timeout = startup_timeout

        self._port: int | None = None
        self._workdir: Path | None = None
        self._storage: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._finalizer: weakref.finalize | None = None
        self._logs: list[Any] = []
        self._token_factory = token_server
        self.token_server: TokenIssuer | None = None
        self.pushed: dict[str, str] = {}   # reference -> manifest digest, for every push()

    def __repr__(self) -> str:
        where = self.host if self._port else "stopped"
        user = f", username={self._username!r}" if self.auth else ""
        return f"LocalRegistry({where}, auth={self.auth!r}{user}, storage_dir={str(self._storage)!r})"

    # ---- properties ------------------------------------------------------- #

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def port(self) -> int:
        if self._port is None:
            raise LocalRegistryError("the registry is not running")
        return self._port

    @property
    def host(self) -> str:
        """``127.0.0.1:PORT`` -- the registry part of an image reference."""
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    @property
    def username(self) -> str | None:
        return self._username

    @property
    def password(self) -> str | None:
        return self._password

    @property
    def storage_dir(self) -> Path:
        if self._storage is None:
            raise LocalRegistryError("the registry is not running")
        return self._storage

    @property
    def workdir(self) -> Path:
        """Config, logs, htpasswd, auth file (removed on stop)."""
        if self._workdir is None:
            raise LocalRegistryError("the registry is not running")
        return self._workdir

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

    # ---- lifecycle -------------------------------------------------------- #

    def _binary(self) -> str:
        if self._binary_arg is not None:
            binary = shutil.which(self._binary_arg)
        else:
            binary = shutil.which("docker-registry") or (
                "/usr/bin/docker-registry" if os.access("/usr/bin/docker-registry", os.X_OK) else None)
        if not binary:
            raise RegistryNotInstalled(
                f"docker-registry (distribution v2) is not installed: {_INSTALL_HINT}")
        return binary

    def start(self) -> "LocalRegistry":
        if self.running:
            return self
        binary = self._binary()
        self._workdir = Path(tempfile.mkdtemp(prefix="flowmesh-registry-"))
        try:
            if self._storage_arg is not None:
                self._storage = self._storage_arg
            else:
                self._storage = self._workdir / "storage"
            self._storage.mkdir(parents=True, exist_ok=True)
            auth_config = self._prepare_auth()
            attempts = 1 if self._port_arg else 3
            for attempt in range(attempts):
                port = self._port_arg or _free_port()
                try:
                    self._launch(binary, port, auth_config)
                    break
                except _PortTaken:
                    if attempt == attempts - 1:
                        raise LocalRegistryError(f"127.0.0.1:{port} is already in use") from None
            if self.auth == "htpasswd" and self._password is None:
                self._read_provisioned_password()
            if self.auth is not None:
                self._write_authfile()
        except BaseException:
            self.stop()
            raise
        return self

    def _prepare_auth(self) -> dict[str, Any] | None:
        if self.auth is None:
            return None
        if self._username is None:
            self._username = _DEFAULT_USER
        if self.auth == "token":
            if self._password is None:
                self._password = secrets.token_urlsafe(18)
            assert self._token_factory is not None   # checked in __init__
            self.token_server = self._token_factory(users={self._username: self._password},
                                                    anonymous_pull=self.anonymous_pull,
                                                    header=self.token_header,
                                                    key_dir=self.workdir / "token")
            self.token_server.start()
            return {"token": {"realm": self.token_server.realm,
                              "service": self.token_server.service,
                              "issuer": self.token_server.issuer,
                              "rootcertbundle": str(self.token_server.cert_path)}}
        # htpasswd
        path = self.workdir / "htpasswd"
        password = self._password or secrets.token_urlsafe(18)
        entry = _bcrypt_entry(self._username, password)
        if entry is None:
            if self._explicit_credentials:
                raise LocalRegistryError(
                    "htpasswd entries need bcrypt: apt-get install -y apache2-utils")
            # Let the registry provision its own user; the password is read from its log.
            self._username = _PROVISIONED_USER
        else:
            self._password = password
            path.write_text(entry + "\n")
            os.chmod(path, 0o600)
        return {"htpasswd": {"realm": "flowmesh-test-registry", "path": str(path)}}

    def _config(self, port: int, auth: dict[str, Any] | None) -> dict[str, Any]:
        config: dict[str, Any] = {
            "version": "0.1",
            "log": {"level": "info", "formatter": "json", "accesslog": {"disabled": False},
                    "fields": {"service": "flowmesh-test-registry"}},
            "storage": {
                "filesystem": {"rootdirectory": str(self.storage_dir)},
                "delete": {"enabled": True},
                "maintenance": {"uploadpurging": {"enabled": False}},
            },
            "http": {"addr": f"127.0.0.1:{port}", "secret": secrets.token_hex(16),
                     "headers": {"X-Content-Type-Options": ["nosniff"]}},
            "health": {"storagedriver": {"enabled": False}},
        }
        if auth:
            config["auth"] = auth
        return config

    def _launch(self, binary: str, port: int, auth: dict[str, Any] | None) -> None:
        config_path = self.workdir / "config.yml"
        # JSON is YAML: no quoting questions for paths or secrets.
        config_path.write_text(json.dumps(self._config(port, auth), indent=2) + "\n")
        os.chmod(config_path, 0o600)
        self._close_logs()
        out = open(self.workdir / "access.log", "wb")
        err = open(self.workdir / "registry.log", "wb")
        self._logs = [out, err]
        # REGISTRY_* variables would override the config file.
        env = {k: v for k, v in os.environ.items() if not k.startswith("REGISTRY_")}
        proc = subprocess.Popen([binary, "serve", str(config_path)], stdin=subprocess.DEVNULL,
                                stdout=out, stderr=err, env=env, start_new_session=True)
        self._proc = proc
        self._port = port
        self._finalizer = weakref.finalize(self, _kill_process, proc)
        try:
            self._wait_ready(time.monotonic() + self.startup_timeout)
        except BaseException:
            _kill_process(proc)
            self._proc = None
            self._port = None
            raise

    def _wait_ready(self, deadline: float) -> None:
        assert self._proc is not None
        url = f"http://127.0.0.1:{self._port}/v2/"
        while True:
            code = self._proc.poll()
            if code is not None:
                tail = self._log_tail()
                if "address already in use" in tail:
                    raise _PortTaken()
                raise LocalRegistryError(f"docker-registry exited with {code}: {tail}")
            try:
                _http("GET", url, timeout=1.0)
                return   # any HTTP answer (200, 401) means it is serving
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            if time.monotonic() > deadline:
                raise LocalRegistryError(f"docker-registry did not answer on {url} within "
                                    f"{self.startup_timeout:.0f}s: {self._log_tail()}")
            time.sleep(0.02)

    def _log_tail(self, n: int = 2000) -> str:
        try:
            text = (self.workdir / "registry.log").read_text(errors="replace")
        except OSError:
            return ""
        # Never echo a provisioned password.
        text = re.sub(r'"password":"[^"]*"', '"password":"***"', text)
        return text[-n:].strip()

    def _read_provisioned_password(self) -> None:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            for line in self.log_path.read_text(errors="replace").splitlines():
                if "provisioning with default user" in line:
                    rec = json.loads(line)
                    self._username, self._password = rec["user"], rec["password"]
                    return
            time.sleep(0.02)
        raise LocalRegistryError("the registry did not provision an htpasswd user")

    def _write_authfile(self) -> None:
        assert self._username is not None and self._password is not None
        token = base64.b64encode(f"{self._username}:{self._password}".encode()).decode()
        path = self.workdir / "auth.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"auths": {self.host: {"auth": token}}}, f)

    def _close_logs(self) -> None:
        for f in self._logs:
            try:
                f.close()
            except OSError:
                pass
        self._logs = []

    def stop(self) -> None:
        """Kill the registry (and the token server); remove the temporary directories."""
        if self._proc is not None:
            _kill_process(self._proc)
            self._proc = None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        self._close_logs()
        if self.token_server is not None:
            self.token_server.stop()
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None
        self._port = None

    def __enter__(self) -> "LocalRegistry":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> "LocalRegistry":
        return await asyncio.to_thread(self.start)

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.stop)

    # ---- HTTP API --------------------------------------------------------- #

    def _token(self, challenge: dict[str, str], credentials: bool) -> str | None:
        query = {"service": challenge.get("service", "")}
        if challenge.get("scope"):
            query["scope"] = challenge["scope"]
        headers = {}
        if credentials and self._username:
            query["account"] = self._username
            headers["Authorization"] = self._basic()
        url = challenge["realm"] + "?" + urllib.parse.urlencode(query)
        resp = _http("GET", url, headers)
        if resp.status != 200:
            return None
        body = resp.json()
        return body.get("token") or body.get("access_token")

    def _basic(self) -> str:
        raw = f"{self._username}:{self._password}".encode()
        return "Basic " + base64.b64encode(raw).decode()

    def request(self, method: str, path: str, *, headers: Mapping[str, str] | None = None,
                data: bytes | None = None, credentials: bool = True,
                timeout: float = 30.0) -> RegistryResponse:
        """One HTTP request to the registry (``path`` starts with ``/v2/``).

        With ``credentials`` it authenticates like a client would: Basic for htpasswd,
        the Bearer challenge and a token from the realm for token auth.
        """
        headers = dict(headers or {})
        url = self.url + path
        if self.auth == "htpasswd" and credentials:
            headers.setdefault("Authorization", self._basic())
        resp = _http(method, url, headers, data, timeout)
        if resp.status == 401 and self.auth == "token" and "authorization" not in {
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

    # ---- logs ------------------------------------------------------------- #

    def request_log(self) -> list[AccessLogEntry]:
        """The registry's access log so far, parsed (oldest first)."""
        try:
            return parse_access_log(self.access_log_path.read_text(errors="replace"))
        except FileNotFoundError:
            return []

    def wait_for_log(self, predicate: Callable[[list[AccessLogEntry]], bool],
                     timeout: float = 5.0) -> list[AccessLogEntry]:
        """The access log once ``predicate(entries)`` holds (the registry writes a line
        just after the response, so a client can finish a moment before its line is there)."""
        deadline = time.monotonic() + timeout
        while True:
            entries = self.request_log()
            if predicate(entries) or time.monotonic() > deadline:
                return entries
            time.sleep(0.02)

    def blob_gets(self, entries: Iterable[AccessLogEntry] | None = None) -> Counter[str]:
        """GETs of blobs by digest (any status) in the access log."""
        entries = self.request_log() if entries is None else entries
        return Counter(e.reference for e in entries
                       if e.method == "GET" and e.kind == "blob" and e.reference)

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


class _PortTaken(Exception):
    pass


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
