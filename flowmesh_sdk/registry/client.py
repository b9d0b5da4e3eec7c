"""A small OCI distribution client (plain HTTP over httpx).

It does what dispatch needs and no more: resolve ``name:tag`` to a manifest digest (an
image index is narrowed to the instance's platform), list the layers and their sizes,
and check existence -- with the registry's auth challenge (anonymous bearer tokens,
basic auth, or bearer tokens fetched with basic credentials).  Pulling the layers is
left to the container runtime on each instance.

Why plain httpx rather than an OCI library: the handful of calls is small, the wire
format is stable (OCI distribution spec v1.0, Docker registry HTTP API v2), and the
PyPI OCI clients either shell out to other tools or pull in a large dependency tree.

Registries on 127.0.0.0/8 and ``localhost`` are spoken to over plain HTTP; every other
registry over HTTPS.  Credentials are never logged (``Credentials`` hides them in its
repr, and headers are not logged).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass

import httpx

from ..errors import (AuthError, ImageNotFoundError, RegistryUnavailableError, SpecError,
                      ThrottledError)
from .auth import Credentials, load_credentials
from .reference import ImageRef

log = logging.getLogger("flowmesh.registry")

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
ACCEPT = ", ".join((OCI_INDEX, DOCKER_LIST, OCI_MANIFEST, DOCKER_MANIFEST))
_ARCH = {"x86_64": "amd64", "arm64": "arm64"}
_PARAM = re.compile(r'(\w+)="([^"]*)"')


@dataclass(frozen=True, slots=True)
class Layer:
    digest: str
    size: int
    media_type: str


@dataclass(frozen=True, slots=True)
class ResolvedImage:
    """An image pinned to its platform manifest digest."""

    ref: ImageRef                 # with .digest set to the platform manifest's digest
    config_digest: str
    layers: tuple[Layer, ...]
    platform: str                 # e.g. linux/amd64
    index_digest: str | None = None

    @property
    def digest(self) -> str:
        assert self.ref.digest
        return self.ref.digest

    @property
    def size(self) -> int:
        return sum(layer.size for layer in self.layers)

    @property
    def pinned(self) -> str:
        return self.ref.pinned()


class RegistryClient:
    def __init__(self, *, credentials: Mapping[str, Credentials] | None = None,
                 timeout_s: float = 30.0, use_auth_files: bool = True) -> None:
        self._creds = dict(credentials or {})
        self._use_auth_files = use_auth_files
        self._http = httpx.AsyncClient(timeout=timeout_s, follow_redirects=True, trust_env=False)
        self._auth: dict[tuple[str, str], str] = {}

    def credentials(self, registry: str) -> Credentials | None:
        if registry in self._creds:
            return self._creds[registry]
        return load_credentials(registry) if self._use_auth_files else None

    async def close(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> RegistryClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- public calls ------------------------------------------------------------
    async def resolve(self, image: str | ImageRef, *, arch: str = "x86_64",
                      os_name: str = "linux") -> ResolvedImage:
        ref = image if isinstance(image, ImageRef) else ImageRef.parse(image)
        if arch not in _ARCH:
            raise SpecError("arch", f"must be one of {', '.join(_ARCH)}, got {arch!r}")
        want = (os_name, _ARCH[arch])
        media, body, digest = await self._manifest(ref, ref.reference)
        index_digest = None
        if media in (OCI_INDEX, DOCKER_LIST):
            index_digest = digest
            entries = json.loads(body).get("manifests") or []
            chosen = next((m for m in entries if (m.get("platform", {}).get("os"),
                                                  m.get("platform", {}).get("architecture")) == want),
                          None)
            if chosen is None:
                found = sorted({f"{m.get('platform', {}).get('os')}/{m.get('platform', {}).get('architecture')}"
                                for m in entries})
                raise ImageNotFoundError(str(ref), f"no {want[0]}/{want[1]} image in its index "
                                                   f"(has: {', '.join(found) or 'none'})")
            media, body, digest = await self._manifest(ref, chosen["digest"])
        if media not in (OCI_MANIFEST, DOCKER_MANIFEST):
            raise ImageNotFoundError(str(ref), f"unsupported manifest type {media!r}")
        doc = json.loads(body)
        layers = tuple(Layer(layer["digest"], int(layer.get("size", 0)), layer.get("mediaType", ""))
                       for layer in doc.get("layers") or [])
        return ResolvedImage(ref=ref.with_digest(digest), config_digest=doc["config"]["digest"],
                             layers=layers, platform=f"{want[0]}/{want[1]}", index_digest=index_digest)

    async def exists(self, image: str | ImageRef) -> bool:
        try:
            await self.resolve(image)
        except ImageNotFoundError:
            return False
        return True

    # ---- wire ----------------------------------------------------------------------
    async def _manifest(self, ref: ImageRef, reference: str) -> tuple[str, bytes, str]:
        resp = await self._get(ref, f"{ref.repository}/manifests/{reference}", ACCEPT)
        body = resp.content
        computed = "sha256:" + hashlib.sha256(body).hexdigest()
        if reference.startswith("sha256:") and computed != reference:
            raise RegistryUnavailableError(f"manifest {reference} of {ref} failed its digest check "
                                           f"(got {computed})", provider=ref.registry,
                                           code="DigestMismatch")
        digest = resp.headers.get("Docker-Content-Digest") or computed
        media = resp.headers.get("Content-Type", "").split(";")[0].strip()
        if not media:
            media = json.loads(body).get("mediaType", "")
        return media, body, digest

    async def _get(self, ref: ImageRef, path: str, accept: str) -> httpx.Response:
        scheme = "http" if ref.loopback else "https"
        url = f"{scheme}://{ref.registry}/v2/{path}"
        scope = f"repository:{ref.repository}:pull"
        headers = {"Accept": accept}
        cached = self._auth.get((ref.registry, scope))
        if cached:
            headers["Authorization"] = cached
        resp = await self._send(ref, url, headers)
        if resp.status_code == 401:
            headers["Authorization"] = await self._authorize(
                ref, scope, resp.headers.get("WWW-Authenticate", ""))
            resp = await self._send(ref, url, headers)
        self._check(ref, resp)
        return resp

    async def _send(self, ref: ImageRef, url: str, headers: dict[str, str],
                    params: Mapping[str, str] | None = None) -> httpx.Response:
        try:
            return await self._http.get(url, headers=headers, params=params)
        except httpx.HTTPError as exc:
            raise RegistryUnavailableError(f"registry {ref.registry} unreachable: "
                                           f"{type(exc).__name__}: {exc}", provider=ref.registry,
                                           code="Unreachable") from exc

    async def _authorize(self, ref: ImageRef, scope: str, challenge: str) -> str:
        creds = self.credentials(ref.registry)
        kind = challenge.split(" ", 1)[0].lower()
        params = dict(_PARAM.findall(challenge))
        if kind == "basic":
            if creds is None:
                raise self._auth_error(ref, None)
            header = creds.basic_header()
        elif kind == "bearer" and params.get("realm"):
            query = {"service": params.get("service", ""), "scope": scope}
            query = {k: v for k, v in query.items() if v}
            hdrs = {"Authorization": creds.basic_header()} if creds else {}
            resp = await self._send(ref, params["realm"], hdrs, params=query)
            if resp.status_code in (401, 403):
                raise self._auth_error(ref, creds)
            if resp.status_code != 200:
                raise RegistryUnavailableError(f"token service of {ref.registry} answered "
                                               f"{resp.status_code}", provider=ref.registry,
                                               code="TokenService")
            data = resp.json()
            token = data.get("token") or data.get("access_token")
            if not token:
                raise RegistryUnavailableError(f"token service of {ref.registry} gave no token",
                                               provider=ref.registry, code="TokenService")
            header = f"Bearer {token}"
        else:
            raise self._auth_error(ref, creds)
        self._auth[(ref.registry, scope)] = header
        return header

    def _auth_error(self, ref: ImageRef, creds: Credentials | None) -> AuthError:
        who = f"user {creds.username!r}" if creds else "anonymous access"
        return AuthError(f"registry {ref.registry} refused {who} to {ref.repository}; log in with "
                         f"`podman login {ref.registry}` (credentials are read from the podman/docker "
                         f"auth files, or pass credentials= to the client)",
                         provider=ref.registry, code="Unauthorized")

    def _check(self, ref: ImageRef, resp: httpx.Response) -> None:
        code = resp.status_code
        if code == 200:
            return
        detail = ""
        try:
            errs = resp.json().get("errors") or []
            if errs:
                detail = f"{errs[0].get('code', '')}: {errs[0].get('message', '')}"
        except ValueError:
            pass
        if code == 404:
            raise ImageNotFoundError(str(ref), detail or f"{ref.registry} answered 404")
        if code in (401, 403):
            raise self._auth_error(ref, self.credentials(ref.registry))
        if code == 429:
            retry = resp.headers.get("Retry-After", "")
            raise ThrottledError(f"registry {ref.registry} is rate limiting ({detail or '429'})",
                                 provider=ref.registry, code="TooManyRequests",
                                 retry_after_s=float(retry) if retry.replace(".", "", 1).isdigit() else None)
        raise RegistryUnavailableError(f"registry {ref.registry} answered {code} for {ref}"
                                       + (f" ({detail})" if detail else ""),
                                       provider=ref.registry, code=str(code))
