"""Placement rules per op: which input placements an op accepts and what it then produces.

A rule lists the op's strategies in order of preference. Each strategy is a tuple of required
input placements and the output placement. The rule depends on the op's kind and on how its
weight is placed (column, row, replicated, or the MoE mode), and it explains, in words, why the
op needs what it needs: those words end up in the audit's reasons.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpplan.layout.placement import S_COL, S_TOK, P, Placement, R
from tpplan.models.graph import Op, OpKind, Value, WeightSplit


@dataclass(frozen=True)
class Strategy:
    inputs: tuple[Placement, ...]
    output: Placement


TRUE = (R, S_TOK)  # placements holding true values of whole rows


def _same(n: int, placements: tuple[Placement, ...]) -> list[Strategy]:
    return [Strategy((p,) * n, p) for p in placements]


def strategies(
    op: Op, split: WeightSplit | str, values: dict[str, Value], prefer_tokens: bool = False
) -> list[Strategy]:
    """All strategies of `op` with its weight placed as `split` (or MoE mode 'tp'/'ep'/'a2a')."""
    k = op.kind
    n_in = len(op.inputs)
    if k is OpKind.LINEAR:
        if split == WeightSplit.COL:
            return [Strategy((R,), S_COL)]
        if split == WeightSplit.ROW:
            return [Strategy((S_COL,), P)]
        order = (S_TOK, R, P) if prefer_tokens else (R, S_TOK, P)
        return _same(1, order)
    if k in (OpKind.NORM, OpKind.ROUTER):
        return _same(n_in, (S_TOK, R) if prefer_tokens else TRUE)
    if k is OpKind.ATTN_RES:
        return _same(n_in, TRUE)
    if k is OpKind.HEAD_NORM or k is OpKind.UNARY or k is OpKind.SWIGLU:
        return _same(n_in, (R, S_TOK, S_COL))
    if k is OpKind.SLICE:
        if op.attrs.get("gated_query"):  # per-head split of a head-structured value
            return _same(1, (R, S_TOK, S_COL))
        return _same(1, (R, S_TOK, P))
    if k is OpKind.MUL:
        # A product with a true factor is linear in the other factor, so partial sums survive it,
        # unless the plain factor goes through a non-linearity first.
        out = _same(2, (R, S_TOK, S_COL))
        if op.attrs.get("sigmoid_second"):
            out.append(Strategy((P, R), P))
        else:
            out += [Strategy((P, R), P), Strategy((R, P), P)]
        return out
    if k is OpKind.ADD:
        if op.role.startswith("layer."):  # the residual stream holds true values only
            return _same(2, (R, S_TOK))
        return _same(2, (R, S_TOK, S_COL, P))
    if k is OpKind.TOKEN_MIX:
        # Mixes tokens within each head: needs every token of the heads it computes. Inputs that are
        # not head-structured (MLA's shared rope key) are needed whole.
        heads_in = tuple(S_COL if values[v].heads else R for v in op.inputs)
        return [Strategy(heads_in, S_COL), Strategy((R,) * n_in, R)]
    if k is OpKind.EXPERTS:
        if split == "a2a":
            return [Strategy((S_TOK, S_TOK), S_TOK)]
        return [Strategy((R, R), P)]
    raise ValueError(f"no placement rule for op kind {k}")


def why_needed(op: Op, needed: Placement, got: Placement, n: int = 0) -> str:
    """One sentence on why `op` needs `needed` where it got `got` (n: the TP size, for shapes)."""
    k = op.kind
    if k is OpKind.LINEAR and needed is R:
        if n and op.split_heads and op.split_heads % n == 0 and len(op.weight_shape) == 2:
            out, inp = op.weight_shape
            return (
                f"it is column-parallel: each rank owns {op.split_heads // n} of {op.split_heads} heads/columns "
                f"(a [{out // n}, {inp}] slice of the weight) and must apply it to every token; from "
                f"token-sharded input a rank can only make its own slice for its own tokens, and gathering those "
                f"slices would mix different ranks' heads"
            )
        return (
            f"it is column-parallel (weight split by {op.split_heads} heads/columns), so each rank must "
            "apply its own slice of the weight to every token"
        )
    if k is OpKind.LINEAR and needed is S_COL:
        return "it is row-parallel, so it reads only its own heads' columns"
    if k is OpKind.TOKEN_MIX:
        return f"it is {op.note or 'token mixing'}: each output token depends on other tokens, so it needs every token"
    if k in (OpKind.NORM, OpKind.ATTN_RES, OpKind.ROUTER):
        if got is P:
            return "it is non-linear in its input, so it needs true values, not partial sums"
        return "it reads the whole feature row of each token"
    if k in (OpKind.MUL, OpKind.SWIGLU, OpKind.ADD, OpKind.HEAD_NORM, OpKind.UNARY):
        return "an elementwise op needs both operands in the same placement, split the same way"
    if k is OpKind.EXPERTS:
        return "routed experts under tensor or expert parallelism (no all-to-all) need every token on every rank"
    if got is P:
        return "it is non-linear, so it needs true values, not partial sums"
    return f"its rule accepts {needed} here"
