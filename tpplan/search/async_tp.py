"""What makes `search --overlap asynctp` exact: a lower bound of every plan's fused time that the
search can minimise.

Async TP's price is not additive (a fused pair's time depends on the collective and the GEMMs beside
it), so the search cannot minimise it directly. It can minimise `FusableFree`: the objective with
every collective async TP could fuse priced at zero. Every fused pair runs at least as long as its
GEMMs did unfused (`cost/async_tp.py`: a chunk never runs faster than its share of the whole GEMM, and
the GEMMs beside the copies never run faster than alone), so a plan's fused time is at least its
`FusableFree` score, and so is its plain time. Walking the plans in `FusableFree` order until the bound
reaches the best time found (`tpplan.search.variants.overlap_entries`) therefore finds the best fused
plan of the deployment, as brute force does (tests/cost/test_async_tp.py).
"""

from __future__ import annotations

from tpplan.layout.propagate import CommEvent, OpDecision
from tpplan.models.graph import ModelGraph
from tpplan.models.opkinds import op_kind
from tpplan.placement import S_TOK, Collective, P, Placement, R
from tpplan.search.objectives import ZERO, Cost, Objective, memory_layer_counts
from tpplan.search.space import GlobalChoice


def may_fuse(graph: ModelGraph, kind: str, c: CommEvent) -> bool:
    """Whether async TP could fuse `c` in some plan: an all-gather of a token-sharded value a linear op
    reads, or a reduce-scatter of a partial sum a linear op (or the previous layer) produced. A superset
    of `tpplan.layout.fused_gemm.fused_pairs`, which also looks at the decisions around it."""
    if c.internal:
        return False
    lg = graph.kinds[kind]
    if c.collective is Collective.ALL_GATHER and c.src is S_TOK and c.dst is R:
        return any(op_kind(op.kind).linear for op in lg.consumers(c.value))
    if c.collective is Collective.REDUCE_SCATTER and c.src is P and c.dst is S_TOK:
        producer = next((op for op in lg.ops if op.name == c.producer), None)
        return op_kind(producer.kind).linear if producer is not None else c.value == "delta"
    return False


class FusableFree:
    """`base` with every collective `may_fuse` admits priced at zero (its memory unchanged)."""

    def __init__(self, base: Objective, graph: ModelGraph) -> None:
        self.base, self.graph = base, graph
        self.name = f"{base.name}, collectives async TP may fuse free"
        self.memory_layer_counts = memory_layer_counts(base)

    def op_cost(self, kind: str, d: OpDecision, n: int, g: GlobalChoice) -> Cost:
        return self.base.op_cost(kind, d, n, g)

    def comm_cost(self, kind: str, c: CommEvent, n: int) -> Cost:
        return ZERO if may_fuse(self.graph, kind, c) else self.base.comm_cost(kind, c, n)

    def fixed(self, graph: ModelGraph, stream: Placement, final_delta: Placement, n: int) -> Cost:
        return self.base.fixed(graph, stream, final_delta, n)


__all__ = ["FusableFree", "may_fuse"]
