"""Give a committed image's top layer the file owners the container saw.

``podman commit`` of a container that runs under a user-namespace map (``--uidmap
0:100000:65536``, or ``--userns=auto``) stores the *host* ids of the files the container
wrote (checked with podman 4.3.1: a file root made inside is stored as 100000).  A
container started from such an image maps 100000 again, to 200000, outside its map: the
files show up as ``nobody`` and cannot be written.  This module rewrites that layer.

It is a script run with the instance's ``python3`` (standard library only) on an
``oci-dir`` written by ``podman save --format oci-dir --uncompressed``::

    python3 - DIR UIDMAP GIDMAP < layershift.py

``UIDMAP``/``GIDMAP`` are the container's maps as podman reports them
(``CONTAINER:HOST:COUNT``, comma-separated).  Only tar headers change; file contents,
whiteouts, hard links, modes and extended attributes are copied as they are.  The new
layer, config, manifest and ``index.json`` replace the old ones (digests recomputed), so
``podman pull oci:DIR`` loads the corrected image.  It prints the new manifest's digest.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tarfile
from typing import TYPE_CHECKING

if TYPE_CHECKING:   # for the type checker only: the script runs on any python3 (no typing at run time)
    from typing import BinaryIO, Protocol

    class _Sink(Protocol):
        """What a tar stream written in ``w|`` mode needs of its file: ``write``."""

        def write(self, data: bytes) -> int: ...

NOBODY = 65534
_LAYER_TYPES = ("application/vnd.oci.image.layer.v1.tar",
                "application/vnd.docker.image.rootfs.diff.tar")


def parse_map(text: str) -> list[tuple[int, int, int]]:
    """``"0:100000:65536,..."`` → ``[(container, host, count), ...]``."""
    out = []
    for part in filter(None, text.split(",")):
        c, h, n = (int(x) for x in part.split(":"))
        out.append((c, h, n))
    return out


def to_container(host_id: int, ranges: list[tuple[int, int, int]]) -> int:
    """The id inside the container for ``host_id`` (``nobody`` when it is outside the map)."""
    for c, h, n in ranges:
        if h <= host_id < h + n:
            return c + host_id - h
    return NOBODY


def _blob(root: str, digest: str) -> str:
    algo, _, hexd = digest.partition(":")
    return os.path.join(root, "blobs", algo, hexd)


def _write_blob(root: str, data: bytes) -> tuple[str, int]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    with open(_blob(root, digest), "wb") as fh:
        fh.write(data)
    return digest, len(data)


class _Hashing:
    """A write-only file that hashes and counts what passes through it."""

    def __init__(self, fh: BinaryIO) -> None:
        self.fh, self.sha, self.size = fh, hashlib.sha256(), 0

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.size += len(data)
        return self.fh.write(data)


def shift_layer(src: str, dst: _Sink, uids: list[tuple[int, int, int]], gids: list[tuple[int, int, int]]) -> None:
    """Copy the tar ``src`` to the binary file ``dst`` with owners mapped back."""
    with tarfile.open(src, "r:") as tin, \
            tarfile.open(fileobj=dst,  # type: ignore[call-overload]  # "w|" only writes; typeshed wants a file
                         mode="w|", format=tarfile.PAX_FORMAT) as tout:
        for m in tin:
            m.uid = to_container(m.uid, uids)
            m.gid = to_container(m.gid, gids)
            m.uname = m.gname = ""
            m.pax_headers = {k: v for k, v in m.pax_headers.items() if k not in ("uid", "gid", "uname", "gname")}
            if m.issparse():                 # written out in full: tarfile writes no sparse maps
                m.type, m.sparse = tarfile.REGTYPE, None
            tout.addfile(m, tin.extractfile(m) if m.isreg() else None)


def shift_image(root: str, uids: list[tuple[int, int, int]], gids: list[tuple[int, int, int]]) -> str:
    """Rewrite the top layer of the single image in the oci-dir ``root``; the new manifest digest."""
    index_path = os.path.join(root, "index.json")
    with open(index_path, encoding="utf-8") as fh:
        index = json.load(fh)
    entry = index["manifests"][0]
    with open(_blob(root, entry["digest"]), encoding="utf-8") as fh:
        manifest = json.load(fh)
    top = manifest["layers"][-1]
    if top["mediaType"] not in _LAYER_TYPES:
        raise SystemExit(f"layershift: the top layer is {top['mediaType']}, not an uncompressed tar")
    old = _blob(root, top["digest"])
    tmp = old + ".shifted"
    with open(tmp, "wb") as out:
        counter = _Hashing(out)
        shift_layer(old, counter, uids, gids)
    digest = "sha256:" + counter.sha.hexdigest()
    os.replace(tmp, _blob(root, digest))
    if digest != top["digest"]:
        os.unlink(old)
    with open(_blob(root, manifest["config"]["digest"]), encoding="utf-8") as fh:
        config = json.load(fh)
    config["rootfs"]["diff_ids"][-1] = digest      # uncompressed: the diff id is the digest
    top["digest"], top["size"] = digest, counter.size
    manifest["config"]["digest"], manifest["config"]["size"] = _write_blob(
        root, json.dumps(config, separators=(",", ":")).encode())
    entry["digest"], entry["size"] = _write_blob(
        root, json.dumps(manifest, separators=(",", ":")).encode())
    with open(index_path, "w", encoding="utf-8") as fh:
        json.dump(index, fh, separators=(",", ":"))
    return entry["digest"]


if __name__ == "__main__":
    print(shift_image(sys.argv[1], parse_map(sys.argv[2]), parse_map(sys.argv[3])))
