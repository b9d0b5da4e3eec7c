"""Quantities (``k8s.io/apimachinery/pkg/api/resource``: suffixes and their canonical form)
and ResourceQuota accounting (the admission plugin,
``k8s.io/apiserver/pkg/admission/plugin/resourcequota/controller.go``: ``exceeded quota: Q,
requested: ..., used: ..., limited: ...`` and ``failed quota: Q: must specify ...``)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from fractions import Fraction

from .meta import ApiError, Obj

__all__ = ["TERMINAL", "counts_for_quota", "format_quantity", "parse_quantity", "pod_quota_usage", "pod_requests",
           "quota_admit", "quota_used"]

_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?$")


def parse_quantity(value: str | int | float) -> Fraction:
    """A Kubernetes quantity (``500m``, ``2``, ``0.5``, ``512Mi``, ``1G``, ``1e3``) as an exact number."""
    text = str(value).strip()
    m = _QUANTITY.match(text)
    if not m:
        raise ValueError(f"quantities must match the regular expression "
                         f"'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$' (got {text!r})")
    number = Fraction(m.group(1))
    suffix = m.group(2) or ""
    if suffix in _BINARY:
        return number * 1024 ** _BINARY[suffix]
    if suffix in _DECIMAL:
        return number * Fraction(10) ** _DECIMAL[suffix]
    return number * Fraction(10) ** int(suffix[1:])


def _is_binary(value: str | int | float) -> bool:
    return str(value).strip()[-2:] in _BINARY


def format_quantity(value: Fraction, *, binary: bool = False) -> str:
    """The canonical form the apiserver prints (``Quantity.String()``): binary suffixes for a
    quantity given with one (when a whole multiple of 1024), else the largest decimal SI
    suffix that keeps the number whole (``0.5`` -> ``500m``, ``2000`` -> ``2k``)."""
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    value = abs(value)
    if binary and value >= 1024 and value.denominator == 1:
        n = int(value)
        best = ""
        for suffix, power in _BINARY.items():
            if n % 1024 ** power == 0:
                best = suffix
        if best:
            return f"{sign}{n // 1024 ** _BINARY[best]}{best}"
    for suffix, exp in sorted(_DECIMAL.items(), key=lambda kv: -kv[1]):
        scaled = value / Fraction(10) ** exp
        if scaled.denominator == 1:
            return f"{sign}{int(scaled)}{suffix}"
    # finer than a nano: rounded up to nanos, as the apiserver does
    nanos = -(-value * 10 ** 9 // 1)
    return f"{sign}{int(nanos)}n"


# ---- quota ----------------------------------------------------------------------------------
TERMINAL = ("Succeeded", "Failed")
_COMPUTE = ("cpu", "memory")


def pod_requests(pod: Obj, kind: str = "requests") -> dict[str, Fraction]:
    """Sum of the containers' ``resources.requests`` (or ``limits``)."""
    out: dict[str, Fraction] = {}
    for c in (pod.get("spec") or {}).get("containers") or []:
        for k, v in ((c.get("resources") or {}).get(kind) or {}).items():
            out[k] = out.get(k, Fraction(0)) + parse_quantity(v)
    return out


def _binary_keys(pod: Obj) -> set[str]:
    keys = set()
    for c in (pod.get("spec") or {}).get("containers") or []:
        for kind in ("requests", "limits"):
            for k, v in ((c.get("resources") or {}).get(kind) or {}).items():
                if _is_binary(v):
                    keys.update({f"{kind}.{k}", k})
    return keys


def pod_quota_usage(pod: Obj) -> dict[str, Fraction]:
    """What a pod counts against a ResourceQuota (the pod evaluator's ``Usage``)."""
    usage: dict[str, Fraction] = {"pods": Fraction(1), "count/pods": Fraction(1)}
    for k, v in pod_requests(pod, "requests").items():
        usage[f"requests.{k}"] = v
        if k in _COMPUTE:
            usage[k] = v
    for k, v in pod_requests(pod, "limits").items():
        if k in _COMPUTE:
            usage[f"limits.{k}"] = v
    return usage


def counts_for_quota(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") not in TERMINAL


def quota_used(quota: Obj, pods: Iterable[Obj]) -> dict[str, str]:
    """``status.used`` of a quota: the keys of its ``spec.hard`` summed over its namespace's
    non-terminated pods."""
    hard = ((quota.get("spec") or {}).get("hard") or {})
    totals = {k: Fraction(0) for k in hard}
    binary = {k for k, v in hard.items() if _is_binary(v)}
    for pod in pods:
        if not counts_for_quota(pod):
            continue
        binary |= _binary_keys(pod)
        for k, v in pod_quota_usage(pod).items():
            if k in totals:
                totals[k] += v
    return {k: format_quantity(v, binary=k in binary) for k, v in totals.items()}


def quota_admit(pod: Obj, quotas: Iterable[Obj], pods: Iterable[Obj]) -> None:
    """The ResourceQuota admission check for a new pod; raises ApiError 403 as the plugin
    words it."""
    name = pod["metadata"]["name"]
    pods = [p for p in pods if counts_for_quota(p)]
    usage = pod_quota_usage(pod)
    binary = _binary_keys(pod)
    for quota in quotas:
        qname = quota["metadata"]["name"]
        hard = ((quota.get("spec") or {}).get("hard") or {})
        # cpu and memory quotas need every container to state the resource (podEvaluator.Constraints)
        missing: dict[str, set[str]] = {}
        for c in (pod.get("spec") or {}).get("containers") or []:
            res = c.get("resources") or {}
            for key in hard:
                kind, _, what = key.rpartition(".")
                if what not in _COMPUTE or kind not in ("", "requests", "limits"):
                    continue
                where = "limits" if kind == "limits" else "requests"
                if what not in (res.get(where) or {}):
                    missing.setdefault(key, set()).add(str(c.get("name", "")))
        if missing:
            parts = [f"{k} for: {','.join(sorted(v))}" for k, v in sorted(missing.items())]
            raise ApiError.forbidden("pods", name, f"failed quota: {qname}: must specify {'; '.join(parts)}")
        used = {k: Fraction(0) for k in hard}
        q_binary = {k for k, v in hard.items() if _is_binary(v)} | binary
        for p in pods:
            q_binary |= _binary_keys(p)
            for k, v in pod_quota_usage(p).items():
                if k in used:
                    used[k] += v
        failed = sorted(k for k in hard if k in usage and used[k] + usage[k] > parse_quantity(hard[k]))
        if failed:
            def show(values: Mapping[str, Fraction]) -> str:
                return ",".join(f"{k}={format_quantity(values[k], binary=k in q_binary)}" for k in failed)
            limits = {k: parse_quantity(hard[k]) for k in failed}
            raise ApiError.forbidden("pods", name, f"exceeded quota: {qname}, requested: {show(usage)}, "
                                                    f"used: {show(used)}, limited: {show(limits)}")
