"""The CLI tests' network guard (see ``sitecustomize.py`` here): :func:`env` gives a client
process the variables that load it, :func:`left_loopback` reads what it refused."""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent


def env(log: Path) -> dict[str, str]:
    """Variables that load the guard into a Python client (``CLOUDSDK_PYTHON_SITEPACKAGES``:
    gcloud otherwise starts its Python with ``-S``, which skips ``sitecustomize``)."""
    return {"PYTHONPATH": str(HERE), "FLOWMESH_NETGUARD_LOG": str(log), "CLOUDSDK_PYTHON_SITEPACKAGES": "1"}


def left_loopback(log: Path) -> list[str]:
    """What the guarded processes tried outside 127.0.0.0/8 (refused), one entry each."""
    return log.read_text().splitlines() if log.exists() else []
