"""What the benchmarks share: a console that keeps tables wide when piped, percentiles,
and the project's busybox image (built by images/build.py when missing)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

ROOT = Path(__file__).resolve().parent.parent


def image_builder():  # type: ignore[no-untyped-def]
    """The project's image builder (:mod:`flowmesh_sdk.imagebuild.build`)."""
    from flowmesh_sdk.imagebuild import build
    return build


def busybox_image() -> str:
    """``localhost/flowmesh/busybox:1``, built from Debian's busybox-static if missing."""
    return image_builder().build_busybox()


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
