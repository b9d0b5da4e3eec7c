#!/usr/bin/env python3
"""Image pulls: how many times each layer blob crosses the wire when many sandboxes ask
for the same image at once -- the SDK against raw ``podman pull``.

A real registry (``LocalRegistry``: Debian's docker-registry on 127.0.0.1) sits behind a
counting reverse proxy (``FaultProxy``, no faults injected); every pull goes through the
proxy, which counts blob GETs per digest.  Three fresh images are built and pushed, and
their local copies dropped, so a pull really fetches:

* image1  = busybox base + one unique layer
* image2  = busybox base + one unique layer
* sibling = image1 + one more unique layer (``FROM image1``)

Then, with a Fleet on the local provider (a temporary FLOWMESH_HOME) and a persistent pool
of one instance with ``sandboxes_per_instance=N`` and ``warm_per_image=0``:

(a) N sandboxes of image1 requested at once;
(b) N sandboxes of the sibling requested at once: only its new layer should be fetched;
(c) baseline, no SDK: N ``podman pull --tls-verify=false`` of image2 started at once.

"Distinct layers needed" for a scenario are the image's layers that the store does not
hold yet: not the busybox base (present as ``localhost/flowmesh/busybox:1``) and not the
layers of an image pulled in an earlier scenario.  Only layer blobs are counted; config
blobs (named by the manifest) are left out.  The last line printed is exactly
``blob_fetches_per_image=<x>``: layer-blob fetches made / distinct new layers needed over
the SDK scenarios (a) and (b), with three decimals (target 1.0).  It is a count, not a
timing.  What the script pulled is removed from podman's store at the end.

    python bench/image_pull.py [--n 8] [--layer-mb 4]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

from flowmesh_sdk import EventKind, Fleet, InstanceSpec, PoolSpec, SandboxSpec
from flowmesh_sdk.registry.client import RegistryClient, ResolvedImage
from flowmesh_sdk.testing.proxy import FaultProxy
from flowmesh_sdk.registry.local import LocalRegistry, RegistryNotInstalled
from flowmesh_providers.local import LocalProvider

ROOT = Path(__file__).resolve().parent.parent
REPO = "fmbench-pull"          # repository prefix in the temporary registry
TARGET = 1.0
HOLD_TIMEOUT_S = 120.0

console = Console(stderr=False)
if not console.is_terminal:
    console = Console(width=160)


# --------------------------------------------------------------------------- #
# helpers
# --------------------------------------------------------------------------- #

def load_build_module():
    from flowmesh_sdk.imagebuild import build
    return build


def podman(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["podman", *argv], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError(f"`podman {' '.join(argv)}` exited {proc.returncode}: "
                           f"{proc.stderr.strip()[-400:]}")
    return proc


def build_layer_image(base: str, tmp: Path, name: str, build_args: list[str],
                      pad_bytes: int) -> tuple[str, str]:
    """``FROM base`` + one COPY layer with unique content (``/data``, a marker the sandboxes
    read back, and ``/pad``, ``pad_bytes`` of random bytes): (local reference, marker)."""
    ctx = tmp / f"ctx-{name}-{uuid.uuid4().hex[:6]}"
    (ctx / "layer").mkdir(parents=True)
    content = f"{name}-{uuid.uuid4().hex}"
    (ctx / "layer" / "data").write_text(content)
    (ctx / "layer" / "pad").write_bytes(os.urandom(pad_bytes))
    (ctx / "Containerfile").write_text(f"FROM {base}\nCOPY layer/ /\n")
    local = f"localhost/{REPO}/{name}:{uuid.uuid4().hex[:8]}"
    podman("build", "-q", "--pull=never", *build_args, "-t", local, str(ctx))
    return local, content


def forget_images_from(*hosts: str) -> int:
    """Remove every image in podman's store that came from one of ``hosts``."""
    out = podman("images", "--all", "--format", "{{.ID}} {{.Repository}}", check=False).stdout
    ids = {line.split()[0] for line in out.splitlines()
           if len(line.split()) == 2 and any(line.split()[1].startswith(f"{h}/") for h in hosts)}
    if ids:
        podman("rmi", "-f", *sorted(ids), check=False)
    return len(ids)


def drain(sub) -> list:
    out = []
    while not sub.queue.empty():
        out.append(sub.queue.get_nowait())
    return out


@dataclass
class Outcome:
    scenario: str
    requested: int
    pulls: int
    needed: set[str]
    layer_gets: dict[str, int]            # layer digest -> GETs (configs left out)
    config_gets: int
    manifest_gets: int
    seconds: float
    sizes: dict[str, int] = field(default_factory=dict)   # layer digest -> compressed bytes
    notes: list[str] = field(default_factory=list)

    @property
    def fetches(self) -> int:
        return sum(self.layer_gets.values())

    @property
    def per_layer(self) -> float:
        return self.fetches / len(self.needed) if self.needed else float("nan")

    @property
    def mb_fetched(self) -> float:
        return sum(self.sizes.get(d, 0) * k for d, k in self.layer_gets.items()) / 1e6

    @property
    def mb_needed(self) -> float:
        return sum(self.sizes.get(d, 0) for d in self.needed) / 1e6

    def wasted(self) -> int:
        """Fetches beyond one per needed layer (repeats, or layers the store held)."""
        return sum(n - (1 if d in self.needed else 0) for d, n in self.layer_gets.items())


def split_gets(gets: dict[str, int], configs: set[str]) -> tuple[dict[str, int], int]:
    layers = {d: n for d, n in gets.items() if d not in configs and n > 0}
    return layers, sum(n for d, n in gets.items() if d in configs)


# --------------------------------------------------------------------------- #
# scenarios
# --------------------------------------------------------------------------- #

async def sdk_burst(fleet: Fleet, pool, proxy: FaultProxy, label: str, image: str, content: str,
                    n: int, needed: set[str], configs: set[str], sb_spec: SandboxSpec) -> Outcome:
    """N sandboxes of ``image`` at once; all N are held open together before any leaves."""
    pulled = fleet.bus.subscribe(EventKind.IMAGE_PULLED)
    proxy.reset_counts()
    barrier = asyncio.Barrier(n)
    seen = {"started": 0, "joined": 0, "cached": 0}
    cache = pool.image_cache
    original = cache.ensure

    async def observed(mi, info):   # what each request found on the instance (read only)
        key = "cached" if info.digest in mi.images else "joined" if info.digest in mi.pulls else "started"
        seen[key] += 1
        return await original(mi, info)

    spec = SandboxSpec(image=image, cpus=sb_spec.cpus, memory_gb=sb_spec.memory_gb)

    async def one() -> str:
        async with pool.sandbox(spec) as sb:
            res = await sb.exec("cat /data")
            await asyncio.wait_for(barrier.wait(), HOLD_TIMEOUT_S)  # N held at once
            return res.stdout

    cache.ensure = observed
    try:
        t0 = time.perf_counter()
        outs = await asyncio.gather(*(one() for _ in range(n)))
        dt = time.perf_counter() - t0
    finally:
        del cache.ensure
    events = drain(pulled)
    pulled.close()
    notes = []
    if any(o != content for o in outs):
        raise RuntimeError(f"{label}: a sandbox saw the wrong image content: {sorted(set(outs))}")
    notes.append(f"all {n} sandboxes read the image's own /data and were open together; of the {n} "
                 f"requests {seen['started']} started the pull, {seen['joined']} joined it in flight, "
                 f"{seen['cached']} found the image already there")
    for e in events:
        notes.append(f"IMAGE_PULLED {e.detail}")
    layers, cfg = split_gets(proxy.blob_gets, configs)
    return Outcome(label, n, len(events), needed, layers, cfg, proxy.manifest_gets, dt, notes=notes)


async def raw_burst(proxy: FaultProxy, label: str, image: str, n: int, needed: set[str],
                    configs: set[str]) -> Outcome:
    """N ``podman pull`` processes of ``image`` started at once (no SDK)."""
    proxy.reset_counts()

    async def one() -> tuple[int, str]:
        proc = await asyncio.create_subprocess_exec(
            "podman", "pull", "--quiet", "--tls-verify=false", image,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        out, err = await proc.communicate()
        return proc.returncode or 0, (err or out).decode("utf-8", "replace").strip()

    t0 = time.perf_counter()
    results = await asyncio.gather(*(one() for _ in range(n)))
    dt = time.perf_counter() - t0
    ok = sum(rc == 0 for rc, _ in results)
    notes = [f"{ok}/{n} podman pull processes exited 0"]
    for rc, msg in results:
        if rc:
            notes.append(f"exit {rc}: {msg[-200:]}")
    layers, cfg = split_gets(proxy.blob_gets, configs)
    return Outcome(label, n, n, needed, layers, cfg, proxy.manifest_gets, dt, notes=notes)


# --------------------------------------------------------------------------- #
# main
# --------------------------------------------------------------------------- #

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="image_pull.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=8, help="sandboxes (and raw pulls) per burst (default 8)")
    p.add_argument("--layer-mb", type=float, default=4.0,
                   help="random (incompressible) bytes in each new layer, in MB (default 4)")
    args = p.parse_args(argv)
    if not 0 <= args.layer_mb <= 1024:
        p.error("--layer-mb must be between 0 and 1024")
    if args.n < 1:
        p.error("--n must be at least 1")
    if args.n > 1024:
        p.error("--n must be at most 1024 (sandboxes_per_instance)")
    return args


def short(digest: str) -> str:
    return digest.removeprefix("sha256:")[:12]


def report(outcomes: list[Outcome], layer_names: dict[str, str]) -> float:
    table = Table(title="layer-blob fetches through the proxy", title_justify="left")
    for col in ("scenario", "requested", "pulls performed", "distinct layers needed",
                "blob fetches made", "fetches per distinct layer", "MB needed", "MB fetched",
                "config GETs", "manifest GETs", "wall s"):
        table.add_column(col, justify="left" if col == "scenario" else "right",
                         no_wrap=col == "scenario")
    for o in outcomes:
        table.add_row(o.scenario, str(o.requested), str(o.pulls), str(len(o.needed)), str(o.fetches),
                      f"{o.per_layer:.3f}", f"{o.mb_needed:.2f}", f"{o.mb_fetched:.2f}",
                      str(o.config_gets), str(o.manifest_gets), f"{o.seconds:.2f}")
    console.print(table)
    for o in outcomes:
        gets = sorted(o.layer_gets.items(), key=lambda item: layer_names.get(item[0], item[0]))
        per = ", ".join(f"{layer_names.get(d, short(d))} x{k}" for d, k in gets)
        console.print(f"[bold]{o.scenario}[/]: layer GETs {per or 'none'}; "
                      f"beyond one per needed layer: {o.wasted()}")
        for note in o.notes:
            console.print(f"    {note}")

    sdk = [o for o in outcomes if o.scenario.startswith("(a)") or o.scenario.startswith("(b)")]
    raw = [o for o in outcomes if o.scenario.startswith("(c)")]
    needed = sum(len(o.needed) for o in sdk)
    made = sum(o.fetches for o in sdk)
    x = made / needed if needed else float("nan")
    ratios = Table(title="side by side", title_justify="left")
    for col in ("", "SDK (a)+(b)", "raw podman (c)"):
        ratios.add_column(col, justify="left" if not col else "right")
    r_needed = sum(len(o.needed) for o in raw)
    r_made = sum(o.fetches for o in raw)
    r_req = sum(o.requested for o in raw)
    ratios.add_row("layer-blob fetches / distinct new layers", f"{x:.3f}",
                   f"{r_made / r_needed:.3f}" if r_needed else "n/a")
    ratios.add_row("pulls performed / sandboxes (or pulls) requested",
                   f"{sum(o.pulls for o in sdk) / sum(o.requested for o in sdk):.3f}",
                   f"{sum(o.pulls for o in raw) / r_req:.3f}" if r_req else "n/a")
    console.print(ratios)
    verdict = "[bold green]MET[/]" if abs(x - TARGET) < 1e-9 else "[bold red]NOT MET[/]"
    console.print(f"blob_fetches_per_image = {made} / {needed} = {x:.3f}  target {TARGET:g}: {verdict}")
    return x


async def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    n = args.n
    pad = int(args.layer_mb * 1e6)
    if shutil.which("podman") is None:
        console.print("podman is not installed: apt-get install -y podman runc")
        return 1
    try:
        LocalRegistry()._binary()
    except RegistryNotInstalled as exc:
        console.print(str(exc))
        return 1
    build = load_build_module()
    base = await asyncio.to_thread(build.build_busybox)
    build_args = build.podman_build_args()
    base_layer_count = len(podman("image", "inspect", "--format", "{{json .RootFS.Layers}}", base)
                           .stdout.strip().strip("[]").split(","))

    work = Path(tempfile.mkdtemp(prefix="flowmesh-bench-pull-"))
    home = work / "home"
    home.mkdir()
    os.environ["FLOWMESH_HOME"] = str(home)   # nothing of this run lands in the user's home
    os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
    hosts: list[str] = []
    local_refs: list[str] = []
    try:
        with LocalRegistry() as reg, FaultProxy(reg.host) as proxy:
            hosts += [reg.host, proxy.host]
            console.print(f"podman {podman('version', '--format', '{{.Client.Version}}').stdout.strip()}; "
                          f"registry {reg.host} behind counting proxy {proxy.host}; base {base} "
                          f"({base_layer_count} layer(s)); N={n}; "
                          f"{args.layer_mb:g} MB of random bytes in each new layer")

            # ---- three fresh images, pushed, local copies dropped ----
            l1, c1 = await asyncio.to_thread(build_layer_image, base, work, "image1", build_args, pad)
            local_refs.append(l1)
            l2, c2 = await asyncio.to_thread(build_layer_image, base, work, "image2", build_args, pad)
            local_refs.append(l2)
            l3, c3 = await asyncio.to_thread(build_layer_image, l1, work, "sibling", build_args, pad)
            local_refs.append(l3)
            refs = {}
            for local, name in ((l1, "image1"), (l2, "image2"), (l3, "sibling")):
                refs[name] = await asyncio.to_thread(reg.push, local, f"{REPO}/{name}:1")
            podman("rmi", l3, l2, l1)
            local_refs.clear()
            via = {k: v.replace(reg.host, proxy.host, 1) for k, v in refs.items()}

            # ---- what each image is made of (asked of the registry directly, not counted) ----
            async with RegistryClient(use_auth_files=False) as client:
                res: dict[str, ResolvedImage] = {k: await client.resolve(v) for k, v in refs.items()}
            lay = {k: [layer.digest for layer in r.layers] for k, r in res.items()}
            configs = {r.config_digest for r in res.values()}
            sizes = {layer.digest: layer.size for r in res.values() for layer in r.layers}
            base_layers = set(lay["image1"]) & set(lay["image2"])
            if len(base_layers) != base_layer_count or lay["sibling"][:-1] != lay["image1"]:
                raise RuntimeError(f"unexpected layer structure: {lay} (base has {base_layer_count})")
            need_a = set(lay["image1"]) - base_layers
            need_b = set(lay["sibling"]) - base_layers - set(lay["image1"])
            need_c = set(lay["image2"]) - base_layers
            names = {d: f"base{i}" for i, d in enumerate(sorted(base_layers))}
            names |= {d: "image1-layer" for d in need_a} | {d: "sibling-layer" for d in need_b}
            names |= {d: "image2-layer" for d in need_c}
            for k, r in res.items():
                console.print(f"[dim]{k}: {refs[k]} = {r.digest}; layers "
                              f"{', '.join(names.get(d, short(d)) + '=' + short(d) for d in lay[k])}; "
                              f"config {short(r.config_digest)}[/]")

            # ---- the SDK: one instance, N slots ----
            prov = LocalProvider(cpus=2, memory_gb=8, state_dir=home / "local")
            sb_mem = min(0.25, 8.0 / n)
            outcomes: list[Outcome] = []
            async with Fleet("bench-pull", home=home, providers={"local": prov}) as fleet:
                pool = await fleet.pool(PoolSpec(
                    name="pull", instance=InstanceSpec(cpus=2, memory_gb=8), min_instances=1,
                    max_instances=1, sandboxes_per_instance=n, warm_per_image=0))
                sb_spec = SandboxSpec(image=base, cpus=0.5, memory_gb=sb_mem)
                outcomes.append(await sdk_burst(fleet, pool, proxy, "(a) SDK: image1", via["image1"], c1,
                                                n, need_a, configs, sb_spec))
                outcomes.append(await sdk_burst(fleet, pool, proxy, "(b) SDK: sibling",
                                                via["sibling"], c3, n, need_b, configs, sb_spec))
            outcomes.append(await raw_burst(proxy, "(c) podman: image2", via["image2"], n,
                                            need_c, configs))
            for o in outcomes:
                o.sizes = sizes
            x = report(outcomes, names)
    finally:
        if local_refs:
            podman("rmi", "-f", *local_refs, check=False)
        removed = forget_images_from(*hosts) if hosts else 0
        shutil.rmtree(work, ignore_errors=True)
        console.print(f"[dim]cleanup: removed {removed} image(s) pulled from the temporary registry[/]")
    print(f"blob_fetches_per_image={x:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
