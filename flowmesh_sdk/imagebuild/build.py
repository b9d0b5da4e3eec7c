#!/usr/bin/env python3
"""Build FlowMesh's local container images into podman storage, and push them.

Two base images, both built without a registry or a Dockerfile:

``localhost/flowmesh/busybox:1``
    The host's static busybox plus one symlink per applet. Builds in about a
    second; the unit tests use it.

``localhost/flowmesh/swe-base:bookworm``
    A ``debootstrap --variant=minbase`` Debian bookworm with python3,
    python3-pytest and git. The first build takes a minute or two; the
    debootstrap tree is cached as a tarball so a later import (for example after
    ``podman rmi``) skips debootstrap.

one for the languages of the SandboxFusion-compatible server
(``flowmesh serve sandbox-fusion``), built with ``podman build`` from
``code-runner.Containerfile`` (the only build here that needs the network: apt-get):

``localhost/flowmesh/code-runner:bookworm``
    swe-base plus Debian's g++ (python3, bash and g++: python, bash and cpp).

and one image per SWE-style task repository (like SWE-bench's per-instance
images), built with ``podman build`` from ``swe-task.Containerfile`` (next to this file):

``localhost/flowmesh/swe-task-NAME:TAG``
    swe-base plus ONE layer holding the task's repository, committed with git
    at ``/work/repo``. TAG defaults to a short content hash of the repository,
    so the same files always give the same tag and an existing image is reused.

An image that already exists in podman storage is left alone unless
``force`` is set.

Usage::

    python -m flowmesh_sdk.imagebuild [busybox|swe-base|code-runner|all] [--force] [--push REGISTRY]
    python -m flowmesh_sdk.imagebuild push REGISTRY [busybox|swe-base|all|swe-tasks] [--tls-verify true|false]
    python -m flowmesh_sdk.imagebuild task NAME DIR [--tag TAG] [--force] [--push REGISTRY]

(``python images/build.py ...`` in a checkout is the same command.)  As a module::

    from flowmesh_sdk import imagebuild
    ref = imagebuild.build_busybox()          # -> "localhost/flowmesh/busybox:1"
    ref = imagebuild.build_task_image("demo", {"m.py": b"...", "tests/test_m.py": b"..."})
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import functools
import hashlib
import ipaddress
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Iterator, Mapping, Sequence

from ..errors import FlowMeshError
from ..remote.runtime import runtime_flags, ulimit_flags

BUSYBOX_IMAGE = "localhost/flowmesh/busybox:1"
SWE_BASE_IMAGE = "localhost/flowmesh/swe-base:bookworm"
#: swe-base plus g++: python, bash and cpp for flowmesh serve sandbox-fusion; see build_code_runner()
CODE_RUNNER_IMAGE = "localhost/flowmesh/code-runner:bookworm"
CODE_RUNNER_CONTAINERFILE = Path(__file__).resolve().parent / "code-runner.Containerfile"

#: short name used in the CLI, in the ``io.flowmesh.image`` label and when pushing
IMAGES = {
    "busybox": BUSYBOX_IMAGE,
    "swe-base": SWE_BASE_IMAGE,
    "code-runner": CODE_RUNNER_IMAGE,
}

LABEL_IMAGE = "io.flowmesh.image"
LABEL_BUILT_FROM = "io.flowmesh.built-from"
LABEL_TASK = "io.flowmesh.task"
LABEL_REPO_DIGEST = "io.flowmesh.repo-digest"

#: ``localhost/flowmesh/swe-task-<name>:<tag>``; see build_task_image()
SWE_TASK_REPO_PREFIX = "localhost/flowmesh/swe-task-"
SWE_TASK_IMAGE_KIND = "swe-task"
SWE_TASK_REPO_DIR = "/work/repo"
SWE_TASK_CONTAINERFILE = Path(__file__).resolve().parent / "swe-task.Containerfile"
#: hex digits of the content hash used as the default tag
SWE_TASK_TAG_LEN = 12

SUITE = "bookworm"
SWE_BASE_PACKAGES = ("python3", "python3-pytest", "git")
DEFAULT_MIRROR = "http://deb.debian.org/debian"

#: Bump when the post-debootstrap customisation changes, so that a stale cached
#: tarball is rebuilt instead of re-imported.
SWE_BASE_RECIPE_VERSION = 1

GITCONFIG = """\
[user]
\tname = flowmesh
\temail = flowmesh@localhost
[init]
\tdefaultBranch = main
[safe]
\tdirectory = *
"""

BUSYBOX_CANDIDATES = ("/bin/busybox", "/usr/bin/busybox")


class ImageBuildError(FlowMeshError, RuntimeError):
    """A build step failed or a required tool is missing (message is one line)."""


# --------------------------------------------------------------------------- #
# small helpers
# --------------------------------------------------------------------------- #


def _log(msg: str) -> None:
    print(f"[images] {msg}", file=sys.stderr, flush=True)


def _require(tool: str, package: str) -> str:
    path = shutil.which(tool) or next(
        (p for p in (f"/usr/sbin/{tool}", f"/sbin/{tool}") if os.access(p, os.X_OK)), None
    )
    if not path:
        raise ImageBuildError(
            f"{tool} not found; install it with: apt-get install -y {package}"
        )
    return path


def _run(cmd: Sequence[str], *, what: str, capture: bool = False, **kw) -> subprocess.CompletedProcess:
    """Run ``cmd`` with check semantics and turn failures into ImageBuildError."""
    try:
        return subprocess.run(
            list(cmd),
            check=True,
            text=True,
            stdout=subprocess.PIPE if capture else None,
            stderr=subprocess.PIPE if capture else None,
            **kw,
        )
    except FileNotFoundError as exc:
        raise ImageBuildError(f"{what}: {cmd[0]} not found") from exc
    except subprocess.CalledProcessError as exc:
        detail = ""
        if capture and exc.stderr:
            lines = [ln for ln in exc.stderr.strip().splitlines() if ln.strip()]
            if lines:
                detail = f": {lines[-1].strip()}"
        raise ImageBuildError(
            f"{what} failed (exit {exc.returncode}): {' '.join(cmd[:4])}...{detail}"
        ) from exc


def _podman() -> str:
    return _require("podman", "podman")


def image_exists(ref: str) -> bool:
    """True when ``ref`` is present in the local podman storage."""
    return subprocess.run(
        [_podman(), "image", "exists", ref],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    ).returncode == 0


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "flowmesh" / "images"


def swe_base_cache_tarball() -> Path:
    return cache_dir() / f"swe-base-{SUITE}.tar"


@functools.cache
def _local_host() -> tuple[int | None, str, bool, bool]:
    """This host's facts for the runtime's flag rules (remote/runtime.py): the CapEff
    mask, the hard nofile limit, cgroups v2, runc installed (read once per process)."""
    cap: int | None = None
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("CapEff:"):
                    cap = int(line.split()[1], 16)
    except (OSError, ValueError):
        cap = None
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return (cap, "" if hard == resource.RLIM_INFINITY else str(hard),
            os.path.exists("/sys/fs/cgroup/cgroup.controllers"), shutil.which("runc") is not None)


def podman_run_ulimit_args() -> list[str]:
    """The ``--ulimit`` pins ``podman run`` needs on this host: those of the SDK's runtime
    probe (``remote.runtime.ulimit_flags``; none with CAP_SYS_RESOURCE)."""
    cap, hard, _, _ = _local_host()
    return ulimit_flags(cap, hard)


def podman_runtime_args() -> list[str]:
    """The ``--runtime`` the SDK's runtime probe picks on this host
    (``remote.runtime.runtime_flags``, ``oci_runtime="auto"``): runc on cgroups v1 when it
    is installed.  Without it a host with crun installed builds with crun, which refuses
    hybrid cgroups, and every RUN step fails."""
    _, _, v2, has_runc = _local_host()
    return runtime_flags("auto", binary=os.path.basename(_podman()), cgroups_v2=v2, has_runc=has_runc)


def _debian_mirror() -> str:
    """The Debian mirror apt already uses on this host (deb822 or one-line format)."""
    env = os.environ.get("FLOWMESH_DEBIAN_MIRROR")
    if env:
        return env
    candidates: list[str] = []
    deb822 = Path("/etc/apt/sources.list.d/debian.sources")
    if deb822.is_file():
        for line in deb822.read_text(errors="replace").splitlines():
            if line.strip().lower().startswith("uris:"):
                candidates += line.split(":", 1)[1].split()
    legacy = Path("/etc/apt/sources.list")
    if legacy.is_file():
        for line in legacy.read_text(errors="replace").splitlines():
            parts = line.split()
            if parts and parts[0] == "deb":
                candidates += [p for p in parts[1:] if "://" in p][:1]
    for uri in candidates:
        if "security" not in uri:
            return uri.rstrip("/")
    return DEFAULT_MIRROR


def _mounts_under(root: Path) -> list[str]:
    """Mount points at or below ``root`` (deepest first)."""
    prefix = str(root).rstrip("/") + "/"
    found = []
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                mnt = line.split()[4].replace("\\040", " ")
                if mnt == str(root) or mnt.startswith(prefix):
                    found.append(mnt)
    except OSError:
        pass
    return sorted(set(found), key=len, reverse=True)


@contextlib.contextmanager
def _workdir(prefix: str) -> Iterator[Path]:
    """A temporary directory under /var/tmp (large) that is removed afterwards.

    debootstrap mounts /proc, /sys and sometimes /dev inside the target; if it
    dies half-way these can stay mounted, and deleting the tree would then
    reach into the host. Anything still mounted is unmounted first, and the
    tree is left in place (with a warning) if that fails.
    """
    base = "/var/tmp" if os.path.isdir("/var/tmp") and os.access("/var/tmp", os.W_OK) else None
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    try:
        yield path
    finally:
        for mnt in _mounts_under(path):
            subprocess.run(["umount", mnt], stderr=subprocess.DEVNULL)
        for mnt in _mounts_under(path):
            subprocess.run(["umount", "-l", mnt], stderr=subprocess.DEVNULL)
        if _mounts_under(path):
            _log(f"warning: {path} still has mounts below it; not deleting it")
        else:
            shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def _lock(name: str) -> Iterator[None]:
    """Serialise concurrent builds of the same image (e.g. parallel test workers)."""
    d = cache_dir()
    d.mkdir(parents=True, exist_ok=True)
    with open(d / f".{name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _image_id(ref: str) -> str | None:
    res = subprocess.run([_podman(), "image", "inspect", "--format", "{{.Id}}", ref],
                         capture_output=True, text=True)
    return res.stdout.strip() or None if res.returncode == 0 else None


def _import(tarball: Path, ref: str, *, name: str, built_from: str) -> None:
    previous = _image_id(ref)
    cmd = [
        _podman(), "import", "--quiet",
        "--change", 'CMD ["/bin/sh"]',
        "--change", "WORKDIR /",
        "--change", f'LABEL {LABEL_IMAGE}="{name}"',
        "--change", f'LABEL {LABEL_BUILT_FROM}="{built_from}"',
        str(tarball), ref,
    ]
    _run(cmd, what=f"podman import {ref}", capture=True)
    if previous and previous != _image_id(ref):
        # --force re-import: drop the image the tag used to name, unless
        # something (another tag, a container) still uses it.
        subprocess.run([_podman(), "image", "rm", previous],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


# --------------------------------------------------------------------------- #
# busybox
# --------------------------------------------------------------------------- #


def _is_static_elf(path: str) -> bool:
    """True when ``path`` is an ELF executable without a PT_INTERP header."""
    import struct

    with open(path, "rb") as fh:
        ident = fh.read(16)
        if ident[:4] != b"\x7fELF":
            return False
        is64 = ident[4] == 2
        end = "<" if ident[5] == 1 else ">"
        if is64:
            fh.seek(0x20)
            (phoff,) = struct.unpack(end + "Q", fh.read(8))
            fh.seek(0x36)
        else:
            fh.seek(0x1C)
            (phoff,) = struct.unpack(end + "I", fh.read(4))
            fh.seek(0x2A)
        phentsize, phnum = struct.unpack(end + "HH", fh.read(4))
        for i in range(phnum):
            fh.seek(phoff + i * phentsize)
            (p_type,) = struct.unpack(end + "I", fh.read(4))
            if p_type == 3:  # PT_INTERP
                return False
    return True


def _find_busybox() -> str:
    for cand in (*BUSYBOX_CANDIDATES, shutil.which("busybox")):
        if cand and os.access(cand, os.X_OK) and _is_static_elf(os.path.realpath(cand)):
            return cand
    raise ImageBuildError(
        "static busybox not found; install it with: apt-get install -y busybox-static"
    )


def _busybox_applets(busybox: str) -> list[str]:
    """Applet paths relative to / (``usr/bin/env``, ``bin/sh``, ...)."""
    res = subprocess.run([busybox, "--list-full"], capture_output=True, text=True)
    if res.returncode == 0 and res.stdout.strip():
        return [ln.strip().lstrip("/") for ln in res.stdout.splitlines() if ln.strip()]
    res = _run([busybox, "--list"], what="busybox --list", capture=True)
    return [f"bin/{ln.strip()}" for ln in res.stdout.splitlines() if ln.strip()]


def _root_owned(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def build_busybox(force: bool = False) -> str:
    """Build ``localhost/flowmesh/busybox:1`` from the host's static busybox."""
    _podman()
    busybox = _find_busybox()
    with _lock("busybox"):
        if not force and image_exists(BUSYBOX_IMAGE):
            _log(f"{BUSYBOX_IMAGE} already present (use --force to rebuild)")
            return BUSYBOX_IMAGE
        t0 = time.monotonic()
        _log(f"building {BUSYBOX_IMAGE} from {busybox}")
        with _workdir("flowmesh-busybox-") as work:
            root = work / "rootfs"
            for d in ("bin", "sbin", "usr/bin", "usr/sbin", "etc", "root", "proc", "sys", "dev"):
                (root / d).mkdir(parents=True, exist_ok=True)
            (root / "tmp").mkdir()
            os.chmod(root / "tmp", 0o1777)
            os.chmod(root / "root", 0o700)
            shutil.copy2(busybox, root / "bin" / "busybox")
            os.chmod(root / "bin" / "busybox", 0o755)
            for applet in _busybox_applets(busybox):
                if "/" not in applet or applet == "bin/busybox":
                    continue  # e.g. "linuxrc" (init glue, not wanted here)
                link = root / applet
                if link.exists() or link.is_symlink():
                    continue
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to(os.path.relpath(root / "bin" / "busybox", link.parent))
            (root / "etc" / "passwd").write_text(
                "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
            )
            (root / "etc" / "group").write_text("root:x:0:\nnogroup:x:65534:\n")
            tarball = work / "rootfs.tar"
            with tarfile.open(tarball, "w", format=tarfile.PAX_FORMAT) as tar:
                for entry in sorted(os.listdir(root)):
                    tar.add(root / entry, arcname=entry, filter=_root_owned)
            _import(tarball, BUSYBOX_IMAGE, name="busybox", built_from="busybox")
        _log(f"built {BUSYBOX_IMAGE} in {time.monotonic() - t0:.1f}s")
    return BUSYBOX_IMAGE


# --------------------------------------------------------------------------- #
# swe-base (debootstrap)
# --------------------------------------------------------------------------- #


def _swe_base_recipe() -> dict:
    return {
        "suite": SUITE,
        "variant": "minbase",
        "packages": list(SWE_BASE_PACKAGES),
        "recipe_version": SWE_BASE_RECIPE_VERSION,
    }


def _cached_tarball_ok(tarball: Path) -> bool:
    stamp = tarball.with_suffix(".json")
    if not tarball.is_file() or not stamp.is_file():
        return False
    try:
        return json.loads(stamp.read_text()) == _swe_base_recipe()
    except (OSError, ValueError):
        return False


def _customise_tree(root: Path) -> None:
    """Post-debootstrap tweaks: drop apt caches, git defaults, sane /tmp, empty /dev."""
    for pattern in ("var/cache/apt/archives/*.deb", "var/cache/apt/*.bin",
                    "var/cache/apt/archives/partial/*", "var/lib/apt/lists/*"):
        for p in root.glob(pattern):
            if p.name == "lock" or p.name == "partial":
                continue
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
    # The runtime provides /dev; leave an empty directory so that the tarball
    # holds no device nodes (rootless import cannot create them).
    dev = root / "dev"
    if dev.is_dir() and not _mounts_under(dev):
        for p in dev.iterdir():
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
    (root / "etc" / "gitconfig").write_text(GITCONFIG)
    tmp = root / "tmp"
    tmp.mkdir(exist_ok=True)
    os.chmod(tmp, 0o1777)
    # podman supplies these at run time; don't bake in the build host's.
    for name in ("etc/hostname", "etc/resolv.conf"):
        p = root / name
        if p.is_file() and not p.is_symlink():
            p.write_text("")


def _debootstrap_to_tarball(tarball: Path) -> None:
    debootstrap = _require("debootstrap", "debootstrap")
    tar = _require("tar", "tar")
    if os.geteuid() != 0:
        raise ImageBuildError(
            f"debootstrap needs root; run as root (or place a prebuilt tree at {tarball})"
        )
    mirror = _debian_mirror()
    tarball.parent.mkdir(parents=True, exist_ok=True)
    with _workdir("flowmesh-swe-base-") as work:
        root = work / "rootfs"
        _log(f"debootstrap {SUITE} from {mirror} (about a minute)")
        t0 = time.monotonic()
        log_path = work / "debootstrap.log"
        with open(log_path, "w") as log:
            proc = subprocess.run(
                [debootstrap, "--variant=minbase",
                 f"--include={','.join(SWE_BASE_PACKAGES)}",
                 SUITE, str(root), mirror],
                stdout=log, stderr=subprocess.STDOUT,
            )
        if proc.returncode != 0:
            tail = log_path.read_text(errors="replace").strip().splitlines()[-1:] or [""]
            raise ImageBuildError(
                f"debootstrap {SUITE} failed (exit {proc.returncode}): {tail[0].strip()}"
            )
        _log(f"debootstrap done in {time.monotonic() - t0:.0f}s; customising tree")
        if _mounts_under(root):
            raise ImageBuildError(f"debootstrap left mounts under {root}: {_mounts_under(root)}")
        _customise_tree(root)
        _log(f"writing cache tarball {tarball}")
        partial = tarball.with_name(tarball.name + ".partial")
        _run([tar, "--numeric-owner", "-C", str(root), "-cf", str(partial), "."],
             what="tar of debootstrap tree", capture=True)
        os.replace(partial, tarball)
        tarball.with_suffix(".json").write_text(json.dumps(_swe_base_recipe(), indent=1) + "\n")


def build_swe_base(force: bool = False) -> str:
    """Build ``localhost/flowmesh/swe-base:bookworm`` (debootstrap, cached)."""
    _podman()
    with _lock("swe-base"):
        if not force and image_exists(SWE_BASE_IMAGE):
            _log(f"{SWE_BASE_IMAGE} already present (use --force to rebuild)")
            return SWE_BASE_IMAGE
        t0 = time.monotonic()
        tarball = swe_base_cache_tarball()
        if force or not _cached_tarball_ok(tarball):
            _debootstrap_to_tarball(tarball)
        else:
            _log(f"reusing cached tree {tarball}")
        _log(f"podman import {SWE_BASE_IMAGE}")
        _import(tarball, SWE_BASE_IMAGE, name="swe-base", built_from=f"debootstrap {SUITE}")
        _log(f"built {SWE_BASE_IMAGE} in {time.monotonic() - t0:.1f}s")
    return SWE_BASE_IMAGE


# --------------------------------------------------------------------------- #
# SWE-style task images (podman build FROM swe-base)
# --------------------------------------------------------------------------- #

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


def podman_build_args() -> list[str]:
    """Flags that every ``podman build`` here gets.

    ``--pull=never`` (the base is local; never go online) and
    ``--network=none`` (RUN steps need no network); the OCI runtime the SDK's runtime
    probe picks (:func:`podman_runtime_args`). On hosts without
    CAP_SYS_RESOURCE, the same ``--ulimit`` pins as for ``podman run``
    are added. podman 4.3's RUN steps already start with nofile=1024:1024, a
    lowered limit that is allowed, so today they work without the pins too. The
    pins make RUN steps work even when containers.conf sets default_ulimits
    above the host's hard limit.
    """
    return ["--pull=never", "--network=none", *podman_runtime_args(), *podman_run_ulimit_args()]


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


# --------------------------------------------------------------------------- #
# code-runner (podman build FROM swe-base, g++ from the Debian mirror)
# --------------------------------------------------------------------------- #


def build_code_runner(force: bool = False) -> str:
    """Build ``localhost/flowmesh/code-runner:bookworm``: swe-base plus Debian's g++ (one
    squashed layer, ``code-runner.Containerfile``), the default image of the
    SandboxFusion-compatible server's languages (python, bash, cpp).  Unlike the task
    images its RUN step needs the network (apt-get from swe-base's Debian mirror).
    swe-base is built first if it is missing.  Returns the image reference."""
    podman = _podman()
    with _lock("code-runner"):
        if not force and image_exists(CODE_RUNNER_IMAGE):
            _log(f"{CODE_RUNNER_IMAGE} already present (use --force to rebuild)")
            return CODE_RUNNER_IMAGE
        if not image_exists(SWE_BASE_IMAGE):
            build_swe_base()
        t0 = time.monotonic()
        previous = _image_id(CODE_RUNNER_IMAGE)
        with _workdir("flowmesh-code-runner-") as ctx:
            text = CODE_RUNNER_CONTAINERFILE.read_text().replace("@@BASE_IMAGE@@", SWE_BASE_IMAGE)
            (ctx / "Containerfile").write_text(text)
            cmd = [podman, "build", "--squash", "--pull=never", *podman_runtime_args(), *podman_run_ulimit_args(),
                   "-f", str(ctx / "Containerfile"), "-t", CODE_RUNNER_IMAGE, str(ctx)]
            proc = subprocess.run(cmd, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            if proc.returncode != 0:
                tail = [ln.strip() for ln in proc.stdout.strip().splitlines() if ln.strip()][-3:]
                raise ImageBuildError(f"podman build {CODE_RUNNER_IMAGE} failed (exit {proc.returncode}): "
                                      f"{' | '.join(tail)}")
        new_id = _image_id(CODE_RUNNER_IMAGE)
        if previous and new_id and previous != new_id:
            subprocess.run([podman, "image", "rm", previous], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _log(f"built {CODE_RUNNER_IMAGE} in {time.monotonic() - t0:.1f}s")
    return CODE_RUNNER_IMAGE


# --------------------------------------------------------------------------- #
# push / CLI
# --------------------------------------------------------------------------- #


def parse_registry(registry: str) -> tuple[str, int | None]:
    """``HOST[:PORT][/PATH]`` -> (host, port); raises ImageBuildError on anything else.

    IPv6 addresses need brackets (``[::1]:5000``). A scheme (``http://``) is
    refused, because podman takes a bare registry name.
    """
    if not isinstance(registry, str) or not registry.strip():
        raise ImageBuildError("registry is empty: give it as HOST:PORT, e.g. 127.0.0.1:5000")
    reg = registry.strip()
    if "://" in reg:
        raise ImageBuildError(
            f"bad registry {registry!r}: give it as HOST:PORT without a scheme (e.g. 127.0.0.1:5000)"
        )
    hostport = reg.split("/", 1)[0]
    m = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\](?::(\d+))?", hostport) or re.fullmatch(
        r"([A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?)(?::(\d+))?", hostport)
    if not m:
        raise ImageBuildError(f"bad registry {registry!r}: expected HOST:PORT, e.g. 127.0.0.1:5000")
    host, port_s = m.group(1), m.group(2)
    port = int(port_s) if port_s is not None else None
    if port is not None and not 0 < port < 65536:
        raise ImageBuildError(f"bad registry {registry!r}: port {port} is out of range")
    return host, port


def is_loopback_registry(registry: str) -> bool:
    """True for ``localhost``, 127.0.0.0/8 and ``[::1]`` registries."""
    host, _ = parse_registry(registry)
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def resolve_tls_verify(registry: str, tls_verify: bool | None = None) -> bool:
    """The ``--tls-verify`` value that a push to ``registry`` uses.

    None -> False for loopback registries and True otherwise. An explicit False
    for a non-loopback host raises ImageBuildError.
    """
    host, _ = parse_registry(registry)
    loopback = is_loopback_registry(registry)
    if tls_verify is None:
        return not loopback
    if not tls_verify and not loopback:
        raise ImageBuildError(
            f"refusing --tls-verify=false for registry {registry!r}: {host} is not a loopback "
            "address; unverified/plain-HTTP pushes are only allowed to 127.0.0.0/8, localhost "
            "or [::1]. Give that registry a TLS certificate that this host trusts."
        )
    return bool(tls_verify)


def push(ref: str, registry: str, *, tls_verify: bool | None = None) -> str:
    """Tag ``ref`` as ``REGISTRY/flowmesh/NAME:TAG`` and push it.

    ``tls_verify=None`` (the default) means ``--tls-verify=false`` for a loopback
    registry (127.0.0.0/8, localhost, [::1]), which serves plain HTTP, and
    ``--tls-verify=true`` for every other host. Asking for
    ``tls_verify=False`` with a non-loopback host raises ImageBuildError.
    """
    tls_verify = resolve_tls_verify(registry, tls_verify)
    repo_tag = ref.split("/", 1)[1] if ref.startswith("localhost/") else ref
    target = f"{registry.strip().rstrip('/')}/{repo_tag}"
    podman = _podman()
    _log(f"pushing {ref} -> {target}" + ("" if tls_verify else " (loopback: TLS not verified)"))
    _run([podman, "tag", ref, target], what=f"podman tag {target}", capture=True)
    _run([podman, "push", f"--tls-verify={'true' if tls_verify else 'false'}", "--quiet", target],
         what=f"podman push {target}", capture=True)
    return target


_BUILDERS = {"busybox": build_busybox, "swe-base": build_swe_base, "code-runner": build_code_runner}
_ALL = ("busybox", "swe-base")   # what "all" builds (code-runner needs the network: by name only)


def _tls_arg(value: str) -> bool | None:
    v = value.strip().lower()
    if v in ("auto", ""):
        return None
    if v in ("true", "1", "yes"):
        return True
    if v in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"invalid value {value!r} (allowed: auto, true, false)")


def _add_tls_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tls-verify", type=_tls_arg, default=None, metavar="auto|true|false",
        help="auto (default): false for a loopback registry (127.0.0.0/8, localhost, [::1]), "
             "true otherwise; false is refused for other hosts")


def _build_and_push(names: Sequence[str], *, force: bool, registry: str | None,
                    tls_verify: bool | None) -> None:
    if registry:
        # fail on a bad registry or a refused --tls-verify=false before building anything
        resolve_tls_verify(registry, tls_verify)
    for name in names:
        if name == "swe-tasks":
            refs = list_task_images()
            if not refs:
                _log("no swe-task images in podman storage")
        else:
            refs = [_BUILDERS[name](force=force)]
        for ref in refs:
            print(ref, flush=True)
            if registry:
                print(push(ref, registry, tls_verify=tls_verify), flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    prog = "python -m flowmesh_sdk.imagebuild"
    try:
        if argv and argv[0] == "push":
            p = argparse.ArgumentParser(
                prog=f"{prog} push",
                description="Build the project images (cached) and push them to REGISTRY as "
                            "REGISTRY/flowmesh/NAME:TAG.")
            p.add_argument("registry", metavar="REGISTRY", help="HOST:PORT, e.g. 127.0.0.1:5000")
            p.add_argument("image", nargs="?", default="all",
                           choices=[*_BUILDERS, "all", "swe-tasks"],
                           help="all (default) = busybox and swe-base; swe-tasks = every "
                                "swe-task image already in podman storage")
            p.add_argument("--force", action="store_true", help="rebuild before pushing")
            _add_tls_flag(p)
            a = p.parse_args(argv[1:])
            names = list(_ALL) if a.image == "all" else [a.image]
            _build_and_push(names, force=a.force, registry=a.registry, tls_verify=a.tls_verify)
        elif argv and argv[0] == "task":
            p = argparse.ArgumentParser(
                prog=f"{prog} task",
                description="Build localhost/flowmesh/swe-task-NAME:TAG from the files in DIR "
                            "(committed at /work/repo on top of swe-base).")
            p.add_argument("name", metavar="NAME")
            p.add_argument("directory", metavar="DIR")
            p.add_argument("--tag", help="image tag (default: a content hash of the files)")
            p.add_argument("--force", action="store_true", help="rebuild even if the image exists")
            p.add_argument("--push", metavar="REGISTRY", help="also push it to REGISTRY (HOST:PORT)")
            _add_tls_flag(p)
            a = p.parse_args(argv[1:])
            if a.push:
                resolve_tls_verify(a.push, a.tls_verify)  # before building
            ref = build_task_image(a.name, task_files_from_dir(a.directory), a.tag, force=a.force)
            print(ref, flush=True)
            if a.push:
                print(push(ref, a.push, tls_verify=a.tls_verify), flush=True)
        else:
            p = argparse.ArgumentParser(
                prog=prog,
                description="Build FlowMesh's local podman images (cached). Also: "
                            f"'{prog} push REGISTRY [IMAGE]' and '{prog} task NAME DIR'.")
            p.add_argument("image", nargs="?", default="all", choices=[*_BUILDERS, "all"])
            p.add_argument("--force", action="store_true",
                           help="rebuild even if the image exists (swe-base: also re-run debootstrap)")
            p.add_argument("--push", metavar="REGISTRY",
                           help="also push to REGISTRY (HOST:PORT, e.g. 127.0.0.1:5000) as "
                                "REGISTRY/flowmesh/NAME:TAG")
            _add_tls_flag(p)
            a = p.parse_args(argv)
            names = list(_ALL) if a.image == "all" else [a.image]
            _build_and_push(names, force=a.force, registry=a.push, tls_verify=a.tls_verify)
    except ImageBuildError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
