"""The three weights of FlowMesh's utility U(j,B) = w_t*T_eff - w_c*C + w_l*G_loc, and
the presets.

Source of the utility: FlowMesh ("a service fabric for composable LLM workflows", §3.1
Scheduler; summary in shared/seeds/001_f03ac67054a00a66.txt): "high w_t, low w_c" is the
latency-sensitive setting, "low w_t, high w_c" the cost-sensitive one.  The paper
publishes no numbers for the weights, so the presets below are this SDK's choice:

=========  =====  =====  =====  ================================================
preset     w_t    w_c    w_l    meaning
=========  =====  =====  =====  ================================================
latency    1.0    0.2    0.5    fastest worker first; price breaks near-ties
cost       0.1    1.0    0.1    cheapest worker first; speed breaks near-ties
balanced   1.0    1.0    0.5    speed and price count alike
=========  =====  =====  =====  ================================================

Each term is normalised to [0, 1] before it is weighted (docs/cost-model.md), so the
weights compare like with like.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import SpecError


@dataclass(frozen=True, slots=True)
class Policy:
    """Weights of throughput (``w_t``), cost (``w_c``) and locality (``w_l``)."""

    w_t: float = 1.0
    w_c: float = 1.0
    w_l: float = 0.5

    def __post_init__(self) -> None:
        for name in ("w_t", "w_c", "w_l"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise SpecError(f"policy.{name}", f"must be a finite number, got {value!r}")
            if value < 0:
                raise SpecError(f"policy.{name}", f"must be >= 0 (a weight, not a penalty), got {value!r}")
        if self.w_t == 0 and self.w_c == 0 and self.w_l == 0:
            raise SpecError("policy", "at least one of w_t, w_c, w_l must be > 0 (all zero ranks nothing)")

    @classmethod
    def preset(cls, name: str) -> Policy:
        try:
            return PRESETS[name]
        except (KeyError, TypeError):
            raise SpecError("preset", f"must be one of {', '.join(PRESETS)}; got {name!r}") from None

    @classmethod
    def parse(cls, text: str) -> Policy:
        """A preset name, or ``w_t,w_c,w_l`` (e.g. ``1,0.5,0``)."""
        if not isinstance(text, str):
            raise SpecError("weights", f"must be a preset name or 'w_t,w_c,w_l', got {text!r}")
        text = text.strip()
        if text in PRESETS:
            return PRESETS[text]
        parts = [p.strip() for p in text.split(",")]
        if len(parts) != 3:
            raise SpecError("weights", f"must be a preset ({', '.join(PRESETS)}) or three numbers "
                                       f"w_t,w_c,w_l; got {text!r}")
        try:
            w_t, w_c, w_l = (float(p) for p in parts)
        except ValueError:
            raise SpecError("weights", f"must be three numbers w_t,w_c,w_l; got {text!r}") from None
        return cls(w_t, w_c, w_l)


PRESETS: dict[str, Policy] = {
    "latency": Policy(1.0, 0.2, 0.5),
    "cost": Policy(0.1, 1.0, 0.1),
    "balanced": Policy(1.0, 1.0, 0.5),
}

__all__ = ["PRESETS", "Policy"]
