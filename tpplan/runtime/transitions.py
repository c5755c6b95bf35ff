"""The runtime's call for every placement transition the planner declares, under the same key.

`tpplan.layout.transitions.TRANSITIONS` says what each (from, to) pair is (its collective,
volume, buffer shape and layout copy); this table says how a rank runs it on its local tensor.
The keys must be the same (checked at import and by tests/test_transitions.py), so the planner
cannot declare a transition the runtime cannot run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from tpplan.layout.dp_attention import DP_TRANSITIONS
from tpplan.layout.schedule import padded_rows, token_range
from tpplan.layout.transitions import TRANSITIONS
from tpplan.placement import S_COL, S_TOK, Collective, P, Placement, R
from tpplan.runtime.shard import head_range
from tpplan.runtime.trace import Comm


def _copy_inline(name: str, copy: Callable[..., Tensor], *args: Any) -> Tensor:
    return copy(*args)


@dataclass
class Move:
    """One rank moving one value: its collectives, the value's name and heads, the batch size.

    `layout(name, copy, *args)` runs a layout copy as a step of its own (`PlanRunner._layout`
    records and times it); `inplace` lets an all-reduce reuse the partial sum's storage (the caller
    promises nothing reads it afterwards); `planned` False traces the call as not in the plan."""

    comm: Comm
    value: str
    heads: int
    tokens: int
    planned: bool = True
    inplace: bool = False
    layout: Callable[..., Tensor] = _copy_inline

    def padded(self, x: Tensor) -> Tensor:
        """The reduce-scatter input of `x`: padded to N*ceil(T/N) rows by a `pack:<value>` step when
        T is not a multiple of N (as predicted), else `x` itself."""
        c = self.comm
        if c.n > 1 and x.shape[0] < padded_rows(self.tokens, c.n)[0]:
            return self.layout(f"pack:{self.value}", c.pad_tokens, x, self.tokens)
        return x


def _keep_rows(m: Move, x: Tensor) -> Tensor:
    per = padded_rows(m.tokens, m.comm.n)[1]
    rows = x[m.comm.rank * per : (m.comm.rank + 1) * per]
    return torch.cat([rows, rows.new_zeros(per - rows.shape[0], *rows.shape[1:])])


def _keep_heads(m: Move, x: Tensor) -> Tensor:
    lo, hi = head_range(m.heads, m.comm.n, m.comm.rank)
    per_head = x.shape[1] // m.heads
    return x[:, lo * per_head : hi * per_head]


def _on_rank0(m: Move, x: Tensor) -> Tensor:
    return x if m.comm.rank == 0 else torch.zeros_like(x)


def _all_reduce(m: Move, x: Tensor) -> Tensor:
    return m.comm.all_reduce(x, m.value, planned=m.planned, inplace=m.inplace)


def _reduce_scatter(m: Move, x: Tensor) -> Tensor:
    return m.comm.reduce_scatter(m.padded(x), m.value, m.tokens, planned=m.planned)


def _gather_tokens(m: Move, x: Tensor) -> Tensor:
    return m.comm.all_gather_tokens(x, m.value, m.tokens, planned=m.planned)


def _gather_heads(m: Move, x: Tensor) -> Tensor:
    c = m.comm
    gathered = c.all_gather_heads(x, m.value, m.heads, planned=m.planned)
    if c.unpack_copies(m.heads):
        return m.layout(f"unpack:{m.value}", c.unpack_heads, gathered, m.heads)
    return c.unpack_heads(gathered, m.heads)


def _tokens_to_heads(m: Move, x: Tensor) -> Tensor:
    c = m.comm
    send = m.layout(f"pack:{m.value}", c.pack_heads, x, m.heads) if c.n > 1 else x
    return c.tokens_to_heads(send, m.value, m.heads, m.tokens, planned=m.planned)


RUNTIME_TRANSITIONS: dict[tuple[Placement, Placement], Callable[[Move, Tensor], Tensor]] = {
    (R, S_TOK): _keep_rows,
    (R, S_COL): _keep_heads,
    (R, P): _on_rank0,
    (P, R): _all_reduce,
    (P, S_TOK): _reduce_scatter,
    (S_TOK, R): _gather_tokens,
    (S_COL, R): _gather_heads,
    (S_TOK, S_COL): _tokens_to_heads,
}

if RUNTIME_TRANSITIONS.keys() != TRANSITIONS.keys():  # pragma: no cover - a table edited on one side only
    raise ImportError(
        f"runtime and planner transitions differ: {sorted(RUNTIME_TRANSITIONS.keys() ^ TRANSITIONS.keys())}"
    )


def _dp_gather_by_sum(m: Move, x: Tensor) -> Tensor:
    """SGLang's `_dp_gather_via_all_reduce`: my real rows into a zero-filled [T, W] buffer at my
    offset, summed over the ranks (every rank ends with every rank's rows)."""
    c = m.comm
    lo, hi = token_range(m.tokens, c.n, c.rank)
    full = x.new_zeros(m.tokens, *x.shape[1:])
    full[lo:hi] = x[: hi - lo]
    return c.all_reduce(full, m.value, planned=m.planned, inplace=True)


def _all_reduce_keep_rows(m: Move, x: Tensor) -> Tensor:
    """The MoE's all-reduce over all T rows, then `dp_scatter`: keep my rows (padded to ceil(T/N))."""
    return _keep_rows(m, _all_reduce(m, x))


RUNTIME_DP_TRANSITIONS: dict[tuple[Placement, Placement, Collective], Callable[[Move, Tensor], Tensor]] = {
    (S_TOK, R, Collective.ALL_REDUCE): _dp_gather_by_sum,
    (P, S_TOK, Collective.ALL_REDUCE): _all_reduce_keep_rows,
}

if RUNTIME_DP_TRANSITIONS.keys() != DP_TRANSITIONS.keys():  # pragma: no cover - edited on one side only
    raise ImportError("runtime and planner DP transitions differ")


__all__ = ["RUNTIME_DP_TRANSITIONS", "RUNTIME_TRANSITIONS", "Move"]
