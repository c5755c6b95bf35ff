"""What the search minimises: objectives priced op by op, additively.

An objective prices an op decision (`op_cost`), a collective (`comm_cost`) and what lies outside
the layers (`fixed`: the final reduction, embedding and head, KV cache and recurrent state, PP's
stage sends). The search may optimise each layer kind on its own only because these prices add up
(docs/design.md, "Search"). `PredictObjective` uses the cost model's public prices
(`tpplan.cost.pricing.Pricer`), so its score of a plan equals `predict_plan`'s (over replicas, where the
split dealt beforehand is the router's: `PredictObjective`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol

from tpplan.audit import PlanAudit
from tpplan.dtypes import DTYPE_BYTES
from tpplan.layout.propagate import CommEvent, LayerResult, OpDecision
from tpplan.mesh import Mesh
from tpplan.models.graph import ModelGraph
from tpplan.placement import Collective, P, Placement, R, ring_elements_per_rank
from tpplan.search.space import GlobalChoice

if TYPE_CHECKING:
    from tpplan.cost.pricing import Pricer
    from tpplan.cost.topology import Topology
    from tpplan.cost.workload import Workload


@dataclass(frozen=True)
class Cost:
    """A score to minimise (seconds for time objectives) and memory per rank in bytes."""

    score: float = 0.0
    memory: float = 0.0

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.score + other.score, self.memory + other.memory)

    def __mul__(self, k: float) -> Cost:
        return Cost(self.score * k, self.memory * k)


ZERO = Cost()


class Objective(Protocol):
    """What the search minimises. Costs must be additive over a layer's op decisions and
    collectives (that is what lets the search optimise each layer kind on its own); `fixed`
    prices what lies outside the layers (the final reduction, embedding and head)."""

    name: str

    def op_cost(self, kind: str, d: OpDecision, n: int, g: GlobalChoice) -> Cost: ...

    def comm_cost(self, kind: str, c: CommEvent, n: int) -> Cost: ...

    def fixed(self, graph: ModelGraph, stream: Placement, final_delta: Placement, n: int) -> Cost: ...


def memory_layer_counts(obj: Objective) -> dict[str, int] | None:
    """How many layers of each kind the objective's memory counts, where that is not every layer
    (`PredictObjective` with PP: the largest count of the kind in one stage); None: every layer."""
    return getattr(obj, "memory_layer_counts", None)


def layer_cost(obj: Objective, res: LayerResult, g: GlobalChoice) -> Cost:
    """One layer's cost under `obj`: the sum over its op decisions and collectives."""
    total = ZERO
    for d in res.decisions:
        total = total + obj.op_cost(res.kind, d, res.n, g)
    for c in res.comms:
        total = total + obj.comm_cost(res.kind, c, res.n)
    return total


def plan_cost(obj: Objective, graph: ModelGraph, pa: PlanAudit) -> Cost:
    """A whole plan's cost from its audit, layer by layer (what brute force ranks by)."""
    total = ZERO
    p = pa.plan
    g = GlobalChoice(p.stream, p.reduce, p.moe, p.ep_size, p.redundant_experts)
    mem_counts, counts = memory_layer_counts(obj), graph.counts()
    for res in pa.layer_results:
        c = layer_cost(obj, res, g)
        if mem_counts is not None:  # PP: memory of a kind's layers counted as the search counts it
            c = Cost(c.score, c.memory * mem_counts[res.kind] / counts[res.kind])
        total = total + c
    final = pa.layer_results[-1].exit_delta if pa.layer_results else P
    return total + obj.fixed(graph, pa.plan.stream, final, pa.n)


def _final_collective(stream: Placement, final_delta: Placement) -> Collective | None:
    if final_delta is not P:
        return None
    return Collective.ALL_REDUCE if stream is R else Collective.REDUCE_SCATTER


@dataclass
class VolumeObjective:
    """Bytes each rank sends per token (the audit's measure) plus `memory_weight` × weight bytes."""

    dtype: str = "bf16"
    memory_weight: float = 0.0
    name: str = "volume"

    def op_cost(self, kind: str, d: OpDecision, n: int, g: GlobalChoice) -> Cost:
        mem = d.weight_elements_per_rank * DTYPE_BYTES[self.dtype]
        return Cost(self.memory_weight * mem, mem)

    def comm_cost(self, kind: str, c: CommEvent, n: int) -> Cost:
        return Cost(c.elements_per_token * DTYPE_BYTES[self.dtype])

    def fixed(self, graph: ModelGraph, stream: Placement, final_delta: Placement, n: int) -> Cost:
        coll = _final_collective(stream, final_delta)
        vol = ring_elements_per_rank(coll, graph.hidden, n) * DTYPE_BYTES[self.dtype] if coll else 0.0
        return Cost(vol, 0.0)


@dataclass
class RooflineObjective:
    """A deliberately simple time model, independent of `tpplan.cost.predict` (the tests use it as
    a second, differently shaped objective): every collective priced by the topology's alpha-beta
    model (`collective_time`), every op's FLOPs at a flat fraction of the GPU's peak (redundant work
    counts in full), weights in memory. `shapes` are (tokens, weight) pairs: one forward of
    `tokens`, or `ttft_shapes(workload)` for a context-free mean TTFT."""

    topology: Topology
    shapes: Sequence[tuple[int, float]] = ((8192, 1.0),)
    dtype: str = "bf16"
    efficiency: float = 0.5
    ranks_per_node: int | None = None
    name: str = "roofline"
    _comm_cache: dict[tuple[str, float, int], float] = field(default_factory=dict, repr=False)

    def _coll_time(self, kind: str, nbytes: float, n: int) -> float:
        key = (kind, nbytes, n)
        t = self._comm_cache.get(key)
        if t is None:
            from tpplan.cost.collectives import collective_time

            rpn = self.ranks_per_node or min(n, self.topology.gpus_per_node)
            t = collective_time(kind, nbytes, n, self.topology, ranks_per_node=rpn).time_s
            self._comm_cache[key] = t
        return t

    def op_cost(self, kind: str, d: OpDecision, n: int, g: GlobalChoice) -> Cost:
        peak = self.topology.gpu.bf16_tflops * 1e12 * self.efficiency
        flops = d.op.flops_per_token * d.compute_share
        score = sum(w * flops * t / peak for t, w in self.shapes)
        return Cost(score, d.weight_elements_per_rank * DTYPE_BYTES[self.dtype])

    def comm_cost(self, kind: str, c: CommEvent, n: int) -> Cost:
        from tpplan.lower.sizes import nccl_size, ring_volume_per_rank

        coll = c.collective.value
        per_logical = ring_volume_per_rank(coll, 1.0, n)
        if per_logical <= 0:
            return ZERO
        score = 0.0
        for t, w in self.shapes:
            logical = c.elements_per_token * t / per_logical
            score += w * self._coll_time(coll, nccl_size(coll, logical, n) * DTYPE_BYTES[self.dtype], n)
        return Cost(score, 0.0)

    def fixed(self, graph: ModelGraph, stream: Placement, final_delta: Placement, n: int) -> Cost:
        coll = _final_collective(stream, final_delta)
        score = 0.0
        if coll is not None and n > 1:
            for t, w in self.shapes:
                score += w * self._coll_time(coll.value, float(t) * graph.hidden * DTYPE_BYTES[self.dtype], n)
        spec = graph.spec
        embed = spec.vocab * spec.hidden * (1 if spec.tie_embeddings else 2) / n * DTYPE_BYTES[self.dtype]
        return Cost(score, embed)


def ttft_batches(workload: Workload, mesh: Mesh | None = None) -> list[tuple[tuple[tuple[int, int], ...], float]]:
    """(batch segments, weight) pairs whose weighted sum of batch times is the mean TTFT.

    The closed-loop FCFS schedule does not depend on how long batches take (a client resubmits at
    a batch boundary), so TTFT_i is the sum of the times of the batches between its arrival and
    its last chunk, and the mean TTFT is linear in batch times with these weights. Segments are
    (new tokens, context) per request, as `tpplan.cost.predict` prices them. With the mesh's replicas, each
    replica's share dealt beforehand (`replica_workloads`) is its own schedule and the mean is over all
    requests: a replica's weights scaled by its share of them, still linear in the (identical) batch times
    (the walk's screen; the TTFT printed and ranked by is the router's, `search.setup.Screen`).
    Batches run one after another, so the batches a request waits through are a run of consecutive
    ones: found by bisection, counted with a difference array (batches + requests, not their product).
    """
    from bisect import bisect_left, bisect_right
    from itertools import accumulate

    from tpplan.cost.workload import replica_workloads, simulate_ttft

    out: dict[tuple[tuple[int, int], ...], float] = {}
    for share in replica_workloads(workload, mesh if mesh is not None else Mesh(1)):
        res = simulate_ttft(share, lambda _b: 1.0)
        starts, ends = [b.start_s for b in res.batches], [b.end_s for b in res.batches]  # both ascending
        steps = [0] * (len(res.batches) + 1)  # request i waits through batches first..last: +1 there, -1 after
        for a, t in zip(res.arrival_s, res.ttft_s, strict=True):
            first, stop = bisect_left(starts, a), bisect_right(ends, a + t)
            if first < stop:
                steps[first] += 1
                steps[stop] -= 1
        for b, inside in zip(res.batches, accumulate(steps), strict=False):
            segs = tuple((sg.n_tokens, sg.start_pos) for sg in b.segments)
            out[segs] = out.get(segs, 0.0) + inside / workload.total_requests
    return list(out.items())


def ttft_shapes(workload: Workload) -> list[tuple[int, float]]:
    """`ttft_batches` reduced to (tokens, weight) for objectives that ignore context."""
    out: dict[int, float] = {}
    for segs, w in ttft_batches(workload):
        t = sum(n for n, _ in segs)
        out[t] = out.get(t, 0.0) + w
    return sorted(out.items())


class PredictObjective:
    """Predicted time from `tpplan.cost`, op by op: the same per-op and per-collective prices
    `predict_plan` sums into a layer's time (`Pricer`), so the search's score of a plan equals
    predict's forward time (no workload) or mean TTFT (workload, closed-loop FCFS, PP 1; over replicas
    the dealt split's, which is predict's where `cost.workload.dealt_is_routed` and otherwise a screen for
    the router's: `search.setup.Screen`).

    With PP > 1 the score adds the stage sends (which depend on the plan only through its stream
    placement): the forward time is still exact; with a workload it is the unpipelined TTFT (the
    pipelined one is not linear in layer times; `search_plans` ranks deployments by
    `predict_plan`'s).

    Memory is the additive part of predict's memory per rank: weights (experts at their weight
    dtype), KV cache, recurrent state, embedding and head. With PP > 1 it is a bound on the fullest
    stage: each layer kind counted at its largest count in one stage (`memory_layer_counts`), and the
    largest stage's KV, state and embedding. Activations (the peak of one chunk) are not additive;
    `search_plans` checks them on the ranked plans.
    """

    def __init__(self, pricer: Pricer, *, workload: Workload | None = None, tokens: int = 8192) -> None:
        self.pricer, self.workload = pricer, workload
        self.graph, self.pp = pricer.graph, pricer.pp
        self.replicas = pricer.deployment.replicas  # the workload split between them (memory: the fullest's)
        self.batches = ttft_batches(workload, pricer.deployment) if workload is not None else [(((tokens, 0),), 1.0)]
        self.name = "mean TTFT" if workload is not None else f"forward time ({tokens} tokens)"
        self.memory_layer_counts: dict[str, int] | None = None
        if self.pp > 1:
            kinds = self.graph.layer_kinds
            self.memory_layer_counts = {
                kind: max(sum(1 for j in rng if kinds[j] == kind) for rng in pricer.stage_layers())
                for kind in self.graph.kinds
            }
        self._ops: dict[tuple[object, ...], Cost] = {}
        self._comms: dict[tuple[str, str, float, bool], float] = {}
        self._copies: dict[tuple[object, ...], float] = {}
        self._fixed: dict[tuple[Placement, Placement, int], Cost] = {}

    def op_cost(self, kind: str, d: OpDecision, n: int, g: GlobalChoice) -> Cost:
        key = (kind, d.op.name, d.split, d.strategy, d.compute_share, d.weight_elements_per_rank, g.ep_size,
               g.redundant_experts)  # fmt: skip
        hit = self._ops.get(key)
        if hit is None:
            lg = self.graph.kinds[kind]
            mesh = replace(self.pricer.deployment, ep=g.ep_size) if d.split == "ep" else None
            r = g.redundant_experts
            secs = sum(w * self.pricer.op_time(lg, d, segs, mesh, r).seconds for segs, w in self.batches)
            hit = Cost(secs, self.pricer.weight_bytes(lg, d))
            self._ops[key] = hit
        return hit

    def comm_cost(self, kind: str, c: CommEvent, n: int) -> Cost:
        key = (kind, c.collective.value, c.elements_per_token, self.pricer.replaced_by_cp(kind, c))
        hit = self._comms.get(key)
        if hit is None:
            hit = sum(w * self.pricer.collective_time(kind, c, segs).seconds for segs, w in self.batches)
            self._comms[key] = hit
        return Cost(hit + self._copy_cost(kind, c), 0.0)

    def _copy_cost(self, kind: str, c: CommEvent) -> float:
        """The runtime's layout copy around `c` (predict's `pack:`/`unpack:` ops of the layer), or 0."""
        key = (kind, c.value, c.collective, c.src, c.dst, c.internal)
        hit = self._copies.get(key)
        if hit is None:
            lg = self.graph.kinds[kind]
            hit = sum(w * self.pricer.layout_copy_time(lg, c, segs) for segs, w in self.batches)
            self._copies[key] = hit
        return hit

    def fixed(self, graph: ModelGraph, stream: Placement, final_delta: Placement, n: int) -> Cost:
        key = (stream, final_delta, n)
        hit = self._fixed.get(key)
        if hit is None:
            hit = Cost(self._fixed_seconds(graph, stream, final_delta, n), self._state_memory())
            self._fixed[key] = hit
        return hit

    def _fixed_seconds(self, graph: ModelGraph, stream: Placement, final_delta: Placement, n: int) -> float:
        """The final reduction and, with PP, the stage sends, with CP, the CP exchanges, for the batches priced."""
        pr = self.pricer
        secs = 0.0
        for segs, w in self.batches:
            if final_delta is P and n > 1:
                secs += w * pr.final_reduce_time(stream, segs)
            if self.pp > 1:
                secs += w * pr.stage_sends_time(stream, segs)
            if pr.cp > 1:  # context parallelism's exchanges: fixed by the graph and TP, not by the plan
                secs += w * sum(k * pr.cp_exchange_time(kind, segs) for kind, k in graph.counts().items())
        return secs

    def _state_memory(self) -> float:
        """KV cache, recurrent state, embedding and head on the fullest stage (no plan changes them)."""
        pr, spec, wl = self.pricer, self.graph.spec, self.workload
        if wl is not None:  # with replicas, each replica's own clients (the fullest counts)
            from tpplan.cost.workload import replica_workloads

            shares = [[w.prompt_len(i) + w.output_len for i in range(w.concurrency)]
                      for w in replica_workloads(wl, self.pricer.deployment)]  # fmt: skip
        else:
            shares = [[sum(t for t, _ in self.batches[0][0])]]
        embed = pr.embedding_bytes()
        stages = pr.stage_layers()
        memory = 0.0
        for seqs in shares:
            for s, rng in enumerate(stages):
                mem = sum(pr.kv_bytes_per_token(j) * sum(seqs) + pr.state_bytes_per_seq(j) * len(seqs) for j in rng)
                mem += embed if s == 0 else 0.0
                mem += embed if s == len(stages) - 1 and (not spec.tie_embeddings or len(stages) > 1) else 0.0
                memory = max(memory, mem)
        return memory
