"""Optimising one layer kind: a walk over its ops that merges branches reaching the same state.

Per global choice, a kind's ops are walked in order carrying every branch of its decision tree
(`tpplan.search.space`); illegal branches are cut at the op that breaks. After each op, branches
that agree on everything the ops ahead can see have identical futures, so only their k-Pareto front
of (score, memory) survives. What is left is grouped by the placement the layer hands the next one
(`KindFront`), which is all the combination across kinds needs (`tpplan.search.combine`). The
branches in one state are expanded once, and each expansion is replayed from `tpplan.search.replay`
after its first walk.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from operator import itemgetter

from tpplan.layout.propagate import LayerWalk, OpDecision
from tpplan.models.graph import LayerGraph
from tpplan.models.opkinds import op_kind
from tpplan.placement import P, Placement, R
from tpplan.search.fronts import cost_key, skyline
from tpplan.search.objectives import ZERO, Cost, Objective
from tpplan.search.replay import StepMemo
from tpplan.search.space import (
    GlobalChoice,
    KindConfig,
    KindIndex,
    SpaceOptions,
    StepDelta,
    _has_experts,
    make_search_plan,
)


@dataclass
class _Partial:
    """A branch of the walk: its cost and config so far, the decision its experts op took (None
    before it, or in a kind without one), and a walk in its state: its own, or that of the first
    branch that reached the same state, whose future is the same (never stepped in place)."""

    cost: Cost
    cfg: KindConfig
    walk: LayerWalk
    experts: OpDecision | None = None


StateKey = tuple[object, ...]
States = dict[StateKey, list[_Partial]]


def _dedupe(parts: list[_Partial]) -> list[_Partial]:
    """One partial per cost: branches in the same state with the same (score, memory) have
    completions of equal cost, so they rank as one plan; keep the one with the fewest decisions
    (`gather x` over three `gather x for ...` that issue the same single all-gather)."""
    if len(parts) == 1:
        return parts
    best: dict[tuple[float, float], _Partial] = {}
    for p in parts:
        key = cost_key(p.cost)
        cur = best.get(key)
        if cur is None or len(p.cfg.choices) < len(cur.cfg.choices):
            best[key] = p
    return list(best.values())


def _step_cost(obj: Objective, kind: str, step: StepDelta, n: int, g: GlobalChoice) -> Cost:
    """The objective's price of one step: its op decision, then the collectives it issued."""
    total = obj.op_cost(kind, step.decision, n, g)
    for c in step.comms:
        total = total + obj.comm_cost(kind, c, n)
    return total


@dataclass(frozen=True)
class _Live:
    """The values still read after one op: those already placed (`placed` reads their placements
    in one call), their producers' qualified names, and all of them by name."""

    placed: Callable[[dict[str, Placement]], object]
    producers: frozenset[str]
    names: frozenset[str]


def _state_key(walk: LayerWalk, cfg: KindConfig, live: _Live) -> StateKey:
    """What the ops ahead can see: each live value's placement and whether its producer is gathered
    or all-to-all'd, and the conversions issued. (A live value not yet produced has no placement
    and no decision of its producer yet, the same in every branch, so it is left out.)"""
    done = frozenset(key for key in walk.done if key[0] in live.names) if walk.done else frozenset()
    return (live.placed(walk.res.placements), cfg.gather & live.producers, cfg.a2a & live.producers, done)


def _live_after(lg: LayerGraph, index: KindIndex, last_use: dict[str, int], i: int) -> _Live:
    live = sorted(v for v, last in last_use.items() if last > i)
    produced = {op.output for op in lg.ops[: i + 1]}
    placed = [v for v in live if v in produced or v not in index.producer_q]  # walked, or a layer input
    getter: Callable[[dict[str, Placement]], object] = itemgetter(*placed) if placed else (lambda _pl: ())
    producers = frozenset(index.producer_q[v] for v in placed if v in index.producer_q)
    return _Live(getter, producers, frozenset(live))


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
    Each op is stepped once per distinct situation under each global choice and replayed after
    that (`StepMemo`), with its price.
    """

    def __init__(self, lg: LayerGraph, n: int, obj: Objective, k: int, opts: SpaceOptions, dtype_bytes: int = 2):
        self.lg, self.n, self.obj, self.k, self.opts, self.dtype_bytes = lg, n, obj, k, opts, dtype_bytes
        self.index = KindIndex(lg)
        self.last_use: dict[str, int] = {}
        for i, op in enumerate(lg.ops):
            for v in op.inputs:
                self.last_use[v] = i
        # values still read after op i (for `_state_key`)
        self.live = [_live_after(lg, self.index, self.last_use, i) for i in range(len(lg.ops))]
        self.split = len(lg.entry) + len(lg.attn.ops) + len(lg.middle)  # first op of the MLP block
        self.prefixes: dict[tuple[Placement, Placement], tuple[States, int, bool]] = {}
        self.fronts: dict[tuple[Placement, Placement, str], KindFront] = {}
        self.memo = StepMemo(self.index, opts)
        self.walks = 0

    def _run(self, g: GlobalChoice, states: States, i0: int, i1: int) -> tuple[States, bool]:
        lg, k, obj, ops, n, memo = self.lg, self.k, self.obj, self.lg.ops, self.n, self.memo
        saw_p = False
        for i in range(i0, i1):
            live = self.live[i]
            last = i == len(ops) - 1  # after the last op only the hand-over matters
            nxt: States = {}
            for bucket in states.values():
                # every branch in one state has the same future: its first branch is expanded, and
                # the others take the same moves into the same states with their own costs and configs
                first = bucket[0]
                branches, p_in, moves = memo.expand(first.walk, first.cfg, g)
                saw_p = saw_p or p_in
                steps = []
                for cfg, w, step in branches:
                    assert step is not None  # the memo gives every branch its step
                    price = step.costs.get(g)
                    if price is None:
                        price = step.costs[g] = _step_cost(obj, lg.kind, step, n, g)
                    key = (w.res.placements["mlp_out"],) if last else _state_key(w, cfg, live)
                    experts = step.decision if op_kind(step.decision.op.kind).routed_experts else None
                    steps.append((nxt.setdefault(key, []), cfg, w, price, experts))
                for part in bucket:
                    for (into, cfg, w, price, experts), (choices, sets, _) in zip(steps, moves, strict=True):
                        own = cfg if part is first else part.cfg.extended(choices, sets)
                        took = experts if experts is not None else part.experts
                        into.append(_Partial(part.cost + price, own, w, took))
                self.walks += len(bucket) * len(steps)
            states = {key: skyline(_dedupe(b), k, lambda p: p.cost) for key, b in nxt.items()}
        return states, saw_p

    def front(self, g: GlobalChoice) -> KindFront:
        """The k-Pareto front of this kind under `g` (EP sizes share the TP front; see `_reprice`)."""
        a2a = g.moe == "a2a"  # its own walk, at its redundant experts (their weights); EP shifts TP's front
        moe_key = (g.moe_label() if a2a else "tp") if _has_experts(self.lg) else "-"
        fkey = (g.stream, g.reduce, moe_key)
        if fkey in self.fronts:
            return self.fronts[fkey]
        if g.reduce is not R:
            twin = self.fronts.get((g.stream, R, moe_key)) or self.front(replace(g, reduce=R))
            if not twin.used_reduce:
                self.fronts[fkey] = twin
                return twin
        base = (
            GlobalChoice(g.stream, g.reduce, "a2a", None, g.redundant_experts)
            if a2a
            else GlobalChoice(g.stream, g.reduce)
        )
        pkey = (g.stream, g.reduce)
        if pkey not in self.prefixes:
            rkey = (g.stream, R)
            if g.reduce is not R and rkey in self.prefixes and not self.prefixes[rkey][2]:
                # no op met a partial sum: the same branches (a walk's own plan is never read again)
                self.prefixes[pkey] = (self.prefixes[rkey][0], 0, False)
            else:
                start = LayerWalk(self.lg, make_search_plan(base, []), self.n, P, self.dtype_bytes)
                init: States = {(): [_Partial(ZERO, KindConfig(self.lg.kind), start)]}
                states, saw = self._run(base, init, 0, self.split)
                self.prefixes[pkey] = (states, 0, saw)
        states, _, saw_prefix = self.prefixes[pkey]
        states, saw_suffix = self._run(base, states, self.split, len(self.lg.ops))
        by_exit: dict[Placement, list[_Partial]] = {}
        for bucket in states.values():
            for part in bucket:
                by_exit.setdefault(part.walk.res.placements["mlp_out"], []).append(part)
        front = KindFront(
            self.lg.kind,
            {e: skyline(b, self.k, lambda p: p.cost) for e, b in by_exit.items()},
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
