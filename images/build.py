#!/usr/bin/env python3
"""Build FlowMesh's local container images into podman storage.

Two images, both built without a registry or a Dockerfile:

``localhost/flowmesh/busybox:1``
    The host's static busybox plus one symlink per applet. Builds in about a
    second; the unit tests use it.

``localhost/flowmesh/swe-base:bookworm``
    A ``debootstrap --variant=minbase`` Debian bookworm with python3,
    python3-pytest and git. The first build takes a minute or two; the
    debootstrap tree is cached as a tarball so a later import (for example after
    ``podman rmi``) skips debootstrap.

An image that already exists in podman storage is left alone unless
``force`` is set.

Usage::

    python images/build.py [busybox|swe-base|all] [--force] [--push REGISTRY]

As a module (stdlib only, loadable by path)::

    spec = importlib.util.spec_from_file_location("flowmesh_images", "images/build.py")
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
    ref = mod.build_busybox()          # -> "localhost/flowmesh/busybox:1"
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Iterator, Sequence

BUSYBOX_IMAGE = "localhost/flowmesh/busybox:1"
SWE_BASE_IMAGE = "localhost/flowmesh/swe-base:bookworm"

#: short name used in the CLI, in the ``io.flowmesh.image`` label and when pushing
IMAGES = {
    "busybox": BUSYBOX_IMAGE,
    "swe-base": SWE_BASE_IMAGE,
}

LABEL_IMAGE = "io.flowmesh.image"
LABEL_BUILT_FROM = "io.flowmesh.built-from"

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
CAP_SYS_RESOURCE = 24


class ImageBuildError(RuntimeError):
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


def podman_run_ulimit_args() -> list[str]:
    """Extra ``podman run`` flags needed on hosts without CAP_SYS_RESOURCE.

    Without that capability the runtime cannot raise RLIMIT_NOFILE/NPROC to
    podman's defaults, so containers fail to start unless the limits are pinned
    to something the host already allows.
    """
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("CapEff:"):
                    caps = int(line.split()[1], 16)
                    if caps & (1 << CAP_SYS_RESOURCE):
                        return []
                    return ["--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096"]
    except (OSError, ValueError):
        pass
    return []


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
# push / CLI
# --------------------------------------------------------------------------- #


def push(ref: str, registry: str) -> str:
    """Tag ``ref`` as ``REGISTRY/flowmesh/NAME:TAG`` and push it (TLS not verified)."""
    repo_tag = ref.split("/", 1)[1] if ref.startswith("localhost/") else ref
    target = f"{registry.rstrip('/')}/{repo_tag}"
    podman = _podman()
    _log(f"pushing {ref} -> {target}")
    _run([podman, "tag", ref, target], what=f"podman tag {target}", capture=True)
    _run([podman, "push", "--tls-verify=false", "--quiet", target],
         what=f"podman push {target}", capture=True)
    return target


_BUILDERS = {"busybox": build_busybox, "swe-base": build_swe_base}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="images/build.py",
        description="Build FlowMesh's local podman images (cached).",
    )
    parser.add_argument("image", nargs="?", default="all", choices=[*_BUILDERS, "all"])
    parser.add_argument("--force", action="store_true",
                        help="rebuild even if the image exists (swe-base: also re-run debootstrap)")
    parser.add_argument("--push", metavar="REGISTRY",
                        help="also push to REGISTRY (e.g. 127.0.0.1:5000) as REGISTRY/flowmesh/NAME:TAG")
    args = parser.parse_args(argv)

    names = list(_BUILDERS) if args.image == "all" else [args.image]
    try:
        for name in names:
            ref = _BUILDERS[name](force=args.force)
            print(ref)
            if args.push:
                print(push(ref, args.push))
    except ImageBuildError as exc:
        print(f"images/build.py: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("images/build.py: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
