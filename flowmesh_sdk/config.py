"""Where the SDK keeps its state on this machine, and who "we" are (the owner tag)."""

from __future__ import annotations

import os
import secrets
import socket
import time
from dataclasses import dataclass
from pathlib import Path


def home_dir() -> Path:
    """The ``home`` setting (:mod:`.settings`): ``$FLOWMESH_HOME``, else ``home`` in the config
    file, else ``$XDG_STATE_HOME/flowmesh``, else ``~/.local/state/flowmesh``; created if missing."""
    from .settings import value
    path = Path(value("home")).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    return path


def _proc_start_ticks(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read().decode("ascii", "replace")
    except OSError:
        return None
    # field 22 (starttime) counted after the ")" that ends the command name
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else None


@dataclass(frozen=True, slots=True)
class Owner:
    """The coordinator process that launched something: host, pid and pid start time."""

    host: str
    pid: int
    start: str

    def __str__(self) -> str:
        return f"{self.host}/{self.pid}/{self.start}"

    @classmethod
    def current(cls) -> Owner:
        pid = os.getpid()
        return cls(socket.gethostname(), pid, _proc_start_ticks(pid) or "0")

    @classmethod
    def parse(cls, text: str) -> Owner | None:
        parts = text.rsplit("/", 2)
        if len(parts) != 3 or not parts[1].isdigit():
            return None
        return cls(parts[0], int(parts[1]), parts[2])

    def alive(self) -> bool | None:
        """True/False for an owner on this host; None when it lives elsewhere (unknown)."""
        if self.host != socket.gethostname():
            return None
        return _proc_start_ticks(self.pid) == self.start


def new_run_id() -> str:
    """A fresh run id: this moment (UTC, sortable) and 6 random hex digits,
    e.g. ``20261203-121503-5f0c2a``."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)
