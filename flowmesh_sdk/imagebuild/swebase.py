"""``localhost/flowmesh/swe-base:bookworm``: a ``debootstrap --variant=minbase`` Debian
bookworm with python3, python3-pytest and git.  The first build takes a minute or two; the
debootstrap tree is cached as a tarball so a later import (for example after ``podman rmi``)
skips debootstrap."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from .host import (ImageBuildError, _import, _lock, _log, _mounts_under, _podman, _require, _run, _workdir,
                   cache_dir, image_exists)

SWE_BASE_IMAGE = "localhost/flowmesh/swe-base:bookworm"

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


def swe_base_cache_tarball() -> Path:
    return cache_dir() / f"swe-base-{SUITE}.tar"


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
