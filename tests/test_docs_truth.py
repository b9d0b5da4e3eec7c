"""Statements of docs/api.md and errors.py checked against the code: the error tree drawn
in errors.py is the real one and every error is exported from the package root; the
conformance suite runs every registered provider; a drained pool's name may be used again."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import tomllib
from pathlib import Path

import flowmesh_sdk
from flowmesh_sdk import InstanceSpec, PoolSpec, SpecError
from flowmesh_sdk.errors import FlowMeshError

ROOT = Path(__file__).resolve().parents[1]


def _error_classes() -> set[type]:
    found: set[type] = set()
    for m in pkgutil.walk_packages(flowmesh_sdk.__path__, "flowmesh_sdk."):
        if m.name.endswith("__main__") or ".testing" in m.name or ".integrations." in m.name:
            continue
        mod = importlib.import_module(m.name)
        found |= {o for o in vars(mod).values()
                  if inspect.isclass(o) and issubclass(o, FlowMeshError) and o.__module__ == mod.__name__}
    return found


def test_the_error_tree_in_errors_py_is_the_real_one_and_all_exported() -> None:
    doc = flowmesh_sdk.errors.__doc__ or ""
    start = doc.index("FlowMeshError\n")
    drawing = doc[doc.rindex("\n", 0, start) + 1:]      # from the start of its (indented) line
    drawn: dict[str, int] = {}       # class -> depth in the drawing
    for line in drawing.splitlines():
        m = re.match(r"^(\s*)(?:[│ ]*[├└]── )?([A-Z]\w+)", line)
        if m and ("──" in line or line.strip() == "FlowMeshError"):
            depth = (line.find(m.group(2)) - 4) // 4   # the block is indented by 4
            drawn[m.group(2)] = depth
    classes = _error_classes()
    assert {c.__name__ for c in classes} == set(drawn), "errors.py's drawing and the classes differ"
    for c in classes:
        assert getattr(flowmesh_sdk, c.__name__) is c, f"{c.__name__} not exported from flowmesh_sdk"
        assert c.__name__ in flowmesh_sdk.__all__
        parent = next(b for b in c.__mro__[1:] if issubclass(b, FlowMeshError) or b is FlowMeshError) \
            if c is not FlowMeshError else None
        if parent is not None:
            assert drawn[c.__name__] == drawn[parent.__name__] + 1, f"{c.__name__} is drawn under the wrong parent"


def test_the_conformance_suite_runs_every_registered_provider() -> None:
    """Every provider pyproject.toml registers has a conformance environment in its folder,
    which the suite's parameters (tests/providers/conftest.py: ENVIRONMENTS) are made of --
    but ``sim``, whose cloud lives inside one process (the suite's crashed-coordinator check
    needs a second process to see it); tests/test_sim.py checks it on virtual time."""
    from flowmesh_sdk import backends
    eps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["flowmesh_sdk.providers"]
    assert set(eps) <= set(backends.descriptors())
    assert "sim" in eps and backends.descriptor("sim").conformance is None
    for name in set(eps) - {"sim"}:
        ref = backends.descriptor(name).conformance
        assert ref == f"flowmesh_providers.{name}.conformance:environment", name
        assert (ROOT / "providers" / name / "conformance.py").is_file(), name
    text = (ROOT / "tests" / "providers" / "conftest.py").read_text()
    assert "ENVIRONMENTS = sorted({n for n, d in backends.descriptors().items() if d.conformance}" in text


async def test_a_drained_pools_name_may_be_used_again(fleet) -> None:
    spec = PoolSpec(name="again", instance=InstanceSpec(cpus=1, memory_gb=1), max_instances=1)
    first = await fleet.pool(spec)
    try:
        await fleet.pool(spec)
    except SpecError as exc:
        assert "already exists" in str(exc)
    else:
        raise AssertionError("a second open pool of the same name was accepted")
    await first.drain()
    second = await fleet.pool(spec)
    assert second is not first and fleet.pools["again"] is second


def test_documented_defaults_are_the_records_defaults() -> None:
    """The default column of docs/api.md's PoolSpec, InstanceSpec and SandboxSpec tables."""
    import dataclasses

    from flowmesh_sdk import PoolMode, SandboxSpec
    text = (ROOT / "docs" / "api.md").read_text()
    namespace = {"PoolMode": PoolMode, "InstanceSpec": InstanceSpec}
    for cls, head in ((PoolSpec, "### PoolSpec\n"), (InstanceSpec, "### InstanceSpec\n"), (SandboxSpec, "## SandboxSpec\n")):
        section = text[text.index(head):]
        section = section[:section.index("\n#", len(head))]
        cells = dict(re.findall(r"^\| `(\w+)` \| ([^|]*) \|", section, re.M))
        for f in dataclasses.fields(cls):
            assert f.name in cells, f"{cls.__name__}.{f.name} is not in its docs/api.md table"
            cell = cells[f.name].strip()
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                assert cell.startswith("required"), (cls.__name__, f.name, cell)
                continue
            want = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
            shown = re.match(r"`([^`]+)`", cell)
            assert shown is not None, (cls.__name__, f.name, cell)
            assert eval(shown.group(1), namespace) == want, (cls.__name__, f.name, cell, want)   # noqa: S307
