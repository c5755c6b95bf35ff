"""Tensor and sequence parallelism: a kernel call per op decision at its per-rank shape, a collective
per planned move of a value between placements (the declared transitions, `layout.transitions`), the
runtime's layout copies beside them, and the reduction of the last layer's partial sum before the
final norm. This is the base every other pass rewrites."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

from tpplan.dtypes import TORCH_DTYPE_BYTES
from tpplan.layout.plan import Plan
from tpplan.layout.propagate import CommEvent, OpDecision
from tpplan.layout.schedule import ring_sent_bytes, value_dtype
from tpplan.layout.transitions import TRANSITIONS, Transition
from tpplan.lower.program import Collective, KernelCall, LayerProgram, LayoutCopy, Program, StageProgram, Step
from tpplan.lower.registry import Pass, register
from tpplan.lower.shapes import rank_ctx
from tpplan.lower.sizes import nccl_bytes
from tpplan.models.graph import LayerGraph
from tpplan.models.opkinds import cost_class, op_kind
from tpplan.placement import P

if TYPE_CHECKING:
    from tpplan.lower.context import Lowering


def kernel_call(d: OpDecision, tokens: int, n: int, plan: Plan, dtype: str) -> KernelCall:
    """One op decision as the kernel a rank of a TP group of `n` runs for a batch of `tokens` (its rows
    and the per-rank shape its kind states; `plan`: its EP size for routed experts split EP).
    Redundant: every rank does the whole op on the same values (replicated inputs); ops on partial
    sums also run whole on every rank, but each on different data, and routed experts never repeat."""
    op = d.op
    cost, kind, rc = cost_class(op), op_kind(op.kind), rank_ctx(d, tokens, n, plan)
    shape, share = kind.shape(op, rc), kind.expert_share(op, rc)
    redundant = n > 1 and d.compute_share >= 1.0 and P not in d.strategy.inputs and share is None
    if share is None:
        return KernelCall(op.name, op.kind.value, cost, rc.rows, shape, dtype, redundant, d)
    return KernelCall(op.name, op.kind.value, cost, rc.rows, shape, dtype, redundant, d,
                      ep_size=rc.expert_groups, experts=share)  # fmt: skip


def collective_steps(
    ctx: Lowering, lg: LayerGraph, c: CommEvent, move: Transition, origin: str = "tp_sp"
) -> list[Step]:
    """A planned move of a value on the TP group: the call (its buffer padded as the runtime pads it,
    the real rows priced) and the layout copies beside it (pack before, unpack after)."""
    val = lg.values[c.value]
    n, t = ctx.tp, ctx.tokens
    assert move.collective is not None
    kind = move.collective.value
    dt = value_dtype(lg, c.value, ctx.act)
    shape = move.call_shape(val.width, val.heads, n, t)
    nbytes = math.prod(shape) * TORCH_DTYPE_BYTES[dt]
    priced = nccl_bytes(c.collective.value, c.elements_per_token * t, n, ctx.elem_bytes)
    call = Collective(c.collective.value, c.value, c.label, c.region, "tp", n, ctx.ranks_per_node, shape, dt,
                      nbytes, ring_sent_bytes(kind, nbytes, n), priced, origin=origin, event=c)  # fmt: skip
    step = layout_copy_step(lg, c, move, n, t, origin)
    if step is None:
        return [call]
    return [step, call] if step.name.startswith("pack:") else [call, step]


def layout_copy_step(
    lg: LayerGraph, c: CommEvent, move: Transition, n: int, tokens: int, origin: str = "tp_sp"
) -> LayoutCopy | None:
    """The runtime's copy beside a planned move on a group of `n`, if its transition needs one
    (`Transition.layout_copy`: pack before an all-to-all or an uneven reduce-scatter, unpack after a
    head all-gather)."""
    val = lg.values[c.value]
    copy = move.layout_copy(c.value, val.width, val.heads, n, tokens)
    return None if copy is None else LayoutCopy(copy.name, c.value, copy.elements, origin)


def _layer(ctx: Lowering, layer: LayerProgram) -> LayerProgram:
    res = ctx.results[layer.index]
    lg = ctx.layer_graph(layer.index)
    before: dict[str, list[Step]] = {}
    for c in res.comms:
        move = TRANSITIONS.get((c.src, c.dst))
        if c.internal or move is None or move.collective is not c.collective:
            continue  # MoE dispatch/combine (ep_a2a), DP attention's SUM_LEN moves (dp_attention)
        before.setdefault(c.consumer, []).extend(collective_steps(ctx, lg, c, move))
    steps: list[Step] = []
    for d in res.decisions:
        steps += before.pop(d.op.name, [])
        steps.append(kernel_call(d, ctx.tokens, ctx.tp, ctx.plan, ctx.act))
    for rest in before.values():  # consumed after the layer (the next layer's stream)
        steps += rest
    return replace(layer, steps=layer.steps + tuple(steps))


def final_reduction(ctx: Lowering, move: Transition, origin: str = "tp_sp") -> Collective:
    """The last layer's partial output reduced into the stream before the final norm."""
    assert move.collective is not None
    n, rows, h = ctx.tp, ctx.rows, ctx.graph.hidden
    kind = move.collective.value
    shape = move.call_shape(h, 0, n, rows)
    nbytes = math.prod(shape) * ctx.elem_bytes
    priced = nccl_bytes(kind, move.elements_per_rank(h, 0, n) * rows, n, ctx.elem_bytes)
    return Collective(kind, "final", "final", "mlp_side", "tp", n, ctx.ranks_per_node, shape, ctx.act, nbytes,
                      ring_sent_bytes(kind, nbytes, n), priced, origin=origin)  # fmt: skip


def _program(ctx: Lowering, prog: Program) -> Program:
    if ctx.tp <= 1 or not ctx.results or ctx.results[-1].exit_delta is not P:
        return prog
    last = prog.stages[-1]
    final = final_reduction(ctx, TRANSITIONS[(P, ctx.plan.stream)])
    stage: StageProgram = replace(last, final=(*last.final, final))
    return replace(prog, stages=(*prog.stages[:-1], stage))


TP_SP = register(
    Pass(
        "tp_sp",
        10,
        "kernels at per-rank shapes; the TP/SP collectives of planned moves, their layout copies; the final reduction",
        _layer,
        _program,
    )
)

__all__ = ["TP_SP", "collective_steps", "final_reduction", "kernel_call", "layout_copy_step"]
