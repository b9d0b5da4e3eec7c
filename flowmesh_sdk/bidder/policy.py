"""The three weights of FlowMesh's utility U(j,B) = w_t*T_eff - w_c*C + w_l*G_loc, and
the presets: :class:`Policy` and :data:`PRESETS`.

A :class:`~flowmesh_sdk.specs.PoolSpec` holds a policy, so the record lives beside the specs
(:mod:`flowmesh_sdk.specs.policy`, which says where the weights and the presets come from);
this module re-exports it for the bidder.
"""

from __future__ import annotations

from ..specs.policy import PRESETS, Policy

__all__ = ["PRESETS", "Policy"]
