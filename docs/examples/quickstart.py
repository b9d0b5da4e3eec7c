#!/usr/bin/env python3
"""FlowMesh SDK quickstart (async): one persistent pool on this machine.

Run from the repository root:

    .venv/bin/python docs/examples/quickstart.py

It builds the small busybox image first if podman does not have it yet (about a
second), then runs a sandbox, a timed-out command and a batch of three tasks.
Everything it starts is removed again before it exits.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from flowmesh_sdk import EventKind, Fleet, InstanceSpec, PoolSpec, SandboxSpec, Task

ROOT = Path(__file__).resolve().parents[2]


def build_busybox_image() -> str:
    """Build the busybox image if it is missing (flowmesh_sdk.imagebuild)."""
    from flowmesh_sdk.imagebuild import build_busybox
    return build_busybox()  # an image already in podman is left as it is


async def main() -> int:
    image = build_busybox_image()
    print(f"image: {image}")

    async with Fleet() as fleet:  # state under $FLOWMESH_HOME (default ~/.local/state/flowmesh)
        finished: list[str] = []
        fleet.bus.on(lambda ev: finished.append(ev.kind.value),
                     EventKind.TASK_SUCCEEDED, EventKind.TASK_FAILED, EventKind.TASK_TIMED_OUT)

        pool = await fleet.pool(PoolSpec(
            name="quickstart", mode="persistent", provider="local",
            instance=InstanceSpec(cpus=1, memory_gb=2),
            min_instances=1, max_instances=1))
        print(f"pool: {pool.name} ({pool.spec.mode.value}), ready instances: {pool.stats().ready}")

        # 1. One sandbox for the body of the `async with`; destroyed afterwards.
        async with pool.sandbox(image=image) as sb:
            await sb.write_file("/work/hello.txt", "hello from the host\n")
            res = await sb.exec("cat hello.txt && wc -c < hello.txt", cwd="/work")
            print(f"exec: exit={res.exit_code} stdout={res.stdout.splitlines()!r}")
            data = await sb.read_file("/work/hello.txt")
            print(f"read_file: {data!r}")

            # 2. A command past its timeout is killed (with every process it started) and
            #    comes back as a result with timed_out=True; the sandbox stays usable.
            slow = await sb.exec("sleep 30 & sleep 30; echo never", timeout_s=1)
            print(f"timeout: timed_out={slow.timed_out} exit={slow.exit_code} ok={slow.ok}")
            after = await sb.exec("echo still usable")
            print(f"after timeout: {after.stdout.strip()}")

        # 3. A batch of declarative tasks: files in, one command, result out (input order).
        tasks = [
            Task(name=f"square-{n}", sandbox=SandboxSpec(image=image),
                 files={"/in/n.txt": f"{n}\n".encode()},
                 command='n=$(cat /in/n.txt); echo "$n squared is $((n * n))"',
                 timeout_s=30)
            for n in (2, 3, 4)
        ]
        results = await pool.map(tasks)
        for r in results:
            assert r.result is not None, r.error
            p = r.phases
            print(f"task {r.name}: ok={r.ok} exit={r.result.exit_code} "
                  f"stdout={r.result.stdout.strip()!r} "
                  f"(queued {p.queued * 1000:.0f} ms, scheduling {p.scheduling * 1000:.0f} ms, "
                  f"env_startup {p.env_startup * 1000:.0f} ms, execution {p.execution * 1000:.0f} ms, "
                  f"teardown {p.teardown * 1000:.0f} ms)")

        print(f"events: {len(finished)} tasks finished, "
              f"{finished.count('task.succeeded')} succeeded")
        ok = all(r.ok for r in results)
    # leaving `async with Fleet()` drained the pool: instances terminated, containers removed
    print("closed" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
