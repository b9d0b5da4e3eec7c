"""``flowmesh status`` / ``flowmesh pools`` / ``flowmesh gc`` on a shared fleet
(``FLOWMESH_STATE=redis://...``): the tables read a store replayed from every
coordinator's events (:mod:`flowmesh_sdk.control.redis.status`); ``status`` adds what only
Redis knows; ``gc`` asks Redis who holds each instance and records what it removed there."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..config import home_dir
from ..control.backend import state_url
from ..control.events import Event
from ..control.shared import SharedHolders
from ..control.store import MetadataStore

_VIEW: dict[str, object] = {}


def open_store() -> MetadataStore:
    """The store the CLI reads: with ``FLOWMESH_STATE=redis://...`` the whole shared fleet,
    replayed from every coordinator's events; else this home's."""
    return shared_store() or MetadataStore(home_dir() / "flowmesh.db")


def shared_store() -> MetadataStore | None:
    """The whole shared fleet's store, or None when the state is in this process."""
    url = state_url()
    if url is None:
        return None
    from ..control.redis.status import shared_view

    store, _VIEW["status"] = shared_view(url)
    _VIEW["store"] = store
    return store


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
    console.print(f"shared control state: {escape(s.url)}")   # its password as *** (snapshot redacts it)
    _table(console, "coordinators sharing the state", ("fleet", "coordinator", "host", "pid", "lease left (ms)"),
           [(c.fleet, c.id, c.host, c.pid, c.lease_left_ms if c.lease_left_ms >= 0 else "lapsed")
            for c in s.coordinators], always=True)
    _table(console, "shared queues", ("fleet", "queue", "queued", "claimed"),
           [(q.fleet or "- (older layout)", q.name, q.queued, q.claimed) for q in s.queues])
    _table(console, "instances owned by the fleet", ("id", "fleet", "pool", "provider", "held by"),
           [(i.id, i.fleet, i.pool, i.provider, i.holder) for i in s.instances])
    _table(console, "adoptions (dead coordinators' work taken over)", ("dead", "adopter", "leases", "tasks", "instances"),
           [(a.dead, a.adopter, a.leases, a.tasks, a.instances) for a in s.adoptions])


@dataclass
class SharedGc:
    """What ``flowmesh gc`` needs from a shared fleet: who holds each instance, and where
    to record what it removed (the fleet's stream; the charges end there)."""

    holders: SharedHolders | None = None
    removed: list[Event] = field(default_factory=list)

    def record(self, ev: Event) -> None:
        self.removed.append(ev)


@contextlib.asynccontextmanager
async def shared_gc(fleet: str | None) -> AsyncIterator[SharedGc]:
    """A reader of the shared state (it does not join as a coordinator); on leaving, what
    gc removed is dropped from the fleet's lists and recorded in its stream."""
    url = state_url()
    out = SharedGc()
    if url is None:
        yield out
        return
    from ..control.redis import RedisBackend

    be = RedisBackend(url)
    await be.client.ping()
    try:
        holders = out.holders = await be.shared_instances(fleet)
        try:
            yield out
        finally:   # what was removed was removed, whatever went wrong after
            gone = {ev.instance_id for ev in out.removed}
            await be.forget_instances([i for i in holders.instances if i.id in gone])
            await asyncio.gather(*(be.events(ev.fleet).publish(ev) for ev in out.removed))
    finally:
        await be.client.close()
