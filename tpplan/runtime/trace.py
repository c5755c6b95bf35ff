"""Every collective the distributed runtime issues goes through `Comm`, which records it.

The record (`tpplan.layout.schedule.CollectiveCall`) is filled from the real tensor handed to
torch.distributed: kind, shape, dtype, bytes (nccl-tests size) and the bytes this rank sends.
`tpplan.lower.schedule.predict_schedule` computes the same fields from the plan alone, and the
proof tests assert that the two lists are equal. With one rank every collective is the identity
and nothing is recorded (nothing moves).

Layout copies are not collectives: where a collective needs its buffer in another layout than
the value's (the all-to-all to head-sharded sends per-destination column blocks; the head
all-gather returns per-rank blocks to interleave; a reduce-scatter needs its rows padded), `Comm`
offers the copy as its own method (`pack_heads`, `unpack_heads`, `pad_tokens`) and the collective
takes or returns the ready buffer. The interpreter runs each copy as a step of its own
(`PlanRunner._layout`), so a benchmark times it as an op and the collective call is the bare
torch.distributed call; the cost model prices the same copies (`pack:<value>`, `unpack:<value>`).

`Comm` also offers untraced helpers (`gather_full_*`) used only to check results against the
single-process reference; they are not part of any plan.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor

from tpplan.layout.schedule import CollectiveCall, ring_sent_bytes
from tpplan.runtime.observe import RunObserver, observed_collective
from tpplan.runtime.shard import head_range

_RS = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_AG = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


@dataclass
class TraceEvent:
    """Something that is not a collective but changes what runs (e.g. a fallback to baseline)."""

    chunk: int
    what: str
    detail: str


@dataclass
class Tracer:
    """Collects the calls of one rank; `chunk` and `layer` are set by the interpreter as it walks."""

    rank: int
    n: int
    calls: list[CollectiveCall] = field(default_factory=list)
    events: list[TraceEvent] = field(default_factory=list)
    copies: list[tuple[int, int, str]] = field(default_factory=list)  # layout copies (chunk, layer, name): not calls
    chunk: int = 0
    layer: int = 0

    def record(
        self, kind: str, value: str, t: Tensor, sent: float | None = None, planned: bool = True,
        shape: tuple[int, ...] | None = None,
    ) -> None:  # fmt: skip
        """Record a call on `t` (the nccl-tests-size buffer); `shape` names it when `t` is stacked."""
        nbytes = t.numel() * t.element_size()
        dtype = str(t.dtype).removeprefix("torch.")
        sent_bytes = ring_sent_bytes(kind, nbytes, self.n) if sent is None else float(sent)
        shp = tuple(t.shape) if shape is None else shape
        self.calls.append(CollectiveCall(self.chunk, self.layer, kind, value, shp, dtype, nbytes, sent_bytes, planned))


class Comm:
    """The collectives of a plan, on local tensors laid out as `tpplan.placement` says.

    Token-sharded tensors hold `per = ceil(T/N)` rows (the last ranks' tail rows are padding);
    head-sharded ones hold every token and the rank's heads' columns (`head_range`).
    """

    def __init__(self, rank: int, n: int, tracer: Tracer, group: object | None = None) -> None:
        self.rank, self.n, self.tracer, self.group = rank, n, tracer, group
        self.observer: RunObserver | None = None  # sees every traced call (`tpplan.runtime.observe`)

    # -- traced, uniform ---------------------------------------------------------------------

    @observed_collective
    def all_reduce(self, x: Tensor, value: str, planned: bool = True, inplace: bool = False) -> Tensor:
        """P -> R. `inplace` reduces x's own storage: the caller promises nothing reads the partial
        sum afterwards (a copy of a [8192, 7168] bf16 tensor added 13% to the all-reduce on 2xH200)."""
        if self.n == 1:
            return x
        y = x if inplace and x.is_contiguous() else x.contiguous().clone()
        self.tracer.record("all_reduce", value, y, planned=planned)
        dist.all_reduce(y, group=self.group)
        return y

    @observed_collective
    def reduce_scatter(self, x: Tensor, value: str, tokens: int, planned: bool = True) -> Tensor:
        """P [T_pad, W] -> S(tok) [per, W]. `x` should already hold N*per rows (`pad_tokens`); a
        shorter one is padded here (a copy inside the call)."""
        if self.n == 1:
            return x
        per = -(-tokens // self.n)
        full = pad_rows(x, per * self.n).contiguous()
        out = full.new_empty(per, *full.shape[1:])
        self.tracer.record("reduce_scatter", value, full, planned=planned)
        _RS(out, full, group=self.group)
        return out

    @observed_collective
    def all_gather_tokens(self, x: Tensor, value: str, tokens: int, planned: bool = True) -> Tensor:
        """S(tok) [per, W] -> R [T, W] (padding dropped)."""
        if self.n == 1:
            return x[:tokens]
        out = x.new_empty(x.shape[0] * self.n, *x.shape[1:])
        self.tracer.record("all_gather", value, out, planned=planned)
        _AG(out, x.contiguous(), group=self.group)
        return out[:tokens]

    @observed_collective
    def all_gather_heads(self, x: Tensor, value: str, heads: int, planned: bool = True) -> Tensor:
        """S(col) [T, w] -> every rank's heads as gathered, [N, T, w] (block r = rank r's columns);
        `unpack_heads` makes the [T, W] value of it."""
        if self.n == 1:
            return x[None]
        out = x.new_empty(self.n, *x.shape)
        flat = out.view(self.n * x.shape[0], *x.shape[1:])
        self.tracer.record("all_gather", value, out, planned=planned, shape=(x.shape[0], self.n * x.shape[1]))
        _AG(flat, x.contiguous(), group=self.group)
        return out

    @observed_collective
    def tokens_to_heads(self, send: Tensor, value: str, heads: int, tokens: int, planned: bool = True) -> Tensor:
        """S(tok) -> S(col) [T, w] by one all-to-all: rank j gets every rank's rows of its heads.
        `send` is the packed buffer [N, per, w] (`pack_heads`); with one rank, the value [per, W] itself."""
        if self.n == 1:
            return send[:tokens]
        if send.dim() != 3 or send.shape[0] != self.n:
            raise ValueError(f"tokens_to_heads wants the packed [{self.n}, per, w] buffer, got {tuple(send.shape)}")
        recv = torch.empty_like(send)
        self.tracer.record("all_to_all", value, send, planned=planned, shape=(send.shape[1], self.n * send.shape[2]))
        dist.all_to_all_single(recv, send.contiguous(), group=self.group)
        return recv.reshape(self.n * send.shape[1], -1)[:tokens]

    # -- layout copies around collectives (not traced: no bytes move between ranks) ------------

    def pack_heads(self, x: Tensor, heads: int) -> Tensor:
        """S(tok) [per, W] -> the all-to-all send buffer [N, per, w]: block j holds rank j's heads'
        columns of this rank's rows. One strided copy (with N = 1 nothing to pack: `x` itself)."""
        if self.n == 1:
            return x
        per_head = x.shape[1] // heads
        parts = []
        for j in range(self.n):
            lo, hi = head_range(heads, self.n, j)
            parts.append(x[:, lo * per_head : hi * per_head])
        return torch.stack(parts)

    def unpack_copies(self, heads: int) -> bool:
        """True when `unpack_heads` copies (several ranks own distinct heads); False: it returns a view."""
        return self.n > 1 and len(_owners(heads, self.n)) > 1

    def unpack_heads(self, gathered: Tensor, heads: int) -> Tensor:
        """[N, T, w] gathered head blocks -> R [T, W]: each distinct head once (ranks sharing a head
        hold the same columns), blocks side by side. One copy, or a view when one rank's block is all."""
        blocks = [gathered[r] for r in _owners(heads, self.n)]
        return blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=1)

    def pad_tokens(self, x: Tensor, tokens: int) -> Tensor:
        """P [T, W] -> the reduce-scatter input [N*per, W] (zero rows appended); `x` itself when T
        is already a multiple of N."""
        return pad_rows(x, -(-tokens // self.n) * self.n) if self.n > 1 else x

    # -- traced, uneven (MoE dispatch / combine) --------------------------------------------

    @observed_collective
    def all_to_all_rows(self, x: Tensor, send_rows: Sequence[int], recv_rows: Sequence[int], value: str) -> Tensor:
        """Rows [sum(send_rows), W] out in rank order; returns the [sum(recv_rows), W] rows received."""
        out = x.new_empty(sum(recv_rows), *x.shape[1:])
        sent = (sum(send_rows) - send_rows[self.rank]) * _row_bytes(x)
        self.tracer.record("all_to_all", value, x, sent=sent)
        dist.all_to_all_single(out, x.contiguous(), list(recv_rows), list(send_rows), group=self.group)
        return out

    @observed_collective
    def exchange_counts(self, counts: Tensor, value: str) -> Tensor:
        """Each rank's N send counts -> the N counts it will receive (int64)."""
        out = torch.empty_like(counts)
        self.tracer.record("all_to_all", value, counts, sent=(self.n - 1) * counts.element_size())
        dist.all_to_all_single(out, counts.contiguous(), group=self.group)
        return out

    # -- untraced: verification only ---------------------------------------------------------

    def gather_full_tokens(self, x: Tensor, tokens: int) -> Tensor:
        """Verification only (not traced): S(tok) rows of every rank, padding dropped."""
        if self.n == 1:
            return x[:tokens]
        out = x.new_empty(x.shape[0] * self.n, *x.shape[1:])
        _AG(out, x.contiguous(), group=self.group)
        return out[:tokens]

    def sum_full(self, x: Tensor) -> Tensor:
        """Verification only (not traced): the true value of a partial sum."""
        if self.n == 1:
            return x
        y = x.contiguous().clone()
        dist.all_reduce(y, group=self.group)
        return y

    def gather_full_heads(self, x: Tensor, heads: int) -> Tensor:
        """Verification only (not traced): the full columns of a head-sharded value."""
        if self.n == 1:
            return x
        out = x.new_empty(self.n, *x.shape)
        _AG(out.view(self.n * x.shape[0], *x.shape[1:]), x.contiguous(), group=self.group)
        return self.unpack_heads(out, heads)


def _owners(heads: int, n: int) -> list[int]:
    """One rank per distinct head block, in head order (ranks sharing a GQA head hold the same columns)."""
    return [r for _, r in sorted({head_range(heads, n, r)[0]: r for r in range(n)}.items())]


def _row_bytes(x: Tensor) -> int:
    n = 1
    for d in x.shape[1:]:
        n *= d
    return n * x.element_size()


def pad_rows(x: Tensor, rows: int) -> Tensor:
    """`x` with zero rows appended up to `rows`."""
    if x.shape[0] >= rows:
        return x
    return torch.cat([x, x.new_zeros(rows - x.shape[0], *x.shape[1:])], dim=0)


__all__ = ["Comm", "TraceEvent", "Tracer", "pad_rows"]
