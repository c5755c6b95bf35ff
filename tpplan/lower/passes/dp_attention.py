"""DP attention (SGLang's SUM_LEN padding, `layout.dp_attention`): the gather before the MLP and the
scatter after it run as all-reduces of every rank's rows (a zero-filled buffer, then `dp_scatter`),
and so does the reduction before the final norm. MAX_LEN plans move by the declared transitions and
need nothing here."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from tpplan.layout.dp_attention import DP_TRANSITIONS, dp_transition, sum_len
from tpplan.lower.passes.tp_sp import collective_steps, final_reduction
from tpplan.lower.program import LayerProgram, Program
from tpplan.lower.registry import Pass, register
from tpplan.placement import S_TOK, Collective, P

if TYPE_CHECKING:
    from tpplan.lower.context import Lowering


def _layer(ctx: Lowering, layer: LayerProgram) -> LayerProgram:
    if not sum_len(ctx.plan):
        return layer
    lg = ctx.layer_graph(layer.index)
    for c in ctx.results[layer.index].comms:
        move = None if c.internal else dp_transition(c.collective, c.src, c.dst)
        if move is not None:
            layer = layer.with_before(c.consumer, collective_steps(ctx, lg, c, move, "dp_attention"))
    return layer


def _program(ctx: Lowering, prog: Program) -> Program:
    if not sum_len(ctx.plan) or ctx.plan.stream is not S_TOK:
        return prog
    last = prog.stages[-1]
    move = DP_TRANSITIONS[(P, S_TOK, Collective.ALL_REDUCE)]
    final = tuple(final_reduction(ctx, move, "dp_attention") if c.value == "final" else c for c in last.final)
    return replace(prog, stages=(*prog.stages[:-1], replace(last, final=final)))


DP_ATTENTION = register(
    Pass("dp_attention", 20, "SUM_LEN's gather, scatter and final reduction as all-reduces", _layer, _program)
)

__all__ = ["DP_ATTENTION"]
