"""One image per SWE-style task repository (like SWE-bench's per-instance images), built
with ``podman build`` from ``swe-task.Containerfile`` (next to this file):
``localhost/flowmesh/swe-task-NAME:TAG`` is swe-base plus ONE layer holding the task's
repository, committed with git at ``/work/repo``.  TAG defaults to a short content hash of
the repository, so the same files always give the same tag and an existing image is reused."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Mapping

from .host import (LABEL_IMAGE, ImageBuildError, _image_id, _lock, _log, _podman, _run, _workdir, image_exists,
                   podman_build_args)
from .swebase import SWE_BASE_IMAGE, build_swe_base

#: ``localhost/flowmesh/swe-task-<name>:<tag>``; see build_task_image()
SWE_TASK_REPO_PREFIX = "localhost/flowmesh/swe-task-"
SWE_TASK_IMAGE_KIND = "swe-task"
SWE_TASK_REPO_DIR = "/work/repo"
SWE_TASK_CONTAINERFILE = Path(__file__).resolve().parent / "swe-task.Containerfile"
#: hex digits of the content hash used as the default tag
SWE_TASK_TAG_LEN = 12

_NAME_RE = re.compile(r"^[a-z0-9]+(?:[._-][a-z0-9]+)*$")
_TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


def task_image_ref(name: str, tag: str) -> str:
    """``localhost/flowmesh/swe-task-<name>:<tag>`` (both parts validated)."""
    if not isinstance(name, str) or not _NAME_RE.match(name) or len(name) > 100:
        raise ImageBuildError(
            f"bad task name {name!r}: use lowercase letters, digits and single '.', '_' or '-' "
            "between them (it becomes part of an image name)"
        )
    if not isinstance(tag, str) or not _TAG_RE.match(tag):
        raise ImageBuildError(
            f"bad tag {tag!r}: use letters, digits, '_', '.' and '-' (at most 128, not starting "
            "with '.' or '-')"
        )
    return f"{SWE_TASK_REPO_PREFIX}{name}:{tag}"


def _normalise_repo_files(repo_files: Mapping[str, bytes]) -> dict[str, bytes]:
    """Validated ``{relative/posix/path: bytes}``; raises ImageBuildError naming the bad entry."""
    from pathlib import PurePosixPath

    if not repo_files:
        raise ImageBuildError("repo_files is empty: a task repository needs at least one file")
    out: dict[str, bytes] = {}
    for raw, data in repo_files.items():
        if not isinstance(raw, str) or not raw or "\\" in raw or "\0" in raw:
            raise ImageBuildError(f"bad repository path {raw!r}")
        parts = [p for p in PurePosixPath(raw).parts if p != "."]
        if raw.startswith("/") or not parts or any(p in ("..", "/") for p in parts):
            raise ImageBuildError(
                f"bad repository path {raw!r}: paths are relative to the repository root, "
                "without '..'"
            )
        if ".git" in parts:
            raise ImageBuildError(
                f"bad repository path {raw!r}: .git is created in the image (git init + commit)"
            )
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise ImageBuildError(f"{raw}: content must be bytes, not {type(data).__name__}")
        key = "/".join(parts)
        if key in out:
            raise ImageBuildError(f"repository path {raw!r} given twice")
        out[key] = bytes(data)
    keys = set(out)
    for key in out:
        parent = key.rsplit("/", 1)[0] if "/" in key else ""
        while parent:
            if parent in keys:
                raise ImageBuildError(f"{parent!r} is both a file and the folder of {key!r}")
            parent = parent.rsplit("/", 1)[0] if "/" in parent else ""
    return out


def _task_template() -> str:
    try:
        return SWE_TASK_CONTAINERFILE.read_text()
    except OSError as exc:
        raise ImageBuildError(f"cannot read {SWE_TASK_CONTAINERFILE}: {exc.strerror}") from exc


def task_repo_digest(repo_files: Mapping[str, bytes]) -> str:
    """sha256 (hex) over the Containerfile template, the base image and the files.

    Paths are sorted and length-prefixed, so the digest depends on the content
    only (not on the order of ``repo_files`` or on file times). Its first
    SWE_TASK_TAG_LEN digits are the default tag of a task image.
    """
    files = _normalise_repo_files(repo_files)
    h = hashlib.sha256()
    for part in (b"flowmesh-swe-task\0", _task_template().encode(), b"\0",
                 SWE_BASE_IMAGE.encode(), b"\0"):
        h.update(part)
    for path in sorted(files):
        data = files[path]
        h.update(path.encode() + b"\0" + len(data).to_bytes(8, "big") + data)
    return h.hexdigest()


def _fill_task_containerfile(name: str, digest: str) -> str:
    text = _task_template()
    for key, value in (("@@BASE_IMAGE@@", SWE_BASE_IMAGE), ("@@REPO_DIR@@", SWE_TASK_REPO_DIR),
                       ("@@TASK_NAME@@", name), ("@@REPO_DIGEST@@", digest)):
        text = text.replace(key, value)
    left = re.findall(r"@@[A-Z_]+@@", text)
    if left:
        raise ImageBuildError(f"{SWE_TASK_CONTAINERFILE.name}: unknown placeholder(s) {sorted(set(left))}")
    return text


def build_task_image(name: str, repo_files: Mapping[str, bytes], tag: str | None = None,
                     *, force: bool = False) -> str:
    """Build ``localhost/flowmesh/swe-task-<name>:<tag>`` FROM swe-base with the repo committed.

    ``repo_files`` maps paths relative to the repository root (``"pkg/m.py"``,
    ``"tests/test_m.py"``) to their content. The image has them at
    ``/work/repo`` (mode 0644, root-owned), already ``git init``-ed and
    committed on ``main`` with a fixed date, so that a sandbox only needs to apply
    the candidate patch and run pytest. ``tag`` defaults to the first 12 hex
    digits of task_repo_digest(), so identical repositories give identical
    tags. An image that already exists is returned without a build unless
    ``force`` is set. The image differs from swe-base by exactly one layer
    (``podman build --squash``). swe-base is built first if it is missing.
    Returns the image reference.
    """
    files = _normalise_repo_files(repo_files)
    digest = task_repo_digest(files)
    ref = task_image_ref(name, tag if tag is not None else digest[:SWE_TASK_TAG_LEN])
    podman = _podman()
    with _lock(f"swe-task-{name}"):
        if not force and image_exists(ref):
            _log(f"{ref} already present")
            return ref
        if not image_exists(SWE_BASE_IMAGE):
            build_swe_base()
        t0 = time.monotonic()
        previous = _image_id(ref)
        with _workdir("flowmesh-swe-task-") as ctx:
            (ctx / "Containerfile").write_text(_fill_task_containerfile(name, digest))
            repo = ctx / "repo"
            repo.mkdir(mode=0o755)
            for rel, data in files.items():
                dest = repo / rel
                for d in reversed(dest.relative_to(repo).parents):
                    sub = repo / d
                    if not sub.is_dir():
                        sub.mkdir(mode=0o755)
                        os.chmod(sub, 0o755)
                dest.write_bytes(data)
                os.chmod(dest, 0o644)
            os.chmod(repo, 0o755)
            iidfile = ctx / "iid"
            # --timestamp 0: the same repository gives the same layer, config and digest
            cmd = [podman, "build", "--squash", "--timestamp", "0", *podman_build_args(),
                   "--iidfile", str(iidfile), "-f", str(ctx / "Containerfile"), "-t", ref, str(ctx)]
            proc = subprocess.run(cmd, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            if proc.returncode != 0:
                tail = [ln.strip() for ln in proc.stdout.strip().splitlines() if ln.strip()][-3:]
                raise ImageBuildError(
                    f"podman build {ref} failed (exit {proc.returncode}): {' | '.join(tail)}"
                )
            new_id = iidfile.read_text().strip() if iidfile.is_file() else _image_id(ref)
        if previous and new_id and previous.removeprefix("sha256:") != new_id.removeprefix("sha256:"):
            # force rebuild: drop the image the tag used to name if nothing else uses it
            subprocess.run([podman, "image", "rm", previous],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _log(f"built {ref} in {time.monotonic() - t0:.1f}s")
    return ref


def task_files_from_dir(directory: str | os.PathLike[str]) -> dict[str, bytes]:
    """Regular files below ``directory`` (skipping any ``.git``) as build_task_image input."""
    root = Path(directory)
    if not root.is_dir():
        raise ImageBuildError(f"{root} is not a directory")
    out: dict[str, bytes] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != ".git")
        for fn in sorted(filenames):
            p = Path(dirpath) / fn
            if p.is_symlink() or not p.is_file():
                _log(f"skipping {p} (not a regular file)")
                continue
            out[p.relative_to(root).as_posix()] = p.read_bytes()
    return out


def list_task_images() -> list[str]:
    """``localhost/flowmesh/swe-task-*`` references in local podman storage (sorted).

    Other names of the same images (such as ``HOST:PORT/flowmesh/swe-task-...``
    left behind by push()) are not listed.
    """
    res = _run([_podman(), "images", "--filter", f"label={LABEL_IMAGE}={SWE_TASK_IMAGE_KIND}",
                "--format", "{{.Repository}}:{{.Tag}}"], what="podman images", capture=True)
    return sorted({ln.strip() for ln in res.stdout.splitlines()
                   if ln.strip().startswith(SWE_TASK_REPO_PREFIX)
                   and not ln.strip().endswith(":<none>")})
