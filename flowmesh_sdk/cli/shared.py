"""``flowmesh status`` / ``flowmesh pools`` on a shared fleet (``FLOWMESH_STATE=redis://...``):
the tables read a store replayed from every coordinator's events
(:mod:`flowmesh_sdk.control.redis.status`); ``status`` adds what only Redis knows."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from ..control.backend import state_url
from ..control.store import MetadataStore

_VIEW: dict[str, object] = {}


def shared_store() -> MetadataStore | None:
    """The whole shared fleet's store, or None when the state is in this process."""
    url = state_url()
    if url is None:
        return None
    from ..control.redis.status import shared_view

    _VIEW["store"], _VIEW["status"] = shared_view(url)
    return _VIEW["store"]   # type: ignore[return-value]


def shared_status() -> object | None:
    """What Redis said at the last :func:`shared_store` (None when not shared)."""
    return _VIEW.get("status")


def _table(console: Console, title: str, cols: tuple[str, ...], rows: list[tuple[object, ...]],
           always: bool = False) -> None:
    if rows or always:
        t = Table(title=title)
        for col in cols:
            t.add_column(col)
        for r in rows:
            t.add_row(*(str(x) for x in r))
        console.print(t)


def print_shared(console: Console) -> None:
    s: Any = shared_status()
    if s is None:
        return
    _table(console, f"coordinators sharing the fleet ({s.url})", ("coordinator", "host", "pid", "lease left (ms)"),
           [(c.id, c.host, c.pid, c.lease_left_ms if c.lease_left_ms >= 0 else "lapsed") for c in s.coordinators],
           always=True)
    _table(console, "shared queues", ("queue", "queued", "claimed"), [(q.name, q.queued, q.claimed) for q in s.queues])
    _table(console, "instances owned by the fleet", ("id", "fleet", "pool", "provider", "held by"),
           [(i.id, i.fleet, i.pool, i.provider, i.holder) for i in s.instances])
    _table(console, "adoptions (dead coordinators' work taken over)", ("dead", "adopter", "leases", "tasks", "instances"),
           [(a.dead, a.adopter, a.leases, a.tasks, a.instances) for a in s.adoptions])
