"""Label selectors (``k8s.io/apimachinery/pkg/labels/selector.go`` syntax, and the
``matchLabels``/``matchExpressions`` form) and field selectors (per resource: the fields
each can be selected by)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .meta import ApiError, Obj

__all__ = ["FieldGetter", "FieldSelector", "LabelSelector", "common_fields", "match_label_selector", "pod_fields"]

_REQ = re.compile(r"^\s*(!?)\s*([A-Za-z0-9][-A-Za-z0-9_./]*)\s*(?:(==|=|!=|>|<)\s*([-A-Za-z0-9_.]*)"
                  r"|\s+(in|notin)\s*\(([^)]*)\))?\s*$")


@dataclass(frozen=True)
class _Requirement:
    key: str
    op: str                  # =, !=, in, notin, exists, !, gt, lt
    values: tuple[str, ...]

    def matches(self, labels: Mapping[str, str]) -> bool:
        has = self.key in labels
        value = labels.get(self.key)
        if self.op == "exists":
            return has
        if self.op == "!":
            return not has
        if self.op in ("=", "in"):
            return has and value in self.values
        if self.op in ("!=", "notin"):
            return not has or value not in self.values
        if not has:
            return False
        try:
            number, bound = int(str(value)), int(self.values[0])
        except ValueError:
            return False
        return number > bound if self.op == "gt" else number < bound


def _split_top(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return parts


class LabelSelector:
    """``labelSelector`` of a list or watch: ``k=v``, ``k==v``, ``k!=v``, ``k in (a,b)``,
    ``k notin (a,b)``, ``k``, ``!k``, ``k>1``, ``k<1``; a comma is AND."""

    def __init__(self, text: str = "") -> None:
        self.text = text
        self.requirements: list[_Requirement] = []
        if not text.strip():
            return
        for part in _split_top(text):
            m = _REQ.match(part)
            if not m or (m.group(1) and (m.group(3) or m.group(5))):
                raise ApiError.bad_request(f"unable to parse requirement: found '{part.strip()}', expected: "
                                           "identifier, '=', '==', '!=', 'in', 'notin', '!', '>' or '<'")
            neg, key, op, value, setop, setvals = m.groups()
            if neg:
                self.requirements.append(_Requirement(key, "!", ()))
            elif op:
                kind = {"==": "=", "=": "=", "!=": "!=", ">": "gt", "<": "lt"}[op]
                self.requirements.append(_Requirement(key, kind, (value,)))
            elif setop:
                vals = tuple(v.strip() for v in setvals.split(",") if v.strip())
                self.requirements.append(_Requirement(key, setop, vals))
            else:
                self.requirements.append(_Requirement(key, "exists", ()))

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        labels = labels or {}
        return all(r.matches(labels) for r in self.requirements)


def match_label_selector(selector: Mapping[str, Any] | None, labels: Mapping[str, str] | None) -> bool:
    """A ``metav1.LabelSelector`` object (``matchLabels``, ``matchExpressions``); an empty
    one selects everything."""
    labels = labels or {}
    if not selector:
        return True
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key", ""), expr.get("operator", ""), tuple(expr.get("values") or ())
        kind = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!"}.get(op)
        if kind is None or not _Requirement(key, kind, values).matches(labels):
            return False
    return True


# ---- field selectors --------------------------------------------------------------------------
FieldGetter = Callable[[Obj], Mapping[str, str]]


def common_fields(obj: Obj) -> dict[str, str]:
    meta = obj.get("metadata") or {}
    out = {"metadata.name": str(meta.get("name", ""))}
    if "namespace" in meta:
        out["metadata.namespace"] = str(meta["namespace"])
    return out


def pod_fields(obj: Obj) -> dict[str, str]:
    """The pod fields the apiserver can select on (``pkg/registry/core/pod/strategy.go``)."""
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    out = common_fields(obj)
    out.update({"spec.nodeName": str(spec.get("nodeName", "")),
                "spec.restartPolicy": str(spec.get("restartPolicy", "")),
                "spec.schedulerName": str(spec.get("schedulerName", "")),
                "spec.serviceAccountName": str(spec.get("serviceAccountName", "")),
                "spec.hostNetwork": str(bool(spec.get("hostNetwork", False))).lower(),
                "status.phase": str(status.get("phase", "")),
                "status.podIP": str(status.get("podIP", "")),
                "status.nominatedNodeName": str(status.get("nominatedNodeName", ""))})
    return out


class FieldSelector:
    """``fieldSelector``: ``f=v``, ``f==v``, ``f!=v`` joined by commas (AND)."""

    def __init__(self, text: str, fields: FieldGetter) -> None:
        self.text = text
        self.fields = fields
        self.terms: list[tuple[str, bool, str]] = []   # (field, equal, value)
        if not text.strip():
            return
        for part in text.split(","):
            m = re.match(r"^\s*([A-Za-z0-9_.]+)\s*(==|=|!=)\s*(.*?)\s*$", part)
            if not m:
                raise ApiError.bad_request(f"invalid selector: '{text}'; can't understand '{part}'")
            self.terms.append((m.group(1), m.group(2) != "!=", m.group(3)))

    def check(self, sample: Obj) -> None:
        known = self.fields(sample)
        for name, _, _ in self.terms:
            if name not in known and name not in ("metadata.namespace",):
                raise ApiError.bad_request(f"field label not supported: {name}")

    def matches(self, obj: Obj) -> bool:
        if not self.terms:
            return True
        values = self.fields(obj)
        return all((values.get(name, "") == value) == equal for name, equal, value in self.terms)
