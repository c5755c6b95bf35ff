"""Pipeline parallelism: contiguous stages (`lower.stages.stage_layers`, the engines' default split)
and what crosses each boundary (`stage_boundary_width`): each TP rank sends its 1/N slice to its peer
in the next stage, and the receivers all-gather it over TP, as both engines do (SGLang's
send_tensor_dict, vLLM's isend_tensor_dict with all_gather_group). Whether a schedule may skip the
re-gather (a token-sharded stream) is the engine's (`cost.pipeline`)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from tpplan.layout.schedule import ring_sent_bytes
from tpplan.lower.program import Collective, Program, SendRecv, StageProgram
from tpplan.lower.registry import Pass, register
from tpplan.lower.stages import stage_boundary_width, stage_layers
from tpplan.placement import S_TOK

if TYPE_CHECKING:
    from tpplan.lower.context import Lowering


def boundary(ctx: Lowering, into_stage: int, layer: int) -> SendRecv:
    """The send into stage `into_stage`, which starts at `layer` (stage s holds ranks [s*tp, (s+1)*tp))."""
    tp, g = ctx.tp, ctx.gpus_per_node
    width = stage_boundary_width(ctx.graph, layer)
    total = ctx.rows * width * ctx.elem_bytes
    cross = ((into_stage - 1) * tp) // g != (into_stage * tp) // g
    gather = None
    if tp > 1:
        shape = (ctx.rows, width)
        gather = Collective("all_gather", "stage_boundary", "stage boundary", "pp", "tp", tp, ctx.ranks_per_node,
                            shape, ctx.act, total, ring_sent_bytes("all_gather", total, tp), float(total),
                            origin="pp")  # fmt: skip
    return SendRecv(into_stage, layer, width, total / tp, cross, gather, ctx.plan.stream is S_TOK)


def _program(ctx: Lowering, prog: Program) -> Program:
    pp = ctx.mesh.pp
    if pp <= 1:
        return prog
    layers = prog.layers
    micro = prog.stages[0].micro_batches
    final = prog.stages[-1].final
    ranges = stage_layers(len(layers), ctx.mesh)
    stages = tuple(
        StageProgram(
            i,
            layers[r.start : r.stop],
            micro,
            boundary(ctx, i + 1, r.stop) if i + 1 < pp else None,
            final if i + 1 == pp else (),
        )
        for i, r in enumerate(ranges)
    )
    return replace(prog, stages=stages)


PP = register(Pass("pp", 50, "pipeline stages and the send/recv (and TP re-gather) at each boundary", program=_program))

__all__ = ["PP", "boundary"]
