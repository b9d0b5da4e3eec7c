"""One fleet shared by several coordinators as real OS processes
(``python -m flowmesh_sdk.control.redis.worker_main``, a trivial task: SHA-256 of the body)
on a real redis-server: one SIGKILLed mid-run while their clocks disagree by hours
(libfaketime), and Redis itself SIGKILLed and restarted mid-run.  After each: every task
published exactly once (the CAS refs, and each process's log of what it published), no
permit or tenant slot left held, nothing left queued or claimed."""

from __future__ import annotations

import asyncio
import glob
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from flowmesh_sdk.control.redis import RedisBackend, RetrySettings
from flowmesh_sdk.errors import FlowMeshError

pytest_plugins = ("_redis",)   # the redis_server fixture

ROOT = Path(__file__).resolve().parents[1]


CAPACITY = 10   # permits of the queue's semaphore, fleet-wide; the coordinators ask for 8 each


def start_worker(url: str, d: Path, name: str, *, queue: str, submit: int, lease_s: float,
                 faketime: str | None = None) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "flowmesh_sdk.control.redis.worker_main", "--url", url, "--queue", queue,
           "--results", str(d / "cas"), "--log", str(d / f"{name}.log"), "--submit", str(submit),
           "--task-ms", "50", "--lease-s", str(lease_s), "--capacity", str(CAPACITY), "--concurrency", "8"]
    env = dict(os.environ)
    if faketime is not None:   # preloaded into the worker itself, so SIGKILL hits the coordinator
        env.update(LD_PRELOAD=libfaketime(), FAKETIME=faketime)
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=open(d / f"{name}.err", "wb"))


def libfaketime() -> str:
    libs = glob.glob("/usr/lib/*/faketime/libfaketime.so.1")
    if not libs:
        pytest.fail("libfaketime is missing: apt-get install -y faketime (bash setup.sh --dev)")
    return libs[0]


def skew_of(faketime: str) -> float:
    """How far ahead a process under ``faketime`` sees the wall clock (the preload works)."""
    env = dict(os.environ, LD_PRELOAD=libfaketime(), FAKETIME=faketime)
    out = subprocess.run([sys.executable, "-c", "import time; print(time.time())"], env=env,
                         capture_output=True, text=True, check=True).stdout
    return float(out) - time.time()


def log_lines(d: Path, name: str) -> list[str]:
    p = d / f"{name}.log"
    return p.read_text().splitlines() if p.exists() else []


def published(d: Path, name: str) -> list[str]:
    return [line.split()[1] for line in log_lines(d, name) if line.startswith("published ")]


def wait_until(pred, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.01)


async def leftovers(url: str, queue: str) -> tuple[int, int, tuple[int, int]]:
    """(permits held, tenant slots held, (queued, claimed)) of ``queue`` now."""
    be = RedisBackend(url, lease_s=1.0)
    await be.start()
    try:
        sem = await be.semaphore(f"queue:{queue}", CAPACITY).held()
        slots = await be.quota(f"queue:{queue}:tenants").in_flight_async("default")
        return sem, slots, await be.queue(queue).depth()
    finally:
        await be.close()


class PermitWatch:
    """Polls the queue's permits held fleet-wide from a thread of its own (through Redis
    restarts too): the most ever held at once must stay within CAPACITY."""

    def __init__(self, url: str, queue: str) -> None:
        self.url, self.queue, self.peak, self.samples = url, queue, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        be = RedisBackend(self.url, lease_s=5.0, retry=RetrySettings(attempts=1))
        await be.client.ping()
        sem = be.semaphore(f"queue:{self.queue}", CAPACITY)
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, await sem.held())
                self.samples += 1
            except FlowMeshError:
                pass   # Redis is down for a moment
            await asyncio.sleep(0.005)
        await be.client.close()

    def __enter__(self) -> PermitWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def coordinator_id(d: Path, name: str) -> str:
    return next(x.split()[1] for x in log_lines(d, name) if x.startswith("coordinator "))


async def claims_held(url: str, coordinator: str, queue: str) -> int:
    """How many tasks of ``queue`` the coordinator's lease holds now (its leases hash)."""
    be = RedisBackend(url, lease_s=1.0)
    try:
        fields = await be.client.command("hkeys", be.keys.key("coord", coordinator, "leases"))
        return sum(f.decode().split("\t")[0] == be.keys.key("q", queue, "claimed") for f in fields)
    finally:
        await be.client.close()


def kill_holding_claims(p: subprocess.Popen[bytes], url: str, coordinator: str, queue: str) -> None:
    """SIGKILL ``p`` at a moment it holds claims: stopped (SIGSTOP) it cannot ack, so what
    Redis says it holds is what it dies holding; if it holds none, it runs on a little."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        p.send_signal(signal.SIGSTOP)
        if asyncio.run(claims_held(url, coordinator, queue)) > 0:
            p.send_signal(signal.SIGKILL)
            return
        p.send_signal(signal.SIGCONT)
        time.sleep(0.005)
    pytest.fail(f"coordinator {coordinator} never held a claim of queue {queue!r}")


def refs(d: Path, queue: str) -> set[str]:
    root = d / "cas" / "refs" / "tasks" / queue
    return {p.name for p in root.iterdir()} if root.exists() else set()


def finish(procs: dict[str, subprocess.Popen[bytes]], d: Path, timeout_s: float = 90) -> None:
    for name, p in procs.items():
        try:
            rc = p.wait(timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()
            pytest.fail(f"{name} did not finish: {(d / f'{name}.err').read_text()[-2000:]}")
        if rc not in (0, -signal.SIGKILL):
            pytest.fail(f"{name} exited {rc}: {(d / f'{name}.err').read_text()[-2000:]}")


def test_sigkilled_coordinator_is_adopted_exactly_once_with_skewed_clocks(redis_server, tmp_path):
    url, q, n = redis_server.url, "crash", 150
    # three coordinators whose clocks disagree by hours: leases run on Redis's clock only
    skews = {"c1": "+2h", "c2": "-3h", "c3": "+0"}
    assert skew_of("+2h") > 7000
    with PermitWatch(url, q) as watch:
        procs = {name: start_worker(url, tmp_path, name, queue=q, submit=n, lease_s=1.0, faketime=skew)
                 for name, skew in skews.items()}
        wait_until(lambda: len(published(tmp_path, "c1")) >= 1, 60, "c1 to publish")
        kill_holding_claims(procs["c1"], url, coordinator_id(tmp_path, "c1"), q)
        assert procs["c1"].wait() == -signal.SIGKILL
        finish(procs, tmp_path)
    assert 0 < watch.peak <= CAPACITY and watch.samples > 10   # 24 asked for, never more than 10 granted
    submitted = sum(n for name in procs if any(x.startswith("submitted") for x in log_lines(tmp_path, name)))
    assert submitted == 3 * n                       # c1 had queued all of its tasks before dying
    assert len(refs(tmp_path, q)) == submitted      # nothing lost: every task's result published
    every = [t for name in procs for t in published(tmp_path, name)]
    assert len(every) == len(set(every))            # nothing published twice
    done = [x for name in ("c2", "c3") for x in log_lines(tmp_path, name) if x.startswith("done")]
    assert len(done) == 2
    redispatched = sum(int(x.split("redispatched=")[1].split()[0]) for x in done)
    assert redispatched > 0                          # c1's claimed tasks ran again elsewhere
    assert asyncio.run(leftovers(url, q)) == (0, 0, (0, 0))   # no permit, slot or claim leaked


def test_redis_restarted_mid_run_coordinators_resume(redis_server, tmp_path):
    url, q, n = redis_server.url, "restart", 150
    with PermitWatch(url, q) as watch:
        procs = {name: start_worker(url, tmp_path, name, queue=q, submit=n, lease_s=3.0) for name in ("r1", "r2")}
        # both under way (a coordinator that cannot reach Redis at start fails, as it should)
        wait_until(lambda: all(published(tmp_path, name) for name in procs)
                   and len(published(tmp_path, "r1")) + len(published(tmp_path, "r2")) >= 40, 60, "progress")
        seen = watch.samples
        redis_server.restart(down_s=0.3)               # SIGKILL; what the AOF (fsync always) holds comes back
        finish(procs, tmp_path)
    assert 0 < watch.peak <= CAPACITY and watch.samples > seen   # nothing granted twice, before or after
    done = [x for name in procs for x in log_lines(tmp_path, name) if x.startswith("done")]
    assert len(done) == 2, [(d, (tmp_path / f"{d}.err").read_text()[-1500:]) for d in procs]
    assert "fenced=0" in done[0] and "fenced=0" in done[1]   # a short outage: nobody lost its lease
    assert len(refs(tmp_path, q)) == 2 * n
    every = [t for name in procs for t in published(tmp_path, name)]
    assert len(every) == len(set(every)) == 2 * n
    assert asyncio.run(leftovers(url, q)) == (0, 0, (0, 0))
    assert os.path.exists(redis_server.dir / "appendonlydir")
