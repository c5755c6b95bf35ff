"""Data-parallel attention: what a plan's `dp_attention` decision changes, and the batch it assumes.

Under DP attention (SGLang `--enable-dp-attention --dp-size N` with attention TP 1, vLLM
`--data-parallel-size N`) each rank serves requests of its own: it holds whole attention weights
and runs the token mixers on its own tokens; around the MLP/MoE the engine gathers every rank's
tokens and scatters the output back. In tpplan's terms the residual stream is token-sharded
(S(tok)) and every attention-side weight is replicated; what is new is only that a token mixer
accepts token-sharded inputs, because a rank's rows are whole requests, not a slice of one
sequence (`mixer_strategies`). Everything else follows from the existing decisions: the MLP input
is gathered, the MoE output is reduced into the token-sharded stream.

The batch this assumes (named in docs/design.md, "DP attention"): the T prompt tokens of a
batch are N requests, rank r's being the rows `token_range(T, N, r)` (ceil(T/N) tokens each, the
last rank's request shorter when N does not divide T). Token-sharded buffers are padded to the
longest rank, ceil(T/N) rows, exactly as SGLang's `DpPaddingMode.MAX_LEN` pads to the largest DP
rank's count. An uneven batch is priced by `priced_tokens`: MAX_LEN moves and computes N x (the
longest rank) rows, SUM_LEN the sum.

How the gather and the scatter run (the plan's `dp_attention` value, SGLang
`python/sglang/srt/layers/dp_attention.py` at 00161092eb7c5cd13b74ae3a9ff1800a6e63ec80):
- `max_len`: `_dp_gather_via_all_gather` (all_gather_into_tensor of [N*max_len, H]) and
  `dp_reduce_scatter_tensor` after the MLP (the MoE skips its all-reduce): the declared
  S(tok) -> R and P -> S(tok) transitions.
- `sum_len`: `_dp_gather_via_all_reduce` (each rank writes its rows into a zero-filled
  [sum T_r, H] buffer, then all-reduce) and, after the MLP, the MoE's own all-reduce followed by
  `dp_scatter` (a local copy of the rank's rows): the two DP transitions `DP_TRANSITIONS`.
  `DpPaddingMode.get_dp_padding_mode` picks SUM_LEN for every extend (prefill) batch that spans
  more than one DP rank, so this is what SGLang runs for prefill.
"""

from __future__ import annotations

from collections.abc import Sequence

from tpplan.layout.plan import Plan
from tpplan.layout.transitions import Transition
from tpplan.models.graph import Op
from tpplan.models.opkind_types import Strategy
from tpplan.models.opkinds import op_kind
from tpplan.placement import S_TOK, Collective, P, Placement, R

SGLANG_DP_ATTENTION = "python/sglang/srt/layers/dp_attention.py@00161092eb7c5cd13b74ae3a9ff1800a6e63ec80"

# SUM_LEN's gather and scatter: same placements as the all-gather / reduce-scatter, another
# collective (an all-reduce of all T rows), so they are declared beside TRANSITIONS, keyed by the
# collective as well (`dp_transition`).
DP_TRANSITIONS: dict[tuple[Placement, Placement, Collective], Transition] = {
    (t.src, t.dst, Collective.ALL_REDUCE): t
    for t in (
        Transition(S_TOK, R, Collective.ALL_REDUCE, "dp_gather_partial via all-reduce: my rows into a zero buffer"),
        Transition(P, S_TOK, Collective.ALL_REDUCE, "all-reduce, then dp_scatter keeps my rows"),
    )
}


def dp_transition(collective: Collective, src: Placement, dst: Placement) -> Transition | None:
    """The SUM_LEN transition that moves `src` to `dst` by `collective`, if there is one."""
    return DP_TRANSITIONS.get((src, dst, collective))


def planned_transition(plan: Plan, collective: Collective, src: Placement, dst: Placement) -> Transition:
    """The transition a planned collective performs under `plan` (a SUM_LEN one where it applies)."""
    from tpplan.layout.transitions import collective_transition

    return (sum_len(plan) and dp_transition(collective, src, dst)) or collective_transition(collective, src, dst)


def stream_reduction(plan: Plan) -> Transition:
    """How the last block's partial output is reduced into the stream before the final norm."""
    from tpplan.layout.transitions import TRANSITIONS

    if sum_len(plan) and plan.stream is S_TOK:
        return DP_TRANSITIONS[(P, S_TOK, Collective.ALL_REDUCE)]
    return TRANSITIONS[(P, plan.stream)]


def sum_len(plan: Plan) -> bool:
    """True when the plan gathers and scatters by all-reduce (SGLang's SUM_LEN padding)."""
    return plan.dp_attention == "sum_len"


def mixer_strategies(op: Op, options: list[Strategy], plan: Plan) -> list[Strategy]:
    """The op's strategies, plus running a token mixer on the rank's own tokens under DP attention:
    each rank's token-sharded rows are its own requests, so mixing within them is exact."""
    if not plan.dp_attention or not op_kind(op.kind).mixes_tokens:
        return options
    own = Strategy((S_TOK,) * len(op.inputs), S_TOK)
    return options if own in options else [*options, own]


def embedding_placement(plan: Plan) -> Placement:
    """How the embedding's output enters the first layer: each DP rank looks up its own tokens with
    the whole table (SGLang builds `VocabParallelEmbedding(enable_tp=not is_dp_attention_enabled())`),
    otherwise the vocab-parallel partial sum."""
    return S_TOK if plan.dp_attention else P


def rank_tokens(tokens: int, n: int) -> list[int]:
    """The real tokens of each DP rank under the assumed batch (rank r's request = its token range)."""
    per = -(-tokens // n)
    return [max(0, min(per, tokens - r * per)) for r in range(n)]


def priced_tokens(per_rank: Sequence[int], padding: str) -> int:
    """The balanced batch size whose price equals an uneven DP batch's: MAX_LEN pads every rank to
    the longest, so N x max; SUM_LEN moves the sum (attention still waits for the longest rank:
    the balanced price understates it by max/mean on the attention side)."""
    if not per_rank:
        return 0
    if padding == "max_len":
        return len(per_rank) * max(per_rank)
    return sum(per_rank)


__all__ = [
    "DP_TRANSITIONS",
    "SGLANG_DP_ATTENTION",
    "dp_transition",
    "embedding_placement",
    "mixer_strategies",
    "planned_transition",
    "priced_tokens",
    "rank_tokens",
    "stream_reduction",
    "sum_len",
]
