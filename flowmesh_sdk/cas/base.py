"""The content-addressable store contract, its errors, and the ref framing both backends share.

A store holds two kinds of thing:

* **objects**, named by the SHA-256 of their bytes (``sha256:<hex>``).  ``put`` is
  idempotent; ``get`` hashes what it read and raises :class:`CasCorruptError` when the
  bytes no longer match their name, so a flipped bit is never served as a result.
* **refs**, small named records (``results/sha256/<hex>`` -> the stored result of one
  ``H_task``).  ``create_ref`` is an atomic *create-if-absent*: of many writers (threads,
  processes, machines) exactly one creates the ref and every other one gets the winner's
  bytes back.  That is how a result is published at most once.  A ref is framed with its
  own checksum (:func:`frame_ref`), so a corrupted ref is detected like a corrupted object.

Nothing half-written is ever visible under an object's or ref's name: the local store
writes a temp file, fsyncs it and links/renames it into place; S3 makes an object visible
only when its PUT completes.
"""

from __future__ import annotations

import abc
import hashlib
import re

from ..errors import FlowMeshError, SpecError
from ..identity import digest_bytes, is_digest

__all__ = ["CasCorruptError", "CasError", "CasNotFoundError", "ContentStore", "check_ref_name",
           "frame_ref", "unframe_ref"]

_REF_NAME = re.compile(r"[a-z0-9][a-z0-9._-]*(/[a-z0-9][a-z0-9._-]*)*", re.ASCII)
_REF_MAGIC = b"fmref1 "


class CasError(FlowMeshError):
    """A content-addressable store operation failed."""


class CasNotFoundError(CasError):
    """No object (or ref) under that name."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"not in the store: {name}")


class CasCorruptError(CasError):
    """What is stored under a name does not match it (a flipped bit, a truncated file, a
    ref whose checksum fails).  Never served; the reuse layer recomputes and rewrites it."""

    def __init__(self, name: str, detail: str) -> None:
        self.name = name
        super().__init__(f"corrupt in the store: {name}: {detail}")


def check_ref_name(name: object) -> str:
    """A ref name: lowercase path segments of ``[a-z0-9._-]``, no empty or dot-only parts."""
    if not isinstance(name, str) or not _REF_NAME.fullmatch(name) or any(
            part in (".", "..") for part in name.split("/")):
        raise SpecError("ref", f"must be lowercase path segments of [a-z0-9._-] separated by '/', "
                               f"got {name!r}")
    return name


def check_object_digest(digest: object) -> str:
    if not is_digest(digest) or not str(digest).startswith("sha256:"):
        raise SpecError("digest", f"must be 'sha256:<64 lowercase hex>', got {digest!r}")
    return digest


def frame_ref(body: bytes) -> bytes:
    """``b"fmref1 " + sha256hex(body) + b"\\n" + body``: a ref that checks itself."""
    return _REF_MAGIC + hashlib.sha256(body).hexdigest().encode() + b"\n" + body


def unframe_ref(name: str, raw: bytes) -> bytes:
    """The body of a framed ref; CasCorruptError when the frame or checksum is wrong."""
    head, sep, body = raw.partition(b"\n")
    if not sep or not head.startswith(_REF_MAGIC) or len(head) != len(_REF_MAGIC) + 64:
        raise CasCorruptError(name, "not a framed ref (truncated or overwritten)")
    if hashlib.sha256(body).hexdigest().encode() != head[len(_REF_MAGIC):]:
        raise CasCorruptError(name, "ref checksum does not match its body")
    return body


def verify_object(digest: str, data: bytes) -> bytes:
    got = digest_bytes(data)
    if got != digest:
        raise CasCorruptError(digest, f"content hashes to {got}")
    return data


class ContentStore(abc.ABC):
    """Objects by content hash, refs with atomic create-if-absent.  All calls are async and
    never block the event loop (backends do their I/O in a worker thread)."""

    #: where the store lives, for provenance and messages (a path or an s3:// URL)
    location: str = ""

    @abc.abstractmethod
    async def put(self, data: bytes) -> str:
        """Store ``data``; return its digest.  Idempotent; a corrupt copy already stored
        under that digest is replaced."""

    @abc.abstractmethod
    async def get(self, digest: str) -> bytes:
        """The bytes stored under ``digest``, verified.  CasNotFoundError / CasCorruptError."""

    @abc.abstractmethod
    async def has(self, digest: str) -> bool:
        """Whether an object is stored under ``digest`` (not verified: ``get`` does that)."""

    @abc.abstractmethod
    async def create_ref(self, name: str, body: bytes) -> tuple[bool, bytes]:
        """Create ref ``name`` with ``body`` unless it exists, atomically.  Returns
        ``(True, body)`` for the one writer that created it, ``(False, existing body)`` for
        every other.  CasCorruptError when the existing ref is corrupt."""

    @abc.abstractmethod
    async def read_ref(self, name: str) -> bytes | None:
        """The body of ref ``name``, verified; None when absent; CasCorruptError when corrupt."""

    @abc.abstractmethod
    async def drop_ref(self, name: str) -> bool:
        """Remove ref ``name`` (a corrupt or stale one) so it can be created again.  True if
        something was removed.  Between a reader seeing corruption and this call another
        writer may already have replaced the ref: dropping it costs one recomputation, never
        a wrong answer, since every read is verified."""

    @abc.abstractmethod
    async def list_refs(self, prefix: str) -> list[str]:
        """Names of the refs under ``prefix`` (a ref-name prefix ending in '/'), sorted."""

    async def close(self) -> None:
        """Release clients and threads (idempotent)."""
