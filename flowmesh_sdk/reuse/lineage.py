"""The reuse layer's bookkeeping: its counts, the lineage of the requests it answered, and
the ``REUSE_*`` events it publishes (the metadata store keeps the whole lineage from them)."""

from __future__ import annotations

import collections
import json
import time
from typing import Any

from ..control.events import Event, EventBus, EventKind
from ..specs import ReuseKind
from .model import Answer, LineageEntry, Request, ReuseCounts

__all__ = ["Ledger"]

_COUNTERS = ("hits", "joins", "executions", "bypassed", "published", "lost_races", "corrupt", "compute_saved_s")


class Ledger:
    """Counts, lineage and events of one :class:`~flowmesh_sdk.reuse.ResultReuse`.  Events go
    on ``bus`` (none: not published) under ``fleet``; the in-memory lineage keeps the last
    ``lineage_limit`` requests."""

    def __init__(self, *, bus: EventBus | None, fleet: str, lineage_limit: int) -> None:
        self.bus = bus
        self.fleet = fleet
        self._counts: dict[str, float] = dict.fromkeys(_COUNTERS, 0)
        self._lineage: collections.deque[LineageEntry] = collections.deque(maxlen=lineage_limit)

    # ---- visibility ------------------------------------------------------------------
    def counts(self) -> ReuseCounts:
        c = self._counts
        return ReuseCounts(hits=int(c["hits"]), joins=int(c["joins"]), executions=int(c["executions"]),
                           bypassed=int(c["bypassed"]), published=int(c["published"]),
                           lost_races=int(c["lost_races"]), corrupt=int(c["corrupt"]),
                           compute_saved_s=float(c["compute_saved_s"]))

    def lineage(self, *, workflow: str | None = None, tenant: str | None = None) -> list[LineageEntry]:
        """The requests answered so far, oldest first, optionally of one workflow / tenant."""
        return [e for e in self._lineage
                if (workflow is None or e.workflow == workflow) and (tenant is None or e.tenant == tenant)]

    # ---- bookkeeping -----------------------------------------------------------------------
    def bypassed(self, request_id: str, name: str, tenant: str, workflow: str | None, pool: str,
                 computed_by: str) -> None:
        """A request that took no part in reuse (ran, nothing stored)."""
        self.count("bypassed")
        self._lineage.append(LineageEntry(request_id, name, tenant, workflow, pool, None, ReuseKind.BYPASSED,
                                          None, computed_by, 0.0, time.time()))

    def answered(self, req: Request, kind: ReuseKind, ans: Answer) -> ReuseKind:
        """``req`` answered without running (``kind``: HIT or JOINED) by ``ans``."""
        saved = ans.provenance.compute_s
        self.count("hits" if kind is ReuseKind.HIT else "joins")
        self.count("compute_saved_s", saved)
        self.record(req, kind, ans.provenance.result_digest, ans.provenance.task_id, saved)
        return kind

    def record(self, req: Request, kind: ReuseKind, result: str | None, computed_by: str | None,
               saved_s: float) -> None:
        """Append ``req``'s lineage entry and publish its ``REUSE_*`` event."""
        self._lineage.append(LineageEntry(req.request_id, req.name, req.tenant, req.workflow, req.pool,
                                          req.h_task, kind, result, computed_by, saved_s, time.time()))
        ev = {ReuseKind.HIT: EventKind.REUSE_HIT, ReuseKind.JOINED: EventKind.REUSE_JOINED,
              ReuseKind.EXECUTED: EventKind.REUSE_EXECUTED}[kind]
        self.publish(ev, name=req.name, pool=req.pool, task_id=req.request_id,
                     detail={"h_task": req.h_task, "tenant": req.tenant, "workflow": req.workflow,
                             "result": result, "computed_by": computed_by, "saved_s": round(saved_s, 6)})

    def count(self, what: str, n: float = 1) -> None:
        self._counts[what] += n

    def publish(self, kind: EventKind, *, name: str, pool: str, detail: dict[str, Any],
                task_id: str | None = None) -> None:
        if self.bus is not None:
            self.bus.publish(Event(kind, fleet=self.fleet, pool=pool, task_id=task_id,
                                   task_name=name or None, detail=json.dumps(detail, sort_keys=True)))
