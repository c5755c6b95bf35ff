"""The search space: global choices, and the sites a walk over a layer kind's ops finds.

A plan is global choices (where the residual stream lives, where partial sums are reduced, the MoE
mode and EP size) plus per-layer-kind decisions. The per-kind decisions are not listed per model:
they are derived from the graph while walking a layer in execution order, by looking at what each
op would receive (the repair logic, made a branching search):

- an op's output that is token-sharded (S(tok)) is a *producer site*: keep it, all-gather it for
  every consumer, or all-to-all it to head-sharded (when a consumer can read heads);
- an op that receives token-sharded (or head-sharded) input it cannot use is a *consumer site*:
  all-gather that input for this op only, or (a column/row-parallel linear) replicate its weight
  so it runs on local tokens and its output becomes a new token-sharded producer;
- a default-replicated linear (MLA's qkv_a, a latent projection) that receives replicated input is
  a *token-shard site*: run it on its own tokens (the seed's prototype) or on every token.

Sites only exist where the walk finds them, so a choice upstream (gather `x`) removes the sites it
makes moot; the knobs form a tree, and the "full product of knobs" is the set of its leaves
(`enumerate_kind`, the reference the tests take brute force over).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from tpplan.errors import TpplanError
from tpplan.layout.plan import MoEMode, Plan
from tpplan.layout.propagate import CommEvent, LayerResult, LayerWalk, OpDecision, Violation, check_divisible
from tpplan.layout.rules import strategies
from tpplan.models.graph import LayerGraph, ModelGraph, Op, WeightSplit
from tpplan.models.opkinds import op_kind, weight_split
from tpplan.placement import S_COL, S_TOK, P, Placement, R


@dataclass(frozen=True)
class GlobalChoice:
    """The model-wide decisions: stream placement, reduce target, MoE mode and EP size, and the redundant
    experts an EP or all-to-all MoE holds (`Plan.redundant_experts`; `SpaceOptions.redundant_experts`)."""

    stream: Placement
    reduce: Placement
    moe: MoEMode = "tp"
    ep_size: int | None = None
    redundant_experts: int = 0

    def moe_label(self) -> str:
        label = self.moe if self.moe != "ep" else f"ep{self.ep_size}"
        return label + (f"+redundant{self.redundant_experts}" if self.redundant_experts else "")


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
        """This config with one more choice: `sets` name the decision sets it adds to."""
        grown = {k: getattr(self, k) for k in DECISION_SETS}
        for k, v in sets.items():
            grown[k] = grown[k] | frozenset(v)
        return KindConfig(self.kind, **grown, choices=(*self.choices, choice))  # the walk's hot path: no `replace`

    def extended(self, choices: tuple[str, ...], sets: Iterable[tuple[str, frozenset[Any]]]) -> KindConfig:
        """This config with more choices, and more decisions in the sets named."""
        grown = {k: getattr(self, k) for k in DECISION_SETS}
        for k, v in sets:
            grown[k] = grown[k] | v
        return KindConfig(self.kind, **grown, choices=self.choices + choices)


DECISION_SETS = ("gather", "gather_for", "a2a", "replicate", "token_shard")


def make_search_plan(g: GlobalChoice, configs: Sequence[KindConfig], name: str = "", summary: str = "") -> Plan:
    """The Plan a global choice and one config per kind stand for."""
    if len(configs) == 1:  # the walk's case: one kind's config, its sets as they are
        sets: dict[str, frozenset[Any]] = {k: getattr(configs[0], k) for k in DECISION_SETS}
    else:
        sets = {k: frozenset().union(*(getattr(c, k) for c in configs)) for k in DECISION_SETS}
    return Plan(
        name or "search",
        "found by search",
        summary,
        stream=g.stream,
        reduce=g.reduce,
        gather=sets["gather"],
        gather_for=sets["gather_for"],
        a2a=sets["a2a"],
        replicate=sets["replicate"],
        token_shard=sets["token_shard"],
        moe=g.moe,
        ep_size=g.ep_size,
        redundant_experts=g.redundant_experts,
        found_by="search",
    )


def _has_experts(lg: LayerGraph) -> bool:
    return any(op_kind(op.kind).routed_experts for op in lg.ops)


def global_choices(
    graph: ModelGraph, n: int, *, streams: Sequence[Placement] = (R, S_TOK), redundant_experts: int = 0
) -> list[GlobalChoice]:
    """Every global choice valid for this model at TP size n (MoE modes the expert counts allow); the EP and
    all-to-all ones hold `redundant_experts` copies beside the experts (SGLang's --ep-num-redundant-experts),
    so an EP size that divides the physical count, not the logical one, is valid."""
    moes: list[tuple[MoEMode, int | None]] = [("tp", None)]
    if any(_has_experts(lg) for lg in graph.kinds.values()) and n > 1:
        moes += [("ep", e) for e in range(2, n + 1) if n % e == 0]
        moes.append(("a2a", None))
    out: list[GlobalChoice] = []
    for stream in streams:
        for reduce in (R, S_TOK):
            for moe, ep in moes:
                g = GlobalChoice(stream, reduce, moe, ep, redundant_experts if moe != "tp" else 0)
                try:
                    probe = make_search_plan(g, [])
                    for lg in graph.kinds.values():
                        check_divisible(lg, probe, n)
                except TpplanError:
                    continue
                out.append(g)
    return out


class KindIndex:
    """What a walk over one layer kind looks up again and again, computed once: each value's
    consumers and its producer's qualified name, and which placements an op's inputs accept."""

    def __init__(self, lg: LayerGraph) -> None:
        self.lg = lg
        self.consumers: dict[str, list[Op]] = {}
        for op in lg.ops:
            for v in op.inputs:
                self.consumers.setdefault(v, []).append(op)
        self.producer_q = {op.output: f"{lg.kind}/{op.role}" for op in lg.ops}
        self.op_q = {op.name: f"{lg.kind}/{op.role}" for op in lg.ops}
        # each op's inputs with their producers' qualified names (a layer input: `<kind>/layer.<value>`)
        self.inputs_q = {
            op.name: tuple((v, self.producer_q.get(v) or f"{lg.kind}/layer.{v}") for v in op.inputs) for op in lg.ops
        }
        self._accepts: dict[tuple[str, str, int, Placement], bool] = {}

    def accepts(self, op: Op, split: str, position: int, placement: Placement) -> bool:
        """Whether some strategy of `op` (weight placed as `split`) takes `placement` at input `position`."""
        key = (op.name, split, position, placement)
        hit = self._accepts.get(key)
        if hit is None:
            hit = any(s.inputs[position] is placement for s in strategies(op, split, self.lg.values))
            self._accepts[key] = hit
        return hit


def _is_stream_add(op: Op) -> bool:
    return op.reduces_into_stream


def _default_split(op: Op, g: GlobalChoice) -> str:
    return str(weight_split(op, g.moe, replicated=False))


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
    redundant_experts: int = 0  # copies beside the routed experts in every EP/all-to-all choice (`global_choices`)


@dataclass
class StepDelta:
    """What walking one op did to a walk: the op's output placement, its decision, the collectives
    it issued, the conversions it recorded as done, and (an illegal op) its violations. `costs`: the
    search's price of the step under each global choice, filled in by the first walk that needs it
    (one objective per memo)."""

    output: str
    placement: Placement
    decision: OpDecision
    comms: tuple[CommEvent, ...]
    done: tuple[tuple[tuple[str, Placement], Placement], ...]
    violations: tuple[Violation, ...]
    tainted: tuple[tuple[str, str], ...]
    costs: dict[GlobalChoice, Any] = field(default_factory=dict)

    def applied(self, walk: LayerWalk) -> LayerWalk:
        """A copy of `walk` (at this delta's op) one op further, as `LayerWalk.step` would leave it."""
        w = walk.copy()
        res = w.res
        res.placements[self.output] = self.placement
        res.decisions.append(self.decision)
        if self.comms:
            res.comms.extend(self.comms)
        if self.done:
            w.done.update(self.done)
        if self.violations:
            res.violations.extend(self.violations)
            w.tainted.update(self.tainted)
        w.index += 1
        return w


class Stepper(Protocol):
    """What steps walks for `_expand` instead of `LayerWalk.step` (`tpplan.search.replay.StepMemo`)."""

    def step(self, walk: LayerWalk, cfg: KindConfig, g: GlobalChoice) -> tuple[LayerWalk, StepDelta]: ...


Branch = tuple[KindConfig, LayerWalk, StepDelta | None]  # a branch: its config, its walk, its step


def _expand(
    walk: LayerWalk,
    cfg: KindConfig,
    g: GlobalChoice,
    opts: SpaceOptions,
    index: KindIndex,
    memo: Stepper | None = None,
) -> tuple[list[Branch], bool]:
    """Walk the next op under every choice its sites offer; return the legal branches.

    Sites, in order: the consumer site (an input it cannot use: gather it for this op, or
    replicate a split linear so it runs on local tokens), the token-shard site (a replicated
    linear that sees every token may run on its own), the producer site (a token-sharded output:
    keep it, gather it for all consumers, or all-to-all it to heads). Gathers and all-to-alls of
    an output only change what later ops receive, so they reuse the walk that produced it.
    Also says whether the op received a partial sum (where the reduce target could matter).
    With a `memo` (the search), steps are replayed from it and each branch carries its step's
    delta; without (`enumerate_kind`, the reference), every step is walked and the delta is None.
    """
    op, n, kind = walk.ops[walk.index], walk.n, walk.lg.kind

    def q(o: Op) -> str:
        return f"{kind}/{o.role}"

    def prod_q(v: str) -> str:
        p = walk.producer_of.get(v)
        return q(p) if p else f"{kind}/layer.{v}"

    def stepped(c: KindConfig) -> tuple[LayerWalk, StepDelta | None]:
        if memo is not None:
            return memo.step(walk, c, g)
        w = walk.copy(make_search_plan(g, [c]) if c is not cfg else None)
        w.step()
        return w, None

    first, first_delta = stepped(cfg)
    d = first.res.decisions[-1]
    saw_p = P in d.inputs_received and not _is_stream_add(op)
    branches: list[Branch] = []
    bad = [
        (v, got)
        for k, (v, got) in enumerate(zip(op.inputs, d.inputs_received, strict=True))
        if got in (S_TOK, S_COL) and not _is_stream_add(op) and not index.accepts(op, d.split, k, got)
    ]
    if bad and n > 1:
        edges = [(prod_q(v), q(op)) for v, _ in bad]
        branches += _consumer_site(cfg, op, q(op), bad, edges, opts, stepped)
    elif d.legal:
        branches.append((cfg, first, first_delta))
    if (
        opts.token_shard
        and n > 1
        and op_kind(op.kind).linear
        and op.split is WeightSplit.REPLICATED
        and d.inputs_received
        and d.inputs_received[0] is R
    ):
        branches += _token_shard_branches(branches, op, q(op), stepped)
    return _producer_site(branches, op, q(op), g, opts, index, n, memo is not None), saw_p


def _consumer_site(
    cfg: KindConfig,
    op: Op,
    role: str,
    bad: list[tuple[str, Placement]],
    edges: list[tuple[str, str]],
    opts: SpaceOptions,
    stepped: Callable[[KindConfig], tuple[LayerWalk, StepDelta | None]],
) -> list[Branch]:
    """The consumer site: inputs `op` cannot use as received (`bad`, over `edges`) gathered for it, or
    a split linear replicated to run on local tokens; the legal ones."""
    names = "+".join(v for v, _ in bad)
    cands = []
    if opts.gather_for:
        cands.append(cfg.add(f"all-gather {names} for {op.name}", gather_for=edges))
    if (
        opts.replicate
        and op_kind(op.kind).linear
        and op.split in (WeightSplit.COL, WeightSplit.ROW)
        and all(got is S_TOK for _, got in bad)
    ):
        cands.append(cfg.add(f"replicate {op.name} (runs on local tokens)", replicate=[role]))
    out: list[Branch] = []
    for c in cands:
        w, delta = stepped(c)
        if w.res.decisions[-1].legal:
            out.append((c, w, delta))
    return out


def _token_shard_branches(
    branches: list[Branch], op: Op, role: str, stepped: Callable[[KindConfig], tuple[LayerWalk, StepDelta | None]]
) -> list[Branch]:
    """The token-shard site: each branch again with the replicated linear `op` on local tokens only."""
    more: list[Branch] = []
    for c, _, _ in branches:
        c2 = c.add(f"{op.name} on local tokens only", token_shard=[role])
        w, delta = stepped(c2)
        if w.res.decisions[-1].legal:
            more.append((c2, w, delta))
    return more


def _producer_site(
    branches: list[Branch],
    op: Op,
    role: str,
    g: GlobalChoice,
    opts: SpaceOptions,
    index: KindIndex,
    n: int,
    memo: bool,
) -> list[Branch]:
    """The producer site: each branch, and where it leaves `op`'s output token-sharded for later ops,
    that output all-gathered for all consumers or moved to heads by all-to-all."""
    out: list[Branch] = []
    v = op.output
    later = [c for c in index.consumers.get(v, []) if not _is_stream_add(c)]
    for c, w, delta in branches:
        out.append((c, w, delta))
        if w.res.placements.get(v) is not S_TOK or not later or _is_stream_add(op) or n == 1:
            continue
        # a gather or all-to-all of the output changes only what later ops receive: the same walk
        # (under the memo walks are never stepped in place and their own plan is never read: shared)
        c2 = c.add(f"all-gather {v}", gather=[role])
        out.append((c2, w if memo else w.copy(make_search_plan(g, [c2])), delta))
        if opts.a2a and any(index.accepts(o, _default_split(o, g), o.inputs.index(v), S_COL) for o in later):
            c3 = c.add(f"all-to-all {v} to heads", a2a=[role])
            out.append((c3, w if memo else w.copy(make_search_plan(g, [c3])), delta))
    return out


def enumerate_kind(
    lg: LayerGraph, g: GlobalChoice, n: int, opts: SpaceOptions | None = None, dtype_bytes: int = 2
) -> list[tuple[KindConfig, LayerResult]]:
    """Every legal leaf of this layer kind's decision tree under `g` (entry: a partial sum).

    The reference enumeration (no merging): tests take the product of these over kinds as the
    brute force that the search must match.
    """
    opts = opts or SpaceOptions()
    index = KindIndex(lg)
    leaves: list[tuple[KindConfig, LayerResult]] = []
    stack = [(KindConfig(lg.kind), LayerWalk(lg, make_search_plan(g, []), n, P, dtype_bytes))]
    while stack:
        cfg, walk = stack.pop()
        if walk.index == len(walk.ops):
            leaves.append((cfg, walk.res))
            continue
        stack.extend((c, w) for c, w, _ in reversed(_expand(walk, cfg, g, opts, index)[0]))
    return leaves
