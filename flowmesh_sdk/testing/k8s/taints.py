"""Node taints and pod tolerations, as the apiserver validates them and kube-scheduler's
``TaintToleration`` filter applies them.

Sources: ``k8s.io/api/core/v1/toleration.go`` (``ToleratesTaint``: a toleration with an
effect matches only that effect, one with a key only that key; operator ``Exists`` matches
any value, ``Equal`` -- the default when empty -- the same value; an empty key with
``Exists`` tolerates every taint), ``.../core/v1/taint.go`` and the scheduler's
``pkg/scheduler/framework/plugins/tainttoleration`` (``FindMatchingUntoleratedTaint`` over
the ``NoSchedule`` and ``NoExecute`` taints only -- ``PreferNoSchedule`` is a score, not a
filter; the reason ``node(s) had untolerated taint {KEY: VALUE}``, status
UnschedulableAndUnresolvable: preemption does not help), and ``pkg/apis/core/validation``
(``ValidateTolerations``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["EFFECTS", "Taint", "tolerates", "toleration_errors", "untolerated"]

EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_FILTERED = ("NoSchedule", "NoExecute")


@dataclass(frozen=True)
class Taint:
    """One taint of a :class:`~.scheduler.Node` (``spec.taints[]``)."""

    key: str
    value: str = ""
    effect: str = "NoSchedule"

    def __post_init__(self) -> None:
        if not self.key:
            raise ValueError("a taint needs a key")
        if self.effect not in EFFECTS:
            raise ValueError(f"taint effect must be one of {', '.join(EFFECTS)}, got {self.effect!r}")

    @classmethod
    def of(cls, value: Taint | Mapping[str, Any]) -> Taint:
        if isinstance(value, Taint):
            return value
        return cls(str(value.get("key") or ""), str(value.get("value") or ""), str(value.get("effect") or ""))

    def to_json(self) -> dict[str, str]:
        out = {"key": self.key, "effect": self.effect}
        if self.value:
            out["value"] = self.value
        return out


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """``Toleration.ToleratesTaint``."""
    effect, key = toleration.get("effect") or "", toleration.get("key") or ""
    if effect and effect != taint.get("effect"):
        return False
    if key and key != taint.get("key"):
        return False
    op = toleration.get("operator") or "Equal"
    if op == "Exists":
        return True
    return op == "Equal" and (toleration.get("value") or "") == (taint.get("value") or "")


def untolerated(taints: Iterable[Mapping[str, Any]],
                tolerations: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The first ``NoSchedule``/``NoExecute`` taint no toleration tolerates, or None."""
    for taint in taints:
        if taint.get("effect") in _FILTERED and not any(tolerates(t, taint) for t in tolerations):
            return taint
    return None


def toleration_errors(tolerations: Any) -> list[tuple[str, str]]:
    """``ValidateTolerations``' errors as (field, message) pairs (the operator, value, key
    and effect rules; label syntax of keys and values is not checked)."""
    if tolerations is None:
        return []
    if not isinstance(tolerations, list):
        return [("spec.tolerations", "Invalid value: must be a list")]
    causes: list[tuple[str, str]] = []
    for i, t in enumerate(tolerations):
        where = f"spec.tolerations[{i}]"
        if not isinstance(t, dict):
            causes.append((where, "Invalid value: must be an object"))
            continue
        key, op, value, effect = (str(t.get(k) or "") for k in ("key", "operator", "value", "effect"))
        if not key and op != "Exists":
            causes.append((f"{where}.operator", f'Invalid value: "{op}": operator must be Exists when `key` is '
                                                'empty, which means "match all values and all keys"'))
        if t.get("tolerationSeconds") is not None and effect != "NoExecute":
            causes.append((f"{where}.effect", f'Invalid value: "{effect}": effect must be \'NoExecute\' when '
                                              '`tolerationSeconds` is set'))
        if op == "Exists" and value:
            causes.append((f"{where}.operator", "Invalid value: value must be empty when `operator` is 'Exists'"))
        elif op not in ("", "Equal", "Exists"):
            causes.append((f"{where}.operator", f'Unsupported value: "{op}": supported values: "Equal", "Exists"'))
        if effect and effect not in EFFECTS:
            causes.append((f"{where}.effect", f'Unsupported value: "{effect}": supported values: "NoSchedule", '
                                              '"PreferNoSchedule", "NoExecute"'))
    return causes
