"""Reference softmax attention (MLA, GQA, DSA's indexer) with a KV cache for chunked prefill.

Part of `tpplan.runtime.kernels` (the module the executor calls, which re-exports these); the
conventions are its docstring's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from tpplan.runtime import fast_kernels as _fast  # GPU fast paths: one-line hooks marked `# fast:`
from tpplan.runtime.kernels_local import Rope, apply_rope, rms_norm, rope_cos_sin

# ----------------------------------------------------------------------------------------------
# Softmax attention (MLA and GQA) with a KV cache for chunked prefill


def causal_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float,
    keep: Tensor | None = None,
    *,
    window: int | None = None,
    chunk: int | None = None,
    sinks: Tensor | None = None,
) -> Tensor:
    """q [T, n, d], k [S, n, d], v [S, n, dv] with the T queries being the last T of S positions
    (key s is absolute position s). `keep` [T, S] (bool, optional): keys each query may attend to
    besides causality (DSA's top-k). `window`: a query at p sees keys (p - window, p] (HF's sliding
    window); `chunk`: keys of its own chunk [p // chunk * chunk, p] (Llama 4); `sinks` [n]: a learned
    logit per head that joins the softmax denominator and contributes no value (gpt-oss)."""
    plain = keep is None and window is None and chunk is None and sinks is None
    if plain and _fast.use(q, "causal_attention"):  # fast:
        return _fast.causal_attention(q, k, v, scale)
    t, s = q.shape[0], k.shape[0]
    rows = query_block(t, q.shape[1] * s)
    out = q.new_empty(t, q.shape[1] * v.shape[-1])
    k, v = k.float(), v.float()  # once, not per block
    for a in range(0, t, rows):  # scores of `rows` queries at a time: fp32 [heads, rows, S] stays small
        b = min(t, a + rows)
        part = None if keep is None else keep[a:b]
        out[a:b] = _attention_rows(q[a:b], k, v, scale, s - t + a, part, window, chunk, sinks)
    return out


SCORE_BUDGET = 2**28  # fp32 score elements (1 GiB) one block of the reference attention or indexer holds


def query_block(t: int, per_query: int, budget: int = SCORE_BUDGET) -> int:
    """How many of `t` queries to score at once so that `per_query` scores each stay within `budget`
    (a power of two, at least 1): DSA's indexer at 8K x 16K x 64 heads needed 32 GiB at once."""
    rows = max(1, budget // max(1, per_query))
    return t if rows >= t else 1 << (rows.bit_length() - 1)


def _attention_rows(
    q: Tensor, k: Tensor, v: Tensor, scale: float, first: int, keep: Tensor | None, window: int | None,
    chunk: int | None, sinks: Tensor | None,
) -> Tensor:  # fmt: skip
    """The reference softmax for queries at absolute positions first, first+1, ... over all S keys."""
    t, s = q.shape[0], k.shape[0]
    scores = torch.einsum("tnd,snd->nts", q.float(), k.float()) * scale
    qpos = torch.arange(first, first + t, device=q.device)[:, None]
    kpos = torch.arange(s, device=q.device)[None, :]
    mask = kpos > qpos
    if window is not None:
        mask |= kpos <= qpos - window
    if chunk is not None:
        mask |= kpos < (qpos // chunk) * chunk
    if keep is not None:
        mask |= ~keep
    scores = scores.masked_fill(mask[None], float("-inf"))
    if sinks is not None:
        sink = sinks.float().reshape(-1, 1, 1).expand(scores.shape[0], t, 1)
        probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    out = torch.einsum("nts,snd->tnd", probs, v.float())
    return out.reshape(t, -1).to(q.dtype)


def index_mask(indices: Tensor, keys: int) -> Tensor:
    """[T, keys] bool, True at each query's selected key positions (DSA top-k indices [T, k])."""
    keep = torch.zeros(indices.shape[0], keys, dtype=torch.bool, device=indices.device)
    return keep.scatter_(1, indices.long(), True)


def append_cache(cache: dict[str, Tensor] | None, name: str, new: Tensor) -> Tensor:
    if cache is None:
        return new
    full = new if name not in cache else torch.cat([cache[name], new], dim=0)
    cache[name] = full
    return full


def mla_attention(
    q: Tensor,
    kv: Tensor,
    k_rope: Tensor,
    *,
    nope_dim: int,
    rope_dim: int,
    v_dim: int,
    positions: Tensor,
    rope: Rope | None,
    scale: float,
    cache: dict[str, Tensor] | None = None,
    keep: Tensor | None = None,
) -> Tensor:
    """MLA core: q [T, n*(nope+rope)], kv [T, n*(nope+v)], k_rope [T, rope] shared by every head.

    `rope=None` is NoPE (Kimi-Linear): the rope slice is concatenated without rotation. `cache`
    (per layer, per rank) holds the keys/values of earlier chunks so chunked prefill is exact.
    `keep` [T, S]: the keys each query may read besides causality (DSA's top-k selection).
    """
    t = q.shape[0]
    qh = q.reshape(t, -1, nope_dim + rope_dim)
    n = qh.shape[1]
    kvh = kv.reshape(t, n, nope_dim + v_dim)
    k_nope, v = kvh[..., :nope_dim], kvh[..., nope_dim:]
    q_nope, q_rot = qh[..., :nope_dim], qh[..., nope_dim:]
    k_rot = k_rope.reshape(t, 1, rope_dim)
    if rope is not None and rope_dim:
        cos, sin = rope_cos_sin(positions, rope_dim, rope)
        q_rot = apply_rope(q_rot, cos, sin, rope.interleave)
        k_rot = apply_rope(k_rot, cos, sin, rope.interleave)
    qf = torch.cat([q_nope, q_rot], dim=-1)
    kf = torch.cat([k_nope, k_rot.expand(t, n, rope_dim)], dim=-1)
    kf = append_cache(cache, "k", kf)
    v = append_cache(cache, "v", v)
    if keep is None:  # the plain call, which a benchmark may route to its own kernel (bench/serving_kernels)
        return causal_attention(qf, kf, v, scale)
    return causal_attention(qf, kf, v, scale, keep)


def dsa_indexer(
    q: Tensor,
    k: Tensor,
    w: Tensor,
    *,
    head_dim: int,
    rope_dim: int,
    positions: Tensor,
    rope: Rope,
    topk: int,
    k_norm_weight: Tensor,
    k_norm_bias: Tensor,
    cache: dict[str, Tensor] | None = None,
) -> Tensor:
    """DSA lightning indexer (DeepSeek-V3.2, GLM-5): the top-`topk` key positions per query, [T, k] int64.

    q [T, H*D] = wq_b(q latent), k [T, D] = wk(x), w [T, H] = weights_proj(x). The key is LayerNorm'd
    (eps 1e-6); RoPE rotates the first `rope_dim` dims of each head (layout: `rope.interleave`);
    score[t, s] = sum_h w[t, h] H^-1/2 relu(D^-1/2 q[t, h] . k[s]) over causal keys, as transformers'
    DeepseekV32Indexer (which skips the reference's Hadamard rotation: orthogonal, dot products kept).
    Ties (exact zeros where every head's ReLU is 0) go to the earlier key: a stable sort, so a
    chunked run selects what the one-shot run selects.
    """
    t = q.shape[0]
    cos, sin = rope_cos_sin(positions, rope_dim, rope)
    qh = indexer_query(q, head_dim, rope_dim, cos, sin, rope.interleave)
    heads = qh.shape[1]
    kf = append_cache(cache, "k", indexer_key(k, k_norm_weight, k_norm_bias, rope_dim, cos, sin, rope.interleave))
    s = kf.shape[0]
    wh = w.float() * heads**-0.5
    out = torch.empty(t, min(topk, s), dtype=torch.int64, device=q.device)
    rows = query_block(t, heads * s)
    for a in range(0, t, rows):  # [rows, heads, S] fp32 scores at a time (the whole [T, H, S] was 32 GiB)
        b = min(t, a + rows)
        scores = torch.relu(torch.einsum("thd,sd->ths", qh[a:b], kf) * head_dim**-0.5)
        index = torch.einsum("th,ths->ts", wh[a:b], scores)
        future = torch.arange(s, device=q.device)[None, :] > positions[a:b, None]
        index = index.masked_fill(future, float("-inf"))
        out[a:b] = torch.sort(index, dim=-1, descending=True, stable=True).indices[:, : min(topk, s)]
    return out


def indexer_query(q: Tensor, head_dim: int, rope_dim: int, cos: Tensor, sin: Tensor, interleave: bool) -> Tensor:
    """The indexer's queries [T, H, D] in fp32, RoPE on each head's first `rope_dim` dims (`dsa_indexer`)."""
    qh = q.float().reshape(q.shape[0], -1, head_dim)
    return torch.cat([apply_rope(qh[..., :rope_dim], cos, sin, interleave), qh[..., rope_dim:]], dim=-1)


def indexer_key(
    k: Tensor, norm_weight: Tensor, norm_bias: Tensor, rope_dim: int, cos: Tensor, sin: Tensor, interleave: bool
) -> Tensor:  # fmt: skip
    """The indexer's new keys [T, D] in fp32: LayerNorm (eps 1e-6), then RoPE on the first `rope_dim` dims."""
    kf = F.layer_norm(k.float(), (k.shape[-1],), norm_weight.float(), norm_bias.float(), 1e-6)
    k_rot = apply_rope(kf[:, None, :rope_dim], cos, sin, interleave)[:, 0]
    return torch.cat([k_rot, kf[:, rope_dim:]], dim=-1)


def gqa_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    head_dim: int,
    positions: Tensor,
    rope: Rope,
    rotary_dim: int,
    q_norm: Tensor | None = None,
    k_norm: Tensor | None = None,
    eps: float = 1e-6,
    norm_offset: float = 0.0,
    cache: dict[str, Tensor] | None = None,
    window: int | None = None,
    chunk: int | None = None,
    sinks: Tensor | None = None,
    scale: float | None = None,
    qk_l2norm: bool = False,
    temperature: tuple[float, float] | None = None,
) -> Tensor:
    """GQA core: optional per-head q/k RMSNorm, partial rotary (first `rotary_dim` dims), grouped KV,
    optional sliding window, attention chunks and per-head sinks (`causal_attention`).

    Query head h reads KV head h // (n / kv), which stays right on a head slice as long as a rank
    holds whole KV groups. The cache keeps every key (exact for windows too; only memory differs).
    """
    qh, kh, vh = gqa_heads(
        q, k, v, head_dim=head_dim, positions=positions, rope=rope, rotary_dim=rotary_dim, q_norm=q_norm,
        k_norm=k_norm, eps=eps, norm_offset=norm_offset, cache=cache, qk_l2norm=qk_l2norm, temperature=temperature,
    )  # fmt: skip
    kh, vh = repeat_kv(kh, vh, qh.shape[1])
    s = head_dim**-0.5 if scale is None else scale
    return causal_attention(qh, kh, vh, s, window=window, chunk=chunk, sinks=sinks)


def gqa_heads(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    head_dim: int,
    positions: Tensor,
    rope: Rope,
    rotary_dim: int,
    q_norm: Tensor | None = None,
    k_norm: Tensor | None = None,
    eps: float = 1e-6,
    norm_offset: float = 0.0,
    cache: dict[str, Tensor] | None = None,
    qk_l2norm: bool = False,
    temperature: tuple[float, float] | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """`gqa_attention`'s q [T, n, d] and the cache's k, v [S, kv, d] (KV heads not yet repeated): q/k norms,
    partial RoPE, Llama 4's L2 norm and temperature, the cache append."""
    t = q.shape[0]
    qh, kh, vh = q.reshape(t, -1, head_dim), k.reshape(t, -1, head_dim), v.reshape(t, -1, head_dim)
    if q_norm is not None:
        qh = rms_norm(qh, q_norm, eps, norm_offset)
    if k_norm is not None:
        kh = rms_norm(kh, k_norm, eps, norm_offset)
    if rotary_dim:
        cos, sin = rope_cos_sin(positions, rotary_dim, rope)
        qh = torch.cat([apply_rope(qh[..., :rotary_dim], cos, sin, rope.interleave), qh[..., rotary_dim:]], -1)
        kh = torch.cat([apply_rope(kh[..., :rotary_dim], cos, sin, rope.interleave), kh[..., rotary_dim:]], -1)
    if qk_l2norm:  # Llama 4: RMS-normalise each head's q and k (no weight), after RoPE
        qh = (qh.float() * torch.rsqrt(qh.float().pow(2).mean(-1, keepdim=True) + eps)).to(qh.dtype)
        kh = (kh.float() * torch.rsqrt(kh.float().pow(2).mean(-1, keepdim=True) + eps)).to(kh.dtype)
    if temperature is not None:  # Llama 4 NoPE layers: log-position query scaling (arXiv 2501.19399)
        floor_scale, attn_scale = temperature
        t_scale = torch.log1p(torch.floor((positions.float() + 1.0) / floor_scale)) * attn_scale + 1.0
        qh = (qh * t_scale[:, None, None].to(qh.device)).to(qh.dtype)
    return qh, append_cache(cache, "k", kh), append_cache(cache, "v", vh)


def repeat_kv(k: Tensor, v: Tensor, heads: int) -> tuple[Tensor, Tensor]:
    """k, v [S, kv, d] with each KV head repeated to `heads` query heads (GQA; unchanged where kv == heads)."""
    rep = heads // k.shape[1]
    return (k, v) if rep == 1 else (k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1))


__all__ = [
    "SCORE_BUDGET",
    "append_cache",
    "causal_attention",
    "dsa_indexer",
    "gqa_attention",
    "gqa_heads",
    "index_mask",
    "indexer_key",
    "indexer_query",
    "mla_attention",
    "query_block",
    "repeat_kv",
]
