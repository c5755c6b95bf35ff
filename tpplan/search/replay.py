"""Replaying a layer kind's walk: each op's branches worked out once per distinct situation.

The search walks one layer kind's ops thousands of times (every surviving branch, every global
choice), and most of those steps repeat one already taken: the op sees the same inputs, placed the
same way, under the same decisions. `StepMemo` keys a step by what it reads and replays the
recorded outcome onto a copy of the walk; it does the same for a whole expansion (`_expand`: every
branch the op's sites offer). The search stays exact: a replayed walk is the walk a real step
gives, which tests/test_search.py checks against the unreplayed enumeration (`enumerate_kind`).
"""

from __future__ import annotations

from collections.abc import Callable
from operator import itemgetter
from typing import Any

from tpplan.layout.propagate import LayerWalk
from tpplan.models.graph import Op
from tpplan.models.opkinds import op_kind
from tpplan.placement import P, Placement
from tpplan.search.space import (
    DECISION_SETS,
    Branch,
    GlobalChoice,
    KindConfig,
    KindIndex,
    SpaceOptions,
    StepDelta,
    _expand,
    make_search_plan,
)

StepKey = tuple[object, ...]


class _Reads:
    """What a step of one op reads, as lookups: its inputs' placements (in one call), their
    producers, the (producer, this op) pairs a config may gather for it, the conversions of its
    inputs a walk may have issued, and whether it reads the MoE mode (an experts op, or one whose
    output an experts op reads)."""

    __slots__ = ("conversions", "gathered_for", "moe", "placements", "producers", "q")

    def __init__(self, op: Op, index: KindIndex) -> None:
        names = [v for v, _ in index.inputs_q[op.name]]
        self.q = index.op_q[op.name]
        self.placements: Callable[[dict[str, Placement]], tuple[Placement, ...]] = (
            itemgetter(*names) if len(names) > 1 else lambda pl: tuple(pl[v] for v in names)
        )
        self.producers = frozenset(pq for _, pq in index.inputs_q[op.name])
        self.gathered_for = frozenset((pq, self.q) for pq in self.producers)
        self.conversions = frozenset((v, dst) for v in names for dst in Placement)
        self.moe = any(op_kind(o.kind).routed_experts for o in (op, *index.consumers.get(op.output, ())))


# A recorded expansion: did the op receive a partial sum, and per branch the choices it appends
# to the config, the decisions it adds to each set, and its step.
Move = tuple[tuple[str, ...], tuple[tuple[str, frozenset[Any]], ...], StepDelta]


class StepMemo:
    """The steps and expansions of one layer kind's walks under every global choice, in one space.

    A step (`LayerWalk.step`) reads: the op; for each input its placement, whether the config
    gathers or all-to-alls its producer or gathers it for this op, and the conversions of it already
    issued (`walk.done`); whether the config replicates or token-shards the op; of the global choice
    only the MoE mode and redundant experts (an experts op) and, where an input is a partial sum, the stream and reduce
    targets (a search plan has no DP attention, fold or bank of its own). `_expand` reads besides
    only the MoE mode where a consumer of the op's output is an experts op. That is the key (`key`).
    Walks that agree on it get the same decision, collectives and output placement, and the same
    branches from `_expand`, each adding the same decisions about this op to the config. A walk
    downstream of an illegal op (never continued by the search) is stepped as it is. Walks handed
    out are never stepped in place, and a walk's own plan is not read again (a step builds it from
    the config), so branches share walks.
    """

    def __init__(self, index: KindIndex, opts: SpaceOptions) -> None:
        self.index, self.opts = index, opts
        self.deltas: dict[StepKey, StepDelta] = {}
        self.expansions: dict[StepKey, tuple[bool, tuple[Move, ...]]] = {}

        self.reads = [_Reads(op, index) for op in index.lg.ops]

    def key(self, walk: LayerWalk, cfg: KindConfig, g: GlobalChoice) -> StepKey:
        r = self.reads[walk.index]
        placed = r.placements(walk.res.placements)
        return (
            walk.index,
            placed,
            cfg.gather & r.producers,
            cfg.a2a & r.producers,
            cfg.gather_for & r.gathered_for,
            r.conversions.intersection(walk.done),
            r.q in cfg.replicate,
            r.q in cfg.token_shard,
            (g.stream, g.reduce) if P in placed else None,
            (g.moe, g.redundant_experts) if r.moe else None,
        )

    def step(self, walk: LayerWalk, cfg: KindConfig, g: GlobalChoice) -> tuple[LayerWalk, StepDelta]:
        """A copy of `walk` one op further under `cfg` and `g`, and what that op did."""
        key = None if walk.tainted else self.key(walk, cfg, g)
        delta = self.deltas.get(key) if key is not None else None
        if delta is not None:
            return delta.applied(walk), delta
        w = walk.copy(make_search_plan(g, [cfg]))
        res = w.res
        n_comms, n_viol, done0, taint0 = len(res.comms), len(res.violations), set(w.done), set(w.tainted)
        w.step()
        out = walk.ops[walk.index].output
        delta = StepDelta(
            out,
            res.placements[out],
            res.decisions[-1],
            tuple(res.comms[n_comms:]),
            tuple((k, d) for k, d in w.done.items() if k not in done0),
            tuple(res.violations[n_viol:]),
            tuple((v, t) for v, t in w.tainted.items() if v not in taint0),
        )
        if key is not None:
            self.deltas[key] = delta
        return w, delta

    def expand(self, walk: LayerWalk, cfg: KindConfig, g: GlobalChoice) -> tuple[list[Branch], bool, tuple[Move, ...]]:
        """`_expand(walk, cfg, g, ...)`: the legal branches at the walk's next op, whether it
        received a partial sum, and per branch what it adds to the config (`Move`: the same for
        every config in the walk's state)."""
        key = None if walk.tainted else self.key(walk, cfg, g)
        hit = self.expansions.get(key) if key is not None else None
        if hit is None:
            branches, saw_p = _expand(walk, cfg, g, self.opts, self.index, self)
            moves = tuple(_move(cfg, c, d) for c, _, d in branches)
            if key is not None:
                self.expansions[key] = (saw_p, moves)
            return branches, saw_p, moves
        saw_p, moves = hit
        out: list[Branch] = []
        walks: dict[int, LayerWalk] = {}
        for choices, sets, delta in moves:
            w = walks.get(id(delta))
            if w is None:
                w = walks[id(delta)] = delta.applied(walk)
            out.append((cfg.extended(choices, sets), w, delta))
        return out, saw_p, moves


def _move(before: KindConfig, after: KindConfig, delta: StepDelta | None) -> Move:
    """What a branch added to its config (every decision a branch adds is about the op it is at,
    so none was in the config before)."""
    assert delta is not None  # `_expand` under a memo gives every branch its step
    grown = tuple((k, getattr(after, k) - getattr(before, k)) for k in DECISION_SETS)
    return (after.choices[len(before.choices) :], tuple((k, v) for k, v in grown if v), delta)
