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

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from tpplan.errors import TpplanError
from tpplan.layout.plan import MoEMode, Plan
from tpplan.layout.propagate import LayerResult, LayerWalk, check_divisible
from tpplan.layout.rules import strategies
from tpplan.models.graph import LayerGraph, ModelGraph, Op, OpKind, WeightSplit
from tpplan.placement import S_COL, S_TOK, P, Placement, R


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
        """This config with one more choice: `sets` name the decision sets it adds to."""
        grown = {k: getattr(self, k) | frozenset(v) for k, v in sets.items()}
        return replace(self, choices=(*self.choices, choice), **grown)


def make_search_plan(g: GlobalChoice, configs: Sequence[KindConfig], name: str = "", summary: str = "") -> Plan:
    """The Plan a global choice and one config per kind stand for."""

    def union(attr: str) -> frozenset[Any]:
        if len(configs) == 1:  # the walk's case: one kind's config, its sets as they are
            own: frozenset[Any] = getattr(configs[0], attr)
            return own
        return frozenset().union(*(getattr(c, attr) for c in configs))

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
    walk: LayerWalk, cfg: KindConfig, g: GlobalChoice, opts: SpaceOptions, index: KindIndex
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
        if got in (S_TOK, S_COL) and not _is_stream_add(op) and not index.accepts(op, d.split, k, got)
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
    later = [c for c in index.consumers.get(v, []) if not _is_stream_add(c)]
    for c, w in branches:
        out.append((c, w))
        if w.res.placements.get(v) is not S_TOK or not later or _is_stream_add(op) or n == 1:
            continue
        c2 = c.add(f"all-gather {v}", gather=[q(op)])
        out.append((c2, w.copy(make_search_plan(g, [c2]))))
        if opts.a2a and any(index.accepts(o, _default_split(o, g), o.inputs.index(v), S_COL) for o in later):
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
    index = KindIndex(lg)
    leaves: list[tuple[KindConfig, LayerResult]] = []
    stack = [(KindConfig(lg.kind), LayerWalk(lg, make_search_plan(g, []), n, P, dtype_bytes))]
    while stack:
        cfg, walk = stack.pop()
        if walk.index == len(walk.ops):
            leaves.append((cfg, walk.res))
            continue
        stack.extend(reversed(_expand(walk, cfg, g, opts, index)[0]))
    return leaves
