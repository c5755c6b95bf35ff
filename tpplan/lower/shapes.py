"""Per-rank shapes of an op decision: the rows a rank runs an op on, a GEMM's (M, K, N), the routed
experts' share. Written once: the lowering puts them on its kernel steps and the compute pricer
prices those steps (`tpplan.cost.kernel_pricer`)."""

from __future__ import annotations

import math

from tpplan.layout.plan import Plan
from tpplan.layout.propagate import OpDecision
from tpplan.models.opkinds import op_kind
from tpplan.placement import S_COL, S_TOK


def token_rows(d: OpDecision, tokens: int, n: int) -> int:
    """Token rows one rank processes for this op: its share when the op reads or writes token-sharded."""
    if d.strategy.output is S_TOK or S_TOK in d.strategy.inputs:
        return math.ceil(tokens / n)
    return tokens


def gemm_shape(d: OpDecision, tokens: int, n: int) -> tuple[int, int, int]:
    """(M, K, N) of a GEMM op on one rank: the weight's column slice (output head-sharded), its row
    slice (a row-split weight), or the whole weight (replicated, or token rows only)."""
    op = d.op
    out, inp = op.weight_shape
    m = token_rows(d, tokens, n)
    wpr = d.weight_elements_per_rank
    if m < tokens or d.split == "replicated" or not op_kind(op.kind).linear:
        return m, inp, out
    if d.strategy.output is S_COL:
        return m, inp, max(1, wpr // inp)
    if d.split == "row":
        return m, max(1, wpr // out), out
    return m, inp, out


def expert_share(d: OpDecision, tokens: int, n: int, plan: Plan) -> tuple[int, int, float]:
    """(experts, intermediate width, routed rows) one rank runs for the routed experts (E: the plan's
    physical experts, `Plan.physical_experts`): all-to-all E/N experts whole on T*k/N rows; EP E/ep
    experts at 1/(N/ep) of the intermediate on T*k/ep rows; TP every expert at 1/N of the intermediate
    on all T*k rows (`plan`: its EP size)."""
    op = d.op
    e, k = op.int_attr("experts"), op.int_attr("top_k")
    inter = op.int_attr("intermediate")
    e = plan.physical_experts(e)  # redundant copies: more experts per rank, the same rows spread over them
    if d.split == "a2a":
        return e // n, inter, tokens * k / n
    if d.split == "ep":
        ep = plan.ep_size or 1
        return e // ep, inter // (n // ep), tokens * k / ep
    return e, inter // n, float(tokens * k)


def experts_shape(d: OpDecision, tokens: int, n: int, plan: Plan) -> tuple[int, int, int]:
    """(routed rows, width, 2 x intermediate) of the first grouped GEMM (gate+up) on one rank (`plan`:
    its EP size where the experts are split EP)."""
    _, inter, rows = expert_share(d, tokens, n, plan)
    return max(1, round(rows)), d.op.int_attr("width"), 2 * inter


__all__ = ["expert_share", "experts_shape", "gemm_shape", "token_rows"]
