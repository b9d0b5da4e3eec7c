"""``localhost/flowmesh/code-runner:bookworm``: swe-base plus Debian's g++ (python3, bash and
g++: python, bash and cpp) for the SandboxFusion-compatible server (``flowmesh serve
sandbox-fusion``), built with ``podman build`` from ``code-runner.Containerfile`` -- the
only build here that needs the network (apt-get)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from .host import (ImageBuildError, _image_id, _lock, _log, _podman, _workdir, image_exists, podman_run_ulimit_args,
                   podman_runtime_args)
from .swebase import SWE_BASE_IMAGE, build_swe_base

#: swe-base plus g++: python, bash and cpp for flowmesh serve sandbox-fusion; see build_code_runner()
CODE_RUNNER_IMAGE = "localhost/flowmesh/code-runner:bookworm"
CODE_RUNNER_CONTAINERFILE = Path(__file__).resolve().parent / "code-runner.Containerfile"

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
