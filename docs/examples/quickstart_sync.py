#!/usr/bin/env python3
"""FlowMesh SDK quickstart for plain (non-async) scripts, through ``SyncFleet``.

Run from the repository root:

    .venv/bin/python docs/examples/quickstart_sync.py

``SyncFleet`` runs the async API on a private event loop in a background thread, so
every call below blocks until it is done.
"""

from __future__ import annotations

import sys
from pathlib import Path

from flowmesh_sdk import InstanceSpec, SandboxSpec, Task
from flowmesh_sdk.sync import SyncFleet

ROOT = Path(__file__).resolve().parents[2]


def build_busybox_image() -> str:
    """Build the busybox image if it is missing (flowmesh_sdk.imagebuild)."""
    from flowmesh_sdk.imagebuild import build_busybox
    return build_busybox()  # an image already in podman is left as it is


def main() -> int:
    image = build_busybox_image()
    print(f"image: {image}")

    with SyncFleet() as fleet:  # closing the fleet drains its pools
        pool = fleet.pool(name="quickstart-sync", mode="persistent", provider="local",
                          instance=InstanceSpec(cpus=1, memory_gb=2),
                          min_instances=1, max_instances=1)

        with pool.sandbox(image=image) as sb:
            sb.write_file("/work/hello.txt", "hello from a script\n")
            res = sb.exec("cat /work/hello.txt")
            print(f"exec: exit={res.exit_code} stdout={res.stdout.strip()!r}")
            slow = sb.exec("sleep 30", timeout_s=1)
            print(f"timeout: timed_out={slow.timed_out} ok={slow.ok}")

        results = pool.map([
            Task(name=f"echo-{n}", sandbox=SandboxSpec(image=image), command=f"echo task {n}")
            for n in (1, 2, 3)
        ])
        for r in results:
            out = r.result.stdout.strip() if r.result else r.error
            print(f"task {r.name}: ok={r.ok} stdout={out!r}")
        stats = pool.stats()
        print(f"stats: in_flight={stats.in_flight} ready={stats.ready}")
        ok = all(r.ok for r in results)
    print("closed" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
