"""Attention variants for the benchmark that skip the keys a mask hides: sliding windows, chunks and sinks.

The runtime's reference attention scores every query against every key (`runtime.kernels.causal_attention`),
and a single [T, S] boolean mask through SDPA (what the bench ran before) still does the whole T x S work:
a 128-token window at 8K tokens is 1/64 of it, so the bench measured many times what an engine's windowed
kernel does. Here each variant touches only the keys it may read, with the same semantics (the CPU tests
compare them with the reference):

- `banded_attention` (Gemma, gpt-oss's sliding layers; the bench's default without fla): queries in blocks, each
  against the keys its window reaches, one SDPA call with a band mask (the memory-efficient kernel);
  `windowed_attention` the same by flash alone (blocks of window - 1 queries against their own keys and
  the block before, two square causal calls, the second on reversed rows, merged by log-sum-exp), which
  ran 1.5x the band's time on an H100 (its merge's many small launches: docs/benchmarks.md).
- `fla_window_attention` (the bench's window kernel on CUDA where fla imports): fla's Triton flash kernel
  `parallel_attn`, which skips the key blocks outside each query block's window, with GQA and sinks
  in the kernel; the band kernel stays the fallback (CPU, no fla, head dims over 256).
- `chunked_attention` (Llama 4): each chunk's queries against that chunk's keys only, causal, by the
  serving path (SDPA flash).
- `sinks` (gpt-oss): a learned logit per head joins the softmax denominator and adds no value, so
  out = out' * sigmoid(lse - sink) from the kernel's own log-sum-exp (flash split as prefix + causal chunk
  and merged, as `serving_kernels.cascade_attention` does; the memory-efficient kernel in a window).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor

from tpplan.runtime.fast_kernels import optional_callable

NEG_INF = float("-inf")


def block_for(window: int) -> int:
    """Queries per block: half the window (the block's band then wastes a third of its key tile), 64-1024."""
    return max(64, min(1024, window // 2))


def _heads_first(x: Tensor, dtype: torch.dtype) -> Tensor:
    return x.transpose(0, 1).unsqueeze(0).to(dtype)  # [T, n, d] -> [1, n, T, d]


def _with_lse(
    q: Tensor, k: Tensor, v: Tensor, scale: float, bias: Tensor | None, causal: bool
) -> tuple[Tensor, Tensor]:
    """(out [B, n, T, dv], lse [B, n, T] fp32) of softmax attention, q/k/v [B, n, T|L, d]; `bias` additive
    [B, 1|n, T, L] or None; `causal` top-left (used only with T == L). Flash on CUDA where no bias is
    given and the head fits it (a narrower v zero-padded), else the memory-efficient kernel; torch's
    flash-for-CPU kernel elsewhere (each returns the row log-sum-exp)."""
    dv = v.shape[-1]
    if dv < q.shape[-1] and (not q.is_cuda or (bias is None and q.shape[-1] <= 256)):
        v = F.pad(v, (0, q.shape[-1] - dv))  # flash needs one head size: a narrower v zero-padded (MLA)
    if q.is_cuda:
        if bias is None and q.shape[-1] == v.shape[-1] and q.shape[-1] <= 256:
            out, lse = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)[:2]
        else:
            b = None if bias is None else bias.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
            out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, b, True, 0.0, causal,
                                                                              scale=scale)[:2]  # fmt: skip
        return out[..., :dv], lse[..., : q.shape[2]].float()
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, attn_mask=bias,
                                                                          scale=scale)  # fmt: skip
    return out[..., :dv], lse.float()


def apply_sinks(out: Tensor, lse: Tensor, sinks: Tensor) -> Tensor:
    """out [B, n, T, dv] with each head's sink logit joining the softmax denominator: out * sigmoid(lse - sink)."""
    keep = torch.sigmoid(lse - sinks.float().reshape(1, -1, 1))
    return (out.float() * keep[..., None]).to(out.dtype)


def sink_attention(q: Tensor, k: Tensor, v: Tensor, scale: float, sinks: Tensor) -> Tensor:
    """`kernels.causal_attention(..., sinks=)` without a window: the cached prefix without a mask and the
    chunk with the causal one, each returning its log-sum-exp, merged, then the sinks applied."""
    t, s = q.shape[0], k.shape[0]
    ctx = s - t
    dv = v.shape[-1]
    qh, kh, vh = (_heads_first(z, q.dtype) for z in (q, k, v))
    o, lse = _with_lse(qh, kh[:, :, ctx:], vh[:, :, ctx:], scale, None, True)
    if ctx > 0:
        o1, lse1 = _with_lse(qh, kh[:, :, :ctx], vh[:, :, :ctx], scale, None, False)
        both = torch.logaddexp(lse, lse1)
        o = (o.float() * (lse - both).exp()[..., None] + o1.float() * (lse1 - both).exp()[..., None]).to(q.dtype)
        lse = both
    return apply_sinks(o, lse, sinks)[0, ..., :dv].transpose(0, 1).reshape(t, -1)


def windowed_attention(q: Tensor, k: Tensor, v: Tensor, scale: float, window: int,
                       sinks: Tensor | None = None) -> Tensor:  # fmt: skip
    """`kernels.causal_attention(..., window=, sinks=)` by flash alone: queries in blocks of B = window - 1,
    each block against its own B keys (causal) and the B keys before them, where a query at offset j may
    read offsets r >= j: reversed in both, that is causal again (the two square flash calls merged by
    their log-sum-exp). The first queries, whose window reaches before position 0, take `banded_attention`."""
    t, s = q.shape[0], k.shape[0]
    b = window - 1
    head = min(t, max(0, b - (s - t))) if b >= 2 else t  # queries whose window starts before key 0
    parts = (
        [] if head == 0 else [banded_attention(q[:head], k[: s - t + head], v[: s - t + head], scale, window, sinks)]
    )
    rest = t - head
    if rest == 0:
        return parts[0]
    n, dv, nb = q.shape[1], v.shape[-1], -(-rest // b)
    first = s - t + head  # position of the first query here (>= b)
    pad = nb * b - rest
    kk = F.pad(k[first - b :], (0, 0, 0, 0, 0, pad)).reshape(nb + 1, b, n, -1).transpose(1, 2).to(q.dtype)
    vv = F.pad(v[first - b :], (0, 0, 0, 0, 0, pad)).reshape(nb + 1, b, n, dv).transpose(1, 2).to(q.dtype)
    qq = F.pad(q[head:], (0, 0, 0, 0, 0, pad)).reshape(nb, b, n, -1).transpose(1, 2)
    with torch.no_grad():
        o1, lse1 = _with_lse(qq, kk[1:], vv[1:], scale, None, True)  # own block, causal
        o2, lse2 = _with_lse(qq.flip(2), kk[:-1].flip(2), vv[:-1].flip(2), scale, None, True)  # keys before it
        o2, lse2 = o2.flip(2), lse2.flip(2)
        lse = torch.logaddexp(lse1, lse2)
        out = o1.float() * (lse1 - lse).exp()[..., None] + o2.float() * (lse2 - lse).exp()[..., None]
        out = out.to(q.dtype) if sinks is None else apply_sinks(out.to(q.dtype), lse, sinks)
    parts.append(out.transpose(1, 2).reshape(nb * b, n * dv)[:rest])
    return torch.cat(parts) if len(parts) > 1 else parts[0]


def banded_attention(
    q: Tensor, k: Tensor, v: Tensor, scale: float, window: int, sinks: Tensor | None = None, block: int | None = None
) -> Tensor:  # fmt: skip
    """`kernels.causal_attention(..., window=, sinks=)`: q [T, n, d] the last T of S positions, each query at
    p reads keys (p - window, p]. Blocks of `block` queries read `block + window - 1` keys (a multiple of 16:
    the memory-efficient kernel's bias alignment), front-padded with zeros the mask hides; one SDPA call
    with a band mask: the bench's window kernel (`windowed_attention` takes it for the queries whose window
    starts before the first key)."""
    t, s = q.shape[0], k.shape[0]
    n, dv = q.shape[1], v.shape[-1]
    blk = block or block_for(window)
    nb = -(-t // blk)
    span = -(-(blk + window - 1) // 16) * 16
    front = window - 1
    back = nb * blk - t + span
    kp = F.pad(k, (0, 0, 0, 0, front, back))  # padded position i is key i - front
    vp = F.pad(v, (0, 0, 0, 0, front, back))
    first = torch.arange(nb, device=q.device) * blk + (s - t)  # each block's first query position
    idx = (first[:, None] + torch.arange(span, device=q.device)[None, :]).reshape(-1)  # padded key positions
    kb = kp.index_select(0, idx).reshape(nb, span, n, -1).transpose(1, 2).to(q.dtype)
    vb = vp.index_select(0, idx).reshape(nb, span, n, dv).transpose(1, 2).to(q.dtype)
    qb = F.pad(q, (0, 0, 0, 0, 0, nb * blk - t)).reshape(nb, blk, n, -1).transpose(1, 2)
    j = torch.arange(blk, device=q.device)[:, None]
    m = torch.arange(span, device=q.device)[None, :]
    band = (m >= j) & (m <= j + window - 1)  # key m of a block is position first - window + 1 + m
    real = m[None] >= (front - first)[:, None, None]  # not a front pad (position >= 0)
    allowed = (band[None] & real)[:, None]  # [nb, 1, blk, span]
    with torch.no_grad():
        if sinks is None:
            out = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=allowed, scale=scale)
        else:
            bias = torch.zeros(allowed.shape, dtype=q.dtype, device=q.device).masked_fill_(~allowed, NEG_INF)
            out, lse = _with_lse(qb, kb, vb, scale, bias, False)
            out = apply_sinks(out, lse, sinks)
    return out.transpose(1, 2).reshape(nb * blk, n * dv)[:t]


WindowKernel = Callable[..., Tensor]  # fla's parallel_attn contract: (q, k, v, scale=, window_size=, sink_bias=)


def fla_parallel_attn() -> WindowKernel | None:
    """fla's `fla.ops.attn.parallel.parallel_attn` (fla 0.6.0) where it imports (it needs triton), else None."""
    return cast(WindowKernel | None, optional_callable("fla.ops.attn.parallel", "parallel_attn"))


def fla_window_attention(
    q: Tensor, k: Tensor, v: Tensor, scale: float, window: int, sinks: Tensor | None = None,
    attn: WindowKernel | None = None,
) -> Tensor:  # fmt: skip
    """`kernels.causal_attention(..., window=, sinks=)` by fla's `parallel_attn` (fla 0.6.0,
    fla/ops/attn/parallel.py): a Triton flash kernel that starts each 128-query block's key loop at the
    first key its window reaches (`i_start`), so the work is about T x window, not T x S. It takes
    [B, T, H, D] with q and k of one length T (its window and causal masks compare positions within
    that T), head dims up to 256 (`NK == 1`: Gemma 3's 256 and gpt-oss's 64 fit), any float dtype,
    GQA (HQ a multiple of H; here k and v come already repeated to q's heads, as `gqa_attention`
    passes them) and per-head sinks in the denominator only (`sink_bias` [HQ]).

    q [T, n, d] are the last T of S positions. After a cache (S > T) only the keys from
    `ctx - window + 1` can be read, so k and v are cut there and q is front-padded with as many zero
    rows as cached keys are kept (at most window - 1), their outputs dropped: exact, at the cost of
    those extra query rows (Gemma 3's 1023 beside a 1K-token chunk, gpt-oss's 127). Value heads wider
    than `V_TILE` run as slices of it. `attn`: the kernel (default fla's; the CPU tests pass a reference
    with the same contract)."""
    run = attn or fla_parallel_attn()
    if run is None:
        raise RuntimeError("fla_window_attention needs fla (fla.ops.attn.parallel) with triton")
    t, s = q.shape[0], k.shape[0]
    ctx = s - t
    lo = max(0, ctx - window + 1)  # the first key any of the T queries may read
    front = ctx - lo  # cached keys kept: that many zero query rows go in front
    qq = F.pad(q, (0, 0, 0, 0, front, 0)) if front else q
    bias = None if sinks is None else sinks.float()
    kk, vv = k[lo:].unsqueeze(0).to(q.dtype), v[lo:].unsqueeze(0).to(q.dtype)
    with torch.no_grad():  # value columns V_TILE at a time: each slice's output is exact (the same scores)
        parts = [run(qq.unsqueeze(0), kk, vv[..., c : c + V_TILE], scale=scale, window_size=window, sink_bias=bias)
                 for c in range(0, vv.shape[-1], V_TILE)]  # fmt: skip
    out = parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)
    return out[0, front:].reshape(t, -1).to(q.dtype)


# Value columns per `parallel_attn` call. fla 0.6.0 on Hopper tiles V whole up to 256 (BV = min(256, V), BK = K,
# 64-key blocks, 3 stages): at Gemma 3's K = V = 256 that asks 262,144 B of shared memory, above an H100's
# 232,448 (Triton OutOfResources, docs/benchmarks/h100-2026-12-06d/call2/check.txt); 128-wide slices need about
# 208 KiB. A slice recomputes the scores, so d = 256 runs two passes over the window's keys.
V_TILE = 128


def chunked_attention(q: Tensor, k: Tensor, v: Tensor, scale: float, chunk: int,
                      causal: Callable[[Tensor, Tensor, Tensor, float], Tensor]) -> Tensor:  # fmt: skip
    """`kernels.causal_attention(..., chunk=)`: each attention chunk's queries against that chunk's keys by
    `causal(q, k, v, scale)` (the serving path: lower-right causal, the queries the last of the keys)."""
    t, s = q.shape[0], k.shape[0]
    outs = []
    lo = s - t
    while lo < s:
        c0 = lo // chunk * chunk
        hi = min(s, c0 + chunk)
        outs.append(causal(q[lo - (s - t) : hi - (s - t)], k[c0:hi], v[c0:hi], scale))
        lo = hi
    return torch.cat(outs)


__all__ = [
    "apply_sinks",
    "banded_attention",
    "block_for",
    "chunked_attention",
    "fla_parallel_attn",
    "fla_window_attention",
    "sink_attention",
    "windowed_attention",
]
