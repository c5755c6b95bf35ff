"""Pareto fronts: k-Pareto fronts of (score, memory), what the search keeps of each set of interchangeable parts;
and `pareto_max`, the plain front of two figures to maximise (the search under targets: tokens/s per GPU
against tokens/s per user).

A part dominated (score and memory both no better) by k others can be swapped out of any plan for
k distinct plans that are no worse in both, so no top-k plan, under any memory cap, uses it.
"""

from __future__ import annotations

import bisect
import math
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


def pareto_max(items: list[T], key: Callable[[T], tuple[float, float]]) -> list[T]:
    """The items no other item dominates (at least as high in both coordinates of `key` and higher in one;
    higher is better), in order of the first coordinate, best first; items equal in both are kept alike.
    Items with a NaN coordinate are left out."""
    pts = [it for it in items if not any(math.isnan(v) for v in key(it))]
    pts.sort(key=lambda it: (-key(it)[0], -key(it)[1]))
    front: list[T] = []
    best_y = -math.inf
    for it in pts:
        x, y = key(it)
        if y > best_y or (front and key(front[-1]) == (x, y)):
            front.append(it)
            best_y = max(best_y, y)
    return front
