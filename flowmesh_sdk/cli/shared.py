"""``flowmesh status`` / ``flowmesh pools`` on a shared fleet (``FLOWMESH_STATE=redis://...``):
the tables read a store replayed from every coordinator's events
(:mod:`flowmesh_sdk.control.redis.status`); ``status`` adds what only Redis knows."""

from __future__ import annotations

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


def print_shared(console: Console) -> None:
    s = shared_status()
    if s is None:
        return
    ct = Table(title=f"coordinators sharing the fleet ({s.url})")   # type: ignore[attr-defined]
    for col in ("coordinator", "host", "pid", "lease left (ms)"):
        ct.add_column(col)
    for c in s.coordinators:   # type: ignore[attr-defined]
        ct.add_row(c.id, c.host, str(c.pid), str(c.lease_left_ms) if c.lease_left_ms >= 0 else "lapsed")
    console.print(ct)
    if s.queues:   # type: ignore[attr-defined]
        qt = Table(title="shared queues")
        for col in ("queue", "queued", "claimed"):
            qt.add_column(col)
        for q in s.queues:   # type: ignore[attr-defined]
            qt.add_row(q.name, str(q.queued), str(q.claimed))
        console.print(qt)
    if s.instances:   # type: ignore[attr-defined]
        it = Table(title="instances owned by the fleet")
        for col in ("id", "fleet", "pool", "provider", "held by"):
            it.add_column(col)
        for i in s.instances:   # type: ignore[attr-defined]
            it.add_row(i.id, i.fleet, i.pool, i.provider, i.holder)
        console.print(it)
    if s.adoptions:   # type: ignore[attr-defined]
        at = Table(title="adoptions (dead coordinators' work taken over)")
        for col in ("dead", "adopter", "leases", "tasks", "instances"):
            at.add_column(col)
        for a in s.adoptions:   # type: ignore[attr-defined]
            at.add_row(a.dead, a.adopter, str(a.leases), str(a.tasks), str(a.instances))
        console.print(at)
