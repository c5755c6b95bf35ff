"""Search for the best legal plan: enumerate decisions from the graph, optimise per layer kind.

The space. A plan is global choices (where the residual stream lives, where partial sums are
reduced, the MoE mode and EP size) plus per-layer-kind decisions. The per-kind decisions are not
listed per model: they are derived from the graph while walking a layer in execution order, by
looking at what each op would receive (the repair logic, made a branching search):

- an op's output that is token-sharded (S(tok)) is a *producer site*: keep it, all-gather it for
  every consumer, or all-to-all it to head-sharded (when a consumer can read heads);
- an op that receives token-sharded (or head-sharded) input it cannot use is a *consumer site*:
  all-gather that input for this op only, or (a column/row-parallel linear) replicate its weight
  so it runs on local tokens and its output becomes a new token-sharded producer;
- a default-replicated linear (MLA's qkv_a, a latent projection) that receives replicated input is
  a *token-shard site*: run it on its own tokens (the seed's prototype) or on every token.

Sites only exist where the walk finds them, so a choice upstream (gather `x`) removes the sites it
makes moot; the knobs form a tree, and the "full product of knobs" is the set of its leaves.

Decomposition. A plan's cost is additive: per-layer cost (summed over the layer's op decisions
and collectives) × layer count, plus the final reduction. Per-kind decisions only touch that
kind's ops, so for each global choice every kind is enumerated on its own (illegal branches cut as
soon as the op that breaks is reached), kinds are coupled only through the placement a layer
hands the next one (handled exactly by grouping configs by that transfer) and through the memory
cap (handled by keeping per-kind k-Pareto fronts of (score, memory) and merging them).
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from tpplan.audit import DTYPE_BYTES, PlanAudit, audit_plan
from tpplan.errors import TpplanError
from tpplan.layout.placement import S_COL, S_TOK, Collective, P, Placement, R
from tpplan.layout.propagate import CommEvent, LayerResult, OpDecision, check_divisible, propagate
from tpplan.layout.rules import strategies
from tpplan.models.graph import LayerGraph, ModelGraph, Op, OpKind, WeightSplit
from tpplan.plans.plan import MoEMode, Plan

# ----------------------------------------------------------------------------------------------
# Objectives


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

    def op_cost(self, kind: str, d: OpDecision, n: int) -> Cost: ...

    def comm_cost(self, kind: str, c: CommEvent, n: int) -> Cost: ...

    def fixed(self, graph: ModelGraph, stream: Placement, final_delta: Placement, n: int) -> Cost: ...


def layer_cost(obj: Objective, res: LayerResult) -> Cost:
    """One layer's cost under `obj`: the sum over its op decisions and collectives."""
    total = ZERO
    for d in res.decisions:
        total = total + obj.op_cost(res.kind, d, res.n)
    for c in res.comms:
        total = total + obj.comm_cost(res.kind, c, res.n)
    return total


def plan_cost(obj: Objective, graph: ModelGraph, pa: PlanAudit) -> Cost:
    """A whole plan's cost from its audit, layer by layer (what brute force ranks by)."""
    total = ZERO
    for res in pa.layer_results:
        total = total + layer_cost(obj, res)
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

    def op_cost(self, kind: str, d: OpDecision, n: int) -> Cost:
        mem = d.weight_elements_per_rank * DTYPE_BYTES[self.dtype]
        return Cost(self.memory_weight * mem, mem)

    def comm_cost(self, kind: str, c: CommEvent, n: int) -> Cost:
        return Cost(c.elements_per_token * DTYPE_BYTES[self.dtype])

    def fixed(self, graph: ModelGraph, stream: Placement, final_delta: Placement, n: int) -> Cost:
        from tpplan.layout.placement import ring_elements_per_rank

        coll = _final_collective(stream, final_delta)
        vol = ring_elements_per_rank(coll, graph.hidden, n) * DTYPE_BYTES[self.dtype] if coll else 0.0
        return Cost(vol, 0.0)


@dataclass
class RooflineObjective:
    """Interim time model until `tpplan.cost.predict` lands: every collective priced by the
    topology's alpha-beta model (`collective_time`), every op's FLOPs at a flat fraction of the
    GPU's peak (redundant work counts in full), weights in memory. `shapes` are (tokens, weight)
    pairs: one forward of `tokens` by default, or a workload's prefill batches weighted so the sum
    is the mean TTFT (the closed-loop FCFS schedule does not depend on batch times)."""

    topology: object  # tpplan.cost.topology.Topology
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

            rpn = self.ranks_per_node or min(n, self.topology.gpus_per_node)  # type: ignore[attr-defined]
            t = collective_time(kind, nbytes, n, self.topology, ranks_per_node=rpn).time_s  # type: ignore[arg-type]
            self._comm_cache[key] = t
        return t

    def op_cost(self, kind: str, d: OpDecision, n: int) -> Cost:
        peak = self.topology.gpu.bf16_tflops * 1e12 * self.efficiency  # type: ignore[attr-defined]
        flops = d.op.flops_per_token * d.compute_share
        score = sum(w * flops * t / peak for t, w in self.shapes)
        return Cost(score, d.weight_elements_per_rank * DTYPE_BYTES[self.dtype])

    def comm_cost(self, kind: str, c: CommEvent, n: int) -> Cost:
        from tpplan.cost.collectives import nccl_size, ring_volume_per_rank

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


def ttft_shapes(workload: object) -> list[tuple[int, float]]:
    """(batch tokens, weight) pairs whose weighted sum of batch times is the workload's mean TTFT.

    The closed-loop FCFS schedule does not depend on how long batches take (a client resubmits at
    a batch boundary), so TTFT_i is the sum of the times of the batches between its arrival and
    its last chunk, and the mean TTFT is linear in batch times with these weights.
    """
    from tpplan.cost.workload import simulate_ttft

    res = simulate_ttft(workload, lambda _b: 1.0)  # type: ignore[arg-type]
    done = [a + t for a, t in zip(res.arrival_s, res.ttft_s, strict=True)]
    weights: dict[int, float] = {}
    for b in res.batches:
        inside = sum(1 for a, e in zip(res.arrival_s, done, strict=True) if a <= b.start_s and b.end_s <= e)
        weights[b.n_tokens] = weights.get(b.n_tokens, 0.0) + inside / len(done)
    return sorted(weights.items())


# ----------------------------------------------------------------------------------------------
# The space


@dataclass(frozen=True)
class GlobalChoice:
    """The model-wide decisions: stream placement, reduce target, MoE mode and EP size."""

    stream: Placement
    reduce: Placement
    moe: MoEMode = "tp"
    ep_size: int | None = None

    def moe_label(self) -> str:
        return self.moe if self.moe != "ep" else f"ep{self.ep_size}"


@dataclass(frozen=True)
class KindConfig:
    """One leaf of a layer kind's decision tree: exact qualified names, and the choices in words."""

    kind: str
    gather: frozenset[str] = frozenset()
    gather_for: frozenset[tuple[str, str]] = frozenset()
    a2a: frozenset[str] = frozenset()
    replicate: frozenset[str] = frozenset()
    token_shard: frozenset[str] = frozenset()
    choices: tuple[str, ...] = ()

    def add(self, choice: str, **sets: Iterable[object]) -> KindConfig:
        kw: dict[str, object] = {}
        for k, v in sets.items():
            kw[k] = getattr(self, k) | frozenset(v)
        return KindConfig(
            self.kind,
            kw.get("gather", self.gather),  # type: ignore[arg-type]
            kw.get("gather_for", self.gather_for),  # type: ignore[arg-type]
            kw.get("a2a", self.a2a),  # type: ignore[arg-type]
            kw.get("replicate", self.replicate),  # type: ignore[arg-type]
            kw.get("token_shard", self.token_shard),  # type: ignore[arg-type]
            (*self.choices, choice),
        )


def make_search_plan(g: GlobalChoice, configs: Sequence[KindConfig], name: str = "", summary: str = "") -> Plan:
    """The Plan a global choice and one config per kind stand for."""

    def union(attr: str) -> frozenset:  # type: ignore[type-arg]
        out: frozenset = frozenset()  # type: ignore[type-arg]
        for c in configs:
            out = out | getattr(c, attr)
        return out

    return Plan(
        name or "search",
        "found by search",
        summary,
        stream=g.stream,
        reduce=g.reduce,
        gather=union("gather"),
        gather_for=union("gather_for"),
        a2a=union("a2a"),
        replicate=union("replicate"),
        token_shard=union("token_shard"),
        moe=g.moe,
        ep_size=g.ep_size,
        found_by="search",
    )


def _has_experts(lg: LayerGraph) -> bool:
    return any(op.kind is OpKind.EXPERTS for op in lg.ops)


def global_choices(graph: ModelGraph, n: int, *, streams: Sequence[Placement] = (R, S_TOK)) -> list[GlobalChoice]:
    """Every global choice valid for this model at TP size n (MoE modes the expert counts allow)."""
    moes: list[tuple[MoEMode, int | None]] = [("tp", None)]
    if any(_has_experts(lg) for lg in graph.kinds.values()) and n > 1:
        moes += [("ep", e) for e in range(2, n + 1) if n % e == 0]
        moes.append(("a2a", None))
    out: list[GlobalChoice] = []
    for stream in streams:
        for reduce in (R, S_TOK):
            for moe, ep in moes:
                g = GlobalChoice(stream, reduce, moe, ep)
                try:
                    probe = make_search_plan(g, [])
                    for lg in graph.kinds.values():
                        check_divisible(lg, probe, n)
                except TpplanError:
                    continue
                out.append(g)
    return out


def _consumers(lg: LayerGraph) -> dict[str, list[Op]]:
    out: dict[str, list[Op]] = {}
    for op in lg.ops:
        for v in op.inputs:
            out.setdefault(v, []).append(op)
    return out


def _is_stream_add(op: Op) -> bool:
    return op.kind is OpKind.ADD and op.role.startswith("layer.")


def _accepts(op: Op, split: str, position: int, placement: Placement, values: dict) -> bool:  # type: ignore[type-arg]
    return any(s.inputs[position] is placement for s in strategies(op, split, values))


def _default_split(op: Op, g: GlobalChoice) -> str:
    return g.moe if op.kind is OpKind.EXPERTS else str(op.split)


@dataclass
class _Walk:
    lg: LayerGraph
    g: GlobalChoice
    n: int
    dtype_bytes: int
    leaves: list[tuple[KindConfig, LayerResult]] = field(default_factory=list)
    propagations: int = 0
    used_reduce: bool = False


def _probe_plan(g: GlobalChoice, cfg: KindConfig) -> Plan:
    return make_search_plan(g, [cfg])


def _run(w: _Walk, cfg: KindConfig) -> LayerResult:
    w.propagations += 1
    res = propagate(w.lg, _probe_plan(w.g, cfg), w.n, P, w.dtype_bytes)
    if not w.used_reduce:
        w.used_reduce = any(
            c.collective in (Collective.ALL_REDUCE, Collective.REDUCE_SCATTER) and not c.consumer.endswith("residual_add")
            for c in res.comms
        )
    return res


def enumerate_kind(
    lg: LayerGraph, g: GlobalChoice, n: int, dtype_bytes: int = 2
) -> tuple[list[tuple[KindConfig, LayerResult]], _Walk]:
    """Every legal leaf of this layer kind's decision tree under global choice `g` (entry delta P).

    Walk the ops in order; at each op look at what it receives under the decisions taken so far
    and branch on the sites it presents. A branch whose op is illegal is cut at once (later
    decisions cannot change what an earlier op receives).
    """
    w = _Walk(lg, g, n, dtype_bytes)
    consumers = _consumers(lg)
    ops = list(lg.ops)
    index = {op.name: i for i, op in enumerate(ops)}
    producer = {op.output: op for op in ops}
    kind = lg.kind

    def q(op: Op) -> str:
        return f"{kind}/{op.role}"

    def prod_q(v: str) -> str:
        p = producer.get(v)
        return q(p) if p else f"{kind}/layer.{v}"

    def step(i: int, phase: int, cfg: KindConfig, res: LayerResult) -> None:
        if i == len(ops):
            if res.legal:
                w.leaves.append((cfg, res))
            return
        op = ops[i]
        d = res.decisions[i]
        if phase == 0:  # consumer site: what this op receives
            bad = [
                (v, got)
                for v, got, need_ok in (
                    (v, got, _accepts(op, d.split, k, got, lg.values))
                    for k, (v, got) in enumerate(zip(op.inputs, d.inputs_received, strict=True))
                )
                if got in (S_TOK, S_COL) and not need_ok and not _is_stream_add(op)
            ]
            if bad and n > 1:
                opts: list[KindConfig] = []
                pairs = [(prod_q(v), q(op)) for v, _ in bad]
                opts.append(cfg.add(f"all-gather {'+'.join(v for v, _ in bad)} for {op.name}", gather_for=pairs))
                if (
                    op.kind is OpKind.LINEAR
                    and op.split in (WeightSplit.COL, WeightSplit.ROW)
                    and all(got is S_TOK for _, got in bad)
                ):
                    opts.append(cfg.add(f"replicate {op.name} (local tokens)", replicate=[q(op)]))
                for o in opts:
                    r2 = _run(w, o)
                    if r2.decisions[i].legal:
                        step(i, 1, o, r2)
                return
            if not d.legal:
                return  # cut: nothing at this op can make it legal
            step(i, 1, cfg, res)
            return
        if phase == 1:  # token-shard site: a replicated linear that sees every token
            if (
                op.kind is OpKind.LINEAR
                and op.split is WeightSplit.REPLICATED
                and d.inputs_received
                and d.inputs_received[0] is R
                and n > 1
            ):
                step(i, 2, cfg, res)
                o = cfg.add(f"{op.name} on local tokens", token_shard=[q(op)])
                r2 = _run(w, o)
                if r2.decisions[i].legal:
                    step(i, 2, o, r2)
                return
            step(i, 2, cfg, res)
            return
        # phase 2: producer site: what to do with a token-sharded output
        v = op.output
        outs = [c for c in consumers.get(v, []) if not _is_stream_add(c)]
        if res.placements.get(v) is S_TOK and outs and not _is_stream_add(op) and n > 1:
            step(i + 1, 0, cfg, res)
            o = cfg.add(f"all-gather {v}", gather=[q(op)])
            step(i + 1, 0, o, _run(w, o))
            if any(
                _accepts(c, _default_split(c, g), c.inputs.index(v), S_COL, lg.values) for c in outs
            ):
                o = cfg.add(f"all-to-all {v} to heads", a2a=[q(op)])
                step(i + 1, 0, o, _run(w, o))
            return
        step(i + 1, 0, cfg, res)

    root = KindConfig(kind)
    step(0, 0, root, _run(w, root))
    del index
    return w.leaves, w
