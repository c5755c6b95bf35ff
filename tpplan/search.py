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
A layer may hand the next one a partial sum, a replicated value, or a value already in the
stream's placement; a hand-over that would change the next layer's stream add (a token-sharded
MoE output under a replicated stream) is outside the space.

Objectives (`Objective`) price op decisions and collectives additively: `PredictObjective` (the
per-op prices of `tpplan.cost.predict`: forward time, or mean TTFT with a workload),
`VolumeObjective` (bytes per token, the audit's measure), `RooflineObjective` (a simple
independent time model). docs/design.md ("Search") has the argument for exactness; the tests
check it against brute force.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from tpplan.audit import DTYPE_BYTES, PlanAudit, audit_plan
from tpplan.errors import TpplanError
from tpplan.layout.placement import S_COL, S_TOK, Collective, P, Placement, R
from tpplan.layout.propagate import CommEvent, LayerResult, LayerWalk, OpDecision, check_divisible
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

    def op_cost(self, kind: str, d: OpDecision, n: int, g: GlobalChoice) -> Cost: ...

    def comm_cost(self, kind: str, c: CommEvent, n: int) -> Cost: ...

    def fixed(self, graph: ModelGraph, stream: Placement, final_delta: Placement, n: int) -> Cost: ...


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
    g = GlobalChoice(p.stream, p.reduce, p.moe, p.ep_size)
    for res in pa.layer_results:
        total = total + layer_cost(obj, res, g)
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
        from tpplan.layout.placement import ring_elements_per_rank

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

    def op_cost(self, kind: str, d: OpDecision, n: int, g: GlobalChoice) -> Cost:
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


def ttft_batches(workload: object) -> list[tuple[tuple[tuple[int, int], ...], float]]:
    """(batch segments, weight) pairs whose weighted sum of batch times is the mean TTFT.

    The closed-loop FCFS schedule does not depend on how long batches take (a client resubmits at
    a batch boundary), so TTFT_i is the sum of the times of the batches between its arrival and
    its last chunk, and the mean TTFT is linear in batch times with these weights. Segments are
    (new tokens, context) per request, as `tpplan.cost.predict` prices them.
    """
    from tpplan.cost.workload import simulate_ttft

    res = simulate_ttft(workload, lambda _b: 1.0)  # type: ignore[arg-type]
    done = [a + t for a, t in zip(res.arrival_s, res.ttft_s, strict=True)]
    out: dict[tuple[tuple[int, int], ...], float] = {}
    for b in res.batches:
        inside = sum(1 for a, e in zip(res.arrival_s, done, strict=True) if a <= b.start_s and b.end_s <= e)
        segs = tuple((sg.n_tokens, sg.start_pos) for sg in b.segments)
        out[segs] = out.get(segs, 0.0) + inside / len(done)
    return list(out.items())


def ttft_shapes(workload: object) -> list[tuple[int, float]]:
    """`ttft_batches` reduced to (tokens, weight) for objectives that ignore context."""
    out: dict[int, float] = {}
    for segs, w in ttft_batches(workload):
        t = sum(n for n, _ in segs)
        out[t] = out.get(t, 0.0) + w
    return sorted(out.items())


class PredictObjective:
    """Predicted time from `tpplan.cost.predict`, op by op: the same per-op and per-collective
    prices `predict_plan` sums into a layer's time, so the search's score of a plan equals
    predict's forward time (no workload) or mean TTFT (workload, closed-loop FCFS, PP 1).

    Memory is the additive part of predict's memory per rank: weights (experts at their weight
    dtype), KV cache, recurrent state, embedding and head. Activations (the peak of one chunk) are
    not additive; `search_cli` checks them on the ranked plans.
    """

    def __init__(
        self,
        graph: ModelGraph,
        topology: object,
        tp: int,
        *,
        workload: object | None = None,
        tokens: int = 8192,
        dtype: str = "bf16",
        expert_dtype: str | None = None,
    ) -> None:
        from tpplan.cost.predict import _Predictor
        from tpplan.plans.named import baseline

        self.graph, self.topology, self.tp, self.dtype, self.expert_dtype = graph, topology, tp, dtype, expert_dtype
        self.workload = workload
        self.batches = ttft_batches(workload) if workload is not None else [(((tokens, 0),), 1.0)]
        self.name = "mean TTFT" if workload is not None else f"forward time ({tokens} tokens)"
        self._base = _Predictor(graph, baseline(), topology, tp, 1, dtype, expert_dtype)  # type: ignore[arg-type]
        self._preds: dict[int | None, object] = {None: self._base}
        self._ops: dict[tuple, Cost] = {}  # type: ignore[type-arg]
        self._comms: dict[tuple[str, float], float] = {}
        self._copies: dict[tuple[object, ...], float] = {}
        from tpplan.cost.predict import _pairs

        self._pairs = [(_pairs(segs), w) for segs, w in self.batches]

    def _pred(self, g: GlobalChoice) -> object:
        key = g.ep_size if g.moe == "ep" else None
        if key not in self._preds:
            from tpplan.cost.predict import _Predictor
            from tpplan.plans.named import baseline

            plan = baseline().with_(moe="ep", ep_size=key)
            self._preds[key] = _Predictor(
                self.graph,
                plan,
                self.topology,  # type: ignore[arg-type]
                self.tp,
                1,
                self.dtype,
                self.expert_dtype,
                audit=self._base.audit,  # type: ignore[attr-defined]
            )
        return self._preds[key]

    def op_cost(self, kind: str, d: OpDecision, n: int, g: GlobalChoice) -> Cost:
        key = (kind, d.op.name, d.split, d.strategy, d.compute_share, d.weight_elements_per_rank, g.ep_size)
        hit = self._ops.get(key)
        if hit is None:
            pred = self._pred(g)
            lg = self.graph.kinds[kind]
            secs = 0.0
            for (t, pairs, ctx), w in self._pairs:
                secs += w * pred._op_time(lg, d, t, pairs, ctx).seconds  # type: ignore[attr-defined]
            wb = pred.expert_bytes if d.op.kind is OpKind.EXPERTS else pred.b  # type: ignore[attr-defined]
            hit = Cost(secs, d.weight_elements_per_rank * wb)
            self._ops[key] = hit
        return hit

    def comm_cost(self, kind: str, c: CommEvent, n: int) -> Cost:
        coll = c.collective.value
        key = (coll, c.elements_per_token)
        hit = self._comms.get(key)
        if hit is None:
            pred = self._base
            hit = 0.0
            for (t, _, _), w in self._pairs:
                nbytes = pred._nbytes(coll, c.elements_per_token, t)  # type: ignore[attr-defined]
                hit += w * pred._coll(kind, c.label, coll, c.region, nbytes).seconds  # type: ignore[attr-defined]
            self._comms[key] = hit
        return Cost(hit + self._copy_cost(kind, c), 0.0)

    def _copy_cost(self, kind: str, c: CommEvent) -> float:
        """The runtime's layout copy around `c` (predict's `pack:`/`unpack:` ops of the layer), or 0."""
        key = (kind, c.value, c.collective, c.src, c.dst, c.internal)
        hit = self._copies.get(key)
        if hit is None:
            pred, lg = self._base, self.graph.kinds[kind]
            hit = 0.0
            for (t, _, _), w in self._pairs:
                op = pred._layout_copy(lg, c, t)  # type: ignore[attr-defined]
                hit += w * op.seconds if op is not None else 0.0
            self._copies[key] = hit
        return hit

    def fixed(self, graph: ModelGraph, stream: Placement, final_delta: Placement, n: int) -> Cost:
        from tpplan.layout.placement import ring_elements_per_rank

        pred = self._base
        secs = 0.0
        coll = _final_collective(stream, final_delta)
        if coll is not None and n > 1:
            el = ring_elements_per_rank(coll, graph.hidden, n)
            for (t, _, _), w in self._pairs:
                nbytes = pred._nbytes(coll.value, el, t)  # type: ignore[attr-defined]
                secs += w * pred._coll("final", "final", coll.value, "mlp_side", nbytes).seconds  # type: ignore[attr-defined]
        spec = graph.spec
        wl = self.workload
        if wl is not None:
            seqs = [wl.prompt_len(i) + wl.output_len for i in range(wl.concurrency)]  # type: ignore[attr-defined]
        else:
            seqs = [sum(t for (t, _, _), _ in self._pairs[:1])]
        kv = sum(pred._kv_per_token(ls.attn) * sum(seqs) for ls in spec.layers)  # type: ignore[attr-defined]
        state = sum(pred._state_per_seq(ls.attn) * len(seqs) for ls in spec.layers)  # type: ignore[attr-defined]
        embed = spec.vocab * spec.hidden / n * pred.b * (1 if spec.tie_embeddings else 2)  # type: ignore[attr-defined]
        return Cost(secs, kv + state + embed)


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


@dataclass(frozen=True)
class SpaceOptions:
    """Which knobs the space offers (all by default; tests shrink it to keep brute force small)."""

    streams: tuple[Placement, ...] = (R, S_TOK)
    reduces: tuple[Placement, ...] = (R, S_TOK)
    moe_modes: tuple[str, ...] = ("tp", "ep", "a2a")
    replicate: bool = True
    a2a: bool = True
    token_shard: bool = True
    gather_for: bool = True


def _expand(
    walk: LayerWalk, cfg: KindConfig, g: GlobalChoice, opts: SpaceOptions, consumers: dict[str, list[Op]]
) -> tuple[list[tuple[KindConfig, LayerWalk]], bool]:
    """Walk the next op under every choice its sites offer; return the legal branches.

    Sites, in order: the consumer site (an input it cannot use: gather it for this op, or
    replicate a split linear so it runs on local tokens), the token-shard site (a replicated
    linear that sees every token may run on its own), the producer site (a token-sharded output:
    keep it, gather it for all consumers, or all-to-all it to heads). Gathers and all-to-alls of
    an output only change what later ops receive, so they reuse the walk that produced it.
    Also says whether the op received a partial sum (where the reduce target could matter).
    """
    lg, n = walk.lg, walk.n
    op = walk.ops[walk.index]
    kind = lg.kind

    def q(o: Op) -> str:
        return f"{kind}/{o.role}"

    def prod_q(v: str) -> str:
        p = walk.producer_of.get(v)
        return q(p) if p else f"{kind}/layer.{v}"

    def stepped(c: KindConfig) -> LayerWalk:
        w = walk.copy(make_search_plan(g, [c]) if c is not cfg else None)
        w.step()
        return w

    first = stepped(cfg)
    d = first.res.decisions[-1]
    saw_p = P in d.inputs_received and not _is_stream_add(op)
    branches: list[tuple[KindConfig, LayerWalk]] = []
    bad = [
        (v, got)
        for k, (v, got) in enumerate(zip(op.inputs, d.inputs_received, strict=True))
        if got in (S_TOK, S_COL) and not _is_stream_add(op) and not _accepts(op, d.split, k, got, lg.values)
    ]
    if bad and n > 1:
        names = "+".join(v for v, _ in bad)
        cands = []
        if opts.gather_for:
            cands.append(cfg.add(f"all-gather {names} for {op.name}", gather_for=[(prod_q(v), q(op)) for v, _ in bad]))
        if (
            opts.replicate
            and op.kind is OpKind.LINEAR
            and op.split in (WeightSplit.COL, WeightSplit.ROW)
            and all(got is S_TOK for _, got in bad)
        ):
            cands.append(cfg.add(f"replicate {op.name} (runs on local tokens)", replicate=[q(op)]))
        for c in cands:
            w = stepped(c)
            if w.res.decisions[-1].legal:
                branches.append((c, w))
    elif d.legal:
        branches.append((cfg, first))
    if (
        opts.token_shard
        and n > 1
        and op.kind is OpKind.LINEAR
        and op.split is WeightSplit.REPLICATED
        and d.inputs_received
        and d.inputs_received[0] is R
    ):
        more = []
        for c, _ in branches:
            c2 = c.add(f"{op.name} on local tokens only", token_shard=[q(op)])
            w = stepped(c2)
            if w.res.decisions[-1].legal:
                more.append((c2, w))
        branches += more
    out: list[tuple[KindConfig, LayerWalk]] = []
    v = op.output
    later = [c for c in consumers.get(v, []) if not _is_stream_add(c)]
    for c, w in branches:
        out.append((c, w))
        if w.res.placements.get(v) is not S_TOK or not later or _is_stream_add(op) or n == 1:
            continue
        c2 = c.add(f"all-gather {v}", gather=[q(op)])
        out.append((c2, w.copy(make_search_plan(g, [c2]))))
        if opts.a2a and any(_accepts(o, _default_split(o, g), o.inputs.index(v), S_COL, lg.values) for o in later):
            c3 = c.add(f"all-to-all {v} to heads", a2a=[q(op)])
            out.append((c3, w.copy(make_search_plan(g, [c3]))))
    return out, saw_p


def enumerate_kind(
    lg: LayerGraph, g: GlobalChoice, n: int, opts: SpaceOptions | None = None, dtype_bytes: int = 2
) -> list[tuple[KindConfig, LayerResult]]:
    """Every legal leaf of this layer kind's decision tree under `g` (entry: a partial sum).

    The reference enumeration (no merging): tests take the product of these over kinds as the
    brute force that the search must match.
    """
    opts = opts or SpaceOptions()
    consumers = _consumers(lg)
    leaves: list[tuple[KindConfig, LayerResult]] = []
    stack = [(KindConfig(lg.kind), LayerWalk(lg, make_search_plan(g, []), n, P, dtype_bytes))]
    while stack:
        cfg, walk = stack.pop()
        if walk.index == len(walk.ops):
            leaves.append((cfg, walk.res))
            continue
        stack.extend(reversed(_expand(walk, cfg, g, opts, consumers)[0]))
    return leaves


# ----------------------------------------------------------------------------------------------
# Per-kind optimisation: a walk over the ops that merges branches reaching the same state


@dataclass
class _Partial:
    cost: Cost
    cfg: KindConfig
    walk: LayerWalk
    sig: int = 0  # behaviour so far: two partials with equal sig produced the same layer result


def _step_sig(before: LayerWalk, after: LayerWalk) -> int:
    d = after.res.decisions[-1]
    comms = tuple((c.collective, c.value, c.dst) for c in after.res.comms[len(before.res.comms) :])
    return hash((d.op.name, d.split, d.strategy, d.inputs_received, comms))


def _cost_key(c: Cost) -> tuple[float, float]:
    return (float(f"{c.score:.12g}"), float(f"{c.memory:.12g}"))


def _dedupe(parts: list[_Partial]) -> list[_Partial]:
    """One partial per cost: branches in the same state with the same (score, memory) have
    completions of equal cost, so they rank as one plan; keep the one with the fewest decisions
    (`gather x` over three `gather x for ...` that issue the same single all-gather)."""
    best: dict[tuple[float, float], _Partial] = {}
    for p in parts:
        key = _cost_key(p.cost)
        cur = best.get(key)
        if cur is None or len(p.cfg.choices) < len(cur.cfg.choices):
            best[key] = p
    return list(best.values())


def _skyline(items: list, k: int, key: Callable[[object], Cost]) -> list:  # type: ignore[type-arg]
    """Keep the items dominated (score and memory both no better) by fewer than k others.

    Any plan using a dropped item is beaten by k distinct plans that swap it for a dominating
    one, so no top-k plan, under any memory cap, uses a dropped item.
    """
    if len(items) <= k:
        return items
    ranked = sorted(items, key=lambda it: (key(it).score, key(it).memory))
    kept: list = []  # type: ignore[type-arg]
    mems: list[float] = []  # memory of every item seen so far, sorted
    import bisect

    for it in ranked:
        m = key(it).memory
        if bisect.bisect_right(mems, m) < k:
            kept.append(it)
        bisect.insort(mems, m)
    return kept


def _step_cost(obj: Objective, kind: str, before: LayerWalk, after: LayerWalk, g: GlobalChoice) -> Cost:
    n = after.n
    total = obj.op_cost(kind, after.res.decisions[-1], n, g)
    for c in after.res.comms[len(before.res.comms) :]:
        total = total + obj.comm_cost(kind, c, n)
    return total


def _state_key(walk: LayerWalk, cfg: KindConfig, live: list[str], lg: LayerGraph) -> tuple:  # type: ignore[type-arg]
    pl = walk.res.placements
    prod = walk.producer_of
    out = []
    for v in live:
        p = prod.get(v)
        qn = f"{lg.kind}/{p.role}" if p else ""
        out.append((v, pl.get(v), qn in cfg.gather, qn in cfg.a2a))
    done = tuple(sorted((v, str(dst)) for (v, dst) in walk.done if v in live))
    return (tuple(out), done)


@dataclass
class KindFront:
    """The best configs of one layer kind under one global choice, by the placement they hand on."""

    kind: str
    by_exit: dict[Placement, list[_Partial]]
    walks: int = 0
    used_reduce: bool = False  # some branch reduced a partial sum outside the stream adds


class KindSolver:
    """Optimises one layer kind for every global choice, sharing what the choices share.

    The walk up to the MLP block does not depend on the MoE mode, so its surviving branches are
    computed once per (stream, reduce) and continued per mode. A part of the walk in which no op
    ever receives a partial sum behaves the same under either reduce target, so it is reused.
    """

    def __init__(self, lg: LayerGraph, n: int, obj: Objective, k: int, opts: SpaceOptions, dtype_bytes: int = 2):
        self.lg, self.n, self.obj, self.k, self.opts, self.dtype_bytes = lg, n, obj, k, opts, dtype_bytes
        self.consumers = _consumers(lg)
        self.last_use: dict[str, int] = {}
        for i, op in enumerate(lg.ops):
            for v in op.inputs:
                self.last_use[v] = i
        self.split = len(lg.entry) + len(lg.attn.ops) + len(lg.middle)  # first op of the MLP block
        self.prefixes: dict[tuple[Placement, Placement], tuple[dict, int, bool]] = {}  # type: ignore[type-arg]
        self.fronts: dict[tuple[Placement, Placement, str], KindFront] = {}
        self.walks = 0

    def _run(self, g: GlobalChoice, states: dict, i0: int, i1: int) -> tuple[dict, bool]:  # type: ignore[type-arg]
        lg, k, obj, ops = self.lg, self.k, self.obj, self.lg.ops
        saw_p = False
        for i in range(i0, i1):
            live = sorted(v for v, last in self.last_use.items() if last > i)
            nxt: dict[tuple, list[_Partial]] = {}  # type: ignore[type-arg]
            for bucket in states.values():
                for part in bucket:
                    branches, p_in = _expand(part.walk, part.cfg, g, self.opts, self.consumers)
                    saw_p = saw_p or p_in
                    for cfg, w in branches:
                        self.walks += 1
                        cost = part.cost + _step_cost(obj, lg.kind, part.walk, w, g)
                        key = _state_key(w, cfg, live, lg) if i < len(ops) - 1 else (w.res.placements["mlp_out"],)
                        sig = hash((part.sig, _step_sig(part.walk, w)))
                        nxt.setdefault(key, []).append(_Partial(cost, cfg, w, sig))
            states = {key: _skyline(_dedupe(b), k, lambda p: p.cost) for key, b in nxt.items()}
        return states, saw_p

    def _rebase(self, states: dict, g: GlobalChoice) -> dict:  # type: ignore[type-arg]
        return {
            key: [_Partial(p.cost, p.cfg, p.walk.copy(make_search_plan(g, [p.cfg])), p.sig) for p in bucket]
            for key, bucket in states.items()
        }

    def front(self, g: GlobalChoice) -> KindFront:
        """The k-Pareto front of this kind under `g` (EP sizes share the TP front; see `_reprice`)."""
        moe_key = ("a2a" if g.moe == "a2a" else "tp") if _has_experts(self.lg) else "-"
        fkey = (g.stream, g.reduce, moe_key)
        if fkey in self.fronts:
            return self.fronts[fkey]
        if g.reduce is not R:
            twin = self.fronts.get((g.stream, R, moe_key)) or self.front(GlobalChoice(g.stream, R, g.moe, g.ep_size))
            if not twin.used_reduce:
                self.fronts[fkey] = twin
                return twin
        base = GlobalChoice(g.stream, g.reduce, "a2a" if moe_key == "a2a" else "tp")
        pkey = (g.stream, g.reduce)
        if pkey not in self.prefixes:
            rkey = (g.stream, R)
            if g.reduce is not R and rkey in self.prefixes and not self.prefixes[rkey][2]:
                self.prefixes[pkey] = (self._rebase(self.prefixes[rkey][0], base), 0, False)
            else:
                start = LayerWalk(self.lg, make_search_plan(base, []), self.n, P, self.dtype_bytes)
                init = {(): [_Partial(ZERO, KindConfig(self.lg.kind), start)]}
                states, saw = self._run(base, init, 0, self.split)
                self.prefixes[pkey] = (states, 0, saw)
        states, _, saw_prefix = self.prefixes[pkey]
        states, saw_suffix = self._run(base, self._rebase(states, base), self.split, len(self.lg.ops))
        by_exit: dict[Placement, list[_Partial]] = {}
        for bucket in states.values():
            for part in bucket:
                by_exit.setdefault(part.walk.res.placements["mlp_out"], []).append(part)
        front = KindFront(
            self.lg.kind,
            {e: _skyline(b, self.k, lambda p: p.cost) for e, b in by_exit.items()},
            self.walks,
            saw_prefix or saw_suffix,
        )
        self.fronts[fkey] = front
        return front


def optimise_kind(
    lg: LayerGraph, g: GlobalChoice, n: int, obj: Objective, k: int, opts: SpaceOptions, dtype_bytes: int = 2
) -> KindFront:
    """The k-Pareto front of this kind's decision tree, exactly, without visiting every leaf.

    Walk the ops in order carrying all branches; after each op, branches that agree on everything
    the ops ahead can see (placements of live values, their gather/all-to-all decisions, the
    conversions already issued) have the same future, so only their k-Pareto front survives.
    """
    return KindSolver(lg, n, obj, k, opts, dtype_bytes).front(g)


# ----------------------------------------------------------------------------------------------
# Whole model: combine kinds, cap memory, rank


@dataclass
class Candidate:
    """One ranked plan: its decisions, its cost under the objective, and what the search knows."""

    plan: Plan
    cost: Cost
    glob: GlobalChoice
    configs: tuple[KindConfig, ...]

    @property
    def score(self) -> float:
        return self.cost.score

    @property
    def memory(self) -> float:
        return self.cost.memory


@dataclass
class SearchResult:
    """Ranked legal plans (best first), and what the memory cap excluded."""

    model: str
    n: int
    objective: str
    candidates: list[Candidate]
    memory_cap: float | None = None
    over_cap: list[Candidate] = field(default_factory=list)  # unconstrained top plans the cap excluded
    globals_searched: int = 0
    walks: int = 0


def _entry_fix(
    lg: LayerGraph, g: GlobalChoice, n: int, obj: Objective, delta: Placement, dtype_bytes: int
) -> Cost | None:
    """What handing a layer of this kind `delta` instead of a partial sum changes: the cost
    difference of its stream add, or None when the add's output would change (or be illegal),
    which would change the whole layer (that hand-over is outside the space)."""
    plan = make_search_plan(g, [])
    ref = LayerWalk(lg, plan, n, P, dtype_bytes)
    alt = LayerWalk(lg, plan, n, delta, dtype_bytes)
    ref.step()
    alt.step()
    op = lg.ops[0]
    if (
        not alt.res.decisions[0].legal
        or alt.res.placements[op.output] != ref.res.placements[op.output]
        or not _is_stream_add(op)
    ):
        return None

    def c(w: LayerWalk) -> Cost:
        total = obj.op_cost(lg.kind, w.res.decisions[0], n, g)
        for e in w.res.comms:
            total = total + obj.comm_cost(lg.kind, e, n)
        return total

    a, b = c(alt), c(ref)
    return Cost(a.score - b.score, a.memory - b.memory)


def _merge(a: list[tuple[Cost, tuple]], b: list[tuple[Cost, tuple]], k: int) -> list[tuple[Cost, tuple]]:  # type: ignore[type-arg]
    return _skyline([(ca + cb, ta + tb) for ca, ta in a for cb, tb in b], k, lambda it: it[0])


def search(
    graph: ModelGraph,
    n: int,
    objective: Objective,
    *,
    top: int = 10,
    memory_cap: float | None = None,
    options: SpaceOptions | None = None,
    dtype: str = "bf16",
    per_family: bool = False,
) -> SearchResult:
    """The `top` best legal plans under `objective`, memory per rank at most `memory_cap` bytes.

    Exact over the space (see the module docstring): per global choice, each kind's k-Pareto
    front, grouped by the placement its layers hand on; every chain of hand-overs that the layer
    order allows is priced; fronts are merged under the cap. Plans of equal score and memory rank
    as one. `per_family`: instead of the k best plans overall (mostly variants of the best one),
    the best plan of each family (stream x reduce x MoE mode), ranked; the first is still the
    optimum, and it needs only Pareto fronts (k = 1), so it is much faster.
    """
    if n < 1:
        raise TpplanError(f"--tp {n}", "the TP size must be at least 1", "pass --tp 1 or more")
    if top < 1:
        raise TpplanError(f"--top {top}", "must be at least 1", "ask for one plan or more")
    if dtype not in DTYPE_BYTES:
        raise TpplanError(f"--dtype {dtype}", "unknown dtype", f"choose one of {', '.join(DTYPE_BYTES)}")
    opts = options or SpaceOptions()
    nbytes = DTYPE_BYTES[dtype]
    k = 1 if per_family else top
    counts = graph.counts()
    order = graph.layer_kinds
    globs = [
        gc
        for gc in global_choices(graph, n, streams=opts.streams)
        if gc.reduce in opts.reduces and gc.moe in opts.moe_modes
    ]
    solvers = {kind: KindSolver(lg, n, objective, k, opts, nbytes) for kind, lg in graph.kinds.items()}
    pool: list[Candidate] = []
    for gc in globs:
        per_kind: dict[str, KindFront] = {}
        for kind, lg in graph.kinds.items():
            front = solvers[kind].front(gc)
            if gc.moe == "ep" and _has_experts(lg):
                base_g = GlobalChoice(gc.stream, gc.reduce, "tp")
                front = _reprice(front, lg, base_g, gc, n, objective)
            per_kind[kind] = front
        if gc.reduce is not R and all(not f.used_reduce for f in per_kind.values()):
            continue  # no op ever meets a partial sum outside the stream: the same plans as reduce=R
        found = _combine(graph, gc, per_kind, counts, order, objective, n, k, nbytes)
        found = [_settle_at_cap(c, memory_cap, graph, n, objective, dtype) for c in found]
        if per_family and found:
            found.sort(key=lambda c: (c.score, c.memory))
            fits = [c for c in found if memory_cap is None or c.memory <= memory_cap]
            found = fits[:1] + ([found[0]] if found[0] not in fits[:1] else [])
        pool += found
    pool.sort(key=lambda c: (c.score, c.memory, sum(len(x.choices) for x in c.configs)))
    seen: set[tuple[float, float]] = set()
    unique = []
    for c in pool:  # plans of equal score and memory rank as one (the one with fewest decisions)
        key = _cost_key(c.cost)
        if key not in seen:
            seen.add(key)
            unique.append(c)
    pool = unique
    feasible = [c for c in pool if memory_cap is None or c.memory <= memory_cap]
    limit = top if not per_family else len(pool)
    over = [c for c in pool[:limit] if memory_cap is not None and c.memory > memory_cap]
    return SearchResult(
        graph.spec.name,
        n,
        objective.name,
        feasible[:top],
        memory_cap,
        over,
        len(globs),
        sum(sv.walks for sv in solvers.values()),
    )


def _settle_at_cap(c: Candidate, cap: float | None, graph: ModelGraph, n: int, obj: Objective, dtype: str) -> Candidate:
    """A candidate whose memory is within rounding of the cap, priced as a whole plan.

    The search sums memory per kind times layer count (EP fronts shifted), in another order than
    the whole-plan sum (`plan_cost` of the audited plan, what brute force ranks by), so they differ
    in the last bits; at the cap those bits decide whether a plan fits. A plan exactly at the cap
    was dropped this way (found by hypothesis). Near the cap the whole plan's audited cost decides.
    """
    if cap is None or abs(c.memory - cap) > 1e-9 * max(1.0, abs(cap)):
        return c
    return replace(c, cost=plan_cost(obj, graph, audit_plan(graph, c.plan, n, dtype)))


def _reprice(
    front: KindFront, lg: LayerGraph, base: GlobalChoice, g: GlobalChoice, n: int, obj: Objective
) -> KindFront:
    """EP without all-to-all places experts like TP as far as placements go (every rank sees every
    token, outputs partial sums); only the experts op's price changes, by the same amount in
    every config, so the TP front shifted by that amount is the EP front."""
    out: dict[Placement, list[_Partial]] = {}
    for e, parts in front.by_exit.items():
        new = []
        for p in parts:
            d = next(x for x in p.walk.res.decisions if x.op.kind is OpKind.EXPERTS)
            shift = obj.op_cost(lg.kind, replace(d, split=g.moe), n, g)
            back = obj.op_cost(lg.kind, d, n, base)
            new.append(_Partial(p.cost + Cost(shift.score - back.score, shift.memory - back.memory), p.cfg, p.walk))
        out[e] = new
    return KindFront(front.kind, out, 0, front.used_reduce)


def _combine(
    graph: ModelGraph,
    g: GlobalChoice,
    per_kind: dict[str, KindFront],
    counts: dict[str, int],
    order: tuple[str, ...],
    obj: Objective,
    n: int,
    k: int,
    nbytes: int,
) -> list[Candidate]:
    kinds = list(per_kind)
    fix_cache: dict[tuple[str, Placement], Cost | None] = {}
    out: list[Candidate] = []
    for exits in itertools.product(*(list(per_kind[kd].by_exit) for kd in kinds)):
        exit_of = dict(zip(kinds, exits, strict=True))
        const = ZERO
        ok = True
        for i in range(1, len(order)):
            d = exit_of[order[i - 1]]
            if d is P:
                continue
            key = (order[i], d)
            if key not in fix_cache:
                fix_cache[key] = _entry_fix(graph.kinds[order[i]], g, n, obj, d, nbytes)
            fix = fix_cache[key]
            if fix is None:
                ok = False
                break
            const = const + fix
        if not ok:
            continue
        const = const + obj.fixed(graph, g.stream, exit_of[order[-1]] if order else P, n)
        merged: list[tuple[Cost, tuple]] = [(const, ())]  # type: ignore[type-arg]
        for kd in kinds:
            items = [(p.cost * counts[kd], (p,)) for p in per_kind[kd].by_exit[exit_of[kd]]]
            merged = _merge(merged, items, k)
        for cost, parts in merged:
            cfgs = tuple(p.cfg for p in parts)
            plan = make_search_plan(g, cfgs)
            out.append(Candidate(plan, cost, g, cfgs))
    return out


# ----------------------------------------------------------------------------------------------
# Naming, named-plan matching, and the report the CLI prints (JSON: docs/search-json.md)

JSON_SCHEMA_VERSION = 1


def _short_choice(choice: str) -> tuple[str, str]:
    """('ag', 'kv_latent'), ('rep', 'q_b_proj'), ('a2a', 'q'), ('tok', 'qkv_a') from a choice in words."""
    if choice.startswith("replicate "):
        return "rep", choice.split()[1]
    if choice.startswith("all-to-all "):
        return "a2a", choice.split()[1]
    if choice.startswith("all-gather "):
        words = choice.split()
        return "ag", words[1] + (f"→{words[3]}" if len(words) > 3 else "")
    return "tok", choice.split()[0]


def describe(g: GlobalChoice, configs: Sequence[KindConfig]) -> tuple[str, str, str]:
    """(name, one-line decisions, summary in words) for a searched plan."""
    stream = "scattered" if g.stream is S_TOK else "replicated"
    groups: dict[str, list[str]] = {"ag": [], "rep": [], "a2a": [], "tok": []}
    for cfg in configs:
        for ch in cfg.choices:
            verb, what = _short_choice(ch)
            if what not in groups[verb]:
                groups[verb].append(what)
    parts = [stream] + (["rs"] if g.reduce is S_TOK else [])
    parts += [f"{v}{len(groups[v])}" for v in ("ag", "rep", "a2a", "tok") if groups[v]]
    parts.append(f"moe={g.moe_label()}")  # not "moe-a2a": that is an alias of the plan sp-moe
    digest = hashlib.sha1(repr(sorted((c.kind, c.choices) for c in configs)).encode()).hexdigest()[:4]
    name = "+".join(parts) + f"#{digest}"
    labels = {"ag": "AG", "rep": "replicate", "a2a": "A2A", "tok": "token-shard"}
    short = "; ".join(f"{labels[v]} {', '.join(groups[v])}" for v in ("ag", "rep", "a2a", "tok") if groups[v])
    moe_words = {"tp": "MoE experts tensor-parallel", "a2a": "MoE all-to-all dispatch/combine"}.get(
        g.moe, f"MoE expert-parallel EP{g.ep_size} without all-to-all"
    )
    head = (
        "Residual stream token-sharded (block outputs reduce-scattered)"
        if g.stream is S_TOK
        else "Residual stream replicated (block outputs all-reduced)"
    )
    if g.reduce is S_TOK:
        head += "; other partial sums reduce-scattered"
    per_kind = [f"{c.kind}: " + ", ".join(c.choices) for c in configs if c.choices]
    summary = f"{head}; {moe_words}." + (" " + ". ".join(per_kind) + "." if per_kind else "")
    return name, (short or "no scattering decisions") + f" | {moe_words}", summary


def behaviour(pa: PlanAudit) -> tuple:  # type: ignore[type-arg]
    """What a plan does, layer by layer (decisions and collectives): equal for equivalent plans."""
    p = pa.plan
    layers = tuple(
        (
            tuple((d.op.name, d.split, d.strategy.output) for d in r.decisions),
            tuple((c.collective, c.value, c.dst) for c in r.comms),
        )
        for r in pa.layer_results
    )
    return (p.moe, p.ep_size if p.moe == "ep" else None, layers)


def _named_behaviours(graph: ModelGraph, n: int, dtype: str) -> dict[tuple, str]:  # type: ignore[type-arg]
    from tpplan.plans.named import EXTRA_PLANS, NAMED_PLANS, make_plan

    out: dict[tuple, str] = {}  # type: ignore[type-arg]
    for name in dict.fromkeys(NAMED_PLANS + EXTRA_PLANS):
        try:
            pa = audit_plan(graph, make_plan(name, graph, n), n, dtype)
        except TpplanError:
            continue
        if pa.legal:
            out.setdefault(behaviour(pa), name)
    return out


def _pct(value: float, base: float) -> float | None:
    return None if not base else round(100.0 * (value - base) / base, 2)


def search_report(
    model: str,
    topology: str | None,
    *,
    tp: int | None = None,
    nodes: int | None = None,
    workload: str | None = None,
    memory_cap_gib: float | None = None,
    top: int = 10,
    tokens: int = 8192,
    dtype: str = "bf16",
    expert_dtype: str | None = None,
    objective: str = "time",
    all_plans: bool = False,
) -> dict[str, object]:
    """Search, then re-audit and predict each ranked plan (legality, bytes, full memory with
    activations, TTFT percentiles); the dict is the JSON documented in docs/search-json.md."""
    import time as _time

    from tpplan.models.config import load_model
    from tpplan.models.graph import build_model_graph
    from tpplan.plans.named import baseline as baseline_plan

    t0 = _time.perf_counter()
    if objective not in ("time", "volume"):
        raise TpplanError(f"--objective {objective}", "unknown objective", "choose time or volume")
    if top < 1:
        raise TpplanError(f"--top {top}", "must be at least 1", "ask for one plan or more")
    if memory_cap_gib is not None and memory_cap_gib <= 0:
        raise TpplanError(f"--memory-cap {memory_cap_gib}", "must be positive", "give GiB per rank, e.g. 140")
    if tokens < 1:
        raise TpplanError(f"--tokens {tokens}", "must be positive", "give the batch size in tokens, e.g. 8192")
    graph = build_model_graph(load_model(model))
    topo = wl = None
    if topology is not None:
        from tpplan.cost.topology import load_topology

        topo = load_topology(topology, nodes)
    elif objective == "time" or workload:
        raise TpplanError("--topology", "predicted time needs a topology", "add --topology (e.g. h200x8-ib400)")
    if workload is not None:
        from tpplan.cost.workload import load_workload

        wl = load_workload(workload)
    n = tp if tp is not None else (topo.world_size if topo is not None else 0)
    if n < 1:
        raise TpplanError(f"--tp {n}", "the TP size must be at least 1", "pass --tp 1 or more")
    if topo is not None and n > topo.world_size:
        raise TpplanError(
            f"--tp {n}",
            f"topology {topo.name} has only {topo.world_size} GPUs ({topo.nodes} x {topo.gpus_per_node})",
            "use a smaller --tp or more --nodes",
        )
    if topo is not None and n > topo.gpus_per_node and n % topo.gpus_per_node:
        raise TpplanError(
            f"--tp {n}",
            f"a TP group larger than a node must fill whole nodes of {topo.gpus_per_node} GPUs",
            f"use a multiple of {topo.gpus_per_node}",
        )
    obj: Objective
    if objective == "time":
        obj = PredictObjective(graph, topo, n, workload=wl, tokens=tokens, dtype=dtype, expert_dtype=expert_dtype)
    else:
        obj = VolumeObjective(dtype)
    # baseline first: it validates that the model splits over n ranks at all (clear error otherwise)
    base_pa = audit_plan(graph, baseline_plan(), n, dtype)
    cap = memory_cap_gib * 2**30 if memory_cap_gib is not None else None
    t_search = _time.perf_counter() - t0
    named = _named_behaviours(graph, n, dtype)

    def evaluate(plan: Plan, pa: PlanAudit, cost: Cost, rank: int | None, g: GlobalChoice | None = None) -> dict:  # type: ignore[type-arg]
        entry: dict[str, object] = {
            "rank": rank,
            "name": plan.name,
            "title": plan.title,
            "summary": plan.summary,
            "found_by": plan.found_by,
            "same_as_named": named.get(behaviour(pa)),
            "legal": pa.legal,
            "decisions": plan.describe(),
            "score": cost.score,
            "comm_bytes_per_token_per_rank": pa.comm_bytes_per_token,
            "weight_bytes_per_rank": pa.weight_bytes_per_rank,
            "replicated_extra_bytes_per_rank": pa.replicated_extra_bytes,
            "search_memory_bytes_per_rank": cost.memory,
        }
        if topo is not None:
            from tpplan.cost.predict import predict_plan

            pr = predict_plan(
                graph, plan, topo, tp=n, workload=wl, tokens=tokens, dtype=dtype, expert_dtype=expert_dtype, audit=pa
            )
            m = pr.memory
            entry["forward_s"] = pr.forward_s
            entry["ttft"] = (
                {"mean_s": pr.ttft.mean_s, "p50_s": pr.ttft.p50_s, "max_s": pr.ttft.max_s} if pr.ttft else None
            )
            entry["memory_bytes_per_rank"] = {
                "weights": m.weights,
                "replicated_extra": m.replicated_extra,
                "activations": m.activations,
                "kv_cache": m.kv_cache,
                "recurrent_state": m.recurrent_state,
                "total": m.total,
            }
        return entry

    base_cost = plan_cost(obj, graph, base_pa)
    base_entry = evaluate(base_pa.plan, base_pa, base_cost, None)
    # Activations (one chunk's peak) are not additive: the search caps the rest. A ranked plan that
    # its own activations push over the cap is excluded; if that happens, the search runs once more
    # with the largest such activations reserved, and the plans that fit from both runs are ranked.
    reserve = 0.0
    kept: dict[str, tuple[float, dict[str, object]]] = {}
    excluded_by: dict[str, dict[str, object]] = {}
    for attempt in range(2):
        t1 = _time.perf_counter()
        res = search(
            graph,
            n,
            obj,
            top=top,
            memory_cap=None if cap is None else cap - reserve,
            dtype=dtype,
            per_family=not all_plans,
        )
        t_search += _time.perf_counter() - t1
        worst_act = 0.0
        fitted = 0
        for c in res.over_cap:
            name, _, _ = describe(c.glob, c.configs)
            excluded_by.setdefault(name, {"name": name, "search_memory_bytes_per_rank": c.memory, "score": c.score})
        for c in res.candidates:
            if fitted >= top:
                break
            name, short, summary = describe(c.glob, c.configs)
            plan = c.plan.with_(name=name, title=short, summary=summary)
            pa = audit_plan(graph, plan, n, dtype)
            if not pa.legal:  # cannot happen: the search walks the audit's own propagation
                raise AssertionError(f"search returned an illegal plan {name}: {[v.sentence() for v in pa.violations]}")
            same = named.get(behaviour(pa))
            if same:  # the search rediscovered a named plan: show it under its name
                plan = plan.with_(name=same, found_by="named")
            entry = evaluate(plan, pa, c.cost, None, c.glob)
            mem = entry.get("memory_bytes_per_rank") if topo is not None else None
            if cap is not None and mem is not None and mem["total"] > cap:  # type: ignore[index]
                worst_act = max(worst_act, float(mem["activations"]))  # type: ignore[index]
                excluded_by[name] = {
                    "name": name,
                    "memory_bytes_per_rank": mem["total"],  # type: ignore[index]
                    "score": c.score,
                    "why": "activations",
                }
                continue
            fitted += 1
            entry["delta_vs_baseline_pct"] = _pct(c.score, base_cost.score)
            entry["comm_delta_vs_baseline_pct"] = _pct(pa.comm_bytes_per_token, base_pa.comm_bytes_per_token)
            kept.setdefault(str(entry["name"]), (c.score, entry))
        if worst_act <= reserve or attempt:
            break
        reserve = worst_act
    plans: list[dict[str, object]] = []
    for _, entry in sorted(kept.values(), key=lambda se: se[0])[:top]:
        entry["rank"] = len(plans) + 1
        plans.append(entry)
    excluded = list(excluded_by.values())
    return {
        "schema_version": JSON_SCHEMA_VERSION,
        "model": graph.spec.name,
        "tp": n,
        "dtype": dtype,
        "expert_dtype": expert_dtype,
        "topology": topo.name if topo is not None else None,
        "nodes": topo.nodes if topo is not None else None,
        "workload": wl.name if wl is not None else None,
        "objective": obj.name,
        "score_unit": "s" if objective == "time" else "bytes per token per rank",
        "mode": "all" if all_plans else "per-family",
        "memory_cap_bytes": cap,
        "gpu_memory_bytes": topo.gpu.memory_GiB * 2**30 if topo is not None else None,
        "baseline": base_entry,
        "plans": plans,
        "excluded_over_cap": {
            "count": len(excluded),
            "reason": (
                f"memory per rank above the cap of {memory_cap_gib:g} GiB"
                " (weights incl. replication, KV cache, recurrent state, embedding/head, and the activations"
                f" of one chunk; {reserve / 2**30:.2f} GiB reserved for them in the search)"
                if cap is not None
                else None
            ),
            "plans": excluded,
        },
        "search": {
            "families": res.globals_searched,
            "walk_steps": res.walks,
            "seconds": round(t_search, 3),
        },
    }
