"""The whole model: combine the layer kinds' fronts, cap memory, rank.

A layer's cost depends on the layer before only through the placement it hands on, so per global
choice every kind's front is grouped by that hand-over; for each assignment of hand-overs to kinds
the chain over the real layer order fixes a constant correction (`_entry_fix`) and the final
reduction, and the fronts, scaled by layer counts, are merged with k-Pareto pruning under the cap.
docs/design.md ("Search") has the argument for exactness; tests/test_search.py checks it against
brute force.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from functools import cached_property

from tpplan.audit import Audits
from tpplan.dtypes import DTYPE_BYTES
from tpplan.errors import TpplanError
from tpplan.layout.plan import Plan
from tpplan.layout.propagate import LayerWalk, weight_elements
from tpplan.mesh import Mesh
from tpplan.models.graph import LayerGraph, ModelGraph
from tpplan.placement import P, Placement, R
from tpplan.search.fronts import cost_key, merge
from tpplan.search.objectives import Cost, Objective, memory_layer_counts, plan_cost
from tpplan.search.space import (
    GlobalChoice,
    KindConfig,
    SpaceOptions,
    _has_experts,
    _is_stream_add,
    global_choices,
    make_search_plan,
)
from tpplan.search.walk import KindFront, KindSolver, _Partial


@dataclass
class Candidate:
    """One ranked plan: its decisions, its cost under the objective, and what the search knows."""

    cost: Cost
    glob: GlobalChoice
    configs: tuple[KindConfig, ...]

    @cached_property
    def plan(self) -> Plan:
        """The plan these decisions stand for (made only for the candidates that are looked at)."""
        return make_search_plan(self.glob, self.configs)

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
    audits: Audits | None = None,
) -> SearchResult:
    """The `top` best legal plans under `objective`, memory per rank at most `memory_cap` bytes.

    Exact over the space (see the module docstring): per global choice, each kind's k-Pareto
    front, grouped by the placement its layers hand on; every chain of hand-overs that the layer
    order allows is priced; fronts are merged under the cap. Plans of equal score and memory rank
    as one. `per_family`: instead of the k best plans overall (mostly variants of the best one),
    the best plan of each family (stream x reduce x MoE mode), ranked; the first is still the
    optimum, and it needs only Pareto fronts (k = 1), so it is much faster. `audits` (of `graph`)
    are used and kept for the plans audited whole.
    """
    _check_arguments(n, top, dtype)
    kept = audits if audits is not None else Audits(graph)
    opts = options or SpaceOptions()
    nbytes = DTYPE_BYTES[dtype]
    k = 1 if per_family else top
    counts = graph.counts()
    mem_counts = memory_layer_counts(objective) or counts
    order = graph.layer_kinds
    globs = [
        gc
        for gc in global_choices(graph, n, streams=opts.streams, redundant_experts=opts.redundant_experts)
        if gc.reduce in opts.reduces and gc.moe in opts.moe_modes
    ]
    solvers = {kind: KindSolver(lg, n, objective, k, opts, nbytes) for kind, lg in graph.kinds.items()}
    pool: list[Candidate] = []
    for gc in globs:
        per_kind = _fronts(graph, solvers, gc, n, objective)
        if gc.reduce is not R and all(not f.used_reduce for f in per_kind.values()):
            continue  # no op ever meets a partial sum outside the stream: the same plans as reduce=R
        found = _combine(graph, gc, per_kind, (counts, mem_counts), order, objective, n, k, nbytes)
        found = [_settle_at_cap(c, memory_cap, kept, n, objective, dtype) for c in found]
        if per_family and found:
            found = _family_best(found, memory_cap)
        pool += found
    pool = _ranked_once(pool)
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


def _fronts(
    graph: ModelGraph, solvers: dict[str, KindSolver], gc: GlobalChoice, n: int, objective: Objective
) -> dict[str, KindFront]:
    """Each layer kind's front under the global choice `gc` (EP fronts re-priced from TP MoE's)."""
    per_kind: dict[str, KindFront] = {}
    for kind, lg in graph.kinds.items():
        front = solvers[kind].front(gc)
        if gc.moe == "ep" and _has_experts(lg):
            base_g = GlobalChoice(gc.stream, gc.reduce, "tp")
            front = _reprice(front, lg, base_g, gc, n, objective)
        per_kind[kind] = front
    return per_kind


def _family_best(found: list[Candidate], memory_cap: float | None) -> list[Candidate]:
    """A family's best plan within the cap, and its best overall where that one is over the cap."""
    found = sorted(found, key=lambda c: (c.score, c.memory))
    fits = [c for c in found if memory_cap is None or c.memory <= memory_cap]
    return fits[:1] + ([found[0]] if found[0] not in fits[:1] else [])


def _check_arguments(n: int, top: int, dtype: str) -> None:
    """The search's own arguments, each error naming its field."""
    if n < 1:
        raise TpplanError(f"tp={n}", "the TP size must be at least 1", "use tp=1 or more")
    if top < 1:
        raise TpplanError(f"top={top}", "must be at least 1", "ask for one plan or more")
    if dtype not in DTYPE_BYTES:
        raise TpplanError(f"dtype={dtype}", "unknown dtype", f"choose one of {', '.join(DTYPE_BYTES)}")


def _ranked_once(pool: list[Candidate]) -> list[Candidate]:
    """`pool` by score, then memory, then fewest decisions; plans of equal score and memory rank as
    one (the one with fewest decisions)."""
    pool = sorted(pool, key=lambda c: (c.score, c.memory, sum(len(x.choices) for x in c.configs)))
    seen: set[tuple[float, float]] = set()
    unique = []
    for c in pool:
        key = cost_key(c.cost)
        if key not in seen:
            seen.add(key)
            unique.append(c)
    return unique


def _settle_at_cap(c: Candidate, cap: float | None, audits: Audits, n: int, obj: Objective, dtype: str) -> Candidate:
    """A candidate whose memory is within rounding of the cap, priced as a whole plan.

    The search sums memory per kind times layer count (EP fronts shifted), in another order than
    the whole-plan sum (`plan_cost` of the audited plan, what brute force ranks by), so they differ
    in the last bits; at the cap those bits decide whether a plan fits. A plan exactly at the cap
    was dropped this way (found by hypothesis). Near the cap the whole plan's audited cost decides.
    """
    if cap is None or abs(c.memory - cap) > 1e-9 * max(1.0, abs(cap)):
        return c
    return replace(c, cost=plan_cost(obj, audits.graph, audits.of(c.plan, Mesh(n), dtype)))


def _reprice(
    front: KindFront, lg: LayerGraph, base: GlobalChoice, g: GlobalChoice, n: int, obj: Objective
) -> KindFront:
    """EP without all-to-all places experts like TP as far as placements go (every rank sees every
    token, outputs partial sums); only the experts op's price changes, by the same amount in
    every config, so the TP front shifted by that amount is the EP front (its weight: `g`'s physical experts,
    redundant copies included)."""
    out: dict[Placement, list[_Partial]] = {}
    plan = make_search_plan(g, [])
    for e, parts in front.by_exit.items():
        new = []
        for p in parts:
            d = p.experts
            assert d is not None  # a kind with experts: every branch walked its experts op
            held = weight_elements(d.op, g.moe, n, d.strategy.output, plan)
            shift = obj.op_cost(lg.kind, replace(d, split=g.moe, weight_elements_per_rank=held), n, g)
            back = obj.op_cost(lg.kind, d, n, base)
            delta = Cost(shift.score - back.score, shift.memory - back.memory)
            new.append(_Partial(p.cost + delta, p.cfg, p.walk, d))
        out[e] = new
    return KindFront(front.kind, out, 0, front.used_reduce)


def _combine(
    graph: ModelGraph,
    g: GlobalChoice,
    per_kind: dict[str, KindFront],
    counts: tuple[dict[str, int], dict[str, int]],
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
        score = memory = 0.0  # the corrections summed layer by layer (as `Cost` sums would, in floats)
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
            score, memory = score + fix.score, memory + fix.memory
        if not ok:
            continue
        const = Cost(score, memory) + obj.fixed(graph, g.stream, exit_of[order[-1]] if order else P, n)
        merged: list[tuple[Cost, tuple[_Partial, ...]]] = [(const, ())]
        for kd in kinds:
            cs, cm = counts[0][kd], counts[1][kd]  # layers the score counts, layers the memory counts
            items: list[tuple[Cost, tuple[_Partial, ...]]] = [
                (Cost(p.cost.score * cs, p.cost.memory * cm), (p,)) for p in per_kind[kd].by_exit[exit_of[kd]]
            ]
            merged = merge(merged, items, k)
        for cost, parts in merged:
            out.append(Candidate(cost, g, tuple(p.cfg for p in parts)))
    return out
