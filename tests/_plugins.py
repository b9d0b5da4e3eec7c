"""Provider packages defined only under ``tests/plugins`` (each a folder with a
``*.dist-info`` beside it that registers its entry point), installed for a test at a time:
:func:`installed` puts ``tests/plugins`` on ``sys.path`` and ``PYTHONPATH`` (for the
processes a test starts) and has :mod:`flowmesh_sdk.backends` read the descriptors again."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

from flowmesh_sdk import backends

PLUGINS = Path(__file__).resolve().parent / "plugins"


def names() -> list[str]:
    """The providers ``tests/plugins`` registers."""
    return sorted(ep.name for d in metadata.distributions(path=[str(PLUGINS)])
                  for ep in d.entry_points if ep.group == backends.GROUP)


@contextlib.contextmanager
def installed() -> Iterator[None]:
    here, old = str(PLUGINS), os.environ.get("PYTHONPATH")
    sys.path.insert(0, here)
    os.environ["PYTHONPATH"] = here + (os.pathsep + old if old else "")
    backends.reload()
    try:
        yield
    finally:
        sys.path.remove(here)
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old
        backends.reload()
