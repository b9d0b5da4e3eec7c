"""``flowmesh top`` in a real terminal (tmux) against a fleet doing work on the local
provider (podman): the screen, read with ``tmux capture-pane``, shows the instance, the
tasks by phase (one still running), throughput and the slowest phases the store holds."""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid

import pytest

from flowmesh_sdk import InstanceSpec, PoolSpec, SandboxSpec, Task

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (apt-get install tmux)")


def _screen(session: str) -> str:
    return subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True,
                          check=True).stdout


COMPLETE = r"slowest recent tasks.*└"   # the last table is drawn to its end (not caught mid-refresh)


async def _wait_screen(session: str, *patterns: str, timeout_s: float = 90) -> str:
    """The pane, once every pattern is on the same capture (it refreshes every 0.3 s);
    fails past the deadline."""
    deadline = time.monotonic() + timeout_s
    screen = ""
    while time.monotonic() < deadline:
        screen = _screen(session)
        if all(re.search(p, screen, re.S) for p in (*patterns, COMPLETE)):
            return screen
        await asyncio.sleep(0.2)
    raise AssertionError(f"{patterns!r} never all appeared; screen:\n{screen}")


async def test_top_shows_a_working_fleet(fleet, fm_home, busybox_image) -> None:
    pool = await fleet.pool(PoolSpec(name="watched", instance=InstanceSpec(cpus=1, memory_gb=2),
                                     max_instances=1, sandboxes_per_instance=2, warm_per_image=0))
    spec = SandboxSpec(image=busybox_image, cpus=0.5, memory_gb=0.25)
    done = await pool.map([Task(name=f"quick{i}", sandbox=spec, command="true") for i in range(3)]
                          + [Task(name="slowpoke", sandbox=spec, command="sleep 0.6"),
                             Task(name="broken", sandbox=spec, command="exit 2")])
    assert [r.result.exit_code for r in done] == [0, 0, 0, 0, 2]
    # one task still at work while the screen is read
    long_task = asyncio.ensure_future(pool.run_task(Task(name="long", sandbox=spec, command="sleep 60")))
    session = f"fm19top-{uuid.uuid4().hex[:8]}"
    cmd = f"env FLOWMESH_HOME={shlex.quote(str(fm_home))} {shlex.quote(sys.executable)} -m flowmesh_sdk top --interval 0.3"
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "170", "-y", "45", cmd], check=True,
                   env={**os.environ, "TERM": "xterm-256color"})
    try:
        screen = await _wait_screen(session, r"running\s*│\s*1\b", r"succeeded\s*│\s*4\b", r"failed\s*│\s*1\b",
                                    r"local\s*│\s*local\s*│\s*ready\s*│\s*1\b",
                                    r"throughput\s+5 tasks in the last 60 s")
        assert "failovers 0" in screen and "spent $0.0000" in screen
        # the slowest recent task: the one with the largest sum of phases in the store
        rows_db = [t for t in fleet.store.tasks() if t.finished_at is not None]
        slowest = max(rows_db, key=lambda t: sum(getattr(t, f"{p}_s") or 0.0 for p in
                                                 ("queued", "scheduling", "env_startup", "execution", "teardown")))
        slow = screen[screen.index("slowest recent tasks"):]
        first = next(line for line in slow.splitlines() if "│" in line and "task" not in line)
        assert f" {slowest.name} " in first.split("│")[-4] + " ", slow
        # the phase table: every phase, slowest mean first
        rows = [(m.group(1), float(m.group(2).replace(",", ""))) for m in
                re.finditer(r"│ (queued|scheduling|env_startup|execution|teardown)\s*│\s*([\d,.]+)", screen)]
        assert sorted(r[0] for r in rows) == sorted(["queued", "scheduling", "env_startup", "execution", "teardown"])
        assert [r[1] for r in rows] == sorted((r[1] for r in rows), reverse=True)
        # the live view follows the fleet: once the long task ends, running goes away
        long_task.cancel()
        await asyncio.gather(long_task, return_exceptions=True)
        await fleet.store.flush()
        screen = await _wait_screen(session, r"cancelled\s*│\s*1\b")
        assert not re.search(r"running\s*│", screen), screen
        subprocess.run(["tmux", "send-keys", "-t", session, "C-c"], check=True)
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
