"""Propagate placements through one layer graph under a plan: the legality check and the source of
every collective.

Walk the ops in order. Each op receives its inputs as produced, after the conversions the plan
names (gathers, all-to-alls). It then takes the cheapest of its strategies that those inputs
satisfy through free steps (slices) or through reductions of partial sums (all-reduce or
reduce-scatter, as the plan's stream and reduce targets say). If no strategy fits, the edge is
illegal: the op is recorded with what it got, what it needs, why, and how a plan could fix it.
Propagation continues past an illegal op (its output keeps the token-sharded placement it would
really have), so every later problem is found too; those are marked as consequences.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from tpplan.errors import TpplanError
from tpplan.layout.dp_attention import embedding_placement, mixer_strategies, planned_transition, sum_len
from tpplan.layout.plan import Plan
from tpplan.layout.rules import Strategy, strategies, why_needed
from tpplan.layout.transitions import transition
from tpplan.models.graph import LayerGraph, ModelGraph, Op, WeightSplit
from tpplan.models.opkinds import op_kind, weight_split
from tpplan.placement import (
    S_COL,
    S_TOK,
    Collective,
    P,
    Placement,
    R,
)

EXTERNAL_INPUTS = ("resid", "delta", "bank")


@dataclass(frozen=True)
class CommEvent:
    """One collective issued in a layer, per token of the batch, as seen by one rank."""

    collective: Collective
    value: str
    width: int
    src: Placement
    dst: Placement
    producer: str  # op name that produced the value (or resid/delta)
    consumer: str  # first op that needed the conversion
    region: str  # "attn_side" | "mlp_side"
    reason: str
    elements_per_token: float  # sent per rank, ring algorithm, with (N-1)/N
    units: float  # relative units (relative_units)
    internal: bool = False  # inside an op (MoE dispatch/combine)

    @property
    def label(self) -> str:
        return f"{self.collective.short} {self.value}[{self.width}]"


@dataclass(frozen=True)
class Violation:
    layer_kind: str
    op: str
    role: str
    value: str
    got: Placement
    needs: Placement
    reason: str
    fixes: tuple[str, ...]
    consequence_of: str | None = None  # an earlier illegal op whose output this one reads

    def sentence(self) -> str:
        lead = (
            f"[{self.layer_kind}] {self.op} receives `{self.value}` {self.got} but needs {self.needs}: {self.reason}."
        )
        if self.consequence_of:
            return f"{lead} (follows from the illegal {self.consequence_of})"
        return lead + (" Fix: " + "; or ".join(self.fixes) + "." if self.fixes else "")


@dataclass(frozen=True)
class OpDecision:
    op: Op
    split: str  # how its weight is placed under the plan
    strategy: Strategy
    inputs_received: tuple[Placement, ...]
    compute_share: float  # fraction of the op's total work one rank does (1.0 = redundant on every rank)
    weight_elements_per_rank: int
    legal: bool


@dataclass
class LayerResult:
    kind: str
    n: int
    placements: dict[str, Placement] = field(default_factory=dict)
    decisions: list[OpDecision] = field(default_factory=list)
    comms: list[CommEvent] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)

    @property
    def legal(self) -> bool:
        return not self.violations

    @property
    def exit_delta(self) -> Placement:
        return self.placements["mlp_out"]

    def elements_per_token(self, region: str | None = None) -> float:
        return sum(c.elements_per_token for c in self.comms if region is None or c.region == region)

    def units(self, region: str | None = None) -> float:
        return sum(c.units for c in self.comms if region is None or c.region == region)


def moe_remote_fraction(experts: int, top_k: int, n: int) -> float:
    """Expected share of a token's copies that leave its rank under all-to-all dispatch.

    A token is sent once to every rank that hosts at least one of its top-k experts (DeepEP
    dedupes by rank). With E/N experts per rank and experts picked uniformly, a given rank is hit
    with probability 1 - C(E - E/N, k) / C(E, k).
    """
    if n <= 1:
        return 0.0
    per_rank = experts / n
    miss = 1.0
    for j in range(top_k):
        miss *= max(experts - per_rank - j, 0) / (experts - j)
    return 1.0 - miss


ROUTING_WEIGHT_BYTES = 4  # MoE combine weights travel as float32 (the kernels route in fp32)


def moe_weight_columns(experts_per_rank: int, act_bytes: int) -> int:
    """Extra columns, in the activation dtype, that carry a dispatched row's float32 combine weights
    for the destination's experts inside the dispatch buffer (bit-reinterpreted, so they travel
    exactly): 2 per expert in bf16/fp16, 1 in fp32, 4 in fp8."""
    if ROUTING_WEIGHT_BYTES % act_bytes:
        raise ValueError(f"float32 routing weights cannot ride in {act_bytes}-byte activation columns")
    return experts_per_rank * ROUTING_WEIGHT_BYTES // act_bytes


def weight_elements(op: Op, split: str, n: int, out_placement: Placement, plan: Plan) -> int:
    """Weight elements one of `n` ranks holds of `op` placed as `split` (routed experts: `plan`'s physical ones)."""
    numel = op.weight_numel
    if not numel:
        return 0
    if op_kind(op.kind).routed_experts:  # the EP group's physical experts (redundant copies too), 1/n of them
        experts = op.int_attr("experts")
        return -(-numel * plan.physical_experts(experts) // (experts * n))
    if split in (WeightSplit.COL, WeightSplit.ROW):
        heads = op.split_heads or n
        if heads % n == 0:
            return numel // n
        return numel // heads  # fewer heads than ranks: each rank holds one head's replica
    if split == WeightSplit.REPLICATED:
        return numel
    # Per-head parameters (conv filters, A_log, head norms) follow their activation.
    return numel // n if out_placement is S_COL and op.split_heads and op.split_heads % n == 0 else numel


def _share(op: Op, strategy: Strategy, n: int, split: str) -> float:
    if op_kind(op.kind).routed_experts:
        return 1.0 / n
    if strategy.output in (S_TOK, S_COL) or (strategy.output is P and split == WeightSplit.ROW):
        return 1.0 / n
    if strategy.output is P and any(p is S_COL for p in strategy.inputs):
        return 1.0 / n
    return 1.0  # runs on every token on every rank: redundant


def _check_copies(plan: Plan, logical: int, n: int) -> None:
    """Refuse more redundant experts than copies of every expert on every other rank of the EP group
    (logical x (EP - 1)): past that a rank holds two copies of one expert, which balances nothing."""
    group = (plan.ep_size or 1) if plan.moe == "ep" else n
    most = logical * (group - 1)
    if plan.redundant_experts > most:
        raise TpplanError(
            f"plan '{plan.name}' (tp={n})",
            f"{plan.redundant_experts} redundant experts over an EP group of {group} put more than the model's "
            f"{logical} experts on a rank (copies of one expert on one rank)",
            f"use at most {most} redundant experts (redundant_experts={most}: every rank holds every expert)",
        )


def check_divisible(lg: LayerGraph, plan: Plan, n: int) -> None:
    """Raise a clear error when a weight that the plan splits by head cannot be split over N ranks."""
    for op in lg.ops:
        qual = f"{lg.kind}/{op.role}"
        if op_kind(op.kind).routed_experts:
            _check_copies(plan, op.int_attr("experts"), n)
            experts = plan.physical_experts(op.int_attr("experts"))
            named = f"{experts} experts" if not plan.redundant_experts else f"{experts} physical experts"
            if plan.moe == "ep":
                ep = plan.ep_size or 1
                if n % ep or experts % ep or (op.split_heads % (n // ep)):
                    raise TpplanError(
                        f"plan '{plan.name}' (tp={n})",
                        f"EP size {ep} must divide the TP size {n} and the {named}, and the expert "
                        f"width {op.split_heads} must divide over the remaining {n // ep}-way split",
                        "choose an EP size that divides both"
                        + (
                            " (or redundant experts that make them divide: <plan>+redundant<r>)" if experts % ep else ""
                        ),
                    )
            elif plan.moe == "a2a" and experts % n:
                raise TpplanError(
                    f"plan '{plan.name}' (tp={n})",
                    f"{named} do not divide over {n} ranks for all-to-all expert parallelism",
                    "use a TP/EP size that divides the expert count, or redundant experts that make it divide "
                    f"(<plan>+redundant{-experts % n}, or redundant_experts={-experts % n})",
                )
            elif plan.moe == "tp" and op.split_heads % n:
                raise TpplanError(
                    f"tp={n}",
                    f"the expert intermediate width {op.split_heads} is not divisible by {n}",
                    "use a TP size that divides it, or an EP/all-to-all MoE plan",
                )
            continue
        if not op_kind(op.kind).linear or plan.replicates(qual) or not op.split_heads:
            continue
        if op.split in (WeightSplit.COL, WeightSplit.ROW) and op.split_heads % n:
            kv_like = op.name in ("k_proj", "v_proj") and n % op.split_heads == 0
            if kv_like:
                continue  # KV heads are replicated across ranks when TP exceeds them
            divisors = [d for d in range(1, op.split_heads + 1) if op.split_heads % d == 0]
            what = (
                "heads" if op.split_heads < 8192 and op.name not in ("gate_proj", "up_proj", "down_proj") else "columns"
            )
            raise TpplanError(
                f"tp={n} ({lg.kind} layer, {op.name})",
                f"{op.split_heads} {what} cannot be split evenly over {n} ranks; each rank must own whole {what}",
                f"use a TP size that divides {op.split_heads} (e.g. {', '.join(map(str, divisors[-6:]))})",
            )


def _fixes(lg: LayerGraph, op: Op, value: str, got: Placement, needs: Placement, n: int, dtype_bytes: int) -> list[str]:
    """Ways a plan could make this edge legal, with their prices."""
    width = lg.values[value].width if value in lg.values else lg.hidden
    fixes: list[str] = []
    if got is S_TOK and needs is R:
        fixes.append(f"all-gather `{value}` ({width} wide) for {op.name}: +{width} units per token")
        if op_kind(op.kind).linear and op.split is WeightSplit.COL:
            mib = op.weight_numel * dtype_bytes * (n - 1) / n / 2**20
            out_w = lg.values[op.output].width
            fixes.append(
                f"replicate {op.name} ({mib:,.1f} MiB more weight per rank) so it runs on local tokens, then "
                f"all-to-all its {out_w}-wide output to head-sharded: +{out_w / n:g} units"
            )
    elif got is S_TOK and needs is S_COL:
        fixes.append(f"all-to-all `{value}` to head-sharded: +{width / n:g} units per token")
        fixes.append(f"all-gather the hidden before the producer of `{value}` so it stays head-sharded")
    elif got is S_COL and needs is R:
        fixes.append(f"all-gather `{value}` by columns: +{width} units")
    elif got is P:
        fixes.append(f"reduce `{value}` first (all-reduce or reduce-scatter)")
    return fixes


def _misfit(received: list[Placement], opt: Strategy) -> int:
    """How far received placements are from a strategy; picks the strategy an illegal op most
    plausibly meant (gathering head-sharded columns back is the least plausible intent)."""
    score = 0
    for got, need in zip(received, opt.inputs, strict=True):
        step = transition(got, need)
        if got == need or (step is not None and step.free) or got is P:
            continue
        score += 3 if got is S_COL else 1  # undoing a head split is the least plausible intent
    return score


class LayerWalk:
    """Propagation state part-way through a layer: one `step` per op, in order.

    `propagate` walks every op; the search copies a walk at an op, changes the plan's decisions
    for the ops still ahead, and continues, so branching never re-runs the ops already walked.
    """

    def __init__(self, lg: LayerGraph, plan: Plan, n: int, delta: Placement = P, dtype_bytes: int = 2) -> None:
        self.lg = lg
        self.ops = lg.ops
        self.plan = plan
        self.n = n
        self.dtype_bytes = dtype_bytes
        self.res = LayerResult(lg.kind, n)
        self.res.placements.update({"resid": plan.stream, "delta": delta, "bank": plan.bank_placement})
        self.producer_of: dict[str, Op] = _producers(lg)
        self.names = _kind_names(lg)
        self.tainted: dict[str, str] = {}  # value -> illegal op it descends from
        self.done: dict[tuple[str, Placement], Placement] = {}  # conversions issued: (value, dst) -> dst
        self.index = 0  # the next op to walk

    def copy(self, plan: Plan | None = None) -> LayerWalk:
        """An independent walk at the same op (optionally under other decisions for the ops ahead)."""
        w = LayerWalk.__new__(LayerWalk)
        w.lg, w.ops, w.plan, w.n, w.dtype_bytes = self.lg, self.ops, plan or self.plan, self.n, self.dtype_bytes
        r = self.res
        w.res = LayerResult(r.kind, r.n, dict(r.placements), list(r.decisions), list(r.comms), list(r.violations))
        w.producer_of, w.tainted, w.done, w.index = self.producer_of, dict(self.tainted), dict(self.done), self.index
        w.names = self.names
        return w

    def qual(self, op: Op) -> str:
        return f"{self.lg.kind}/{op.role}"

    def emit(self, coll: Collective, value: str, src: Placement, dst: Placement, consumer: Op, reason: str) -> None:
        if (value, dst) in self.done:
            return
        self.done[(value, dst)] = dst
        lg, n = self.lg, self.n
        width, heads = lg.values[value].width, lg.values[value].heads
        move = planned_transition(self.plan, coll, src, dst)
        prod = self.producer_of[value].name if value in self.producer_of else value
        self.res.comms.append(
            CommEvent(
                coll,
                value,
                width,
                src,
                dst,
                prod,
                consumer.name,
                _region(lg, consumer),
                reason,
                move.elements_per_rank(width, heads, n),
                move.relative_units(width, heads, n),
            )
        )

    def _fold(self, op: Op, received: list[Placement]) -> bool:
        """A folded residual add (the plan's `fold`): a token-sharded stream input becomes a partial
        sum for free (each rank's rows, zeros elsewhere), the block output is already one, and one
        all-reduce of their sum over every row leaves the stream replicated. False (the ordinary
        rules decide) unless the inputs are exactly a token-sharded or replicated stream and a
        partial sum."""
        if not op_kind(op.kind).sums_inputs or sorted(map(str, received)) not in (
            sorted([str(S_TOK), str(P)]),
            sorted([str(R), str(P)]),
        ):
            return False
        self.emit(
            Collective.ALL_REDUCE, op.output, P, R, op,
            "all-reduce the block output over every row with the rank's stream rows folded in",
        )  # fmt: skip
        strat = Strategy((P,) * len(op.inputs), R)
        self.res.placements[op.output] = R
        parents = [self.tainted[v] for v in op.inputs if v in self.tainted]
        if parents:
            self.tainted[op.output] = parents[0]
        self.res.decisions.append(OpDecision(op, str(op.split), strat, tuple(received), 1.0, 0, True))
        return True

    def step(self) -> None:
        """Walk the next op: the conversions the plan names for its inputs, the cheapest strategy those
        placements satisfy (reducing partial sums it needs whole) or the violations where none does,
        then the MoE traffic inside the op."""
        op = self.ops[self.index]
        self.index += 1
        plan, n, res, tainted = self.plan, self.n, self.res, self.tainted
        q = self.names.op_q[op.name]
        split = weight_split(op, plan.moe, plan.replicates(q))
        received = self._receive(op, q)  # 1. conversions the plan names for these edges
        if op.reduces_into_stream and plan.folds(q) and self._fold(op, received):
            return
        # 2. the cheapest strategy the received placements satisfy
        prefer_tokens = plan.shards_tokens(q)
        rule_key = (op.name, split, prefer_tokens)
        rules = self.names.rules.get(rule_key)
        if rules is None:
            rules = self.names.rules[rule_key] = strategies(op, split, self.lg.values, prefer_tokens=prefer_tokens)
        options = mixer_strategies(op, rules, plan)
        best = self._cheapest(op, received, options, prefer_tokens)
        parents = [tainted[v] for v in op.inputs if v in tainted]
        if best is not None:
            strat, out, legal = best, best.output, True
            self._reduce_partials(op, received, strat)
            if parents:  # downstream of an illegal op, even where this op itself fits
                tainted[op.output] = parents[0]
        else:
            strat, legal = min(options, key=lambda o: _misfit(received, o)), False
            self._violations(op, received, strat, parents)
            out = S_TOK if S_TOK in received else strat.output
            tainted[op.output] = parents[0] if parents else op.name
        # 3. work inside the op: MoE dispatch and combine
        if op_kind(op.kind).routed_experts and split == "a2a" and legal and n > 1:
            self._moe_traffic(op)
        res.placements[op.output] = out
        res.decisions.append(
            OpDecision(
                op,
                str(split),
                strat,
                tuple(received),
                _share(op, strat, n, str(split)) if legal else 1.0,
                weight_elements(op, str(split), n, out, plan),
                legal,
            )
        )

    def _receive(self, op: Op, q: str) -> list[Placement]:
        """Each input's placement after the conversions the plan names for that edge (emitted)."""
        lg, plan, emit = self.lg, self.plan, self.emit
        received: list[Placement] = []
        for v in op.inputs:
            p = self.res.placements[v]
            prod_q = self.names.prod_q.get(v) or f"{lg.kind}/layer.{v}"
            if p in (S_TOK, S_COL) and (plan.gathers(prod_q) or plan.gathers_for(prod_q, q)):
                if p is S_TOK and sum_len(plan):
                    emit(Collective.ALL_REDUCE, v, p, R, op, "DP gather: every rank's rows into a zero buffer, summed")
                else:
                    emit(Collective.ALL_GATHER, v, p, R, op, "the plan all-gathers it")
                p = R
            elif p is S_TOK and plan.a2a_of(prod_q):
                emit(Collective.ALL_TO_ALL, v, p, S_COL, op, "the plan moves it to head-sharded by all-to-all")
                p = S_COL
            received.append(p)
        return received

    def _cheapest(
        self, op: Op, received: list[Placement], options: Sequence[Strategy], prefer_tokens: bool
    ) -> Strategy | None:
        """The strategy the received placements reach most cheaply (free steps 1, reductions 2; the
        first that fits where the plan prefers token sharding); None where none is reachable."""
        plan = self.plan
        is_stream_add = op.reduces_into_stream
        best: tuple[float, Strategy] | None = None
        for opt in options:
            cost = 0.0
            for got, need in zip(received, opt.inputs, strict=True):
                if got == need:
                    continue
                step = transition(got, need)
                if step is not None and step.free:
                    cost += 1
                elif got is P and (
                    need is (plan.stream if is_stream_add else plan.reduce)
                    or (opt.partial_to_need and need in (R, S_TOK))
                ):
                    cost += 2
                else:
                    cost = math.inf
                    break
            if cost < math.inf:
                if prefer_tokens:  # explicit preference: take the first that fits
                    return opt
                if best is None or cost < best[0]:
                    best = (cost, opt)
        return best[1] if best is not None else None

    def _reduce_partials(self, op: Op, received: list[Placement], strat: Strategy) -> None:
        """Emit the reduction of every partial-sum input the strategy needs whole."""
        for v, got, need in zip(op.inputs, received, strat.inputs, strict=True):
            if got is P and need is not P:
                coll = Collective.ALL_REDUCE if need is R or sum_len(self.plan) else Collective.REDUCE_SCATTER
                why = (
                    "reduce the block output into the residual stream"
                    if op.reduces_into_stream
                    else f"{op.name} needs the total over every rank's features"
                    if strat.partial_to_need
                    else f"{op.name} needs true values"
                )
                self.emit(coll, v, P, need, op, why)

    def _violations(self, op: Op, received: list[Placement], strat: Strategy, parents: list[str]) -> None:
        """One violation per input the nearest strategy cannot take as received (with its fixes)."""
        lg, n = self.lg, self.n
        for v, got, need in zip(op.inputs, received, strat.inputs, strict=True):
            step = transition(got, need)
            if got == need or (step is not None and step.free):
                continue
            self.res.violations.append(
                Violation(
                    lg.kind,
                    op.name,
                    op.role,
                    v,
                    got,
                    need,
                    why_needed(op, need, got, n),
                    tuple(_fixes(lg, op, v, got, need, n, self.dtype_bytes)),
                    consequence_of=parents[0] if parents else None,
                )
            )

    def _moe_traffic(self, op: Op) -> None:
        """The all-to-all dispatch and combine inside an all-to-all MoE op."""
        n = self.n
        width, experts = op.int_attr("width"), op.int_attr("experts")
        frac = moe_remote_fraction(experts, op.int_attr("top_k"), n)
        # The dispatch carries each row's combine weights for the destination's experts as extra columns of
        # the same buffer (one launch); the combine returns W-wide rows. A rank's experts are its physical ones
        # (redundant copies too), as the engines deal them (`tpplan.engines.redundant_experts`, DISPATCH).
        local = self.plan.physical_experts(experts) // n
        extra = moe_weight_columns(local, self.dtype_bytes)
        for name, w in (("dispatch", width + extra), ("combine", width)):
            words = f" + {local} fp32 routing weights ({extra} columns)" if w > width else ""
            self.res.comms.append(
                CommEvent(
                    Collective.ALL_TO_ALL,
                    f"{op.inputs[0]}:{name}",
                    w,
                    S_TOK,
                    S_TOK,
                    op.name,
                    op.name,
                    _region(self.lg, op),
                    f"MoE {name}: each token to the ranks of its top-{op.attrs['top_k']} experts "
                    f"({frac:.0%} of ranks hit on average){words}",
                    frac * w * (n - 1) / n,
                    frac * w,
                    internal=True,
                )
            )


def _producers(lg: LayerGraph) -> dict[str, Op]:
    cached = _PRODUCERS.get(id(lg))
    if cached is None or cached[0] is not lg:
        cached = (lg, {op.output: op for op in lg.ops})
        _PRODUCERS[id(lg)] = cached
    return cached[1]


_PRODUCERS: dict[int, tuple[LayerGraph, dict[str, Op]]] = {}


@dataclass
class _KindNames:
    """What every step of a walk over one layer kind looks up, computed once per layer graph:
    qualified names (`<kind>/<role>`, what plans match) and each op's strategies per weight split."""

    op_q: dict[str, str]  # op name -> its qualified name
    prod_q: dict[str, str]  # value -> its producer's qualified name
    rules: dict[tuple[str, str, bool], list[Strategy]] = field(default_factory=dict)  # (op, split, prefer_tokens)


_NAMES: dict[int, tuple[LayerGraph, _KindNames]] = {}


def _kind_names(lg: LayerGraph) -> _KindNames:
    cached = _NAMES.get(id(lg))
    if cached is None or cached[0] is not lg:
        op_q = {op.name: f"{lg.kind}/{op.role}" for op in lg.ops}
        cached = (lg, _KindNames(op_q, {op.output: op_q[op.name] for op in lg.ops}))
        _NAMES[id(lg)] = cached
    return cached[1]


_REGIONS: dict[int, tuple[LayerGraph, dict[str, str]]] = {}


def _region(lg: LayerGraph, op: Op) -> str:
    cached = _REGIONS.get(id(lg))
    if cached is None or cached[0] is not lg:
        cached = (lg, {o.name: lg.region_of(o) for o in lg.ops})
        _REGIONS[id(lg)] = cached
    return cached[1][op.name]


def propagate(lg: LayerGraph, plan: Plan, n: int, delta: Placement = P, dtype_bytes: int = 2) -> LayerResult:
    """Run the plan over one layer; `delta` is how the previous block's output arrives."""
    walk = LayerWalk(lg, plan, n, delta, dtype_bytes)
    for _ in lg.ops:
        walk.step()
    return walk.res


@dataclass
class ModelWalk:
    """A plan propagated over every layer of a model, each layer seeing the previous one's exit."""

    results: list[LayerResult]  # one per layer, in order
    by_entry: dict[tuple[str, str], LayerResult]  # (layer kind, entry placement) -> its result
    entries: dict[str, dict[str, int]]  # layer kind -> entry placement -> layers after the first
    exit_delta: Placement  # how the last block's output leaves (P: reduced before the final norm)


def propagate_model(graph: ModelGraph, plan: Plan, n: int, dtype_bytes: int = 2) -> ModelWalk:
    """Propagate `plan` over every layer, once per (layer kind, entry placement); the embedding's
    output is a partial sum (vocab-parallel). Raises TpplanError when a split cannot divide."""
    for lg in graph.kinds.values():
        check_divisible(lg, plan, n)
    delta = embedding_placement(plan)
    walk = ModelWalk([], {}, {}, delta)
    for i, kind in enumerate(graph.layer_kinds):
        key = (kind, str(delta))
        if key not in walk.by_entry:
            walk.by_entry[key] = propagate(graph.kinds[kind], plan, n, delta, dtype_bytes)
        res = walk.by_entry[key]
        walk.results.append(res)
        seen = walk.entries.setdefault(kind, {})
        seen[str(delta)] = seen.get(str(delta), 0) + (1 if i else 0)
        delta = res.exit_delta
    walk.exit_delta = delta
    return walk
