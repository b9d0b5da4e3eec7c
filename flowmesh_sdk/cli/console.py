"""What the cost commands share (``cli/cost.py``, ``cli/simulate.py``): the consoles they
print on, how an error ends a command, and the parsers of their repeatable options."""

from __future__ import annotations

import math
import sys
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape

from ..errors import SpecError

# Tables are wide; when piped (not a terminal) rich would squeeze them into 80 columns.
console = Console(width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 200)


def fail(exc: Exception) -> typer.Exit:
    """Print ``exc`` as the command's error; raise what this returns (exit status 1)."""
    err.print(f"[red]error:[/red] {escape(str(exc))}")
    return typer.Exit(1)


def split(values: Optional[list[str]]) -> tuple[str, ...]:
    """A repeatable option's values, each also comma-separated."""
    out: list[str] = []
    for v in values or []:
        out.extend(p.strip() for p in v.split(",") if p.strip())
    return tuple(out)


def prices(values: Optional[list[str]]) -> dict[str, float]:
    """``--price TYPE=USD`` (repeatable) as ``{type: $/h}``."""
    out: dict[str, float] = {}
    for text in values or []:
        if "=" not in text:
            raise SpecError("--price", f"must be TYPE=USD (e.g. c7i.2xlarge=0.30), got {text!r}")
        itype, usd = text.split("=", 1)
        if not itype.strip():
            raise SpecError("--price", f"must be TYPE=USD (e.g. c7i.2xlarge=0.30): {text!r} names no instance type")
        try:
            value = float(usd)
        except ValueError:
            raise SpecError("--price", f"{itype}: {usd!r} is not a number of USD per hour") from None
        if not math.isfinite(value) or value < 0:
            raise SpecError("--price", f"{itype}: must be >= 0 USD per hour, got {usd}")
        out[itype.strip()] = value
    return out


__all__ = ["console", "err", "fail", "prices", "split"]
