"""Routed experts by all-to-all (`plan.moe == "a2a"`): per MoE layer, an all-to-all of the N send
counts, the dispatch of token rows with their fp32 routing weights for the destination's E/N experts
appended as extra columns (`moe_weight_columns`), and, after the experts, the combine of their
outputs. Only real (not padding) tokens are dispatched; a token goes once to every rank hosting one
of its experts. Exact rows need the routing (`Batch.routes`); without it, the rows expected under
uniform routing. The cost model prices the dispatch and the combine at the planner's expected volume."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from tpplan.dtypes import TORCH_DTYPE_BYTES
from tpplan.layout.propagate import CommEvent, moe_remote_fraction, moe_weight_columns
from tpplan.layout.schedule import token_range
from tpplan.lower.program import Collective, LayerProgram
from tpplan.lower.registry import Pass, register
from tpplan.lower.sizes import nccl_bytes
from tpplan.models.graph import Op, OpKind

if TYPE_CHECKING:
    from tpplan.lower.context import Lowering


def _rows(ctx: Lowering, op: Op, routes: Sequence[Sequence[int]] | None) -> tuple[list[int], list[int]]:
    """Rows this rank sends to each rank, and receives from each."""
    n, tokens, rank = ctx.tp, ctx.tokens, ctx.batch.rank
    experts = op.int_attr("experts")
    per = experts // n
    if routes is not None:
        hits = [[{e // per for e in routes[t]} for t in range(*token_range(tokens, n, src))] for src in range(n)]
        send = [sum(1 for h in hits[rank] if dst in h) for dst in range(n)]
        recv = [sum(1 for h in hits[src] if rank in h) for src in range(n)]
        return send, recv
    hit = moe_remote_fraction(experts, op.int_attr("top_k"), n)  # expectation under uniform routing
    lo, hi = token_range(tokens, n, rank)
    send = [round((hi - lo) * hit)] * n
    return send, send


def moe_calls(ctx: Lowering, layer: int, op: Op, dispatch: CommEvent, combine: CommEvent) -> list[Collective]:
    """Counts, dispatch (rows with their routing weights as extra columns) and combine of one layer."""
    n, rank, act, t = ctx.tp, ctx.batch.rank, ctx.act, ctx.tokens
    value, width = op.inputs[0], op.int_attr("width")
    isz = TORCH_DTYPE_BYTES[act]
    local = ctx.plan.physical_experts(op.int_attr("experts")) // n  # the rank's physical experts (redundant too)
    wide = width + moe_weight_columns(local, isz)  # activations + fp32 weights as columns
    send, recv = _rows(ctx, op, (ctx.batch.routes or {}).get(layer))
    out_rows, in_rows = sum(send), sum(recv)
    sent_rows, back_rows = out_rows - send[rank], in_rows - recv[rank]
    rpn, b = ctx.ranks_per_node, ctx.elem_bytes

    def priced(c: CommEvent) -> float:
        return nccl_bytes("all_to_all", c.elements_per_token * t, n, b)

    return [
        Collective("all_to_all", f"{value}:counts", f"a2a {value}:counts[{n}]", dispatch.region, "ep", n, rpn, (n,),
                   "int64", n * 8, float((n - 1) * 8), 0.0, priced=False, origin="ep_a2a"),
        Collective("all_to_all", f"{value}:dispatch", dispatch.label, dispatch.region, "ep", n, rpn, (out_rows, wide),
                   act, out_rows * wide * isz, float(sent_rows * wide * isz), priced(dispatch), origin="ep_a2a",
                   event=dispatch),
        Collective("all_to_all", f"{value}:combine", combine.label, combine.region, "ep", n, rpn, (in_rows, width),
                   act, in_rows * width * isz, float(back_rows * width * isz), priced(combine), origin="ep_a2a",
                   event=combine),
    ]  # fmt: skip


def _layer(ctx: Lowering, layer: LayerProgram) -> LayerProgram:
    comms = ctx.results[layer.index].comms
    dispatch = next((c for c in comms if c.internal and c.value.endswith(":dispatch")), None)
    combine = next((c for c in comms if c.internal and c.value.endswith(":combine")), None)
    if (dispatch is None and combine is None) or ctx.tp <= 1:
        return layer
    # Each move lowers on its own, so a fragment holding one of them (the search prices one planned move at
    # a time, `cost.pricing.Pricer`) gets its own call.
    op = next(o for o in ctx.layer_graph(layer.index).ops if o.kind is OpKind.EXPERTS)
    counts, send, back = moe_calls(ctx, layer.index, op, dispatch or combine, combine or dispatch)  # type: ignore[arg-type]
    if dispatch is not None:
        layer = layer.with_before(op.name, [counts, send])
    return layer.with_after(op.name, [back]) if combine is not None else layer


EP_A2A = register(Pass("ep_a2a", 30, "MoE all-to-all: send counts, dispatch (with routing weights), combine", _layer))

__all__ = ["EP_A2A", "moe_calls"]
