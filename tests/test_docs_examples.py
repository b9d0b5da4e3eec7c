"""The docs must not rot silently.

* docs/examples/quickstart.py and quickstart_sync.py run (real podman, busybox image)
  and print what the docs say they print;
* every ``from flowmesh_sdk... import ...`` in docs/api.md code blocks imports;
* every field of the documented records, every EventKind and every CLI option is
  named in docs/api.md.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
API_MD = DOCS / "api.md"


def _run_example(script: str, home: Path) -> str:
    env = dict(os.environ, FLOWMESH_HOME=str(home), PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, str(DOCS / "examples" / script)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, (f"{script} exited {proc.returncode}\n--- stdout\n{proc.stdout}"
                                  f"\n--- stderr\n{proc.stderr}")
    return proc.stdout


def _assert_left_nothing(home: Path, pool: str, tasks: int) -> None:
    from flowmesh_sdk.control.store import MetadataStore

    assert not list((home / "local" / "instances").glob("*.json")), "local instances left behind"
    store = MetadataStore(home / "flowmesh.db")
    try:
        pools = {p.name: p for p in store.pools()}
        rows = store.tasks(pool=pool)
        live = store.instances(live_only=True)
    finally:
        store.close()
    assert pool in pools and pools[pool].drained_at is not None
    assert len(rows) == tasks and all(t.state == "succeeded" for t in rows), rows
    assert not live, live


def test_quickstart_runs(tmp_path: Path, busybox_image: str) -> None:
    out = _run_example("quickstart.py", tmp_path)
    lines = out.splitlines()
    for expected in [
        f"image: {busybox_image}",
        "pool: quickstart (persistent), ready instances: 1",
        "exec: exit=0 stdout=['hello from the host', '20']",
        r"read_file: b'hello from the host\n'",
        "timeout: timed_out=True exit=137 ok=False",
        "after timeout: still usable",
        "events: 4 tasks finished, 4 succeeded",
        "closed",
    ]:
        assert expected in lines, f"missing line {expected!r} in:\n{out}"
    for n in (2, 3, 4):
        prefix = f"task square-{n}: ok=True exit=0 stdout='{n} squared is {n * n}' (queued "
        assert any(line.startswith(prefix) for line in lines), f"no {prefix!r} in:\n{out}"
    assert lines[-1] == "closed"
    # one sandbox lease + three tasks, all recorded, pool drained, nothing left running
    _assert_left_nothing(tmp_path, "quickstart", tasks=4)


def test_quickstart_sync_runs(tmp_path: Path, busybox_image: str) -> None:
    out = _run_example("quickstart_sync.py", tmp_path)
    lines = out.splitlines()
    for expected in [
        f"image: {busybox_image}",
        "exec: exit=0 stdout='hello from a script'",
        "timeout: timed_out=True ok=False",
        "task echo-1: ok=True stdout='task 1'",
        "task echo-2: ok=True stdout='task 2'",
        "task echo-3: ok=True stdout='task 3'",
        "stats: in_flight=0 ready=1",
        "closed",
    ]:
        assert expected in lines, f"missing line {expected!r} in:\n{out}"
    _assert_left_nothing(tmp_path, "quickstart-sync", tasks=4)


def test_sandbox_agent_example_runs(tmp_path: Path, busybox_image: str) -> None:
    out = _run_example("sandbox_agent.py", tmp_path)
    lines = out.splitlines()
    for expected in [
        "session: building in /work/repo (test) [/bin/sh]",
        "other session: cwd=/ MODE=unset",
        "interrupted: exit=130, then cwd=/work/repo",
        "timeout: timed_out=True, MODE=test",
        "server: hello from httpd",
        "server stopped: exit=143",
        "streamed: ['line 1', 'line 2', 'line 3']",
        "on_stdout: [b'1', b'2', b'3', b'4', b'5'] exit=0",
        r"stdin round trip: b'\x00binary\xffstdin\n'",
        "concurrent: ['A', 'B']",
        "network none: reachable=False",
        "closed",
    ]:
        assert expected in lines, f"missing line {expected!r} in:\n{out}"


# --------------------------------------------------------------------------- #
# docs/api.md stays true to the code
# --------------------------------------------------------------------------- #

_FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
_IMPORT = re.compile(r"^\s*(from\s+flowmesh_(?:sdk|providers)[\w.]*\s+import\s|import\s+flowmesh_(?:sdk|providers))")


def _doc_imports(path: Path) -> list[str]:
    """The flowmesh import statements of every ```python block, multi-line ones joined."""
    stmts: list[str] = []
    for block in _FENCE.findall(path.read_text()):
        lines = block.splitlines()
        i = 0
        while i < len(lines):
            line = lines[i]
            if _IMPORT.match(line):
                stmt = line.strip()
                while stmt.count("(") > stmt.count(")") and i + 1 < len(lines):
                    i += 1
                    stmt += " " + lines[i].strip()
                stmts.append(stmt)
            i += 1
    return stmts


def test_api_md_imports_resolve() -> None:
    stmts = _doc_imports(API_MD)
    assert len(stmts) >= 10, stmts
    names: set[str] = set()
    for stmt in stmts:
        ns: dict[str, object] = {}
        try:
            exec(compile(stmt, "docs/api.md", "exec"), ns)  # noqa: S102 - our own docs
        except ImportError as exc:
            pytest.fail(f"docs/api.md: `{stmt}` does not import: {exc}")
        names |= {k for k in ns if k != "__builtins__"}
    for must in ("Fleet", "PoolSpec", "InstanceSpec", "SandboxSpec", "Task", "SyncFleet",
                 "RuntimeConfig", "QuotaLimits", "EventKind", "LocalProvider"):
        assert must in names, f"docs/api.md never imports {must}"


def _records():
    from flowmesh_sdk import (ExecResult, InstanceSpec, PhaseTimings, PoolSpec, QuotaLimits,
                              SandboxSpec, Task, TaskResult)
    from flowmesh_sdk.control import Event
    from flowmesh_sdk.pools import PoolStats
    from flowmesh_sdk.remote.runtime import RuntimeConfig
    from flowmesh_sdk.workers import (ElasticStats, ElasticWorker, ScalingDecision, ScalingPolicy, ServeCommand,
                                      WorkerLag)
    return [ExecResult, InstanceSpec, PhaseTimings, PoolSpec, QuotaLimits, SandboxSpec, Task,
            TaskResult, Event, PoolStats, RuntimeConfig, ScalingPolicy, ServeCommand, WorkerLag, ScalingDecision,
            ElasticStats, ElasticWorker]


@pytest.mark.parametrize("record", _records(), ids=lambda r: r.__name__)
def test_api_md_names_every_field(record: type) -> None:
    text = API_MD.read_text()
    missing = [f.name for f in dataclasses.fields(record) if f"`{f.name}`" not in text]
    assert not missing, f"docs/api.md does not mention {record.__name__} fields {missing}"


def test_api_md_lists_every_event_kind() -> None:
    from flowmesh_sdk import EventKind

    text = API_MD.read_text()
    missing = [k.name for k in EventKind if f"`{k.name}`" not in text or f"`{k.value}`" not in text]
    assert not missing, f"docs/api.md does not list events {missing}"


def test_api_md_lists_every_cli_command_and_option() -> None:
    import typer.main

    from flowmesh_sdk.cli.main import app

    text = API_MD.read_text()
    group = typer.main.get_command(app)
    for name, cmd in group.commands.items():  # type: ignore[attr-defined]
        assert f"flowmesh {name}" in text or f"**`{name}" in text, f"CLI command {name} not documented"
        for param in cmd.params:
            for opt in getattr(param, "opts", []):
                if opt.startswith("-") and opt != "--help":
                    assert opt in text, f"`flowmesh {name} {opt}` not documented in docs/api.md"
