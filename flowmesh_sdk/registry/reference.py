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
# every pattern is applied with fullmatch (``$`` would let a trailing newline through) and
# ASCII-only (``\w`` and ``\d`` would otherwise take any Unicode letter or digit)
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}", re.ASCII)
_REPO = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*",
                   re.ASCII)
_TAG = re.compile(r"[\w][\w.-]{0,127}", re.ASCII)
_HOST_PART = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_REGISTRY = re.compile(rf"(?:{_HOST_PART}(?:\.{_HOST_PART})*|\[[0-9A-Fa-f:.]+\])(?::(?P<port>[0-9]{{1,5}}))?",
                       re.ASCII)


def _printable_no_space(text: str) -> bool:
    """No whitespace and no control character in ``text`` (in ASCII, the one printable
    whitespace is the space: the common case is two C-level scans, not a loop)."""
    if text.isascii():
        return text.isprintable() and " " not in text
    return not any(c.isspace() or not c.isprintable() for c in text)


@dataclass(frozen=True, slots=True)
class ImageRef:
    registry: str
    repository: str
    tag: str | None = None
    digest: str | None = None

    @classmethod
    def parse(cls, text: str) -> ImageRef:
        if not isinstance(text, str) or not text or not _printable_no_space(text):
            raise SpecError("image", f"must be an image reference "
                                     f"([registry[:port]/]repository[:tag][@sha256:<64 hex>], no "
                                     f"spaces or control characters), got {text!r}")
        rest, digest = text, None
        if "@" in rest:
            rest, digest = rest.split("@", 1)
            if not _DIGEST.fullmatch(digest):
                raise SpecError("image", f"{text!r}: digest must be sha256:<64 hex>")
        first, _, remainder = rest.partition("/")
        if remainder and ("." in first or ":" in first or first == "localhost"):
            registry, path = first, remainder
            m = _REGISTRY.fullmatch(registry)
            if not m or (m.group("port") is not None and not 1 <= int(m.group("port")) <= 65535):
                raise SpecError("image", f"{text!r}: bad registry {registry!r} (a host name or "
                                         "address, optionally :port 1-65535)")
        else:
            registry, path = DOCKER_HUB, rest
        tag = None
        last = path.rsplit("/", 1)[-1]
        if ":" in last:
            path, tag = path.rsplit(":", 1)
            if not _TAG.fullmatch(tag):
                raise SpecError("image", f"{text!r}: bad tag {tag!r} (1-128 of A-Z a-z 0-9 _ . -, "
                                         "not starting with . or -)")
        if registry == DOCKER_HUB and "/" not in path:
            path = f"library/{path}"
        if not _REPO.fullmatch(path):
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
            raise SpecError("image", f"{self} is not pinned to a digest (resolve it first)")
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
