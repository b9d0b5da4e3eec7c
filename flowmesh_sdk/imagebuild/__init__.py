"""The project's images, built on this machine from Debian packages (no registry, no
Dockerfile download): a function API over :mod:`.build`, and the GPU worker's image
definition (``gpu-worker/``: Containerfile and entrypoint) shipped as package data.

* :func:`build_busybox` -> ``localhost/flowmesh/busybox:1`` (about a second; the unit tests' image)
* :func:`build_swe_base` -> ``localhost/flowmesh/swe-base:bookworm`` (debootstrap, cached)
* :func:`build_code_runner` -> ``localhost/flowmesh/code-runner:bookworm`` (swe-base plus g++; needs the network)
* :func:`build_task_image` -> ``localhost/flowmesh/swe-task-NAME:TAG`` (one per SWE task repository)
* :func:`push` an image to a registry; :func:`list_task_images`, :func:`resolve_tls_verify`

From the shell: ``python -m flowmesh_sdk.imagebuild --help`` (in a checkout also
``python images/build.py``).  Each function is blocking (it runs podman); from async code
call it through ``asyncio.to_thread``.
"""

from __future__ import annotations

from pathlib import Path

from .build import (BUSYBOX_IMAGE, CODE_RUNNER_CONTAINERFILE, CODE_RUNNER_IMAGE, IMAGES, LABEL_BUILT_FROM,
                    LABEL_IMAGE, LABEL_REPO_DIGEST, LABEL_TASK,
                    SWE_BASE_IMAGE, SWE_BASE_PACKAGES, SWE_TASK_CONTAINERFILE, SWE_TASK_IMAGE_KIND,
                    SWE_TASK_REPO_DIR, SWE_TASK_REPO_PREFIX, ImageBuildError, build_busybox, build_code_runner,
                    build_swe_base,
                    build_task_image, cache_dir, image_exists, is_loopback_registry, list_task_images, main,
                    parse_registry, podman_build_args, podman_run_ulimit_args, podman_runtime_args, push,
                    resolve_tls_verify,
                    swe_base_cache_tarball, task_files_from_dir, task_image_ref, task_repo_digest)

#: the GPU worker's image definition (Containerfile, entrypoint.py, README.md); built on a GPU host
GPU_WORKER_DIR = Path(__file__).resolve().parent / "gpu-worker"
#: the worker's entrypoint, also run directly as a process by the training worker's process mode
GPU_WORKER_ENTRYPOINT = GPU_WORKER_DIR / "entrypoint.py"

__all__ = [
    "BUSYBOX_IMAGE", "CODE_RUNNER_CONTAINERFILE", "CODE_RUNNER_IMAGE", "GPU_WORKER_DIR", "GPU_WORKER_ENTRYPOINT",
    "IMAGES", "LABEL_BUILT_FROM", "LABEL_IMAGE",
    "LABEL_REPO_DIGEST", "LABEL_TASK", "SWE_BASE_IMAGE", "SWE_BASE_PACKAGES", "SWE_TASK_CONTAINERFILE",
    "SWE_TASK_IMAGE_KIND", "SWE_TASK_REPO_DIR", "SWE_TASK_REPO_PREFIX", "ImageBuildError", "build_busybox",
    "build_code_runner", "build_swe_base", "build_task_image", "cache_dir", "image_exists", "is_loopback_registry",
    "list_task_images", "main", "parse_registry", "podman_build_args", "podman_run_ulimit_args",
    "podman_runtime_args", "push",
    "resolve_tls_verify", "swe_base_cache_tarball", "task_files_from_dir", "task_image_ref",
    "task_repo_digest",
]
