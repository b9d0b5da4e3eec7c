"""One choice of OCI runtime and ulimits for every podman command the SDK makes (issue 24
#17): ``podman build`` (imagebuild) gets what the runtime probe gives ``podman run``.
With crun installed on a cgroups-v1 host, podman would pick crun for a build, and crun
refuses hybrid cgroups: every RUN step failed."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from flowmesh_sdk.imagebuild import build as imagebuild
from flowmesh_sdk.remote.local import LocalRunner
from flowmesh_sdk.remote.runtime import ContainerRuntime, runtime_flags, ulimit_flags


@pytest.mark.parametrize("oci, binary, v2, runc, flags", [
    ("auto", "podman", False, True, ["--runtime", "runc"]),     # v1 + runc: runc, never crun
    ("auto", "podman", False, False, []),
    ("auto", "podman", True, True, []),                         # v2: podman's own choice
    ("auto", "docker", False, True, []),
    ("default", "podman", False, True, []),
    ("crun", "podman", False, True, ["--runtime", "crun"]),
])
def test_runtime_rule(oci, binary, v2, runc, flags):
    assert runtime_flags(oci, binary=binary, cgroups_v2=v2, has_runc=runc) == flags


def test_ulimit_rule():
    without = 0xffffffff & ~(1 << 24)
    assert ulimit_flags(None, "1048576") == []
    assert ulimit_flags(1 << 24, "1048576") == []
    assert ulimit_flags(without, "1048576") == ["--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096"]
    assert ulimit_flags(without, "1024")[:2] == ["--ulimit", "nofile=1024:1024"]


def _pairs(flags: list[str], name: str) -> list[str]:
    return [flags[i + 1] for i, f in enumerate(flags[:-1]) if f == name]


async def test_build_gets_the_probes_runtime_and_ulimits():
    info = await ContainerRuntime(LocalRunner()).probe()
    build = imagebuild.podman_build_args()
    assert _pairs(build, "--runtime") == _pairs(info.run_flags, "--runtime")
    assert _pairs(build, "--ulimit") == _pairs(info.run_flags, "--ulimit")
    assert _pairs(imagebuild.podman_run_ulimit_args(), "--ulimit") == _pairs(info.run_flags, "--ulimit")


@pytest.mark.skipif(shutil.which("crun") is None, reason="crun is not installed (apt-get install -y crun)")
def test_a_build_with_crun_installed_uses_the_probes_runtime(tmp_path):
    base = imagebuild.build_busybox()
    (tmp_path / "Containerfile").write_text(f"FROM {base}\nRUN echo built > /built\n")
    ref = "localhost/flowmesh/test-runtime-choice:1"
    try:
        res = subprocess.run(["podman", "build", *imagebuild.podman_build_args(), "-t", ref, str(tmp_path)],
                             capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    finally:
        subprocess.run(["podman", "rmi", "-f", ref], capture_output=True, timeout=120)
