"""What one deployment's search computed, kept by call, so the search can run again with another cutoff.

A forked worker cannot know the cutoff the one-core search gives a deployment (the `top`-th best score of
the deployments before it in grid order), so it searches with a looser one and keeps more plans. The parent
then runs the deployment's search again, in grid order, with the one-core cutoff and the worker's `Memo`:
every walk, audit, prediction and variant the worker made is answered from the memo (a call with other
arguments, such as a walk under another activations reserve, is computed), so the parent's run is the
one-core search itself, made cheaply, and the output is the one-core output (`search.ranking._search_forked`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass
class Memo:
    """Results by (what was asked, its arguments); `hits` and `misses` say how the rerun went."""

    results: dict[tuple[str, Hashable], Any] = field(default_factory=dict)
    hits: int = 0
    misses: int = 0

    def get(self, what: str, key: Hashable, make: Callable[[], T]) -> T:
        """The result kept for (`what`, `key`), else `make()`'s, kept."""
        k = (what, key)
        if k in self.results:
            self.hits += 1
            return self.results[k]
        self.misses += 1
        got = self.results[k] = make()
        return got


__all__ = ["Memo"]
