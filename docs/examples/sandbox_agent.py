#!/usr/bin/env python3
"""What an agent loop needs from a sandbox: a shell session, interrupts, streamed and
background processes, stdin, and an egress policy.

Run from the repository root:

    .venv/bin/python docs/examples/sandbox_agent.py

It uses the small busybox image (built first if podman does not have it), one
persistent pool on this machine, and removes everything it started before it exits.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

from flowmesh_sdk import Fleet, InstanceSpec, PoolSpec, SandboxSpec

ROOT = Path(__file__).resolve().parents[2]


def build_busybox_image() -> str:
    """Build the busybox image if it is missing (flowmesh_sdk.imagebuild)."""
    from flowmesh_sdk.imagebuild import build_busybox
    return build_busybox()  # an image already in podman is left as it is


async def main() -> int:
    image = build_busybox_image()
    async with Fleet() as fleet:
        pool = await fleet.pool(PoolSpec(name="agent-example", mode="persistent", provider="local",
                                         instance=InstanceSpec(cpus=1, memory_gb=2),
                                         min_instances=1, max_instances=1))
        # network="none" is the default; an allow-list would be e.g. ("10.88.0.1:8000",)
        async with pool.sandbox(SandboxSpec(image=image, cpus=0.5, memory_gb=0.25)) as sb:
            # 1. A session: state persists between commands, as in a terminal.
            sh = sb.session()
            await sh.run("mkdir -p /work/repo && cd /work/repo && export MODE=test && "
                         "build() { echo \"building in $(pwd) ($MODE)\"; }")
            r = await sh.run("build")
            print(f"session: {r.stdout.strip()} [{sh.shell}]")
            other = sb.session("scratch")
            print(f"other session: cwd={(await other.run('pwd')).stdout.strip()} "
                  f"MODE={(await other.run('echo ${MODE:-unset}')).stdout.strip()}")

            # 2. Interrupt a command that would run for 100 s; the session goes on.
            task = asyncio.create_task(sh.run("sleep 100"))
            while not sh.running:
                await asyncio.sleep(0.01)
            await sh.interrupt()
            r = await task
            print(f"interrupted: exit={r.exit_code}, then cwd={(await sh.run('pwd')).stdout.strip()}")

            # A timeout kills the command's tree, the rest of the command is not run, and
            # the session keeps its state.
            r = await sh.run("sleep 100; echo not-reached", timeout_s=1)
            print(f"timeout: timed_out={r.timed_out}, MODE={(await sh.run('echo $MODE')).stdout.strip()}")

            # 3. A background server with start(), reached from another command.
            await sb.write_file("/srv/index.html", "hello from httpd\n")
            server = await sb.start("exec httpd -f -p 127.0.0.1:8080 -h /srv")
            for _ in range(100):
                r = await sb.exec("wget -q -O - http://127.0.0.1:8080/index.html")
                if r.ok:
                    break
                await asyncio.sleep(0.05)
            print(f"server: {r.stdout.strip()}")
            await server.kill(signal.SIGTERM)
            print(f"server stopped: exit={(await server.wait()).exit_code}")

            # 4. Streaming: chunks in order, as they are written.
            proc = await sb.start("for i in 1 2 3; do echo line $i; sleep 0.1; done")
            lines: list[str] = []
            async for chunk in proc.stdout:          # each chunk as soon as it is written
                lines += chunk.decode().splitlines()
            print(f"streamed: {lines}")
            seen: list[bytes] = []
            r = await sb.exec("seq 1 5", on_stdout=seen.append)
            print(f"on_stdout: {b''.join(seen).split()} exit={r.exit_code}")

            # 5. Standard input, any bytes.
            cat = await sb.start("cat", binary=True)
            await cat.write_stdin(b"\x00binary\xffstdin\n")
            await cat.close_stdin()
            print(f"stdin round trip: {(await cat.wait()).stdout_raw!r}")

            # 6. Several commands at once: each waits for the other.
            a = sb.exec("touch /tmp/a; while [ ! -e /tmp/b ]; do sleep 0.02; done; echo A")
            b = sb.exec("while [ ! -e /tmp/a ]; do sleep 0.02; done; touch /tmp/b; echo B")
            print(f"concurrent: {[x.stdout.strip() for x in await asyncio.gather(a, b)]}")

            # 7. The default network policy: nothing but loopback.
            r = await sb.exec("nc -w 2 10.88.0.1 80 </dev/null 2>&1; echo rc=$?")
            print(f"network none: reachable={'rc=0' in r.stdout}")
        print("closed")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
