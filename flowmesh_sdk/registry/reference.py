"""Image references: ``[registry[:port]/]repository[:tag][@digest]`` (the Docker grammar).

A first path component with a dot, a colon, or equal to ``localhost`` names a registry;
otherwise the registry is Docker Hub and a one-component repository gets ``library/``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..backoff import is_loopback_host
from ..errors import SpecError

DOCKER_HUB = "docker.io"
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_REPO = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$")
_TAG = re.compile(r"^[\w][\w.-]{0,127}$")


@dataclass(frozen=True, slots=True)
class ImageRef:
    registry: str
    repository: str
    tag: str | None = None
    digest: str | None = None

    @classmethod
    def parse(cls, text: str) -> ImageRef:
        if not isinstance(text, str) or not text or any(c.isspace() for c in text):
            raise SpecError("image", f"must be an image reference, got {text!r}")
        rest, digest = text, None
        if "@" in rest:
            rest, digest = rest.split("@", 1)
            if not _DIGEST.match(digest):
                raise SpecError("image", f"{text!r}: digest must be sha256:<64 hex>")
        first, _, remainder = rest.partition("/")
        if remainder and ("." in first or ":" in first or first == "localhost"):
            registry, path = first, remainder
        else:
            registry, path = DOCKER_HUB, rest
        tag = None
        last = path.rsplit("/", 1)[-1]
        if ":" in last:
            path, tag = path.rsplit(":", 1)
            if not _TAG.match(tag):
                raise SpecError("image", f"{text!r}: bad tag {tag!r}")
        if registry == DOCKER_HUB and "/" not in path:
            path = f"library/{path}"
        if not _REPO.match(path):
            raise SpecError("image", f"{text!r}: bad repository name {path!r} "
                                     "(lowercase letters, digits and separators . _ - /)")
        if tag is None and digest is None:
            tag = "latest"
        return cls(registry, path, tag, digest)

    @property
    def reference(self) -> str:
        """What to ask the registry for: the digest if pinned, else the tag."""
        return self.digest or self.tag or "latest"

    def with_digest(self, digest: str) -> ImageRef:
        return ImageRef(self.registry, self.repository, self.tag, digest)

    def pinned(self) -> str:
        """``registry/repository@digest`` -- what a sandbox runs."""
        if not self.digest:
            raise ValueError(f"{self} is not pinned to a digest")
        return f"{self.registry}/{self.repository}@{self.digest}"

    @property
    def loopback(self) -> bool:
        """True for registries on this machine (plain HTTP and --tls-verify=false allowed)."""
        return is_loopback_host(self.registry)

    def __str__(self) -> str:
        out = f"{self.registry}/{self.repository}"
        if self.tag:
            out += f":{self.tag}"
        if self.digest:
            out += f"@{self.digest}"
        return out
