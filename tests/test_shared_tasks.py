"""A pool's tasks on a shared fleet's queue (flowmesh_sdk.pools.shared.SharedTasks): two
coordinators as real OS processes (tests/_pool_worker.py), each with its own persistent
local pool ``eval`` on one Redis and one content-addressed store; the one that submitted
the tasks is SIGKILLed mid-run; the other runs what it had claimed, every task's result is
published exactly once with the right output, and the dead one's instance is reclaimed."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flowmesh_sdk import SandboxSpec, SpecError, Task
from flowmesh_sdk.cas.local import LocalDirStore
from flowmesh_sdk.pools.shared import decode_result, decode_task, encode_task
from conftest import podman_names  # noqa: E402

pytest_plugins = ("_redis",)   # the redis_server fixture

ROOT = Path(__file__).resolve().parents[1]
N = 6


def worker(url: str, d: Path, name: str, image: str, submit: int = 0) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(ROOT / "tests" / "_pool_worker.py"), url, str(d / name),
                             str(d / "local-state"), str(d / "cas"), image, str(submit)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=open(d / f"{name}.err", "w"), text=True)


def refs(d: Path) -> list[str]:
    root = d / "cas" / "refs" / "tasks" / "eval"
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


def first_line(p: subprocess.Popen[str], d: Path, name: str) -> list[str]:
    assert p.stdout is not None
    line = p.stdout.readline().split()
    if not line:
        pytest.fail(f"{name} printed nothing: {(d / f'{name}.err').read_text()[-2000:]}")
    return line


def test_task_codec_round_trips_and_needs_shared_state(tmp_path):
    t = Task(name="t", sandbox=SandboxSpec(image="localhost/x:1", network=("10.0.0.1:443",), env={"A": "1"}),
             command="echo hi", files={"/w/a.bin": bytes(range(256))}, timeout_s=5, tenant="alice", seed=3)
    assert decode_task(encode_task(t)) == t
    from flowmesh_sdk import Fleet
    from flowmesh_sdk.pools.shared import SharedTasks
    with pytest.raises(SpecError, match="fleet.state"):
        SharedTasks(Fleet("f", home=tmp_path, reconcile_interval_s=None), object(), results=LocalDirStore(tmp_path))  # type: ignore[arg-type]


def test_a_killed_submitters_claimed_tasks_run_on_the_other_coordinator(redis_server, tmp_path, busybox_image):
    c1 = worker(redis_server.url, tmp_path, "c1", busybox_image, submit=N)
    c2 = None
    try:
        line = first_line(c1, tmp_path, "c1")
        assert line[0] == "submitted" and len(line) == N + 1, line
        ids = line[1:]
        c2 = worker(redis_server.url, tmp_path, "c2", busybox_image)
        assert first_line(c2, tmp_path, "c2") == ["serving"]
        deadline = time.monotonic() + 90
        while not refs(tmp_path):                       # c1 (or c2) has published one
            assert time.monotonic() < deadline, (tmp_path / "c1.err").read_text()[-2000:]
            time.sleep(0.05)
        c1.send_signal(signal.SIGKILL)
        assert c1.wait(10) == -signal.SIGKILL
        out, _ = c2.communicate(timeout=120)
        assert c2.returncode == 0, (tmp_path / "c2.err").read_text()[-2000:]
    finally:
        for p in (c1, c2):
            if p is not None and p.poll() is None:
                p.kill()
    done = out.split()
    assert done[0] == "done" and int(done[3].split("=")[1]) > 0, out   # c1's claims ran again on c2
    assert refs(tmp_path) == sorted(ids)                                # every task published, once each
    store = LocalDirStore(tmp_path / "cas")
    import asyncio

    async def results():
        return [decode_result(await store.get((await store.read_ref(f"tasks/eval/{i}")).decode())) for i in ids]
    got = asyncio.run(results())
    assert [(r.task_id, r.name, r.ok, r.result.stdout if r.result else None) for r in got] == [
        (tid, f"t{i}", True, f"out-{i}\n") for i, tid in enumerate(ids)]
    # c1's instance was reclaimed by c2 (same host, same local state); c2 drained its own
    assert podman_names("flowmesh.fleet=shared-tasks") == []
