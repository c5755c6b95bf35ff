"""Placement transitions: one object per (from, to) pair owns everything about moving a value.

A transition turns a value held as one placement into another: a free local step (keep my rows,
my heads' columns, or the whole value on rank 0) or exactly one collective. Each `Transition` says
which collective, what one rank sends (the planner's volume), the buffer it hands to
torch.distributed (the schedule's shape, nccl-tests size) and the layout copy the runtime runs
beside the collective (priced by the cost model as an op of its own). The runtime registers its
call for every transition under the same key (`tpplan.runtime.transitions.RUNTIME_TRANSITIONS`),
and tests/test_transitions.py walks every pair: planner volume, schedule bytes and cost bytes
agree, and the runtime moves exactly the predicted bytes. The models are DTensor's
`redistribute` between placements and Megatron's named mappings (`reduce_from_...`,
`gather_from_...`, `scatter_to_...`).

Not declared, so impossible in one step: anything out of a partial sum except by reduction
(P -> S(col)), and S(col) -> S(tok). No plan decision asks for the latter (the propagation
all-to-alls only S(tok) -> S(col), for a plan's `a2a` producers), so neither the planner nor the
runtime offers it; an op that would need it is an illegal edge.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tpplan.placement import S_COL, S_TOK, Collective, P, Placement, R, relative_units, ring_elements_per_rank


def local_width(value_width: int, heads: int, n: int) -> int:
    """Columns of a value a rank holds when it is head-sharded (one shared head when N > heads)."""
    if not heads or n <= 1:
        return value_width // max(n, 1) if n > 1 else value_width
    per_head = value_width // heads
    if heads % n == 0:
        return per_head * (heads // n)
    return per_head


@dataclass(frozen=True)
class LayoutCopy:
    """A copy the runtime runs as a step of its own beside a collective (`pack:<value>` before it,
    `unpack:<value>` after it); `elements` is read + write of the local buffer."""

    name: str
    elements: float


@dataclass(frozen=True)
class Transition:
    """Moving a value from `src` to `dst`: free (`collective` None) or one collective."""

    src: Placement
    dst: Placement
    collective: Collective | None
    mapping: str  # what it does, in Megatron's words
    heads_side: bool = False  # moves head-sharded columns (GQA heads fewer than ranks are shared)

    @property
    def free(self) -> bool:
        return self.collective is None

    def wire_width(self, width: int, heads: int, n: int) -> int:
        """Width the collective really moves. A head-sharded value with fewer heads than ranks (GQA
        KV heads) has one head per rank, shared: moving it to or from head-sharded carries N heads'
        columns, not `heads`."""
        if self.heads_side and heads and heads < n and n % heads == 0:
            return width // heads * n
        return width

    def elements_per_rank(self, width: int, heads: int, n: int, tokens: float = 1.0) -> float:
        """The planner's volume: elements one rank sends for `tokens` tokens (ring algorithms)."""
        if self.collective is None:
            return 0.0
        return ring_elements_per_rank(self.collective, self.wire_width(width, heads, n), n, tokens)

    def relative_units(self, width: int, heads: int, n: int) -> float:
        """Relative units per token (docs/concepts.md; 0 for a free step)."""
        if self.collective is None:
            return 0.0
        return relative_units(self.collective, self.wire_width(width, heads, n), n)

    def call_shape(self, width: int, heads: int, n: int, tokens: int) -> tuple[int, ...]:
        """The buffer one rank hands to torch.distributed (nccl-tests size): all_reduce the [T, W]
        value, reduce_scatter its padded input and all_gather its padded output by token, the head
        all-gather [T, N*w], the all-to-all the rank's [T_pad/N, N*w] send buffer."""
        per = -(-tokens // n)
        coll = self.collective
        if coll is Collective.ALL_REDUCE:
            return (tokens, width)
        if coll in (Collective.REDUCE_SCATTER, Collective.ALL_GATHER) and S_COL not in (self.src, self.dst):
            return (per * n, width)
        if coll is Collective.ALL_GATHER:
            return (tokens, n * local_width(width, heads, n))
        if coll is Collective.ALL_TO_ALL:
            return (per, n * local_width(width, heads, n))
        raise ValueError(f"{self.src} -> {self.dst} moves nothing between ranks")

    def layout_copy(self, value: str, width: int, heads: int, n: int, tokens: int) -> LayoutCopy | None:
        """The runtime's copy around this collective, if it needs one: the all-to-all packs the
        per-destination blocks; the head all-gather interleaves the gathered blocks (none when one
        head is all there is); a reduce-scatter of T rows not divisible by N pads them first."""
        if n <= 1 or self.collective is None:
            return None
        per = math.ceil(tokens / n)
        if self.collective is Collective.ALL_TO_ALL:
            return LayoutCopy(f"pack:{value}", 2.0 * per * n * local_width(width, heads, n))
        if self.collective is Collective.ALL_GATHER and self.src is S_COL and heads != 1:
            return LayoutCopy(f"unpack:{value}", 2.0 * tokens * width)
        if self.collective is Collective.REDUCE_SCATTER and tokens % n:
            return LayoutCopy(f"pack:{value}", float(tokens + per * n) * width)
        return None


TRANSITIONS: dict[tuple[Placement, Placement], Transition] = {
    (t.src, t.dst): t
    for t in (
        Transition(R, S_TOK, None, "scatter_to_sequence_parallel_region: keep my rows"),
        Transition(R, S_COL, None, "scatter_to_tensor_model_parallel_region: keep my heads' columns"),
        Transition(R, P, None, "rank 0 keeps the value, the others hold zeros"),
        Transition(P, R, Collective.ALL_REDUCE, "reduce_from_tensor_model_parallel_region"),
        Transition(P, S_TOK, Collective.REDUCE_SCATTER, "reduce_scatter_to_sequence_parallel_region"),
        Transition(S_TOK, R, Collective.ALL_GATHER, "gather_from_sequence_parallel_region"),
        Transition(S_COL, R, Collective.ALL_GATHER, "gather_from_tensor_model_parallel_region", heads_side=True),
        Transition(S_TOK, S_COL, Collective.ALL_TO_ALL, "all_to_all_sp2hp: tokens to heads", heads_side=True),
    )
}
"""Every transition in one step. Pairs not listed are impossible in one step."""


def transition(src: Placement, dst: Placement) -> Transition | None:
    """The single step from `src` to `dst` (a free identity when they are equal), or None when
    there is none (e.g. P -> S(col))."""
    if src == dst:
        return Transition(src, dst, None, "already there")
    return TRANSITIONS.get((src, dst))


def collective_transition(collective: Collective, src: Placement, dst: Placement) -> Transition:
    """The declared transition a planned collective performs (raises on one the table lacks)."""
    t = TRANSITIONS.get((src, dst))
    if t is None or t.collective is not collective:
        raise ValueError(f"no transition {src} -> {dst} by {collective}")
    return t


__all__ = ["TRANSITIONS", "LayoutCopy", "Transition", "collective_transition", "local_width", "transition"]
