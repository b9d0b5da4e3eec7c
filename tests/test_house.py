"""The house's rules that a tool can check: the core (``flowmesh_sdk`` outside ``testing/``)
names no cloud -- everything it knows of one is in that provider's descriptor.  Code is
checked (identifiers, imports, string literals); docstrings and comments may use a
cloud as an example."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from flowmesh_sdk import backends

ROOT = Path(__file__).resolve().parents[1]
VENDORS = ("amazonaws", "googleapis", "aliyuncs", "azure", "vast.ai", "boto3", "botocore",
           "k8s", "kubernetes")   # k8s is unpriced (no snapshot), so not among the words below


def _clouds() -> re.Pattern[str]:
    words = {w for d in backends.descriptors().values() if d.snapshot is not None for w in (d.name, *d.aliases)}
    assert {"ec2", "gce", "azure", "alibaba", "vast", "aws", "gcp"} <= words
    return re.compile(r"(?<![a-z0-9])(" + "|".join(sorted(map(re.escape, words | set(VENDORS)))) + r")(?![a-z0-9])",
                      re.I)


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def _named(path: Path, rx: re.Pattern[str]) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    skip = _docstrings(tree)
    hits = []
    for node in ast.walk(tree):
        texts: list[str] = []
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            texts = [node.value]
        elif isinstance(node, ast.Name):
            texts = [node.id]
        elif isinstance(node, ast.Attribute):
            texts = [node.attr]
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            texts = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.arg)):
            texts = [getattr(node, "name", None) or getattr(node, "arg", "")]
        for t in texts:
            m = rx.search(t)
            if m:
                hits.append(f"{path.name}:{getattr(node, 'lineno', '?')}: {m.group(0)!r} in {t[:80]!r}")
    return hits


#: the S3 result store speaks the S3 API (AWS's, and MinIO's, R2's, ...) with boto3: a storage
#: protocol, not a provider the core places work on
ALLOWED = {"flowmesh_sdk/cas/s3.py"}


def test_the_core_names_no_cloud() -> None:
    rx = _clouds()
    core = [p for p in sorted((ROOT / "flowmesh_sdk").rglob("*.py"))
            if "testing" not in p.relative_to(ROOT).parts and str(p.relative_to(ROOT)) not in ALLOWED]
    assert len(core) > 100
    hits = [h for p in core for h in _named(p, rx)]
    assert hits == []


def test_the_check_sees_a_cloud_in_code_but_not_in_a_docstring(tmp_path: Path) -> None:
    f = tmp_path / "probe.py"
    f.write_text('"""ec2 as an example."""\n# gce in a comment\nX = {"aws": 1}\ndef f(vast_id):\n    return 0\n')
    hits = _named(f, _clouds())
    assert [h.split(": ", 1)[1] for h in hits] == ["'aws' in 'aws'", "'vast' in 'vast_id'"]


#: the house's size rule: a file longer than this has more than one owner -- split it along its seam
MAX_LINES = 500


def _shipped() -> list[Path]:
    return sorted([*(ROOT / "flowmesh_sdk").rglob("*.py"), *(ROOT / "providers").rglob("*.py")])


def test_no_file_in_the_core_or_a_provider_is_over_the_size_rule() -> None:
    files = _shipped()
    assert len(files) > 200
    long = {str(p.relative_to(ROOT)): n for p in files if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_every_timeout_in_the_core_and_the_providers_is_the_sdks_own() -> None:
    """One way to set a timeout: ``flowmesh_sdk.timers.timeout`` (one loop timer for all of
    them), never ``asyncio.timeout``, which puts a timer each on the loop's heap (issue 29)."""
    used = []
    for p in _shipped():
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            if (isinstance(node, ast.Attribute) and node.attr in ("timeout", "timeout_at")
                    and isinstance(node.value, ast.Name) and node.value.id == "asyncio"):
                used.append(f"{p.relative_to(ROOT)}:{node.lineno}")
    assert used == []


def test_mypy_checks_every_module_with_no_exemption() -> None:
    """No per-module baseline in [tool.mypy], and the provider packages are checked under the
    name users import (the .typecheck link), so their imports of each other resolve."""
    import tomllib

    mypy = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert "overrides" not in mypy
    assert set(mypy["files"]) == {"flowmesh_sdk", ".typecheck/flowmesh_providers"}
    link = ROOT / ".typecheck" / "flowmesh_providers"
    assert link.is_symlink() and link.resolve() == (ROOT / "providers").resolve()


IGNORE = re.compile(r"#\s*type:\s*ignore(?P<codes>\[[^\]]*\])?(?P<rest>.*)$")


def test_every_type_ignore_names_its_codes_and_its_reason() -> None:
    bare = []
    for p in _shipped():
        for i, line in enumerate(p.read_text().splitlines(), 1):
            m = IGNORE.search(line)
            if m and (not m["codes"] or not re.match(r"\s*#\s*\S", m["rest"])):
                bare.append(f"{p.relative_to(ROOT)}:{i}: {line.strip()[:100]}")
    assert bare == []


def test_every_package_folder_is_in_the_wheel() -> None:
    """[tool.setuptools] lists packages by name: a new subpackage left off the list is missing
    from a wheel install (the editable install here would not notice)."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {"flowmesh_sdk": ROOT / "flowmesh_sdk", "flowmesh_providers": ROOT / "providers"}
    found = {".".join((name, *init.parent.relative_to(top).parts))
             for name, top in folders.items() for init in top.rglob("__init__.py")}
    assert found - listed == set()


def test_the_house_drawn_in_the_architecture_page_is_the_layers_contract() -> None:
    import tomllib

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (layers,) = [c["layers"] for c in contracts if c["type"] == "layers" and c.get("containers") == ["flowmesh_sdk"]]
    page = (ROOT / "docs" / "architecture.md").read_text()
    drawn = page.split("## The house", 1)[1].split("```", 2)[1].strip().splitlines()
    assert drawn == layers
    types = {c["type"] for c in contracts}
    assert {"layers", "acyclic_siblings", "forbidden", "independence"} <= types
    # every top-level module and package of the core sits in one layer
    named = {m for line in layers for m in line.replace("|", ":").split(" : ")}
    tops = {p.stem for p in (ROOT / "flowmesh_sdk").glob("*.py")} | {
        p.name for p in (ROOT / "flowmesh_sdk").iterdir() if (p / "__init__.py").exists()}
    assert tops - {"__init__", "__main__"} == named
