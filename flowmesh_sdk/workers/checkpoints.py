"""Checkpoints in the content-addressed store (:mod:`flowmesh_sdk.cas`).

The store holds byte objects named by their SHA-256.  A checkpoint is a folder, so it
is stored as one object per file plus a **manifest** object::

    {"kind": "flowmesh.checkpoint/v1", "name": "checkpoint-2", "step": 2,
     "files": {"config.json": {"digest": "sha256:...", "size": 612}, ...}}

(JSON, keys sorted, no spaces), and the checkpoint's digest is the manifest's digest:
equal folders give equal digests, and a file shared by two checkpoints (a tokenizer) is
stored once.  With ``ref_prefix`` the manifest digest is also recorded under the ref
``<ref_prefix>/<name>`` (create-if-absent: the first publisher of a name wins).

The store's ``put`` takes bytes, so each file is read whole into memory, one at a time
(in a worker thread); a streaming put would lift that for very large shards.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ..cas.base import CasCorruptError, ContentStore
from ..errors import SpecError

MANIFEST_KIND = "flowmesh.checkpoint/v1"


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """One published checkpoint: ``digest`` is its manifest's content address; ``ref`` the
    store ref that names it (None without a ref prefix)."""

    name: str
    step: int | None
    digest: str
    files: int
    bytes: int
    ref: str | None = None


def _safe_rel(rel: str) -> str:
    p = PurePosixPath(rel)
    if p.is_absolute() or not p.parts or any(part in ("", ".", "..") for part in p.parts):
        raise SpecError("checkpoint.files", f"unsafe path in a checkpoint: {rel!r}")
    return str(p)


async def publish_files(store: ContentStore, root: Path, files: Sequence[str], *, name: str,
                        step: int | None, ref_prefix: str | None = None) -> Checkpoint:
    """Store ``files`` (paths relative to ``root``) and their manifest; return the checkpoint."""
    entries: dict[str, dict[str, object]] = {}
    total = 0
    for rel in sorted(set(files)):
        rel = _safe_rel(rel)
        data = await asyncio.to_thread((root / rel).read_bytes)
        entries[rel] = {"digest": await store.put(data), "size": len(data)}
        total += len(data)
    if not entries:
        raise SpecError("checkpoint", f"{name}: no files under {root}")
    manifest = json.dumps({"kind": MANIFEST_KIND, "name": name, "step": step, "files": entries},
                          sort_keys=True, separators=(",", ":")).encode()
    digest = await store.put(manifest)
    ref = None
    if ref_prefix:
        ref = f"{ref_prefix}/{name}"
        await store.create_ref(ref, digest.encode())
    return Checkpoint(name, step, digest, len(entries), total, ref)


async def publish_dir(store: ContentStore, directory: Path, *, name: str, step: int | None = None,
                      ref_prefix: str | None = None) -> Checkpoint:
    """Store every file under ``directory`` (recursively) as one checkpoint."""
    files = await asyncio.to_thread(
        lambda: [p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file()])
    return await publish_files(store, directory, files, name=name, step=step, ref_prefix=ref_prefix)


async def read_manifest(store: ContentStore, digest: str) -> dict[str, object]:
    """The manifest of checkpoint ``digest`` (verified by the store)."""
    raw = await store.get(digest)
    try:
        manifest = json.loads(raw)
    except ValueError as exc:
        raise CasCorruptError(digest, "not a checkpoint manifest (not JSON)") from exc
    if not isinstance(manifest, dict) or manifest.get("kind") != MANIFEST_KIND:
        raise SpecError("digest", f"{digest} is not a {MANIFEST_KIND} manifest")
    return manifest


async def restore_checkpoint(store: ContentStore, digest: str, dest: str | Path) -> list[str]:
    """Write checkpoint ``digest``'s files under ``dest``; returns their relative paths.
    Every file is verified against its digest on the way out."""
    manifest = await read_manifest(store, digest)
    files = manifest.get("files")
    if not isinstance(files, dict):
        raise CasCorruptError(digest, "manifest has no file table")
    out = Path(dest)
    written: list[str] = []
    for rel, entry in sorted(files.items()):
        rel = _safe_rel(rel)
        data = await store.get(str(entry["digest"]))
        target = out / rel

        def write(target: Path = target, data: bytes = data) -> None:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        await asyncio.to_thread(write)
        written.append(rel)
    return written
