#!/usr/bin/env python3
"""Evaluate candidate patches for small SWE-style tasks in sandboxes that run per-task
images pulled from a registry by digest.

Each task is a tiny git repository with one bug, a pytest test that fails because of
it, and a candidate patch (a unified diff).  Like SWE-bench, every task gets its own
image: ``flowmesh_sdk.imagebuild`` builds ``localhost/flowmesh/swe-task-<name>:<tag>`` FROM
swe-base with the repository committed at ``/work/repo`` (one small layer).  The recipe
pushes swe-base and every task image to a registry (a throw-away ``docker-registry`` on
127.0.0.1, or ``--registry HOST:PORT``), removes the local task images, and runs each
task in ``HOST/flowmesh/swe-task-<name>:<tag>``: the SDK resolves it to its manifest
digest and pulls it by digest (only the task's own layer travels; swe-base stays local).
Inside the sandbox only the patch is shipped; the task:

1. checks that ``/work/repo`` is the image's clean commit,
2. checks that the test fails before the patch (else the task itself is broken),
3. applies the patch with ``git apply`` and restores ``tests/`` from the commit (a patch
   must fix the code, not edit the test),
4. runs ``python3 -m pytest -q``; exit 0 only if the test now passes.

Half the patches are right and half are wrong, so the expected verdict of every task is
known; the run succeeds only if every task's verdict matches.  The same batch runs on a
persistent pool (one warm instance, every image prefetched onto it, a fresh container per
task) and on an ephemeral pool (a fresh instance per task, which pulls its image), one
after the other; images pulled from the registry are removed in between, so both modes
really pull.

    python recipes/local_swe_eval.py [--tasks N] [--mode persistent|ephemeral|both]
                                     [--registry HOST:PORT] [--json PATH]

Importable too: ``await main(["--tasks", "4"])`` returns the exit status.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import difflib
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from flowmesh_sdk import EventKind, Fleet, InstanceSpec, PoolSpec, Task, TaskResult
from flowmesh_sdk.images import ImageInfo
from flowmesh_sdk.registry.local import LocalRegistry

BASE_IMAGE = "localhost/flowmesh/swe-base:bookworm"   # flowmesh_sdk.imagebuild's SWE_BASE_IMAGE
REPO = "/work/repo"                                    # where the task images hold the repo
PATCH = "/work/patch.diff"                             # the one file a task ships
TASK_TIMEOUT_S = 120.0
PHASES = ("queued", "scheduling", "env_startup", "execution", "teardown")
PHASE_LABELS = ("queued", "sched", "env", "exec", "teardown")

# Exit codes of the in-sandbox script (besides pytest's own 0 = passed, 1 = failed).
RC_PRE_PASSED = 3      # the test passed before the patch: the task is broken
RC_APPLY_FAILED = 4    # git apply refused the patch
RC_SETUP_FAILED = 5    # /work/repo is not the image's clean git commit

console = Console()
if not console.is_terminal:  # piped or captured: rich would fall back to 80 columns
    console = Console(width=180)


# --------------------------------------------------------------------------- #
# the tasks
# --------------------------------------------------------------------------- #

@dataclass(frozen=True)
class BugKind:
    """One kind of bug: the module, its buggy statement, a right and a wrong replacement
    for that statement, and a test that fails on the bug."""

    name: str
    module: str
    bug: str
    buggy: str
    right: str
    wrong: str
    test: str


def _src(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


BUG_KINDS: tuple[BugKind, ...] = (
    BugKind(
        "off-by-one", "series",
        bug='return sum(range(n))',
        buggy=_src('''
            """Arithmetic series."""


            def sum_to(n):
                """1 + 2 + ... + n."""
                return sum(range(n))


            def squares(n):
                return [i * i for i in range(n)]
            '''),
        right="return sum(range(n + 1))", wrong="return sum(range(1, n))",
        test=_src('''
            from series import sum_to


            def test_sum_to():
                assert sum_to(4) == 10
                assert sum_to(1) == 1
            '''),
    ),
    BugKind(
        "wrong-operator", "geometry",
        bug='return w + h',
        buggy=_src('''
            """Rectangles."""


            def area(w, h):
                """The area of a w x h rectangle."""
                return w + h


            def is_square(w, h):
                return w == h
            '''),
        right="return w * h", wrong="return 2 * (w + h)",
        test=_src('''
            from geometry import area


            def test_area():
                assert area(3, 4) == 12
                assert area(2, 2) == 4
            '''),
    ),
    BugKind(
        "wrong-comparison", "people",
        bug='return age > ADULT_AGE',
        buggy=_src('''
            """Age rules."""

            ADULT_AGE = 18


            def is_adult(age):
                """True from the 18th birthday on."""
                return age > ADULT_AGE
            '''),
        right="return age >= ADULT_AGE", wrong="return age >= ADULT_AGE - 1",
        test=_src('''
            from people import is_adult


            def test_is_adult():
                assert is_adult(18)
                assert not is_adult(17)
            '''),
    ),
    BugKind(
        "wrong-index", "seqs",
        bug="return xs[0]",
        buggy=_src('''
            """Sequence helpers."""


            def first(xs):
                return next(iter(xs))


            def last(xs):
                """The last element of a non-empty sequence."""
                return xs[0]
            '''),
        right="return xs[-1]", wrong="return xs[len(xs) - 2]",
        test=_src('''
            from seqs import last


            def test_last():
                assert last([1, 2, 3]) == 3
                assert last("ab") == "b"
            '''),
    ),
    BugKind(
        "swapped-bounds", "ranges",
        bug='return max(hi, min(lo, x))',
        buggy=_src('''
            """Clamping."""


            def clamp(x, lo, hi):
                """x limited to [lo, hi]."""
                return max(hi, min(lo, x))
            '''),
        right="return max(lo, min(hi, x))", wrong="return min(lo, max(hi, x))",
        test=_src('''
            from ranges import clamp


            def test_clamp():
                assert clamp(5, 0, 10) == 5
                assert clamp(-1, 0, 10) == 0
                assert clamp(11, 0, 10) == 10
            '''),
    ),
    BugKind(
        "wrong-literal", "text",
        bug='return s.lower().replace(" ", "_")',
        buggy=_src('''
            """Text helpers."""


            def slugify(s):
                """'Hello World' -> 'hello-world'."""
                return s.lower().replace(" ", "_")
            '''),
        right='return s.lower().replace(" ", "-")', wrong='return s.replace(" ", "-")',
        test=_src('''
            from text import slugify


            def test_slugify():
                assert slugify("Hello World") == "hello-world"
            '''),
    ),
    BugKind(
        "inverted-condition", "parity",
        bug='return n % 2 == 1',
        buggy=_src('''
            """Parity."""


            def is_even(n):
                return n % 2 == 1
            '''),
        right="return n % 2 == 0", wrong="return n // 2 == 0",
        test=_src('''
            from parity import is_even


            def test_is_even():
                assert is_even(4)
                assert is_even(0)
                assert not is_even(7)
            '''),
    ),
    BugKind(
        "wrong-divisor", "stats",
        bug='return sum(xs) / (len(xs) - 1)',
        buggy=_src('''
            """Statistics."""


            def mean(xs):
                """The arithmetic mean of a non-empty list."""
                return sum(xs) / (len(xs) - 1)
            '''),
        right="return sum(xs) / len(xs)", wrong="return sum(xs) // len(xs)",
        test=_src('''
            from stats import mean


            def test_mean():
                assert mean([1, 2]) == 1.5
                assert mean([2, 4, 6]) == 4
            '''),
    ),
)


@dataclass(frozen=True)
class SweTask:
    name: str
    bug: str
    patch_kind: str          # "right" or "wrong"
    how: str                 # what the patch does
    repo_files: dict[str, bytes]   # relative to the repository root; baked into the image
    patch: bytes                   # shipped into the sandbox at PATCH
    expected: str            # "pass" or "fail"


def _fix(kind: BugKind, stmt: str) -> str:
    """The module with its buggy statement replaced by ``stmt``."""
    if kind.buggy.count(kind.bug) != 1:
        raise ValueError(f"{kind.name}: the buggy statement must occur exactly once")
    return kind.buggy.replace(kind.bug, stmt)


def _diff(path: str, old: str, new: str) -> str:
    out = "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                       fromfile=f"a/{path}", tofile=f"b/{path}"))
    if not out:
        raise ValueError(f"empty diff for {path}")
    return out


def make_tasks(n: int) -> list[SweTask]:
    """``n`` tasks cycling through the bug kinds; right and wrong patches alternate
    (flipped on every other cycle so each kind gets both), and every other wrong patch
    edits the test instead of the code (the run restores the test, so it must fail)."""
    tasks = []
    wrong_seen = 0
    for i in range(n):
        kind = BUG_KINDS[i % len(BUG_KINDS)]
        cycle = i // len(BUG_KINDS)
        right = (i + cycle) % 2 == 0
        mod, test_path = f"{kind.module}.py", f"tests/test_{kind.module}.py"
        if right:
            patch, how = _diff(mod, kind.buggy, _fix(kind, kind.right)), "fixes the bug"
        elif wrong_seen % 2 == 0:
            patch, how = _diff(mod, kind.buggy, _fix(kind, kind.wrong)), "bad fix"
            wrong_seen += 1
        else:
            # a "fix" that skips the test instead of fixing the code
            tampered = "import pytest\n\n\n@pytest.mark.skip\n" + kind.test.split("\n\n\n", 1)[1]
            tampered = kind.test.split("\n\n\n", 1)[0] + "\n" + tampered
            patch, how = _diff(test_path, kind.test, tampered), "edits the test"
            wrong_seen += 1
        readme = f"# task {i}: {kind.name}\n\n`python3 -m pytest -q` must pass.\n"
        repo_files = {
            mod: kind.buggy.encode(),
            test_path: kind.test.encode(),
            "README.md": readme.encode(),
        }
        tasks.append(SweTask(name=f"t{i:02d}-{kind.name}", bug=kind.name,
                             patch_kind="right" if right else "wrong", how=how,
                             repo_files=repo_files, patch=patch.encode(),
                             expected="pass" if right else "fail"))
    return tasks


#: runs in the sandbox: the task image holds the repository, committed, at REPO; the
#: patch was shipped to PATCH
TASK_SCRIPT = f"""\
set -u
export PYTHONDONTWRITEBYTECODE=1
cd {REPO} || exit {RC_SETUP_FAILED}
echo "== repository from the image"
git log --oneline -1 || exit {RC_SETUP_FAILED}
if [ -n "$(git status --porcelain)" ]; then
  git status --short; echo "the image's repository is not a clean commit"; exit {RC_SETUP_FAILED}
fi
echo "== before the patch"
if python3 -m pytest -q -p no:cacheprovider; then
  echo "the test passes before the patch: the task is broken"; exit {RC_PRE_PASSED}
fi
echo "== git apply"
git apply --whitespace=nowarn {PATCH} || exit {RC_APPLY_FAILED}
git diff --stat
git checkout -q HEAD -- tests   # the patch must fix the code, not the test
echo "== after the patch"
python3 -m pytest -q -p no:cacheprovider
"""


async def agent_session(pool: Any, task: SweTask, image: str) -> dict[str, Any]:
    """The task as an agent loop would drive it: one shell session, ``cd`` into the
    repository once, then each step as its own command (state such as the cwd and the
    exported variable carries over), the verdict read from the last step."""
    t0 = time.monotonic()
    steps: list[tuple[str, int]] = []
    async with pool.sandbox(pool.default_sandbox(image)) as sb:
        await sb.write_file(PATCH, task.patch)
        sh = sb.session("agent")

        async def step(cmd: str) -> Any:
            r = await sh.run(cmd, timeout_s=TASK_TIMEOUT_S)
            steps.append((cmd, r.exit_code))
            return r

        await step(f"cd {REPO} && export PYTHONDONTWRITEBYTECODE=1")
        clean = (await step("git status --porcelain")).stdout.strip() == ""
        before = await step("python3 -m pytest -q -p no:cacheprovider")
        applied = await step(f"git apply --whitespace=nowarn {PATCH}")
        await step("git checkout -q HEAD -- tests")
        after = await step("python3 -m pytest -q -p no:cacheprovider")
    if not clean or before.ok or not applied.ok:
        verdict = "error"
    else:
        verdict = "pass" if after.ok else "fail"
    return {"task": task.name, "expected": task.expected, "got": verdict,
            "matched": verdict == task.expected, "commands": len(steps),
            "steps": [{"cmd": c, "exit_code": rc} for c, rc in steps],
            "wall_s": time.monotonic() - t0, "restarts": sh.restarts}


def verdict_of(res: TaskResult) -> str:
    """What the sandbox said: pass, fail, or why there is no verdict."""
    if res.error is not None or res.result is None:
        return "error"
    r = res.result
    if r.timed_out:
        return "timeout"
    return {0: "pass", 1: "fail", RC_PRE_PASSED: "pre-passed", RC_APPLY_FAILED: "apply-failed",
            RC_SETUP_FAILED: "setup-failed"}.get(r.exit_code, f"exit {r.exit_code}")


# --------------------------------------------------------------------------- #
# images and the registry
# --------------------------------------------------------------------------- #

class Registry(Protocol):
    """What the recipe needs of a registry: LocalRegistry, or ExistingRegistry below."""

    host: str
    pushed: dict[str, str]

    def push(self, local_image: str, name_tag: str) -> str: ...


class ExistingRegistry:
    """``--registry HOST:PORT``: a registry that is already running.  Pushes like
    ``LocalRegistry.push``: ``podman push`` straight to ``docker://HOST/NAME:TAG`` (no
    extra local tag), recording the manifest digest in ``pushed``."""

    def __init__(self, host: str, tls_verify: bool) -> None:
        self.host = host
        self.tls_verify = tls_verify
        self.pushed: dict[str, str] = {}

    def push(self, local_image: str, name_tag: str) -> str:
        ref = f"{self.host}/{name_tag}"
        env = dict(os.environ)
        env["NO_PROXY"] = env["no_proxy"] = ",".join(
            filter(None, [env.get("NO_PROXY", ""), "127.0.0.1,localhost"]))
        with tempfile.TemporaryDirectory(prefix="flowmesh-push-") as tmp:
            digest_file = Path(tmp) / f"digest-{secrets.token_hex(4)}"
            proc = subprocess.run(
                ["podman", "push", f"--tls-verify={str(self.tls_verify).lower()}", "--quiet",
                 "--digestfile", str(digest_file), local_image, f"docker://{ref}"],
                capture_output=True, text=True, timeout=600, env=env)
            if proc.returncode != 0:
                raise RuntimeError(f"podman push {local_image} -> {ref} failed ({proc.returncode}): "
                                   f"{proc.stderr.strip()[-1500:]}")
            self.pushed[ref] = digest_file.read_text().strip()
        return ref


@dataclass(frozen=True)
class TaskImage:
    local: str     # localhost/flowmesh/swe-task-<name>:<tag>, removed once pushed
    image: str     # HOST/flowmesh/swe-task-<name>:<tag>, what the sandboxes name
    pushed: str    # the manifest digest the push reported


def _podman(*args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], capture_output=True, text=True, check=check)


def _short(digest: str) -> str:
    return digest[:19]   # "sha256:" and 12 hex digits


def build_and_push(build: Any, reg: Registry, swe: list[SweTask],
                   built: list[str]) -> dict[str, TaskImage]:
    """Build one image per task (FROM swe-base), push swe-base and them to ``reg``, then
    remove the local copies so that the sandboxes must pull.  ``built`` collects the
    local references as they are made (for clean-up when something fails half-way)."""
    t0 = time.monotonic()
    # The tag is the repository's content hash (build.py's default) plus a per-run suffix:
    # the local image is removed again once pushed, and another run of this recipe at the
    # same time must not remove (or reuse) this run's images.
    run_id = secrets.token_hex(3)
    local: dict[str, str] = {}
    for t in swe:
        tag = f"{build.task_repo_digest(t.repo_files)[:build.SWE_TASK_TAG_LEN]}-{run_id}"
        local[t.name] = build.build_task_image(t.name, t.repo_files, tag)
        built.append(local[t.name])
    console.print(f"built {len(swe)} task images FROM {BASE_IMAGE} in {time.monotonic() - t0:.1f} s "
                  f"(one layer each: the repository committed at {REPO})")

    t0 = time.monotonic()
    ref = reg.push(BASE_IMAGE, BASE_IMAGE.removeprefix("localhost/"))
    console.print(f"pushed {ref} {_short(reg.pushed.get(ref, '?'))} in {time.monotonic() - t0:.1f} s")
    images: dict[str, TaskImage] = {}
    t0 = time.monotonic()
    for i, t in enumerate(swe, 1):
        t1 = time.monotonic()
        ref = reg.push(local[t.name], local[t.name].removeprefix("localhost/"))
        digest = reg.pushed.get(ref)
        if not digest or not digest.startswith("sha256:"):
            raise RuntimeError(f"push of {ref} reported no manifest digest ({digest!r})")
        images[t.name] = TaskImage(local=local[t.name], image=ref, pushed=digest)
        console.print(f"[dim]  [{i}/{len(swe)}] pushed {ref} {_short(digest)} "
                      f"({time.monotonic() - t1:.2f} s)[/]")
    console.print(f"pushed {len(swe)} task images to {reg.host} in {time.monotonic() - t0:.1f} s")

    # Drop the local copies: the task images (their localhost/ tags) and any HOST/ tag a
    # push left, so that every sandbox has to pull its image from the registry.
    # swe-base stays, so a pull fetches only the task's own layer.
    removed = 0
    for ti in images.values():
        res = _podman("rmi", ti.local)
        if res.returncode != 0:
            raise RuntimeError(f"podman rmi {ti.local} failed: {res.stderr.strip()[-500:]}")
        built.remove(ti.local)
        removed += 1
    leftover_tags = [r for r in reg.pushed if _podman("image", "exists", r).returncode == 0]
    for r in leftover_tags:
        _podman("rmi", r)   # by name: untags only, never deletes swe-base
    still = [ti.local for ti in images.values() if _podman("image", "exists", ti.local).returncode == 0]
    still += [r for r in reg.pushed if _podman("image", "exists", r).returncode == 0]
    if still:
        raise RuntimeError(f"local copies still present after podman rmi: {still}")
    console.print(f"removed {removed} local task images and {len(leftover_tags)} pushed "
                  f"{reg.host}/ tag(s); {BASE_IMAGE} stays, so each pull fetches one small layer")
    return images


def remove_pulled(host: str) -> int:
    """Remove the task images pulled from ``host`` (never swe-base); returns how many."""
    res = _podman("images", "-q", "--no-trunc", "--filter", f"reference={host}/*/*")
    ids = set(res.stdout.split())
    base = _podman("image", "inspect", "--format", "{{.Id}}", BASE_IMAGE).stdout.strip()
    ids.discard(base)
    ids.discard(f"sha256:{base}")
    if ids:
        _podman("rmi", "-f", *sorted(ids))
    return len(ids)


# --------------------------------------------------------------------------- #
# running
# --------------------------------------------------------------------------- #

@dataclass
class Fetched:
    """What the registry served during one mode (from a LocalRegistry's access log)."""

    manifests: int
    layers: int
    blob_bytes: int


@dataclass
class ModeRun:
    mode: str
    pool: str
    wall_s: float
    tasks: list[SweTask]
    results: list[TaskResult]
    images: dict[str, TaskImage]
    infos: dict[str, ImageInfo]          # task name -> what its image resolved to
    pulls: list[dict[str, Any]]          # the IMAGE_PULLED events of this mode's pool
    prefetch_s: float | None = None      # persistent: pool.prefetch() of every image
    fetched: Fetched | None = None       # None: not our registry (no access log)
    agent: list[dict[str, Any]] = field(default_factory=list)   # the step-by-step session runs

    def matched(self) -> list[bool]:
        return [verdict_of(r) == t.expected for t, r in zip(self.tasks, self.results)]


def pool_spec(mode: str) -> PoolSpec:
    if mode == "persistent":
        # one warm 2-cpu instance, two sandboxes (1 cpu each) at a time; no warm
        # containers: every task has its own image, and a warm container of one image
        # cannot serve another
        return PoolSpec(name="swe-persistent", mode="persistent",
                        instance=InstanceSpec(cpus=2, memory_gb=4), min_instances=1,
                        max_instances=1, sandboxes_per_instance=2, warm_per_image=0)
    # a fresh 1-cpu instance per task, two at a time
    return PoolSpec(name="swe-ephemeral", mode="ephemeral", instance=InstanceSpec(cpus=1, memory_gb=2),
                    max_instances=2)


def _access_log(reg: Registry) -> list[Any] | None:
    return reg.request_log() if isinstance(reg, LocalRegistry) else None


def _fetched(reg: Registry, mark: int, infos: dict[str, ImageInfo]) -> Fetched | None:
    if not isinstance(reg, LocalRegistry):
        return None
    layer_digests = {layer.digest for info in infos.values() for layer in info.layers}
    entries = reg.request_log()[mark:]
    gets = [e for e in entries if e.method == "GET" and e.status == 200]
    blobs = [e for e in gets if e.kind == "blob"]
    return Fetched(manifests=sum(e.kind == "manifest" for e in gets),
                   layers=sum(e.reference in layer_digests for e in blobs),
                   blob_bytes=sum(e.size for e in blobs))


async def run_mode(fleet: Fleet, reg: Registry, mode: str, swe: list[SweTask],
                   images: dict[str, TaskImage], spec: PoolSpec | None = None) -> ModeRun:
    """Run the batch in a pool of ``spec`` (default: this recipe's local pool for ``mode``)."""
    spec = spec or pool_spec(mode)
    refs = [images[t.name].image for t in swe]
    log_mark = len(_access_log(reg) or [])
    pulled = fleet.bus.subscribe(EventKind.IMAGE_PULLED)
    prefetch_s: float | None = None
    try:
        t_pool = time.monotonic()
        pool = await fleet.pool(spec)
        try:
            st, inst = pool.stats(), spec.instance
            shape = (f"{st.instances} instance(s) of {inst.cpus} cpus up on {', '.join(spec.infra)}, "
                     f"{spec.sandboxes_per_instance} sandboxes at a time" if mode == "persistent" else
                     f"a fresh {inst.cpus}-cpu instance per task, {spec.max_instances} at a time")
            console.print(f"[dim]{mode}: pool {pool.name} ready in {time.monotonic() - t_pool:.1f} s "
                          f"({shape})[/]")
            if mode == "persistent":
                # pull every task image onto the warm instance ahead of the batch
                t0 = time.monotonic()
                resolved = await pool.prefetch(refs)
                prefetch_s = time.monotonic() - t0
                console.print(f"{mode}: prefetched {len(resolved)} images by digest onto "
                              f"{st.instances} instance(s) in {prefetch_s:.1f} s")
            else:
                # resolve only (the resolver caches it, so a task's "queued" phase is not
                # charged with the lookup); each fresh instance pulls its own image
                resolved = [await fleet.images.resolve(r) for r in refs]
            infos = {t.name: info for t, info in zip(swe, resolved)}
            for t in swe:
                info, pushed = infos[t.name], images[t.name].pushed
                if info.digest != pushed or f"@{pushed}" not in info.run_ref:
                    raise RuntimeError(f"{images[t.name].image} resolved to {info.digest} "
                                       f"({info.run_ref}), but the push reported {pushed}")
            tasks = [Task(name=t.name, sandbox=pool.default_sandbox(images[t.name].image),
                          command=TASK_SCRIPT, files={PATCH: t.patch}, timeout_s=TASK_TIMEOUT_S)
                     for t in swe]
            expected = {t.name: t.expected for t in swe}
            counts = {"ok": 0, "bad": 0}
            with Progress(SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(),
                          MofNCompleteColumn(), TextColumn("{task.fields[tally]}"),
                          TimeElapsedColumn(), console=console, transient=False) as progress:
                bar = progress.add_task(f"{mode:<10}", total=len(tasks), tally="")

                def on_result(res: TaskResult) -> None:
                    counts["ok" if verdict_of(res) == expected[res.name] else "bad"] += 1
                    tally = f"[green]{counts['ok']} as expected[/]" + (
                        f" [red]{counts['bad']} not[/]" if counts["bad"] else "")
                    progress.update(bar, advance=1, tally=tally)

                t0 = time.monotonic()
                results = await pool.map(tasks, on_result=on_result)
                wall = time.monotonic() - t0
            agent: list[dict[str, Any]] = []
            if mode == "persistent":
                # one right and one wrong patch again, step by step in a shell session
                for kind in ("pass", "fail"):
                    t = next((x for x in swe if x.expected == kind), None)
                    if t is not None:
                        agent.append(await agent_session(pool, t, images[t.name].image))
                for a in agent:
                    mark = "[green]as expected[/]" if a["matched"] else "[red]NOT as expected[/]"
                    console.print(f"{mode}: agent session on {a['task']}: {a['got']} {mark} "
                                  f"({a['commands']} commands in one shell, {a['wall_s']:.1f} s)")
        finally:
            await pool.drain()  # frees the host's cpus for the next mode
    finally:
        pulls = []
        while not pulled.queue.empty():
            ev = pulled.queue.get_nowait()
            if ev.pool == spec.name:
                pulls.append({"instance_id": ev.instance_id, "detail": ev.detail})
        pulled.close()
    return ModeRun(mode=mode, pool=pool.name, wall_s=wall, tasks=swe, results=results,
                   images=images, infos=infos, pulls=pulls, prefetch_s=prefetch_s,
                   fetched=_fetched(reg, log_mark, infos), agent=agent)


# --------------------------------------------------------------------------- #
# reporting
# --------------------------------------------------------------------------- #

def _ms(s: float) -> str:
    return f"{s * 1000:.0f}"


def task_table(run: ModeRun) -> Table:
    t = Table(title=f"{run.mode} pool ({run.pool}); phases in ms", title_justify="left")
    for col in ("task", "patch", "expected", "got", "verdict", "instance", "digest"):
        t.add_column(col, no_wrap=True)
    for label in PHASE_LABELS:
        t.add_column(label, justify="right")
    for task, res, ok in zip(run.tasks, run.results, run.matched()):
        got = verdict_of(res)
        t.add_row(task.name, task.patch_kind + ("" if task.patch_kind == "right" else f": {task.how}"),
                  task.expected,
                  f"[green]{got}[/]" if got == "pass" else f"[yellow]{got}[/]",
                  "[green]✓[/]" if ok else "[bold red]✗[/]", res.instance_id or "-",
                  _short(run.infos[task.name].digest),
                  *(_ms(getattr(res.phases, p)) for p in PHASES))
    return t


def _fetched_text(f: Fetched | None) -> str:
    if f is None:
        return "-"
    return f"{f.layers} layers, {f.blob_bytes / 1024:.0f} KiB"


def summary_table(runs: list[ModeRun]) -> Table:
    t = Table(title="summary (phase columns: p50 ms)", title_justify="left")
    for col in ("mode", "tasks", "passed", "expected-match", "wall s", "pulls", "prefetch s",
                "from registry"):
        t.add_column(col, justify="right" if col != "mode" else "left")
    for label in PHASE_LABELS:
        t.add_column(f"p50 {label}", justify="right")
    for run in runs:
        matched = sum(run.matched())
        passed = sum(verdict_of(r) == "pass" for r in run.results)
        style = "green" if matched == len(run.tasks) else "bold red"
        t.add_row(run.mode, str(len(run.tasks)), str(passed),
                  f"[{style}]{matched}/{len(run.tasks)}[/]", f"{run.wall_s:.1f}",
                  str(len(run.pulls)), "-" if run.prefetch_s is None else f"{run.prefetch_s:.1f}",
                  _fetched_text(run.fetched),
                  *(_ms(statistics.median(getattr(r.phases, p) for r in run.results)) for p in PHASES))
    return t


def print_mismatches(run: ModeRun) -> None:
    for task, res, ok in zip(run.tasks, run.results, run.matched()):
        if ok:
            continue
        console.print(f"[bold red]{run.mode} {task.name}[/]: expected {task.expected}, "
                      f"got {verdict_of(res)}")
        if res.error:
            console.print(f"  error: {res.error}")
        if res.result is not None:
            tail = (res.result.stdout + res.result.stderr).strip().splitlines()[-15:]
            console.print("\n".join("  | " + ln for ln in tail), markup=False, highlight=False)


def to_json(registry: str, runs: list[ModeRun], ok: bool) -> dict[str, Any]:
    modes: dict[str, Any] = {}
    for run in runs:
        rows = []
        for task, res, matched in zip(run.tasks, run.results, run.matched()):
            r = res.result
            info = run.infos[task.name]
            rows.append({
                "task": task.name, "bug": task.bug, "patch": task.patch_kind, "patch_does": task.how,
                "expected": task.expected, "got": verdict_of(res), "matched": matched,
                "exit_code": r.exit_code if r else None, "timed_out": r.timed_out if r else None,
                "error": res.error, "task_id": res.task_id, "instance_id": res.instance_id,
                "image": run.images[task.name].image, "digest": info.digest, "pinned": info.run_ref,
                "phases_s": asdict(res.phases),
                "output_tail": ((r.stdout + r.stderr)[-2000:] if r else ""),
            })
        modes[run.mode] = {
            "pool": run.pool, "wall_s": run.wall_s, "tasks": len(rows),
            "passed": sum(x["got"] == "pass" for x in rows),
            "expected_match": sum(x["matched"] for x in rows),
            "pulls": len(run.pulls), "pull_events": run.pulls, "prefetch_s": run.prefetch_s,
            "registry_sent": asdict(run.fetched) if run.fetched else None,
            "p50_phases_s": {p: statistics.median(getattr(r.phases, p) for r in run.results)
                             for p in PHASES},
            "results": rows,
            "agent_session": run.agent,
        }
    return {"base_image": BASE_IMAGE, "registry": registry, "ok": ok, "modes": modes}


# --------------------------------------------------------------------------- #
# main
# --------------------------------------------------------------------------- #

def _load_image_builder() -> Any:
    from flowmesh_sdk.imagebuild import build   # the project's images, shipped in the package
    return build


def ensure_base(build: Any) -> None:
    console.print(f"making sure {build.SWE_BASE_IMAGE} exists (the first build runs debootstrap "
                  "and may take a minute or two; later runs reuse it)")
    build.build_swe_base()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="local_swe_eval.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=int, default=8, metavar="N", help="number of tasks (default 8)")
    p.add_argument("--mode", choices=("persistent", "ephemeral", "both"), default="both")
    p.add_argument("--registry", metavar="HOST:PORT",
                   help="push to and pull from this running registry (plain HTTP only on "
                        "loopback) instead of a throw-away docker-registry on 127.0.0.1")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    args = p.parse_args(argv)
    if args.tasks < 1:
        p.error("--tasks must be at least 1")
    return args


async def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    build = _load_image_builder()
    if build.SWE_BASE_IMAGE != BASE_IMAGE:
        console.print(f"[bold red]flowmesh_sdk.imagebuild builds {build.SWE_BASE_IMAGE}, not {BASE_IMAGE}[/]")
        return 2
    registry: ExistingRegistry | None = None
    if args.registry:
        try:
            host = args.registry.strip().rstrip("/")
            registry = ExistingRegistry(host, build.resolve_tls_verify(host))
        except build.ImageBuildError as exc:
            console.print(f"[bold red]bad --registry:[/] {exc}")
            return 2
    try:
        await asyncio.to_thread(ensure_base, build)
    except Exception as exc:  # noqa: BLE001 - ImageBuildError and friends, reported plainly
        console.print(f"[bold red]image not available:[/] {exc}")
        return 2
    swe = make_tasks(args.tasks)
    kinds = sorted({t.bug for t in swe})
    console.print(f"{len(swe)} tasks, {len(kinds)} bug kinds, "
                  f"{sum(t.patch_kind == 'right' for t in swe)} right and "
                  f"{sum(t.patch_kind == 'wrong' for t in swe)} wrong patches, "
                  f"one image per task FROM {BASE_IMAGE}")
    modes = ["persistent", "ephemeral"] if args.mode == "both" else [args.mode]
    runs: list[ModeRun] = []
    async with contextlib.AsyncExitStack() as stack:
        if registry is not None:
            reg: Registry = registry
            console.print(f"using the registry at {reg.host}")
        else:
            try:
                reg = await stack.enter_async_context(LocalRegistry())
            except LocalRegistryError as exc:   # RegistryNotInstalled among them
                console.print(f"[bold red]cannot start a local registry:[/] {exc}")
                return 2
            console.print(f"started docker-registry at {reg.host} (throw-away, stopped at the end)")
        host = reg.host   # a LocalRegistry forgets its port once stopped
        built: list[str] = []
        try:
            try:
                images = await asyncio.to_thread(build_and_push, build, reg, swe, built)
            except Exception as exc:  # noqa: BLE001 - build, push or rmi failed
                console.print(f"[bold red]task images not available:[/] {exc}")
                return 2
            async with Fleet(name="swe-eval") as fleet:
                for i, mode in enumerate(modes):
                    if i:
                        # the instances share this host's image store: drop what the previous
                        # mode pulled, so that this mode pulls from the registry too
                        n = await asyncio.to_thread(remove_pulled, reg.host)
                        console.print(f"[dim]removed {n} image(s) pulled by the {modes[i - 1]} "
                                      f"pool, so the {mode} pool pulls them again[/]")
                    runs.append(await run_mode(fleet, reg, mode, swe, images))
        finally:
            for ref in built:   # a build or push that failed half-way
                _podman("rmi", ref)
            n = await asyncio.to_thread(remove_pulled, reg.host)
            console.print(f"[dim]clean-up: removed {n} image(s) pulled from {reg.host}; "
                          f"{BASE_IMAGE} stays[/]")
    for run in runs:
        console.print(task_table(run))
        print_mismatches(run)
    console.print(summary_table(runs))
    verdicts_ok = all(all(run.matched()) and all(a["matched"] for a in run.agent) for run in runs)
    pulled_ok = all(run.pulls for run in runs)
    ok = verdicts_ok and pulled_ok
    for run in runs:
        if not run.pulls:
            console.print(f"[bold red]{run.mode}: no image was pulled from the registry[/]")
    if args.json:
        Path(args.json).write_text(json.dumps(to_json(host, runs, ok), indent=2) + "\n")
        console.print(f"results written to {args.json}")
    if verdicts_ok:
        console.print("[bold green]every verdict matched its expectation[/]")
    else:
        bad = sum(not m for run in runs for m in run.matched()) + sum(
            not a["matched"] for run in runs for a in run.agent)
        console.print(f"[bold red]{bad} verdict(s) did not match their expectation[/]")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
