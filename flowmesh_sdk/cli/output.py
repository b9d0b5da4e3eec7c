"""Machine-readable output of the ``flowmesh`` command: one JSON document per command on
stdout (``--json``), its schema named ``flowmesh.<command>/<version>``; docs/cli.md
describes each one.  Notes and progress go to stderr so stdout stays parseable."""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import sys
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

SCHEMA_VERSION = 1


def plain(value: Any) -> Any:
    """``value`` as JSON-ready data: dataclasses as objects, tuples as lists, enums by
    value, paths as strings and non-finite floats as null."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [plain(v) for v in value]
    if isinstance(value, enum.Enum):
        return plain(value.value)
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def document(command: str, **body: Any) -> dict[str, Any]:
    return {"schema": f"flowmesh.{command}/{SCHEMA_VERSION}", **{k: plain(v) for k, v in body.items()}}


def emit(command: str, **body: Any) -> None:
    """Write the JSON document of ``command`` to stdout (one line)."""
    sys.stdout.write(json.dumps(document(command, **body), allow_nan=False) + "\n")
    sys.stdout.flush()


JSON_HELP = "print one JSON document on stdout instead of tables (schema: docs/cli.md)"
