"""The SDK's logging: every module logs under the ``flowmesh`` logger tree
(``flowmesh.pools``, ``flowmesh.providers.ec2``, ...).  A library does not configure
logging; the CLI (and any application that wants the same) calls :func:`configure`."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import TextIO

ROOT = "flowmesh"
LEVELS = ("debug", "info", "warning", "error", "critical")
_STD_ATTRS = frozenset(vars(logging.makeLogRecord({})).keys()) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts (UTC, ISO 8601), level, logger, message, any
    ``extra={...}`` fields and the exception text."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STD_ATTRS and not key.startswith("_"):
                doc[key] = value if isinstance(value, (str, int, float, bool, type(None))) else repr(value)
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc)


def level_from(verbose: int = 0, level: str | None = None) -> int:
    """``--log-level`` wins; else warning, ``-v`` info, ``-vv`` debug."""
    if level is not None:
        name = level.strip().lower()
        if name not in LEVELS:
            raise ValueError(f"log level must be one of {', '.join(LEVELS)}, got {level!r}")
        return int(getattr(logging, name.upper()))
    return logging.WARNING if verbose <= 0 else logging.INFO if verbose == 1 else logging.DEBUG


def configure(level: int = logging.WARNING, *, json_lines: bool = False,
              stream: TextIO | None = None) -> logging.Handler:
    """Send the ``flowmesh`` tree at ``level`` to ``stream`` (stderr), as text or JSON lines.
    Calling it again replaces the handler it installed before."""
    root = logging.getLogger(ROOT)
    for h in list(root.handlers):
        if getattr(h, "_flowmesh_cli", False):
            root.removeHandler(h)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler._flowmesh_cli = True  # type: ignore[attr-defined]  # our marker, found again by the loop above
    handler.setFormatter(JsonFormatter() if json_lines else
                         logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(level)
    return handler
