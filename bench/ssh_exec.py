#!/usr/bin/env python3
"""SSH exec latency: one command on a remote host, five ways, side by side.

Against one real OpenSSH sshd on a loopback address (``LoopbackSshd``: its own host key,
client key and container storage), ``--n`` samples each after one unmeasured warm-up:

(a) ``ssh host true``: a new OpenSSH client process per command, host key pinned
    (``-o StrictHostKeyChecking=yes`` with a temporary known_hosts holding the host's key);
(b) fabric, a new ``Connection`` per command: connect, ``run("true")``, close (host key
    pinned the same way: RejectPolicy plus the key in the client's host keys);
(c) fabric, one reused ``Connection``: ``run("true")`` on it (a new session channel each);
(d) the SDK's runner, ``runner.run(["true"])`` on its held connection (a fabric
    ``Connection`` opened once; a new session channel on its transport per command, like (c));
(e) the SDK's exec on a held-open sandbox channel: ``sb.exec("true")`` in a busybox
    sandbox of a persistent pool on the ``ssh`` provider with that one host.

It also prints the bootstrap of that host split by step (reach, runtime, registry login,
prefetch, agent): first fresh (its own empty container store, so the prefetch pulls), then
bootstrapped again by a second fleet (a no-op: nothing changed).

Then every p50 against (a)'s, and the target: p50(e) <= 0.02 x p50(a).  The last line
printed is exactly ``ssh_exec_ratio=<p50(e) / p50(a)>`` (three decimals).  Exit status 0
whether or not the target is met.

    python bench/ssh_exec.py [--n 50]

It needs /usr/sbin/sshd, ssh, podman and docker-registry (the busybox image is built by
images/build.py and served from a throw-away LocalRegistry on 127.0.0.1).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from rich.table import Table

from _common import busybox_image, console as bench_console, pct  # bench/_common.py (the script's folder is on sys.path)

from flowmesh_sdk import Fleet, InstanceSpec, PoolSpec, SandboxSpec
from flowmesh_sdk.specs import BootstrapReport
from flowmesh_sdk.remote.keys import PublicKey, host_id
from flowmesh_sdk.registry.local import LocalRegistry
from flowmesh_sdk.testing.sshd import LoopbackSshd

HOST = "127.0.0.50"
TARGET = 0.02

console = bench_console()


# --------------------------------------------------------------------------- #
# helpers
# --------------------------------------------------------------------------- #

def sample_sync(n: int, one: Callable[[], None]) -> list[float]:
    one()   # warm-up, not measured
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        one()
        out.append(time.perf_counter() - t0)
    return out


async def sample_async(n: int, one: Callable[[], Awaitable[None]]) -> list[float]:
    await one()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        await one()
        out.append(time.perf_counter() - t0)
    return out


# --------------------------------------------------------------------------- #
# (a) OpenSSH client process per command
# --------------------------------------------------------------------------- #

def openssh_per_command(d: LoopbackSshd, n: int, tmp: Path) -> list[float]:
    known = tmp / "known_hosts"
    known.write_text(f"{host_id(d.host, d.port)} {d.host_public_key}\n")
    argv = ["ssh", "-F", "/dev/null", "-i", d.client_key_path, "-p", str(d.port),
            "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={known}",
            "-o", "GlobalKnownHostsFile=/dev/null", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
            "-o", "LogLevel=ERROR", f"{d.user}@{d.host}", "true"]

    def one() -> None:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
        if proc.returncode != 0:
            raise RuntimeError(f"ssh exited {proc.returncode}: {proc.stderr.decode(errors='replace')[-300:]}")
    return sample_sync(n, one)


# --------------------------------------------------------------------------- #
# (b), (c) fabric
# --------------------------------------------------------------------------- #

def fabric_connection(d: LoopbackSshd):
    import paramiko
    from fabric import Config, Connection

    cfg = Config(overrides={"load_ssh_configs": False})
    c = Connection(d.host, user=d.user, port=d.port, config=cfg, connect_timeout=10,
                   connect_kwargs={"key_filename": d.client_key_path, "look_for_keys": False,
                                   "allow_agent": False})
    # fabric adds unknown host keys by default (AutoAddPolicy); pin the host's key instead
    key = PublicKey.parse(d.host_public_key)
    c.client.set_missing_host_key_policy(paramiko.RejectPolicy())
    c.client.get_host_keys().add(host_id(d.host, d.port), key.key_type,
                                 paramiko.PKey.from_type_string(key.key_type, key.blob))
    return c


def fabric_run(c) -> None:
    r = c.run("true", hide=True, in_stream=False, warn=True)
    if r.exited != 0:
        raise RuntimeError(f"fabric run exited {r.exited}: {r.stderr[-300:]}")


def fabric_new_each_time(d: LoopbackSshd, n: int) -> list[float]:
    def one() -> None:
        c = fabric_connection(d)
        try:
            fabric_run(c)
        finally:
            c.close()
    return sample_sync(n, one)


def fabric_reused(d: LoopbackSshd, n: int) -> list[float]:
    c = fabric_connection(d)
    try:
        return sample_sync(n, lambda: fabric_run(c))
    finally:
        c.close()


# --------------------------------------------------------------------------- #
# (d), (e) the SDK
# --------------------------------------------------------------------------- #

async def sdk(d: LoopbackSshd, n: int, home: Path) -> tuple[list[float], list[float]]:
    from flowmesh_providers.ssh import SshHost, SshProvider

    image = await asyncio.to_thread(busybox_image)
    host = SshHost(name="bench", host=d.host, port=d.port, user=d.user, key_path=d.client_key_path,
                   host_key=d.host_public_key, cpus=2, memory_gb=2)
    prov = SshProvider([host], state_dir=home / "ssh")
    with LocalRegistry() as reg:
        ref = await asyncio.to_thread(reg.push, image, "bench/busybox:1")
        spec = PoolSpec(name="bench", provider="ssh", min_instances=1, max_instances=1,
                        instance=InstanceSpec(cpus=2, memory_gb=2), warm_per_image=0, warm_images=(ref,))
        async with Fleet("ssh-exec-bench", home=home, providers={"ssh": prov}) as fleet:
            pool = await fleet.pool(spec)
            (mi,) = pool.instances.values()
            fresh = mi.bootstrap
            runner = mi.runtime.runner

            async def run_true() -> None:
                res = await runner.run(["true"], timeout_s=30)
                if res.exit_code != 0:
                    raise RuntimeError(f"runner.run(true) exited {res.exit_code}")
            runs = await sample_async(n, run_true)

            async with pool.sandbox(SandboxSpec(image=ref, cpus=1, memory_gb=0.25)) as sb:
                async def exec_true() -> None:
                    res = await sb.exec("true", timeout_s=30)
                    if res.exit_code != 0:
                        raise RuntimeError(f"sb.exec(true) exited {res.exit_code}")
                execs = await sample_async(n, exec_true)
        async with Fleet("ssh-exec-bench-again", home=home, providers={"ssh": prov}) as fleet:
            (again,) = [m.bootstrap for m in (await fleet.pool(spec)).instances.values()]
        if fresh is not None and again is not None:
            bootstrap_by_step(fresh, again)
    await prov.close()
    return runs, execs


# --------------------------------------------------------------------------- #
# bootstrap of a fresh host, split by step
# --------------------------------------------------------------------------- #

def bootstrap_by_step(fresh: BootstrapReport, again: BootstrapReport) -> None:
    """The five steps on a fresh host (its own empty container store, so the prefetch
    really pulls) and on the same host bootstrapped a second time (a no-op)."""
    table = Table(title="bootstrap of a loopback host, by step (s; * = changed something)",
                  title_justify="left")
    for col in ("step", "fresh host", "second bootstrap", "detail (fresh)"):
        table.add_column(col, justify="left" if col in ("step", "detail (fresh)") else "right")
    for a, b in zip(fresh.steps, again.steps):
        table.add_row(a.name, f"{a.seconds:.3f}{'*' if a.changed else ''}",
                      f"{b.seconds:.3f}{'*' if b.changed else ''}", a.detail)
    table.add_row("total", f"{fresh.total_s:.3f}", f"{again.total_s:.3f}", "")
    console.print(table)


# --------------------------------------------------------------------------- #

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="ssh_exec.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=50, help="samples per measurement (default 50)")
    args = p.parse_args(argv)
    if args.n < 1:
        p.error("--n must be at least 1")
    return args


async def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="fm-ssh-bench-") as tmpdir:
        tmp = Path(tmpdir)
        os.environ["FLOWMESH_HOME"] = str(tmp / "home")   # keep the bench's state apart
        with LoopbackSshd(HOST) as d:
            console.print(f"host: OpenSSH sshd on {d.host}:{d.port} (loopback), {os.cpu_count()} cpus; "
                          f"n={args.n} per measurement after 1 warm-up")
            rows = [
                ("(a) ssh host true (new OpenSSH process per command)", openssh_per_command(d, args.n, tmp)),
                ("(b) fabric: new Connection per command", fabric_new_each_time(d, args.n)),
                ("(c) fabric: one reused Connection", fabric_reused(d, args.n)),
            ]
            runs, execs = await sdk(d, args.n, tmp / "home")
            rows += [("(d) SDK runner.run (new channel, held connection)", runs),
                     ("(e) SDK sb.exec on a held-open sandbox channel", execs)]

    base = pct(rows[0][1], 50)
    table = Table(title="one `true` on a loopback sshd host (ms)", title_justify="left")
    for col in ("measurement", "n", "p50", "p95", "min", "max", "p50 / p50(a)"):
        table.add_column(col, justify="left" if col == "measurement" else "right")
    for label, xs in rows:
        table.add_row(label, str(len(xs)), f"{pct(xs, 50) * 1e3:.2f}", f"{pct(xs, 95) * 1e3:.2f}",
                      f"{min(xs) * 1e3:.2f}", f"{max(xs) * 1e3:.2f}", f"{pct(xs, 50) / base:.3f}")
    console.print(table)
    ratio = pct(execs, 50) / base
    verdict = "[bold green]MET[/]" if ratio <= TARGET else "[bold red]NOT MET[/]"
    console.print(f"ssh_exec_ratio = p50(e) / p50(a) = {ratio:.3f}  target <= {TARGET:g}: {verdict}")
    print(f"ssh_exec_ratio={ratio:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
