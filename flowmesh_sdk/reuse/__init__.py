"""Result reuse: identical work runs once, across pools, tenants, workflows and processes.

:class:`ResultReuse` sits *above* the pools.  Given a :class:`~flowmesh_sdk.specs.Task`
and a pool (anything with ``async run_task(task) -> TaskResult``), it

1. resolves the task's image to its digest (a tag is never hashed) and computes
   ``H_task`` / ``H_exec`` (:mod:`flowmesh_sdk.identity`);
2. looks ``H_task`` up in the content-addressable store: a **hit** returns the stored
   result with the provenance of the run that computed it, and nothing runs;
3. otherwise, if the same ``H_task`` is in flight in this process (any pool, any tenant),
   **joins** it: one execution, each requester's lineage recorded;
4. otherwise **executes** it through the pool and publishes the result once: the result
   record goes into the CAS by content hash, and the index ref ``results/<H_task>`` is
   created with an atomic create-if-absent.  Of two processes publishing the same
   ``H_task`` one wins; the other discards its own copy and returns the winner's, so every
   requester sees the same bytes.

Only reusable work takes part.  A task is reusable when it is ``deterministic`` or pinned
by a ``seed`` (the seed goes into ``H_task``); anything else is **bypassed**: it runs
every time and nothing is stored.

What is stored, and what is shared with requests already waiting (the failure policy):

=============================================  ==========  ==============================
outcome of the run                              published   shared with joined requests
=============================================  ==========  ==============================
exit 0                                          yes         yes
exit 1..127 (a verdict: tests failed)           only with   yes (same work, same moment)
                                                ``cache_failures``
exit >= 128 without timeout (killed by signal,  no          no (each runs its own)
e.g. the OOM killer)
timed out                                       no          no
infra error (image, quota, lost instance,       no          no
pool closed), or the image moved under the tag
=============================================  ==========  ==============================

Every read is verified (objects by their hash, refs by their checksum, the record by the
``H_task`` it names).  A corrupt entry is reported (``REUSE_CORRUPT``), dropped, and the
work is computed again and republished.

The layer is split along those seams: :mod:`.model` (its vocabulary), :mod:`.records`
(result records and the failure policy), :mod:`.lineage` (the ``Ledger``: counts, lineage,
events), :mod:`.store` (the ``ResultIndex``: lookup and publish-once), :mod:`.flight` (the
``SingleFlight``) and :mod:`.layer` (:class:`ResultReuse`, which owns one of each and answers
sandbox tasks and in-process operators through them).
"""

from .layer import ResultReuse
from .model import CallResult, LineageEntry, ReuseCounts, ReusePolicy, TaskRunner

__all__ = ["CallResult", "LineageEntry", "ResultReuse", "ReuseCounts", "ReusePolicy", "TaskRunner"]
