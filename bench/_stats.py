"""What the benchmarks share: a console that keeps tables wide when piped, and percentiles."""

from __future__ import annotations

from rich.console import Console


def console() -> Console:
    """stdout; 120 columns when it is not a terminal (rich would squeeze tables into 80)."""
    c = Console(stderr=False)
    return c if c.is_terminal else Console(width=120)


def pct(xs: list[float], q: float) -> float:
    """The q-th percentile (0-100), linear interpolation between closest ranks."""
    s = sorted(xs)
    if len(s) == 1:
        return s[0]
    k = (len(s) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)
