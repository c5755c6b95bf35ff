"""The collectives a plan issues for a concrete batch, chunk by chunk, as the runtime's trace records
them: the lowered program's collective steps (`tpplan.lower`), cut into prefill chunks, with the
fallback of a chunk too small to scatter (`layout.schedule.falls_back`); and (`predict_cp_calls`) the
program's context-parallel steps (`lower.passes.cp`) as one CP rank records them. The distributed
runtime's tracer records the same fields from the real tensors, and the proof tests assert the two
lists are equal. Conventions (nccl-tests sizes, padding, MoE all-to-all rows): `layout.schedule`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tpplan.layout.plan import Plan
from tpplan.layout.propagate import LayerResult
from tpplan.layout.schedule import ChunkSchedule, CollectiveCall, chunk_sizes, fallback_plan, falls_back, layer_results
from tpplan.lower.batch import Batch
from tpplan.lower.lowering import lower
from tpplan.mesh import Mesh
from tpplan.models.graph import ModelGraph


def chunk_calls(
    graph: ModelGraph,
    plan: Plan,
    n: int,
    tokens: int,
    *,
    chunk: int = 0,
    dtype: str = "float32",
    rank: int = 0,
    routes: Mapping[int, Sequence[Sequence[int]]] | None = None,
    results: list[LayerResult] | None = None,
) -> list[CollectiveCall]:
    """Every collective of one chunk of `tokens` tokens under `plan` on a TP group of `n` (no fallback
    logic here): the program's collective steps in run order, the final reduction listed at layer L."""
    if n <= 1:
        return []
    batch = Batch(((tokens, 0),), dtype, rank, routes)
    prog = lower(graph, plan, Mesh(n), batch, results=results if results is not None else layer_results(graph, plan, n))
    calls = []
    for stage in prog.stages:
        for layer in stage.layers:
            calls += [CollectiveCall(chunk, layer.index, c.kind, c.value, c.shape, c.dtype, c.bytes, c.sent_bytes)
                      for c in layer.collectives()]  # fmt: skip
        calls += [CollectiveCall(chunk, len(prog.layers), c.kind, c.value, c.shape, c.dtype, c.bytes, c.sent_bytes)
                  for c in stage.final]  # fmt: skip
    return calls


def predict_schedule(
    graph: ModelGraph,
    plan: Plan,
    n: int,
    tokens: int,
    *,
    chunk: int | None = None,
    dtype: str = "float32",
    rank: int = 0,
    routes: Mapping[tuple[int, int], Sequence[Sequence[int]]] | None = None,
) -> list[ChunkSchedule]:
    """The predicted collectives of a `tokens`-long prefill on rank `rank` of a TP group of `n`, chunk
    by chunk. `routes[(chunk, layer)]` lists each token's selected experts (from the single-process
    reference) and makes MoE all-to-all shapes exact; other collectives need no data."""
    out = []
    main = layer_results(graph, plan, n)
    base: list[LayerResult] | None = None
    for c, t in enumerate(chunk_sizes(tokens, chunk)):
        fb = falls_back(graph, plan, n, t)
        run_plan = fallback_plan(plan, Mesh(n)) if fb else plan
        assert run_plan is not None
        if fb and base is None:
            base = layer_results(graph, run_plan, n)
        layer_routes = {layer: r for (ci, layer), r in (routes or {}).items() if ci == c}
        calls = chunk_calls(graph, run_plan, n, t, chunk=c, dtype=dtype, rank=rank, routes=layer_routes,
                            results=base if fb else main)  # fmt: skip
        out.append(ChunkSchedule(c, t, run_plan.name, fb, calls))
    return out


@dataclass(frozen=True)
class CpCall:
    """One CP collective one rank issues (what the runtime's CP trace records, torch-free)."""

    layer: int
    kind: str  # all_gather | all_reduce | send_recv (recorded by the receiving rank)
    op: str
    value: str
    nbytes: float


def predict_cp_calls(
    graph: ModelGraph, plan: Plan, mesh: Mesh, tokens: int, *, cp_rank: int, dtype: str = "float32"
) -> list[CpCall]:
    """The CP collectives CP rank `cp_rank` of `mesh` issues for one `tokens`-long sequence under `plan`, in
    order: the lowered program's CP steps (each all-gather's whole output, every rank's rows padded to the
    longest; each all-reduce's buffer), each received state or halo on the receiving rank only (rank 0
    receives none). The runtime's CP trace must equal this list (`tpplan.runtime.context_parallel`)."""
    prog = lower(graph, plan, mesh, Batch(((tokens, 0),), dtype))
    return [CpCall(layer.index, c.kind, c.op or "", c.value, c.bytes)
            for layer in prog.layers for c in layer.collectives()
            if c.origin == "cp" and (c.kind != "send_recv" or cp_rank > 0)]  # fmt: skip


__all__ = ["CpCall", "chunk_calls", "predict_cp_calls", "predict_schedule"]
