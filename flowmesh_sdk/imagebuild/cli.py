"""``python -m flowmesh_sdk.imagebuild``: the command line over the builders and the push."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from .busybox import BUSYBOX_IMAGE, build_busybox
from .coderunner import CODE_RUNNER_IMAGE, build_code_runner
from .host import ImageBuildError, _log
from .pushing import push, resolve_tls_verify
from .swebase import SWE_BASE_IMAGE, build_swe_base
from .tasks import build_task_image, list_task_images, task_files_from_dir

#: short name used in the CLI, in the ``io.flowmesh.image`` label and when pushing
IMAGES = {
    "busybox": BUSYBOX_IMAGE,
    "swe-base": SWE_BASE_IMAGE,
    "code-runner": CODE_RUNNER_IMAGE,
}


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
