"""What the reuse layer (flowmesh_sdk.reuse) says of a result: :class:`ReuseKind`, :class:`Provenance`."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class ReuseKind(str, enum.Enum):
    """How the reuse layer (flowmesh_sdk.reuse) answered one request."""

    EXECUTED = "executed"   # this request ran the work (and published it, when allowed)
    HIT = "hit"             # answered from the content-addressed store; nothing ran
    JOINED = "joined"       # the same work was in flight; this request shared that run
    BYPASSED = "bypassed"   # not eligible for reuse (not deterministic, no seed): it just ran


@dataclass(frozen=True, slots=True)
class Provenance:
    """Where a result came from: the run that first computed it.

    A reused result carries the provenance of the run that computed it, not of the request
    that got it (that request's own record is its lineage entry in the reuse layer)."""

    h_task: str                 # the exact identity of the work (flowmesh_sdk.identity)
    h_exec: str                 # its execution signature
    result_digest: str          # content digest of the stored result record
    task_id: str                # the run that computed it
    tenant: str                 # who asked for that run
    workflow: str | None        # which workflow asked, if any
    fleet: str
    pool: str
    instance_id: str | None
    host: str                   # the machine of the process that published it
    computed_at: float          # wall-clock seconds when it was published
    compute_s: float            # sandbox seconds that run took (what a reuse saves)
    published: bool = True      # False: shared with requests in flight only, not stored
