"""Sparse files through snapshot and fork.

podman (checked with 4.3.1) writes every file of a layer it commits or pulls in full: a
1 GiB sparse file holding a few kilobytes becomes a gigabyte on the disk of the machine
that pulls the snapshot (an OCI layer has no holes podman keeps; GNU sparse tar entries it
refuses, PAX sparse ones it fills in).  So a snapshot lists its sparse files in an image
label, and the machine that pulls it digs the holes back into the pulled layers:

* at commit, :data:`SCAN` lists the big files of the container's writable layer from the
  host (its storage ``UpperDir``), and those with at least :data:`MIN_HOLE` bytes not on
  disk are named in the label :data:`LABEL` (with the paths the container's image already
  named there, so a snapshot of a fork keeps them);
* after a pull, :data:`DIG` runs ``fallocate --dig-holes`` on each listed path in each
  layer directory of the image: only regular files reached without a symbolic link, their
  bytes unchanged (only blocks of zeros are deallocated) and their access and modification
  times put back.

The list is capped (:data:`LABEL_CAP` characters, the files with the most hole first):
past it, files stay as podman writes them.  Where ``find -printf`` (GNU findutils) or
``fallocate`` (util-linux) is missing, or the storage has no ``UpperDir``, snapshots work
as before, without the holes.
"""

from __future__ import annotations

import base64
import binascii
import zlib
from collections.abc import Iterable, Sequence

#: the image label a snapshot names its sparse files in
LABEL = "io.flowmesh.sparse"
#: a file with at least this many bytes of its size not on disk is kept sparse
MIN_HOLE = 1 << 20
#: the most characters the label's value may have (it travels as one argument)
LABEL_CAP = 32 << 10
_PREFIX = "z1:"

#: ``sh -c SCAN sh UPPERDIR``: ``BLOCKS SIZE PATH\\0`` for each regular file over 1 MiB
SCAN = ('cd -- "$1" 2>/dev/null || exit 0; '
        "exec find . -xdev -type f -size +1024k -printf '%b %s %P\\0' 2>/dev/null")

#: ``sh -c DIG sh LAYERDIR...`` with the NUL-separated paths on stdin
DIG = r"""
command -v fallocate >/dev/null 2>&1 || { echo "no fallocate (util-linux) here" >&2; exit 3; }
t=$(mktemp -d) || exit 1
trap 'rm -rf "$t"' EXIT
cat > "$t/list" && : > "$t/times" || exit 1
for l in "$@"; do
  ( cd -- "$l" 2>/dev/null || exit 0
    xargs -0 sh -c '
      ref=$1; d=$(pwd -P); shift
      for p; do
        f=./$p
        [ -f "$f" ] && [ ! -L "$f" ] || continue
        [ "$(readlink -f -- "$f")" = "$d/$p" ] || continue
        touch -r "$f" -- "$ref" && fallocate --dig-holes -- "$f" && touch -r "$ref" -- "$f" || exit 255
      done' sh "$t/times" < "$t/list" ) || exit 1
done
"""


def sparse_paths(scan_output: bytes) -> list[tuple[int, bytes]]:
    """``(bytes not on disk, path)`` of the sparse files in :data:`SCAN`'s output."""
    out: list[tuple[int, bytes]] = []
    for rec in scan_output.split(b"\0"):
        blocks, _, rest = rec.partition(b" ")
        size, _, path = rest.partition(b" ")
        if not (blocks.isdigit() and size.isdigit()) or not valid_path(path):
            continue
        hole = int(size) - 512 * int(blocks)
        if hole >= MIN_HOLE:
            out.append((hole, path))
    return out


def valid_path(path: bytes) -> bool:
    """A relative path of plain names (no ``.``, ``..``, empty parts or NUL)."""
    parts = path.split(b"/")
    return bool(path) and b"\0" not in path and all(p not in (b"", b".", b"..") for p in parts)


def encode(ranked: Iterable[tuple[int, bytes]], inherited: Sequence[bytes] = ()) -> str:
    """The label value naming the ``(hole, path)`` files (most hole first), then the
    ``inherited`` ones, as many as fit in :data:`LABEL_CAP`; "" when there are none."""
    paths = list(dict.fromkeys([*(p for _, p in sorted(ranked, key=lambda r: -r[0])), *inherited]))
    while paths:
        value = _PREFIX + base64.b64encode(zlib.compress(b"\0".join(paths), 9)).decode("ascii")
        if len(value) <= LABEL_CAP:
            return value
        paths = paths[: len(paths) // 2]
    return ""


def decode(value: str) -> list[bytes]:
    """The paths a label value names; [] for a missing or malformed one."""
    if not value.startswith(_PREFIX):
        return []
    try:
        raw = zlib.decompressobj().decompress(base64.b64decode(value[len(_PREFIX):], validate=True),
                                              16 << 20)
    except (binascii.Error, ValueError, zlib.error):
        return []
    return [p for p in raw.split(b"\0") if valid_path(p)]
