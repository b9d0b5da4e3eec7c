"""The default content-addressable store: a directory on this machine.

Layout under ``root``::

    objects/sha256/ab/cdef...    one file per object, named by its digest
    refs/<name>                  framed refs (results/sha256/<hex>, ...)
    tmp/                         files being written; never read
    quarantine/                  refs dropped as corrupt, kept for a post-mortem

Every write goes to a fresh file in ``tmp/``, is fsynced, then appears under its final
name in one atomic step, and the directory is fsynced:

* an object with ``os.replace`` (same digest -> same bytes, so a concurrent writer of the
  same object is harmless; a corrupt copy is replaced);
* a ref with ``os.link``, which fails with EEXIST when the name exists: of two processes
  creating the same ref, exactly one succeeds and the other reads the winner.

A writer killed half-way leaves only a file in ``tmp/`` (see :meth:`sweep_tmp`); no reader
ever sees a partial object or ref.  This needs a POSIX file system with hard links (ext4,
xfs, overlayfs; NFSv3+ honours link() atomically too).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import time
from pathlib import Path

from .base import (CasCorruptError, CasNotFoundError, ContentStore, check_object_digest, check_ref_name,
                   frame_ref, unframe_ref, verify_object)
from ..identity import digest_bytes

__all__ = ["LocalDirStore"]


class LocalDirStore(ContentStore):
    """A content-addressable store in a local directory (created if missing)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.location = str(self.root)
        for sub in ("objects", "refs", "tmp", "quarantine"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)

    def __repr__(self) -> str:
        return f"LocalDirStore({self.location!r})"

    # ---- paths -------------------------------------------------------------------
    def object_path(self, digest: str) -> Path:
        algo, _, hexpart = check_object_digest(digest).partition(":")
        return self.root / "objects" / algo / hexpart[:2] / hexpart[2:]

    def ref_path(self, name: str) -> Path:
        return self.root / "refs" / check_ref_name(name)

    # ---- writing -----------------------------------------------------------------
    def _write_tmp(self, data: bytes) -> Path:
        fd, tmp = tempfile.mkstemp(dir=self.root / "tmp", prefix="w-")
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        os.close(fd)
        return Path(tmp)

    @staticmethod
    def _fsync_dir(path: Path) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _put(self, data: bytes) -> str:
        digest = digest_bytes(data)
        final = self.object_path(digest)
        if final.exists():
            try:
                verify_object(digest, final.read_bytes())
                return digest          # already stored, intact
            except (CasCorruptError, OSError):
                pass                   # replace the corrupt copy below
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._write_tmp(data)
        try:
            os.replace(tmp, final)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        self._fsync_dir(final.parent)
        return digest

    def _create_ref(self, name: str, body: bytes) -> tuple[bool, bytes]:
        final = self.ref_path(name)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._write_tmp(frame_ref(body))
        try:
            os.link(tmp, final)        # atomic; EEXIST when another writer got there first
            created = True
        except FileExistsError:
            created = False
        finally:
            os.unlink(tmp)
        if created:
            self._fsync_dir(final.parent)
            return True, body
        existing = self._read_ref(name)
        if existing is None:           # dropped between our link and our read: try once more
            return self._create_ref(name, body)
        return False, existing

    # ---- reading -----------------------------------------------------------------
    def _get(self, digest: str) -> bytes:
        try:
            data = self.object_path(digest).read_bytes()
        except FileNotFoundError:
            raise CasNotFoundError(digest) from None
        return verify_object(digest, data)

    def _read_ref(self, name: str) -> bytes | None:
        try:
            raw = self.ref_path(name).read_bytes()
        except FileNotFoundError:
            return None
        return unframe_ref(name, raw)

    def _drop_ref(self, name: str) -> bool:
        path = self.ref_path(name)
        target = self.root / "quarantine" / f"{name.replace('/', '_')}.{time.time_ns()}"
        try:
            os.rename(path, target)
        except FileNotFoundError:
            return False
        self._fsync_dir(path.parent)
        return True

    def _list_refs(self, prefix: str) -> list[str]:
        base = self.root / "refs"
        start = base / prefix.rstrip("/") if prefix else base
        if not start.is_dir():
            return []
        return sorted(str(p.relative_to(base)) for p in start.rglob("*") if p.is_file())

    def _sweep_tmp(self, max_age_s: float) -> int:
        cutoff = time.time() - max_age_s
        removed = 0
        for p in (self.root / "tmp").iterdir():
            with contextlib.suppress(FileNotFoundError):
                if p.stat().st_mtime < cutoff:
                    p.unlink()
                    removed += 1
        return removed

    # ---- the async contract (I/O in a worker thread) --------------------------------
    async def put(self, data: bytes) -> str:
        return await asyncio.to_thread(self._put, bytes(data))

    async def get(self, digest: str) -> bytes:
        return await asyncio.to_thread(self._get, check_object_digest(digest))

    async def has(self, digest: str) -> bool:
        return await asyncio.to_thread(self.object_path(digest).is_file)

    async def create_ref(self, name: str, body: bytes) -> tuple[bool, bytes]:
        check_ref_name(name)
        return await asyncio.to_thread(self._create_ref, name, bytes(body))

    async def read_ref(self, name: str) -> bytes | None:
        check_ref_name(name)
        return await asyncio.to_thread(self._read_ref, name)

    async def drop_ref(self, name: str) -> bool:
        check_ref_name(name)
        return await asyncio.to_thread(self._drop_ref, name)

    async def list_refs(self, prefix: str) -> list[str]:
        return await asyncio.to_thread(self._list_refs, prefix)

    async def sweep_tmp(self, max_age_s: float = 3600.0) -> int:
        """Remove files left in ``tmp/`` by writers that died more than ``max_age_s`` ago
        (never a live writer's file, given a sane age).  Returns how many were removed."""
        return await asyncio.to_thread(self._sweep_tmp, max_age_s)
