"""The coordinator's garbage-collector thresholds, while a fleet is open.

A coordinator holds a large, long-lived heap -- every in-flight task's journey, every
instance's records and runtime -- and allocates a few hundred container objects per task.
With CPython's default thresholds, ``(700, 10, 10)``, the youngest generation is collected
every 700 net allocations, and each tenth gen-1 pass may turn into a *full* pass over the
whole heap.  At 10,000 tasks in flight that was 15 full passes over up to 1.5 million
objects: about a quarter of the process's CPU (``bench/control_plane_scale.py``; issue 29).

While at least one :class:`~flowmesh_sdk.fleet.Fleet` is open in the process, the
thresholds are raised to at least ``coordinator.gc_threshold`` (default ``50000,20,10``:
a young pass per 50,000 allocations and a middle pass per twenty young ones).  What a
pass costs per object grows with the heap, so fewer, larger passes are cheaper at scale;
the price is cyclic garbage waiting longer for a pass (the SDK's own per-task objects are
freed by reference counting).  docs/operations.md ("The coordinator's garbage
collector") has the measurements.  A threshold the process already set higher
is kept, a collector switched off stays off, and when the last fleet closes the
interpreter's values come back -- unless somebody changed them meanwhile, whose values
are then left alone.  ``coordinator.gc_threshold = "off"`` (or
``FLOWMESH_GC_THRESHOLD=off``) leaves the collector as the process has it.
"""

from __future__ import annotations

import gc
import threading

from .errors import SpecError

SETTING = "coordinator.gc_threshold"
DEFAULT = "50000,20,10"

_lock = threading.Lock()
_holders = 0
_saved: tuple[int, int, int] | None = None     # the thresholds before the first holder
_applied: tuple[int, int, int] | None = None   # what the first holder set


def parse(text: str, source: str = "") -> tuple[int, int, int] | None:
    """``"off"`` -> None; ``"A,B,C"`` (three positive integers) -> ``(A, B, C)``.  ``source``
    (where the text came from: ``env NAME``, ``file PATH``) is named in the error."""
    t = text.strip().lower()
    if t in ("off", "none", "no", "false", "0"):
        return None
    parts = [p.strip() for p in t.split(",")]
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        where = f" (from {source})" if source else ""
        raise SpecError(SETTING, f"three positive integers 'A,B,C' (gc.set_threshold's) or 'off', "
                                 f"got {text!r}{where}")
    a, b, c = (int(p) for p in parts)
    return a, b, c


def hold(threshold: tuple[int, int, int] | None) -> None:
    """One more open fleet; the first raises the thresholds to at least ``threshold``
    (None: leaves them).  Pair each call with :func:`release`."""
    global _holders, _saved, _applied
    with _lock:
        _holders += 1
        if _holders != 1 or threshold is None or not gc.isenabled():
            return
        now = gc.get_threshold()
        if now[0] == 0:   # collection switched off by threshold: the process's choice
            return
        a, b, c = (max(x, y) for x, y in zip(now, threshold))
        if (a, b, c) != now:
            gc.set_threshold(a, b, c)
            _saved, _applied = (now[0], now[1], now[2]), (a, b, c)


def release() -> None:
    """One fleet fewer; the last puts back what :func:`hold` changed, if nobody else has
    changed it since."""
    global _holders, _saved, _applied
    with _lock:
        _holders = max(0, _holders - 1)
        if _holders or _saved is None:
            return
        if gc.get_threshold() == _applied:
            gc.set_threshold(*_saved)
        _saved = _applied = None
