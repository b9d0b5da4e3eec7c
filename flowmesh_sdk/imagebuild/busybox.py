"""``localhost/flowmesh/busybox:1``: the host's static busybox plus one symlink per applet,
imported into podman storage (about a second; the unit tests' image)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import time

from .host import ImageBuildError, _import, _lock, _log, _podman, _run, _workdir, image_exists

BUSYBOX_IMAGE = "localhost/flowmesh/busybox:1"
BUSYBOX_CANDIDATES = ("/bin/busybox", "/usr/bin/busybox")


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
