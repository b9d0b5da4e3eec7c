"""Result records: what a run's result is for reuse, how a stored one is read back and
verified, and the failure policy that says which runs are published and shared (the table
in :mod:`flowmesh_sdk.reuse`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from ..cas.base import CasCorruptError
from ..identity import decode
from ..specs import ExecResult, Provenance, TaskResult
from .model import Fresh

__all__ = ["RECORD_VERSION", "check_record", "decode_dict", "exec_record", "exec_result", "fresh_from_task",
           "index_name", "provenance"]

log = logging.getLogger("flowmesh.reuse")
RECORD_VERSION = 1

_EXEC_FIELDS = {"exit_code": int, "stdout": str, "stderr": str, "timed_out": bool, "stdout_truncated": bool,
                "stderr_truncated": bool, "stdout_bytes": int, "stderr_bytes": int}


def check_record(name: str, rec: Mapping[str, Any]) -> None:
    """CasCorruptError unless ``rec`` is a whole result record (a record that verifies by
    its digest but lacks a field was written by something else: never served)."""
    kind = rec.get("kind")
    if kind == "exec":
        for key, typ in _EXEC_FIELDS.items():
            if not isinstance(rec.get(key), typ) or (typ is int and isinstance(rec.get(key), bool)):
                raise CasCorruptError(name, f"result record field {key!r} is missing or not {typ.__name__}")
    elif kind == "call":
        if not isinstance(rec.get("output"), (bytes, bytearray)):
            raise CasCorruptError(name, "result record has no bytes output")
    else:
        raise CasCorruptError(name, f"unknown result record kind {kind!r}")


def index_name(key: str) -> str:
    """The index ref of ``H_task`` ``key``."""
    algo, _, hexpart = key.partition(":")
    return f"results/{algo}/{hexpart}"


def decode_dict(name: str, body: bytes) -> dict[str, Any]:
    """``body`` decoded as a canonical record; CasCorruptError when it is not one."""
    try:
        value = decode(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CasCorruptError(name, f"not a canonical record: {exc}") from exc
    if not isinstance(value, dict):
        raise CasCorruptError(name, "not a record")
    return value


def provenance(idx: Mapping[str, Any], *, published: bool) -> Provenance:
    """The provenance an index entry records."""
    return Provenance(h_task=str(idx["h_task"]), h_exec=str(idx["h_exec"]),
                      result_digest=str(idx["result"]), task_id=str(idx["task_id"]),
                      tenant=str(idx["tenant"]), workflow=idx.get("workflow"),
                      fleet=str(idx["fleet"]), pool=str(idx["pool"]),
                      instance_id=idx.get("instance_id"), host=str(idx["host"]),
                      computed_at=float(idx["computed_at"]), compute_s=float(idx["compute_s"]),
                      published=published)


def exec_record(res: ExecResult, image_digest: str) -> dict[str, Any]:
    """What a command's result is, for reuse: everything but its wall-clock duration."""
    return {"kind": "exec", "exit_code": res.exit_code, "stdout": res.stdout, "stderr": res.stderr,
            "timed_out": res.timed_out, "stdout_truncated": res.stdout_truncated,
            "stderr_truncated": res.stderr_truncated, "stdout_bytes": res.stdout_bytes,
            "stderr_bytes": res.stderr_bytes, "image_digest": image_digest}


def exec_result(rec: Mapping[str, Any], duration_s: float = 0.0) -> ExecResult:
    """The command result a stored exec record stands for."""
    return ExecResult(exit_code=int(rec["exit_code"]), stdout=str(rec["stdout"]), stderr=str(rec["stderr"]),
                      duration_s=duration_s, timed_out=bool(rec["timed_out"]),
                      stdout_truncated=bool(rec["stdout_truncated"]),
                      stderr_truncated=bool(rec["stderr_truncated"]),
                      stdout_bytes=int(rec["stdout_bytes"]), stderr_bytes=int(rec["stderr_bytes"]))


def fresh_from_task(tr: TaskResult, digest: str, cache_failures: bool,
                    files: Mapping[str, bytes]) -> Fresh:
    """Apply the failure policy (:mod:`flowmesh_sdk.reuse`) to one run of a task."""
    res = tr.result
    p = tr.phases
    compute_s = p.env_startup + p.execution + p.teardown

    def fresh(record: dict[str, Any] | None, *, publish: bool, share: bool) -> Fresh:
        return Fresh(record=record, publish=publish, share=share, compute_s=compute_s, task_id=tr.task_id,
                     pool=tr.pool, instance_id=tr.instance_id, inputs=dict(files), native=tr)

    if tr.error is not None or res is None:
        return fresh(None, publish=False, share=False)
    if tr.image_digest and tr.image_digest != digest:
        log.warning("reuse: task %s ran image %s, not %s (the tag moved): not reused",
                    tr.name, tr.image_digest, digest)
        return fresh(None, publish=False, share=False)
    record = exec_record(res, digest)
    if res.timed_out or res.exit_code >= 128 or res.exit_code < 0:
        return fresh(record, publish=False, share=False)
    if res.exit_code == 0:
        return fresh(record, publish=True, share=True)
    return fresh(record, publish=cache_failures, share=True)
