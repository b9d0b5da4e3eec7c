"""Tolerations the ``k8s`` provider puts on its pods, and which nodes' taints they tolerate.

:class:`Toleration` is a pod's ``spec.tolerations[]`` entry as a typed record (``key``,
``operator`` ``Equal``/``Exists``, ``value``, ``effect`` ``NoSchedule``/``PreferNoSchedule``/
``NoExecute`` or empty for all, ``toleration_seconds`` for ``NoExecute``), validated as the
apiserver validates it (``ValidateTolerations``) so a bad one is a :class:`SpecError` here,
not a 422 at the first launch.

Which pods get which (:func:`pod_tolerations`): every pod the user's ``tolerations``; a GPU
shape also ``gpu_tolerations``, by default :data:`GPU_TOLERATION` (``nvidia.com/gpu``
Exists NoSchedule).  Why that default: GPU node pools are tainted so that pods which do not
ask for a GPU stay off them -- GKE taints its GPU nodes ``nvidia.com/gpu=present:NoSchedule``,
the NVIDIA GPU Operator's docs and EKS's GPU AMIs use the same key -- and the apiserver's
``ExtendedResourceToleration`` admission plugin, where a cluster enables it, adds exactly this
toleration to every pod that requests ``nvidia.com/gpu``.  It is harmless where no node has
that taint (a toleration only allows), and a CPU sandbox never gets it, so CPU sandboxes stay
off the GPU nodes.  Clusters that taint otherwise (AKS's documented ``sku=gpu:NoSchedule``)
pass ``gpu_tolerations=[Toleration("sku", "Equal", "gpu", "NoSchedule")]``; ``()`` turns the
default off.

:func:`untolerated` is kube-scheduler's ``TaintToleration`` filter (``ToleratesTaint`` of
``k8s.io/api/core/v1``): the first ``NoSchedule`` or ``NoExecute`` taint of a node that no
toleration tolerates; :mod:`.capacity` counts no room on such a node.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from flowmesh_sdk.errors import SpecError

EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
OPERATORS = ("Equal", "Exists")


@dataclass(frozen=True, slots=True)
class Toleration:
    """One ``spec.tolerations[]`` entry (see the module docstring)."""

    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""
    toleration_seconds: int | None = None

    def __post_init__(self) -> None:
        where = f"k8s.tolerations[{self.key or '*'}]"
        if self.operator not in OPERATORS:
            raise SpecError(where, f"operator must be one of {', '.join(OPERATORS)}, got {self.operator!r}")
        if not self.key and self.operator != "Exists":
            raise SpecError(where, "operator must be Exists when the key is empty (match every taint)")
        if self.operator == "Exists" and self.value:
            raise SpecError(where, "value must be empty when the operator is Exists")
        if self.effect and self.effect not in EFFECTS:
            raise SpecError(where, f"effect must be empty (every effect) or one of {', '.join(EFFECTS)}, "
                                   f"got {self.effect!r}")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise SpecError(where, "toleration_seconds needs effect NoExecute")

    @classmethod
    def of(cls, value: Toleration | Mapping[str, Any]) -> Toleration:
        """A record from itself or from the API's JSON shape (``tolerationSeconds``)."""
        if isinstance(value, Toleration):
            return value
        if not isinstance(value, Mapping):
            raise SpecError("k8s.tolerations", f"must be Toleration records or mappings, got {value!r}")
        seconds = value.get("tolerationSeconds", value.get("toleration_seconds"))
        return cls(str(value.get("key") or ""), str(value.get("operator") or "Equal"), str(value.get("value") or ""),
                   str(value.get("effect") or ""), int(seconds) if seconds is not None else None)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"operator": self.operator}
        if self.key:
            out["key"] = self.key
        if self.value:
            out["value"] = self.value
        if self.effect:
            out["effect"] = self.effect
        if self.toleration_seconds is not None:
            out["tolerationSeconds"] = self.toleration_seconds
        return out

    def tolerates(self, taint: Mapping[str, Any]) -> bool:
        """``Toleration.ToleratesTaint``."""
        if self.effect and self.effect != taint.get("effect"):
            return False
        if self.key and self.key != taint.get("key"):
            return False
        return self.operator == "Exists" or self.value == (taint.get("value") or "")


GPU_TOLERATION = Toleration("nvidia.com/gpu", "Exists", effect="NoSchedule")


def tolerations_of(values: Iterable[Toleration | Mapping[str, Any]]) -> tuple[Toleration, ...]:
    return tuple(Toleration.of(v) for v in values)


def pod_tolerations(gpus: int, every: Sequence[Toleration], gpu: Sequence[Toleration]) -> tuple[Toleration, ...]:
    """The tolerations of a pod of a shape with ``gpus`` GPUs (duplicates dropped)."""
    out: list[Toleration] = []
    for t in (*every, *(gpu if gpus else ())):
        if t not in out:
            out.append(t)
    return tuple(out)


def untolerated(taints: Iterable[Mapping[str, Any]], tolerations: Sequence[Toleration]) -> Mapping[str, Any] | None:
    """The first ``NoSchedule``/``NoExecute`` taint none of ``tolerations`` tolerates."""
    for taint in taints:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not any(t.tolerates(taint) for t in tolerations):
            return taint
    return None
