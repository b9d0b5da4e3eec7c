"""What the base install (``bash setup.sh``: the SDK without extras) can import and run.

The dev install has every extra, so an import of one at module level on the way from
``import flowmesh_sdk``, the ``flowmesh`` CLI or a shipped recipe would pass every other
test and still fail for a user (the main job once imported aiohttp through the registry).
Here a child interpreter refuses every module that no base dependency provides, then does
what a base user does.  ``.ci/run`` also runs the README's first command on a real base
install; this check names the offending import at once and covers every command and recipe.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[(]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _closure(names: set[str]) -> set[str]:
    """The distributions ``names`` install, with everything they require (no extras)."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = md.requires(name) or []
        except md.PackageNotFoundError:
            continue
        todo += [_name(r) for r in requires if "extra ==" not in r]
    return seen


def _top_level_modules(dist: str) -> set[str]:
    try:
        files = md.files(dist) or []
    except md.PackageNotFoundError:
        return set()
    tops = set()
    for f in files:
        parts = f.parts
        if not parts or parts[0].endswith((".dist-info", ".egg-info", ".data")) or parts[0] in ("..", "bin"):
            continue
        top = parts[0].removesuffix(".py") if len(parts) == 1 else parts[0]
        if len(parts) == 1 and not f.name.endswith((".py", ".so", ".pyd")):
            continue
        tops.add(top.split(".")[0])
    return tops


def _blocked_modules() -> list[str]:
    """Top-level modules installed only by an extra: present here, absent from a base install."""
    base = _closure({_name(r) for r in PYPROJECT["project"]["dependencies"]})
    extras = {_name(r) for reqs in PYPROJECT["project"]["optional-dependencies"].values() for r in reqs}
    base_modules = {m for d in base for m in _top_level_modules(d)}
    only_extras = _closure(extras) - base
    blocked = {m for d in only_extras for m in _top_level_modules(d)} - base_modules
    # a venv starts with pip and setuptools; the project's own packages are the base
    seeded = {"pip", "setuptools", "pkg_resources", "_distutils_hack"}
    return sorted(blocked - seeded - {"flowmesh_sdk", "flowmesh_providers", "flowmesh_recipes"})


# Runs in the child: refuse the blocked modules, then do what base users do.
_CHILD = r"""
import importlib.abc, json, os, runpy, sys
BLOCKED = set(json.loads(os.environ["FM_BLOCKED"]))
hits = []

class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            hits.append(name)
            raise ModuleNotFoundError(f"No module named {name!r} (an extra's, refused here)", name=name)
        return None

sys.meta_path.insert(0, Refuse())
what = sys.argv[1]
if what == "import":
    import flowmesh_sdk, flowmesh_sdk.cli.main, flowmesh_sdk.sync  # noqa: F401
elif what == "cli":
    from flowmesh_sdk.cli.main import main
    sys.argv = ["flowmesh", *sys.argv[2:]]
    try:
        main()
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise
elif what == "recipe":
    sys.argv = [sys.argv[2], "--help"]
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise
print("FM-BLOCKED-HITS " + json.dumps(hits))
"""


def _run_child(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "FLOWMESH_HOME": str(tmp_path / "fmhome"),
           "FM_BLOCKED": json.dumps(_blocked_modules()), "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-c", _CHILD, *args], capture_output=True, text=True,
                          timeout=120, env=env, cwd=tmp_path)


def test_the_block_list_holds_what_only_extras_install() -> None:
    blocked = _blocked_modules()
    # the check means something only if the extras' packages are on the list and the base's are not
    for extra_only in ("aiohttp", "boto3", "redis", "fabric", "paramiko", "yaml", "moto"):
        assert extra_only in blocked, extra_only
    for base in ("typer", "rich", "httpx", "numpy", "opentelemetry", "pydantic"):
        assert base not in blocked, base


def test_import_flowmesh_sdk_needs_no_extra(tmp_path: Path) -> None:
    r = _run_child(tmp_path, "import")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "FM-BLOCKED-HITS" in r.stdout


def _commands() -> list[list[str]]:
    """Every command's --help, and the commands that work offline on a fresh home."""
    from typer.main import get_command

    from flowmesh_sdk.cli.main import app

    root = get_command(app)
    out: list[list[str]] = [["--help"]]

    def walk(cmd, path: list[str]) -> None:   # noqa: ANN001 - a click command
        for name, sub in sorted(getattr(cmd, "commands", {}).items()):
            out.append([*path, name, "--help"])
            walk(sub, [*path, name])

    walk(root, [])
    return out + [["config", "show"], ["pools"], ["status"], ["gc"], ["catalog", "show"],
                  ["offers", "--cpus", "8", "--memory", "16"],
                  ["cost", "estimate", "--tasks", "100", "--minutes", "10"]]


@pytest.mark.parametrize("argv", _commands(), ids=lambda a: " ".join(a))
def test_cli_command_needs_no_extra(tmp_path: Path, argv: list[str]) -> None:
    r = _run_child(tmp_path, "cli", *argv)
    assert r.returncode == 0, f"flowmesh {' '.join(argv)}:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"


_RECIPES = sorted(p for p in (ROOT / "recipes").glob("*.py") if not p.name.startswith("_"))


@pytest.mark.parametrize("recipe", _RECIPES, ids=lambda p: p.stem)
def test_recipe_help_needs_no_extra(tmp_path: Path, recipe: Path) -> None:
    """Every shipped recipe's options are readable on the base install (a cloud recipe needs its
    extra to run, and says so when run; its module-level imports must not)."""
    r = _run_child(tmp_path, "recipe", str(recipe))
    assert r.returncode == 0, f"{recipe.name} --help:\n{r.stderr[-3000:]}"
    assert "usage:" in r.stdout.lower()
