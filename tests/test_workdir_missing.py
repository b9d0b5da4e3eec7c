"""Issue 12, defect 11 (last part): a ``workdir`` the image lacks fails the sandbox's start
(podman: 'workdir ... does not exist', exit 126 from ``podman run``).  The container
podman created for it must not stay behind until the pool drains.

The failure comes from ``runtime.start`` (``podman run -i``), before ``Sandbox.start``;
the runtime, and the pool's sandboxes after it, remove the container by name when the
start fails."""

import pytest

from flowmesh_sdk import InstanceSpec, SandboxSpec
from flowmesh_sdk.errors import ContainerRuntimeError

from conftest import podman_names


async def test_a_missing_workdir_leaves_no_container_behind(fleet, busybox_image):
    pool = await fleet.pool(name="wd", instance=InstanceSpec(cpus=1, memory_gb=1))
    spec = SandboxSpec(image=busybox_image, cpus=1, memory_gb=0.5, workdir="/does/not/exist")
    with pytest.raises(ContainerRuntimeError, match="does not exist"):
        async with pool.sandbox(spec):
            pass
    left = podman_names("flowmesh.pool=wd")
    try:
        assert left == [], f"failed container(s) left behind until drain: {left}"
    finally:
        await pool.drain(timeout_s=30)
