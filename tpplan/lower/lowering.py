"""`lower(graph, plan, mesh, batch) -> Program`: the registered passes applied in order.

The passes read one context (`tpplan.lower.context.Lowering`): the graph, the plan, the mesh's sizes,
the batch and propagation's per-layer decisions (the audit's, when the caller has them). Importing
this module registers the built-in passes (`tpplan.lower.passes`).
"""

from __future__ import annotations

import tpplan.lower.passes  # noqa: F401  # the built-in passes register on import
from tpplan.layout.context_parallel import CpAudit, audit_cp
from tpplan.layout.plan import Plan
from tpplan.layout.propagate import LayerResult
from tpplan.layout.schedule import layer_results
from tpplan.lower.batch import Batch
from tpplan.lower.context import Lowering
from tpplan.lower.program import LayerProgram, MicroBatch, Program, StageProgram
from tpplan.lower.registry import passes
from tpplan.mesh import Mesh
from tpplan.models.graph import ModelGraph


def lowering(
    graph: ModelGraph,
    plan: Plan,
    mesh: Mesh,
    batch: Batch,
    *,
    results: list[LayerResult] | None = None,
    gpus_per_node: int | None = None,
    cp_audit: CpAudit | None = None,
) -> Lowering:
    """The passes' context. `results`: the audit's propagation, when the caller has it (else
    propagated here, memoised); `gpus_per_node`: the cluster's (default: the TP group fits one node);
    `cp_audit`: the mesh's CP audit, when the caller has it."""
    res = results if results is not None else layer_results(graph, plan, mesh.tp)
    cpa = cp_audit if cp_audit is not None else audit_cp(graph, mesh)
    return Lowering(graph, plan, mesh, batch, tuple(res), gpus_per_node or mesh.tp, cpa)


def lower_layer(ctx: Lowering, index: int) -> LayerProgram:
    """One layer's steps: every registered pass's layer hook, in order."""
    layer = LayerProgram(index, ctx.results[index].kind, ())
    for p in passes():
        if p.layer is not None:
            layer = p.layer(ctx, layer)
    return layer


def lower_program(ctx: Lowering) -> Program:
    """The whole program: every layer lowered, then every registered pass's program hook, in order."""
    return _program_hooks(ctx, tuple(lower_layer(ctx, i) for i in range(len(ctx.results))))


def lower_outline(ctx: Lowering) -> Program:
    """The program's outline: its stages, micro-batches, stage sends, final reduction and fused pairs,
    with the layers' steps left out (every program hook over empty layers). The cost model prices the
    sends and the final reduction from it without lowering every layer again; so a program hook places
    those from the context and the layers' indices, never from their steps."""
    return _program_hooks(ctx, tuple(LayerProgram(i, r.kind, ()) for i, r in enumerate(ctx.results)))


def _program_hooks(ctx: Lowering, layers: tuple[LayerProgram, ...]) -> Program:
    stage = StageProgram(0, layers, (MicroBatch(0, ctx.batch.segments),))
    prog = Program(ctx.plan.name, ctx.tp, ctx.tokens, (stage,))
    for p in passes():
        if p.program is not None:
            prog = p.program(ctx, prog)
    return prog


def lower(
    graph: ModelGraph,
    plan: Plan,
    mesh: Mesh,
    batch: Batch,
    *,
    results: list[LayerResult] | None = None,
    gpus_per_node: int | None = None,
) -> Program:
    """The program one rank (`batch.rank`) runs for `batch` under `plan` on `mesh`."""
    return lower_program(lowering(graph, plan, mesh, batch, results=results, gpus_per_node=gpus_per_node))


__all__ = ["Lowering", "lower", "lower_layer", "lower_outline", "lower_program", "lowering"]
