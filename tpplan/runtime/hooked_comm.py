"""The traced collectives a plan run issues, with the collective hooks run first.

`make_comm` is what `PlanRunner` and the bench use (re-exported by `tpplan.runtime.distributed`); the hooks
(`tpplan.runtime.hooks`) let tests kill or hang a rank at a chosen collective.
"""

from __future__ import annotations

from torch import Tensor

from tpplan.runtime.hooks import before_collective
from tpplan.runtime.trace import Comm, Tracer


class _Traced(Comm):
    """`Comm` whose traced calls run the collective hooks first (`tpplan.runtime.hooks`: tests kill or hang a rank)."""

    def _hook(self, kind: str) -> None:
        before_collective(self.rank, kind)

    def all_reduce(self, x: Tensor, value: str, planned: bool = True, inplace: bool = False) -> Tensor:
        self._hook("all_reduce")
        return super().all_reduce(x, value, planned, inplace)

    def reduce_scatter(self, x: Tensor, value: str, tokens: int, planned: bool = True) -> Tensor:
        self._hook("reduce_scatter")
        return super().reduce_scatter(x, value, tokens, planned)

    def all_gather_tokens(self, x: Tensor, value: str, tokens: int, planned: bool = True) -> Tensor:
        self._hook("all_gather")
        return super().all_gather_tokens(x, value, tokens, planned)

    def all_gather_heads(self, x: Tensor, value: str, heads: int, planned: bool = True) -> Tensor:
        self._hook("all_gather")
        return super().all_gather_heads(x, value, heads, planned)

    def tokens_to_heads(self, send: Tensor, value: str, heads: int, tokens: int, planned: bool = True) -> Tensor:
        self._hook("all_to_all")
        return super().tokens_to_heads(send, value, heads, tokens, planned)


def make_comm(rank: int, n: int, group: object | None = None) -> Comm:
    """Traced collectives for rank `rank` of `n` on `group` (default: the world group)."""
    return _Traced(rank, n, Tracer(rank, n), group)


__all__ = ["make_comm"]
