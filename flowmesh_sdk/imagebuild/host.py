"""What every image build here shares: the error, the image labels, and the commands run on
the host (podman, locks, work directories under /var/tmp, the runtime flags of this host's
``podman build``/``podman run``, ``podman import`` of a root tarball).

The builders (:mod:`.busybox`, :mod:`.swebase`, :mod:`.coderunner`, :mod:`.tasks`) and the
push (:mod:`.pushing`) sit on top of it; :mod:`.build` re-exports every public name.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator, Sequence

from ..errors import FlowMeshError
from ..remote.runtime import runtime_flags, ulimit_flags

LABEL_IMAGE = "io.flowmesh.image"
LABEL_BUILT_FROM = "io.flowmesh.built-from"
LABEL_TASK = "io.flowmesh.task"
LABEL_REPO_DIGEST = "io.flowmesh.repo-digest"


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


def _run(cmd: Sequence[str], *, what: str, capture: bool = False,
         **kw: Any) -> subprocess.CompletedProcess[str]:
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
