"""The result index over a content-addressable store: lookup (every read verified, a corrupt
entry reported and dropped) and publish-once (the record by content hash, then the index
ref ``results/<H_task>`` created at most once; a writer that loses the race returns the
winner's record)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ..cas.base import CasCorruptError, CasError, CasNotFoundError, ContentStore
from ..control.events import EventKind
from ..identity import canonical, check_digest, digest_bytes
from ..specs import Provenance, ReuseKind
from .lineage import Ledger
from .model import Answer, Fresh, Request
from .records import RECORD_VERSION, check_record, decode_dict, index_name, provenance

__all__ = ["ResultIndex"]

log = logging.getLogger("flowmesh.reuse")


class ResultIndex:
    """Lookup and publish-once over ``cas``.  What it finds corrupt, executes and publishes
    goes into ``ledger``; ``host`` is named in every index entry it writes."""

    def __init__(self, cas: ContentStore, ledger: Ledger, *, host: str) -> None:
        self.cas = cas
        self.ledger = ledger
        self.host = host

    async def stored(self, key: str) -> Provenance | None:
        """The provenance of the published result of ``H_task`` ``key``, None when there is
        none (or it was corrupt: then it is dropped, as on any lookup)."""
        found = await self.lookup(check_digest("h_task", key))
        return found.provenance if found else None

    async def lookup(self, key: str) -> Answer | None:
        """The verified published answer for ``H_task`` ``key``; None (a corrupt entry dropped) if none."""
        name = index_name(key)
        try:
            body = await self.cas.read_ref(name)
            if body is None:
                return None
            idx = decode_dict(name, body)
            if idx.get("h_task") != key:
                raise CasCorruptError(name, f"names {idx.get('h_task')!r}, not {key}")
            result = idx.get("result")
            if not isinstance(result, str):
                raise CasCorruptError(name, "names no result object")
            rec = decode_dict(result, await self.cas.get(result))
            check_record(result, rec)
            try:
                prov = provenance(idx, published=True)
            except (KeyError, TypeError, ValueError) as exc:
                raise CasCorruptError(name, f"not a result index: {exc!r} missing or malformed") from exc
            return Answer(rec, prov)
        except CasNotFoundError as exc:
            await self._corrupt(name, CasCorruptError(name, f"its result object is missing: {exc}"))
        except CasCorruptError as exc:
            await self._corrupt(name, exc)
        return None

    async def _corrupt(self, name: str, exc: CasCorruptError) -> None:
        log.warning("reuse: %s; dropping it and computing again", exc)
        self.ledger.count("corrupt")
        self.ledger.publish(EventKind.REUSE_CORRUPT, name="", pool="", detail={"ref": name, "error": str(exc)})
        try:
            await self.cas.drop_ref(name)
        except CasError as drop_exc:  # the recompute still runs; the next publish retries
            log.warning("reuse: could not drop %s: %s", name, drop_exc)

    async def execute(self, req: Request, execute: Callable[[], Awaitable[Fresh]]
                      ) -> tuple[Fresh, Answer | None]:
        """Run ``execute`` for ``req`` and publish its result once (when it is one to publish)."""
        fresh = await execute()
        self.ledger.count("executions")
        if fresh.record is None:
            self.ledger.record(req, ReuseKind.EXECUTED, None, fresh.task_id, 0.0)
            return fresh, None
        blob = canonical(fresh.record)
        digest = digest_bytes(blob)
        now = time.time()
        index = {"v": RECORD_VERSION, "h_task": req.h_task, "h_exec": req.h_exec, "result": digest,
                 "task_id": fresh.task_id, "tenant": req.tenant, "workflow": req.workflow,
                 "fleet": self.ledger.fleet, "pool": fresh.pool, "instance_id": fresh.instance_id,
                 "host": self.host, "computed_at": now, "compute_s": float(fresh.compute_s),
                 "inputs": {k: digest_bytes(v) for k, v in fresh.inputs.items()}}
        if not fresh.publish:
            answer = Answer(fresh.record, provenance(index, published=False))
            self.ledger.record(req, ReuseKind.EXECUTED, digest, fresh.task_id, 0.0)
            return fresh, answer
        answer = await self._publish_result(req, fresh, blob, index)
        self.ledger.record(req, ReuseKind.EXECUTED, answer.provenance.result_digest,
                     answer.provenance.task_id, 0.0)
        return fresh, answer

    async def _publish_result(self, req: Request, fresh: Fresh, blob: bytes,
                              index: dict[str, Any]) -> Answer:
        """Store the record and its inputs, then create the index ref once.  Losing the
        create to another writer returns the winner's record instead of ours."""
        await asyncio.gather(self.cas.put(blob), *(self.cas.put(v) for v in fresh.inputs.values()))
        name = index_name(req.h_task)
        for _ in range(2):
            try:
                created, body = await self.cas.create_ref(name, canonical(index))
            except CasCorruptError as exc:      # a corrupt ref in the way: drop it, try again
                await self._corrupt(name, exc)
                continue
            if created:
                self.ledger.count("published")
                return Answer(fresh.record or {}, provenance(index, published=True))
            self.ledger.count("lost_races")
            winner = await self.lookup(req.h_task)
            if winner is not None:
                return winner
        # could not publish (or read back) a sound entry: answer with our own, unpublished
        return Answer(fresh.record or {}, provenance(index, published=False))
