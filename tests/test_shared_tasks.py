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

from flowmesh_sdk import InfraFailure, SandboxSpec, SpecError, Task
from flowmesh_sdk.cas.local import LocalDirStore
from flowmesh_sdk.pools.shared import decode_result, decode_task, encode_task
from conftest import podman_names  # noqa: E402

pytest_plugins = ("_redis",)   # the redis_server fixture

ROOT = Path(__file__).resolve().parents[1]
N = 6


def worker(url: str, d: Path, name: str, image: str, submit: int = 0, retries: int = 2) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(ROOT / "tests" / "_pool_worker.py"), url, str(d / name),
                             str(d / "local-state"), str(d / "cas"), image, str(submit), str(retries)],
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


def _kill_the_submitter_mid_run(url: str, d: Path, image: str, retries: int) -> tuple[list[str], str]:
    """c1 submits N tasks and serves them with c2; c1 is SIGKILLed once one is published.
    Returns the task ids and c2's last line."""
    c1 = worker(url, d, "c1", image, submit=N, retries=retries)
    c2 = None
    try:
        line = first_line(c1, d, "c1")
        assert line[0] == "submitted" and len(line) == N + 1, line
        ids = line[1:]
        c2 = worker(url, d, "c2", image, retries=retries)
        assert first_line(c2, d, "c2") == ["serving"]
        deadline = time.monotonic() + 90
        while not refs(d):                       # c1 (or c2) has published one
            assert time.monotonic() < deadline, (d / "c1.err").read_text()[-2000:]
            time.sleep(0.05)
        c1.send_signal(signal.SIGKILL)
        assert c1.wait(10) == -signal.SIGKILL
        out, _ = c2.communicate(timeout=120)
        assert c2.returncode == 0, (d / "c2.err").read_text()[-2000:]
    finally:
        for p in (c1, c2):
            if p is not None and p.poll() is None:
                p.kill()
    return ids, out


def _published(d: Path, ids: list[str]) -> list:
    import asyncio
    store = LocalDirStore(d / "cas")

    async def results():
        return [decode_result(await store.get((await store.read_ref(f"tasks/eval/{i}")).decode())) for i in ids]
    return asyncio.run(results())


def test_a_killed_submitters_claimed_tasks_run_on_the_other_coordinator(redis_server, tmp_path, busybox_image):
    ids, out = _kill_the_submitter_mid_run(redis_server.url, tmp_path, busybox_image, retries=2)
    done = out.split()
    assert done[0] == "done" and int(done[3].split("=")[1]) > 0, out   # c1's claims ran again on c2
    assert refs(tmp_path) == sorted(ids)                                # every task published, once each
    got = _published(tmp_path, ids)
    assert [(r.task_id, r.name, r.ok, r.result.stdout if r.result else None) for r in got] == [
        (tid, f"t{i}", True, f"out-{i}\n") for i, tid in enumerate(ids)]
    assert all(r.infra_failure is None and r.run == "shared-run" for r in got)
    assert any(r.attempts == 2 for r in got)        # c1's claims: their second dispatch ran on c2
    # c1's instance was reclaimed by c2 (same host, same local state); c2 drained its own
    assert podman_names("flowmesh.fleet=shared-tasks") == []


def test_with_no_retry_a_dead_coordinators_claims_end_coordinator_lost(redis_server, tmp_path, busybox_image):
    ids, out = _kill_the_submitter_mid_run(redis_server.url, tmp_path, busybox_image, retries=0)
    assert out.split()[0] == "done", out
    got = _published(tmp_path, ids)
    lost = [r for r in got if r.infra_failure is not None]
    assert lost, [(r.name, r.ok, r.attempts) for r in got]          # c1 held claims when it died
    for r in lost:
        assert (r.infra_failure, r.ok, r.result, r.attempts) == (InfraFailure.COORDINATOR_LOST, False, None, 1)
        assert "retry_infra_failures" in (r.error or "")
    assert all(r.ok and r.attempts == 1 for r in got if r.infra_failure is None)
    assert podman_names("flowmesh.fleet=shared-tasks") == []
