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

The code is split along its seams: :mod:`.host` (the error, the labels, the commands run
on the host), :mod:`.busybox`, :mod:`.swebase`, :mod:`.coderunner`, :mod:`.tasks` (the
builders), :mod:`.pushing` (push to a registry) and :mod:`.cli` (the command line).  This
module re-exports every name they had here, so ``flowmesh_sdk.imagebuild.build.X`` keeps
working.
"""

from __future__ import annotations

import sys

from .busybox import (BUSYBOX_CANDIDATES, BUSYBOX_IMAGE, _busybox_applets, _find_busybox, _is_static_elf,
                      _root_owned, build_busybox)
from .cli import _ALL, _BUILDERS, IMAGES, _add_tls_flag, _build_and_push, _tls_arg, main
from .coderunner import CODE_RUNNER_CONTAINERFILE, CODE_RUNNER_IMAGE, build_code_runner
from .host import (LABEL_BUILT_FROM, LABEL_IMAGE, LABEL_REPO_DIGEST, LABEL_TASK, ImageBuildError, _image_id,
                   _import, _local_host, _lock, _log, _mounts_under, _podman, _require, _run, _workdir, cache_dir,
                   image_exists, podman_build_args, podman_run_ulimit_args, podman_runtime_args)
from .pushing import is_loopback_registry, parse_registry, push, resolve_tls_verify
from .swebase import (DEFAULT_MIRROR, GITCONFIG, SUITE, SWE_BASE_IMAGE, SWE_BASE_PACKAGES, SWE_BASE_RECIPE_VERSION,
                      _cached_tarball_ok, _customise_tree, _debian_mirror, _debootstrap_to_tarball, _swe_base_recipe,
                      build_swe_base, swe_base_cache_tarball)
from .tasks import (_NAME_RE, _TAG_RE, SWE_TASK_CONTAINERFILE, SWE_TASK_IMAGE_KIND, SWE_TASK_REPO_DIR,
                    SWE_TASK_REPO_PREFIX, SWE_TASK_TAG_LEN, _fill_task_containerfile, _normalise_repo_files,
                    _task_template, build_task_image, list_task_images, task_files_from_dir, task_image_ref,
                    task_repo_digest)

__all__ = [
    "BUSYBOX_CANDIDATES", "BUSYBOX_IMAGE", "CODE_RUNNER_CONTAINERFILE", "CODE_RUNNER_IMAGE", "DEFAULT_MIRROR",
    "GITCONFIG", "IMAGES", "LABEL_BUILT_FROM", "LABEL_IMAGE", "LABEL_REPO_DIGEST", "LABEL_TASK", "SUITE",
    "SWE_BASE_IMAGE", "SWE_BASE_PACKAGES", "SWE_BASE_RECIPE_VERSION", "SWE_TASK_CONTAINERFILE",
    "SWE_TASK_IMAGE_KIND", "SWE_TASK_REPO_DIR", "SWE_TASK_REPO_PREFIX", "SWE_TASK_TAG_LEN", "ImageBuildError",
    "build_busybox", "build_code_runner", "build_swe_base", "build_task_image", "cache_dir", "image_exists",
    "is_loopback_registry", "list_task_images", "main", "parse_registry", "podman_build_args",
    "podman_run_ulimit_args", "podman_runtime_args", "push", "resolve_tls_verify", "swe_base_cache_tarball",
    "task_files_from_dir", "task_image_ref", "task_repo_digest",
    # the private helpers, for code that reached them here before the split
    "_ALL", "_BUILDERS", "_NAME_RE", "_TAG_RE", "_add_tls_flag", "_build_and_push", "_busybox_applets",
    "_cached_tarball_ok", "_customise_tree", "_debian_mirror", "_debootstrap_to_tarball", "_fill_task_containerfile",
    "_find_busybox", "_image_id", "_import", "_is_static_elf", "_local_host", "_lock", "_log", "_mounts_under",
    "_normalise_repo_files", "_podman", "_require", "_root_owned", "_run", "_swe_base_recipe", "_task_template",
    "_tls_arg", "_workdir",
]

if __name__ == "__main__":
    sys.exit(main())
