"""Placements of an activation [T tokens, W features] on a TP group of N ranks, and how to move
between them.

- `R`      replicated: every rank holds all of it;
- `S(tok)` token-sharded: rank r holds its T/N rows (padded when N does not divide T);
- `S(col)` feature-sharded by head: every rank holds all T rows and its W/N columns;
- `P`      partial: every rank holds a T×W summand; the true value is the sum over ranks.

A redistribution is either free (a local slice, or keeping a replica on one rank) or one
collective. Volumes are what one rank sends with ring algorithms, per token, in elements.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Placement(StrEnum):
    R = "R"
    S_TOK = "S(tok)"
    S_COL = "S(col)"
    P = "P"

    @property
    def words(self) -> str:
        return _WORDS[self]


_WORDS = {
    Placement.R: "replicated (every rank holds every token's full row)",
    Placement.S_TOK: "token-sharded (each rank holds only its 1/N of the tokens)",
    Placement.S_COL: "head-sharded (each rank holds all tokens, only its own heads' columns)",
    Placement.P: "partial (each rank holds a summand that still has to be reduced)",
}

R, S_TOK, S_COL, P = Placement.R, Placement.S_TOK, Placement.S_COL, Placement.P


class Collective(StrEnum):
    ALL_REDUCE = "all_reduce"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_GATHER = "all_gather"
    ALL_TO_ALL = "all_to_all"
    SEND_RECV = "send_recv"

    @property
    def short(self) -> str:
        return {
            "all_reduce": "AR",
            "reduce_scatter": "RS",
            "all_gather": "AG",
            "all_to_all": "A2A",
            "send_recv": "P2P",
        }[self.value]


@dataclass(frozen=True)
class Redistribution:
    """How to turn one placement into another: `collective` None means a free local step."""

    src: Placement
    dst: Placement
    collective: Collective | None

    @property
    def free(self) -> bool:
        return self.collective is None


# The redistribution table. Pairs not listed are impossible in one step.
_TABLE: dict[tuple[Placement, Placement], Collective | None] = {
    (R, S_TOK): None,  # keep my rows
    (R, S_COL): None,  # keep my columns
    (R, P): None,  # rank 0 keeps the value, others hold zeros
    (P, R): Collective.ALL_REDUCE,
    (P, S_TOK): Collective.REDUCE_SCATTER,
    (S_TOK, R): Collective.ALL_GATHER,
    (S_COL, R): Collective.ALL_GATHER,  # gather columns (rarely wanted; never free)
    (S_TOK, S_COL): Collective.ALL_TO_ALL,
    (S_COL, S_TOK): Collective.ALL_TO_ALL,
}


def redistribution(src: Placement, dst: Placement) -> Redistribution | None:
    """The single step from `src` to `dst`, or None when there is none (e.g. P → S(col))."""
    if src == dst:
        return Redistribution(src, dst, None)
    if (src, dst) not in _TABLE:
        return None
    return Redistribution(src, dst, _TABLE[(src, dst)])


def ring_elements_per_rank(collective: Collective, width: int, n: int, tokens: float = 1.0) -> float:
    """Elements one rank sends for a [tokens, width] tensor (ring algorithms, with (N-1)/N)."""
    if n <= 1:
        return 0.0
    tw = tokens * width
    if collective is Collective.ALL_REDUCE:
        return 2.0 * (n - 1) / n * tw
    if collective in (Collective.REDUCE_SCATTER, Collective.ALL_GATHER):
        return (n - 1) / n * tw
    if collective is Collective.ALL_TO_ALL:
        return (n - 1) / (n * n) * tw
    if collective is Collective.SEND_RECV:
        return tw
    raise ValueError(collective)


def relative_units(collective: Collective, width: int, n: int) -> float:
    """Relative units per token (docs/concepts.md): AR = 2W, RS = AG = W, A2A = W/N, no (N-1)/N."""
    if n <= 1:
        return 0.0
    return {
        Collective.ALL_REDUCE: 2.0 * width,
        Collective.REDUCE_SCATTER: float(width),
        Collective.ALL_GATHER: float(width),
        Collective.ALL_TO_ALL: width / n,
        Collective.SEND_RECV: float(width),
    }[collective]
