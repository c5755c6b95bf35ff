"""k-Pareto fronts of (score, memory): what the search keeps of each set of interchangeable parts.

A part dominated (score and memory both no better) by k others can be swapped out of any plan for
k distinct plans that are no worse in both, so no top-k plan, under any memory cap, uses it.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import TypeVar

from tpplan.search.objectives import Cost

T = TypeVar("T")


def cost_key(c: Cost) -> tuple[float, float]:
    """(score, memory) to 12 significant digits: costs equal up to summation order compare equal."""
    return (float(f"{c.score:.12g}"), float(f"{c.memory:.12g}"))


def skyline(items: list[T], k: int, key: Callable[[T], Cost]) -> list[T]:
    """Keep the items dominated (score and memory both no better) by fewer than k others.

    Any plan using a dropped item is beaten by k distinct plans that swap it for a dominating
    one, so no top-k plan, under any memory cap, uses a dropped item.
    """
    if len(items) <= k:
        return items
    ranked = sorted(items, key=lambda it: (key(it).score, key(it).memory))
    kept: list[T] = []
    mems: list[float] = []  # memory of every item seen so far, sorted
    for it in ranked:
        m = key(it).memory
        if bisect.bisect_right(mems, m) < k:
            kept.append(it)
        bisect.insort(mems, m)
    return kept


Parts = list[tuple[Cost, tuple[T, ...]]]


def merge(a: Parts[T], b: Parts[T], k: int) -> Parts[T]:
    """Every sum of one part of `a` and one of `b` (costs added, parts concatenated), pruned to k-Pareto."""
    return skyline([(ca + cb, ta + tb) for ca, ta in a for cb, tb in b], k, lambda it: it[0])
