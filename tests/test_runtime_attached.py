"""Issue 29, cold starts: a sandbox's container and its first agent channel come from one
runtime process (``podman run -i``, :meth:`ContainerRuntime.start`) instead of two
(``run -d`` then ``exec -i``).  What the attached channel must keep of an ``exec -i`` one,
on real podman: the agent runs a command; its death reads as the channel's end at once
(not at the call's timeout); closing it ends the client but not the container; a
container that cannot start says why and leaves nothing behind.  And
:meth:`Channel.kill`, which closing an attached channel needs, does not wait for the
process to exit by itself."""

import uuid

import pytest

from flowmesh_sdk.errors import ContainerRuntimeError, SandboxClosedError
from flowmesh_sdk.remote.attached import AttachedChannel
from flowmesh_sdk.remote.local import LocalRunner
from flowmesh_sdk.remote.runtime import ContainerRuntime
from flowmesh_sdk.sandbox import Sandbox
from flowmesh_sdk.specs import SandboxSpec

from conftest import podman_names


def _label() -> dict[str, str]:
    return {"flowmesh.test": f"attached-{uuid.uuid4().hex[:8]}"}


async def test_the_first_agent_runs_on_the_containers_own_stdio(busybox_image):
    rt, labels = ContainerRuntime(LocalRunner()), _label()
    name = f"fmt-att-{uuid.uuid4().hex[:8]}"
    spec = SandboxSpec(image=busybox_image, cpus=1, memory_gb=0.25)
    cid, shell = await rt.start(name, spec, labels)
    assert cid == name and isinstance(shell, AttachedChannel)
    sb = Sandbox(rt, cid, name, spec, shell=shell)
    try:
        await sb.open()
        agent = sb._channels.idle[0]
        assert agent.chan is shell, "the first agent must start on the channel the container came with"
        r = await sb.exec("echo out; echo err >&2; exit 3")
        assert (r.exit_code, r.stdout, r.stderr) == (3, "out\n", "err\n")
        # PID 1 stays the idle loop (the sandbox outlives its first channel); the agent is not it
        ps = await sb.exec("cat /proc/1/cmdline | tr '\\0' ' '")
        assert "sleep 86400" in ps.stdout and agent.pid != 1

        # the agent killed from inside: the call on it sees the channel end now, as with exec -i
        with pytest.raises(SandboxClosedError, match="channel closed"):
            await sb.exec(f"kill -9 {agent.pid}", timeout_s=600)
        assert not shell.alive
        again = await sb.exec("echo again")   # a new channel (exec -i) into the same container
        assert again.stdout == "again\n"
        assert podman_names(f"flowmesh.test={labels['flowmesh.test']}") == [name]
    finally:
        await sb.close()
    assert podman_names(f"flowmesh.test={labels['flowmesh.test']}") == []


async def test_closing_the_attached_channel_leaves_the_container_running(busybox_image):
    rt, labels = ContainerRuntime(LocalRunner()), _label()
    name = f"fmt-att-{uuid.uuid4().hex[:8]}"
    spec = SandboxSpec(image=busybox_image, cpus=1, memory_gb=0.25)
    cid, shell = await rt.start(name, spec, labels)
    try:
        assert shell is not None
        await shell.close()
        assert not shell.alive
        [info] = await rt.list(labels)
        assert info.state == "running"
        sb = Sandbox(rt, cid, name, spec)     # the container serves channels opened later
        await sb.open()
        assert (await sb.exec("echo still")).stdout == "still\n"
        await sb.close()
    finally:
        await rt.remove([cid])


async def test_a_container_that_cannot_start_says_why_and_is_removed(busybox_image):
    rt, labels = ContainerRuntime(LocalRunner()), _label()
    name = f"fmt-att-{uuid.uuid4().hex[:8]}"
    spec = SandboxSpec(image=busybox_image, cpus=1, memory_gb=0.25, workdir="/does/not/exist")
    with pytest.raises(ContainerRuntimeError, match="does not exist") as err:
        await rt.start(name, spec, labels)
    assert name in str(err.value)
    assert podman_names(f"flowmesh.test={labels['flowmesh.test']}") == []


async def test_kill_does_not_wait_for_the_process_to_exit_by_itself():
    # `cat` ends at EOF, then the shell takes a second more and exits 7: close() waits for
    # that (status 7); kill() does not (killed: -9)
    argv = ["sh", "-c", "cat >/dev/null; sleep 1; exit 7"]
    runner = LocalRunner()
    closed = await runner.open_channel(argv)
    await closed.close()
    killed = await runner.open_channel(argv)
    await killed.kill()
    assert (closed._proc.returncode, killed._proc.returncode) == (7, -9)   # type: ignore[attr-defined]


def test_a_full_kernel_key_quota_is_named_with_its_setting():
    # what runc says when the 201st container of one uid map starts on a host with the
    # kernel's default quota (kernel.keys.maxkeys = 200 for a uid other than root)
    stderr = ("Error: OCI runtime error: runc: runc create failed: unable to start container process: "
              "error during container init: unable to join session keyring: unable to create session key: "
              "disk quota exceeded")
    rt = ContainerRuntime(LocalRunner())
    err = rt._start_error(SandboxSpec(image="x"), stderr, stderr)
    assert isinstance(err, ContainerRuntimeError)
    assert "kernel.keys.maxkeys" in str(err) and "disk quota exceeded" in str(err)
    other = rt._start_error(SandboxSpec(image="x"), "Error: workdir does not exist", "Error: workdir does not exist")
    assert "kernel.keys" not in str(other)
