"""DSA's lightning indexer as the engines run it: one fused Triton kernel for the index scores, then top-k.

The runtime's reference (`runtime.kernels.dsa_indexer`) builds fp32 [rows, H, S] scores a block of
queries at a time and sorts each row stably: right, but far slower than what an engine runs, so the bench's
DeepSeek-V3.2 / GLM-5.1 layers were dominated by it. The engines call DeepGEMM's fused MQA-logits kernel:

- vLLM 0.34.0, vllm/model_executor/layers/sparse_attn_indexer.py, `sparse_attn_indexer` (prefill): for
  row chunks bounded by a logits budget, `fp8_fp4_mqa_logits` (vllm/utils/deep_gemm.py, DeepGEMM) returns
  [rows, S] logits = sum_h w[t, h] relu(q[t, h] . k[s]) from fp8 q and k, then a per-row top-k;
- SGLang 0.5.23, sglang/srt/layers/attention/dsa/dsa_indexer.py, `Indexer._get_topk_ragged`: the same
  DeepGEMM kernel through `resolve_fp8_mqa_logits_fn()` (rows bounded by `mqa_logits_budget_bytes`),
  then `metadata.topk_transform`.

`index_scores` is that kernel's work in Triton: each program holds one key tile [D, BS] and loops over the
H heads, accumulating w[t, h] relu(q[t, h] . k[s]) for its [BT, BS] tile in fp32; the [T, H, S] scores are
never stored, only [rows, S] fp32 logits (rows bounded by `kernels_attention.SCORE_BUDGET`, as the engines'
budgets). Key tiles wholly after a block's last query are skipped (written -inf). Inputs bf16 (q after RoPE,
k after LayerNorm and RoPE, as the reference computes them in fp32, then rounded); fp32 accumulation. Not fp8:
DeepGEMM's fp8 e4m3 with per-token key scales is not reproduced here.

Needs triton (imported here at the top: import this module only where `available()` said yes).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from tpplan.runtime import kernels_attention as KA
from tpplan.runtime.kernels_local import Rope, rope_cos_sin

BT, BS = 64, 128  # queries x keys per program (the score tile: 32 KiB of fp32 accumulators)


@triton.jit
def _index_scores_kernel(
    q, k, w, pos, out, T, S, H: tl.constexpr, D: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_S: tl.constexpr
):  # fmt: skip
    """out[t, s] = sum_h w[t, h] relu(q[t, h] . k[s]) for keys s <= pos[t], -inf after. q [T, H, D], k [S, D],
    w [T, H] fp32 (scales folded in), pos [T] int64, out [T, S] fp32; contiguous. Key tiles on axis 0, so
    programs side by side share one query block (it stays in L2)."""
    i_s, i_t = tl.program_id(0), tl.program_id(1)
    o_t = i_t * BLOCK_T + tl.arange(0, BLOCK_T)
    o_s = i_s * BLOCK_S + tl.arange(0, BLOCK_S)
    o_d = tl.arange(0, D)
    m_t, m_s = o_t < T, o_s < S
    acc = tl.zeros([BLOCK_T, BLOCK_S], dtype=tl.float32)
    b_pos = tl.load(pos + o_t, mask=m_t, other=-1)
    if i_s * BLOCK_S <= tl.max(b_pos, axis=0):  # some key here is not after every query
        b_k = tl.load(k + o_s[None, :].to(tl.int64) * D + o_d[:, None], mask=m_s[None, :], other=0.0)  # [D, BS]
        for h in range(H):
            p_q = q + (o_t[:, None].to(tl.int64) * H + h) * D + o_d[None, :]
            b_q = tl.load(p_q, mask=m_t[:, None], other=0.0)  # [BT, D]
            b_w = tl.load(w + o_t.to(tl.int64) * H + h, mask=m_t, other=0.0)  # [BT]
            acc += tl.maximum(tl.dot(b_q, b_k), 0.0) * b_w[:, None]
    causal = o_s[None, :] <= b_pos[:, None]
    acc = tl.where(causal, acc, float("-inf"))
    p_o = out + o_t[:, None].to(tl.int64) * S + o_s[None, :]
    tl.store(p_o, acc, mask=m_t[:, None] & m_s[None, :])


def index_scores(q: Tensor, k: Tensor, w: Tensor, positions: Tensor) -> Tensor:
    """[T, S] fp32 index logits of queries q [T, H, D] at `positions` [T] over keys k [S, D] (same dtype; key s
    at position s), weights w [T, H] fp32 with every scale folded in; keys after a query are -inf."""
    t, h, d = q.shape
    s = k.shape[0]
    out = torch.empty(t, s, dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(s, BS), triton.cdiv(t, BT))
    _index_scores_kernel[grid](
        q.contiguous(), k.contiguous(), w.float().contiguous(), positions.to(torch.int64).contiguous(), out, t, s,
        H=h, D=d, BLOCK_T=BT, BLOCK_S=BS,
    )  # fmt: skip
    return out


def fused_dsa_indexer(
    q: Tensor, k: Tensor, w: Tensor, *, head_dim: int, rope_dim: int, positions: Tensor, rope: Rope, topk: int,
    k_norm_weight: Tensor, k_norm_bias: Tensor, cache: dict[str, Tensor] | None = None,
) -> Tensor:  # fmt: skip
    """`runtime.kernels.dsa_indexer`'s contract ([T, min(topk, S)] int64 key positions), by `index_scores`
    a block of queries at a time (RoPE on that block's queries only), then `torch.topk` per row.

    The cache holds the keys in the inputs' half precision (the reference's fp32 cache is cast once per
    call).

    Ties: `torch.topk` does not keep the earlier key first, unlike the reference's stable sort. Two finite
    scores tie only when their fp32 sums are equal (in practice keys no head scores above zero, score 0), and
    a query with fewer than `topk` earlier keys fills its slots with later ones (-inf), which attention masks
    by causality anyway. So the kept set can differ from the reference only among keys scored alike, and in
    bf16 near the top-k boundary; the bench accepts that because it times the work, and the attention after
    the indexer costs the same whichever keys are kept (`gpu_check.py` measures the overlap on the GPU)."""
    t = q.shape[0]
    cos, sin = rope_cos_sin(positions, rope_dim, rope)
    half = q.dtype if q.dtype in (torch.float16, torch.bfloat16) else torch.bfloat16
    new = KA.indexer_key(k, k_norm_weight, k_norm_bias, rope_dim, cos, sin, rope.interleave).to(half)
    if cache is not None and "k" in cache and cache["k"].dtype != half:
        cache["k"] = cache["k"].to(half)
    keys = KA.append_cache(cache, "k", new)
    s, heads = keys.shape[0], q.shape[1] // head_dim
    wf = w.float() * (heads**-0.5 * head_dim**-0.5)  # relu(c x) = c relu(x) for c > 0: D^-1/2 folded into w
    out = torch.empty(t, min(topk, s), dtype=torch.int64, device=q.device)
    rows = KA.query_block(t, s)
    for a in range(0, t, rows):  # [rows, S] fp32 logits at a time, as the engines' logits budgets
        b = min(t, a + rows)
        qh = KA.indexer_query(q[a:b], head_dim, rope_dim, cos[a:b], sin[a:b], rope.interleave).to(half)
        logits = index_scores(qh, keys, wf[a:b], positions[a:b])
        out[a:b] = torch.topk(logits, min(topk, s), dim=-1).indices
    return out


__all__ = ["BS", "BT", "fused_dsa_indexer", "index_scores"]
