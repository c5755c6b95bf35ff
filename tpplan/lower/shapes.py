"""The glue between an op decision and its kind's per-rank shape: the token rows a rank runs an op on
(the same rule for every kind: its share where the op reads or writes token-sharded) and the
`RankCtx` the kind's definition reads. The per-kind part (a linear's weight slice, a router's whole
weight, the routed experts' share) is the op kind's own (`OpKindDef.shape`, `.expert_share` in
`tpplan.models.opkind_defs`); the lowering puts it on the kernel steps the compute pricer prices."""

from __future__ import annotations

import math

from tpplan.layout.plan import Plan
from tpplan.layout.propagate import OpDecision
from tpplan.models.opkinds import ExpertShare, RankCtx, Shape, op_kind
from tpplan.placement import S_TOK


def token_rows(d: OpDecision, tokens: int, n: int) -> int:
    """Token rows one rank processes for this op: its share when the op reads or writes token-sharded."""
    if d.strategy.output is S_TOK or S_TOK in d.strategy.inputs:
        return math.ceil(tokens / n)
    return tokens


def rank_ctx(d: OpDecision, tokens: int, n: int, plan: Plan) -> RankCtx:
    """What `d`'s kind needs for its per-rank shape on a TP group of `n` for a batch of `tokens`
    (`plan`: its EP size, for routed experts split EP, and their redundant copies)."""
    groups = plan.ep_size if d.split == "ep" else None
    rows = token_rows(d, tokens, n)
    return RankCtx(d.split, d.strategy.output, rows, tokens, n, d.weight_elements_per_rank, groups,
                   plan.redundant_experts)  # fmt: skip


def rank_shape(d: OpDecision, tokens: int, n: int, plan: Plan) -> Shape | None:
    """The per-rank kernel shape `d`'s kind states (a GEMM's (M, K, N); None for shapeless classes)."""
    return op_kind(d.op.kind).shape(d.op, rank_ctx(d, tokens, n, plan))


def expert_share(d: OpDecision, tokens: int, n: int, plan: Plan) -> ExpertShare:
    """The rank's share of `d`'s routed experts (experts, intermediate width, routed rows) its kind states."""
    share = op_kind(d.op.kind).expert_share(d.op, rank_ctx(d, tokens, n, plan))
    if share is None:
        raise ValueError(f"{d.op.name}: {d.op.kind.value} ops are not routed experts")
    return share


__all__ = ["expert_share", "rank_ctx", "rank_shape", "token_rows"]
