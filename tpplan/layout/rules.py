"""Placement rules per op: which input placements an op accepts and what it then produces.

A rule lists the op's strategies in order of preference. Each strategy is a tuple of required
input placements and the output placement. The rule depends on the op's kind and on how its
weight is placed (column, row, replicated, or the MoE mode), and it explains, in words, why the
op needs what it needs: those words end up in the audit's reasons. The rules themselves are
registered with their op kinds (`tpplan.models.opkinds`); this module is the planner's view.
"""

from __future__ import annotations

from tpplan.models.graph import Op, Value, WeightSplit
from tpplan.models.opkinds import TRUE, Strategy, op_kind
from tpplan.placement import P, Placement

__all__ = ["TRUE", "Strategy", "strategies", "why_needed"]


def strategies(
    op: Op, split: WeightSplit | str, values: dict[str, Value], prefer_tokens: bool = False
) -> list[Strategy]:
    """All strategies of `op` with its weight placed as `split` (or MoE mode 'tp'/'ep'/'a2a')."""
    return op_kind(op.kind).rule(op, split, values, prefer_tokens)


def why_needed(op: Op, needed: Placement, got: Placement, n: int = 0) -> str:
    """One sentence on why `op` needs `needed` where it got `got` (n: the TP size, for shapes)."""
    why = op_kind(op.kind).why(op, needed, got, n)
    if why is not None:
        return why
    if got is P:
        return "it is non-linear, so it needs true values, not partial sums"
    return f"its rule accepts {needed} here"
