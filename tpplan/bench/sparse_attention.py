"""DSA's sparse attention as the engines run it: each query attends only its top-k keys, gathered by index.

The runtime's reference (`kernels_attention.causal_attention` with `keep`) scores every query against all S
keys in fp32 and masks all but the selected ones: [heads, rows, S] per query block, S/topk times the work.
The engines gather the selected rows instead:

- vLLM 0.34.0, vllm/v1/attention/backends/mla/flashmla_sparse.py, `FlashMLASparseImpl.forward_mqa`: "for the
  sparse FlashMLA kernels the kernels want to use MQA 576/512 approach for both prefill and decode", i.e. the
  absorbed (latent) form: every head's query [kv_lora_rank + rope] = 576 against one shared latent row per
  key, values the row's first 512; `_bf16_flash_mla_kernel` calls FlashMLA's `flash_mla_sparse_fwd(q, kv,
  topk_indices [T, 1, topk], scale)`. A prefill whose longest sequence is at most topk tokens runs dense MHA
  instead (vllm/model_executor/layers/attention/sparse_mla_attention.py, `_use_dense_mha_prefill`).
- SGLang 0.5.23 resolves DSA prefill to flashmla_sparse on SM90 (`_dsa_split_backend_resolution`, per the
  issue; not re-read here).

`sparse_attention` is that work in Triton: one program per (query, KV head, block of that KV head's query
heads) gathers its query's selected key rows BLOCK_K at a time, scores them with `tl.dot` (the heads of one
KV head share each gathered row: G = H / Hk rows of the dot, 128 in the absorbed MLA form, 1 in the
runtime's per-head layout), and keeps an online softmax (running max, denominator, fp32 accumulator of the
values). Nothing of size S is formed. Head dims: D split as a power of two plus a power-of-two remainder (576 =
512 + 64, MLA's 192 = 128 + 64), DV a power of two. Indices < 0 or after the query are skipped.

Needs triton (imported at the top: import this module only where `gpu_kernels` said it imports).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

BLOCK_K = 32  # gathered key rows per step
BLOCK_G = 16  # query heads per program (tl.dot's least M; fewer heads are masked rows)


def split_head_dim(d: int) -> tuple[int, int] | None:
    """(DA, DB) with DA + DB = d, DA the largest power of two <= d, DB 0 or a power of two >= 16; None if d has
    no such split (the kernel then refuses the shape)."""
    if d < 16:
        return None
    da = 1 << (d.bit_length() - 1)
    db = d - da
    return (da, db) if db == 0 or (db >= 16 and db & (db - 1) == 0) else None


@triton.jit
def _sparse_attention_kernel(
    q, k, v, idx, out, scale, first, sq_t, sq_h, sk_s, sk_h, sv_s, sv_h, so_t, so_h, NK: tl.constexpr,
    G: tl.constexpr, DA: tl.constexpr, DB: tl.constexpr, DV: tl.constexpr, BG: tl.constexpr, BK: tl.constexpr,
):  # fmt: skip
    """out[t, h] = softmax over the selected keys s of (q[t, h] . k[s, h // G]) * scale, times v[s, h // G].
    Program (t, kv head, head block); idx [T, NK] int64 contiguous; query t at position first + t."""
    t, hk, hb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_g = hb * BG + tl.arange(0, BG)
    m_g = o_g < G
    heads = (hk * G + o_g).to(tl.int64)
    p_q = q + t.to(tl.int64) * sq_t + heads[:, None] * sq_h
    q_a = tl.load(p_q + tl.arange(0, DA)[None, :], mask=m_g[:, None], other=0.0)  # [BG, DA]
    if DB > 0:
        q_b = tl.load(p_q + DA + tl.arange(0, DB)[None, :], mask=m_g[:, None], other=0.0)
    pos = first + t
    m_i = tl.full([BG], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BG], dtype=tl.float32)
    acc = tl.zeros([BG, DV], dtype=tl.float32)
    for kb in range(0, tl.cdiv(NK, BK)):  # NK constexpr: the interpreter cannot loop to a runtime bound
        o_k = kb * BK + tl.arange(0, BK)
        ix = tl.load(idx + t.to(tl.int64) * NK + o_k, mask=o_k < NK, other=-1)
        valid = (ix >= 0) & (ix <= pos)
        row = tl.where(valid, ix, 0).to(tl.int64) * sk_s + hk * sk_h
        k_a = tl.load(k + row[None, :] + tl.arange(0, DA)[:, None], mask=valid[None, :], other=0.0)  # [DA, BK]
        s = tl.dot(q_a, k_a)
        if DB > 0:
            k_b = tl.load(k + row[None, :] + DA + tl.arange(0, DB)[:, None], mask=valid[None, :], other=0.0)
            s += tl.dot(q_b, k_b)
        s = tl.where(valid[None, :], s * scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a head with nothing yet: no NaN from -inf - -inf
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        vrow = tl.where(valid, ix, 0).to(tl.int64) * sv_s + hk * sv_h
        b_v = tl.load(v + vrow[:, None] + tl.arange(0, DV)[None, :], mask=valid[:, None], other=0.0)  # [BK, DV]
        acc = acc * alpha[:, None] + tl.dot(p.to(b_v.dtype), b_v)
        m_i = m_new
    o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    p_o = out + t.to(tl.int64) * so_t + heads[:, None] * so_h + tl.arange(0, DV)[None, :]
    tl.store(p_o, o.to(out.dtype.element_ty), mask=m_g[:, None])


def sparse_attention(q: Tensor, k: Tensor, v: Tensor, indices: Tensor, scale: float) -> Tensor:
    """Attention of queries q [T, H, D] (the last T of S positions: key s at position s) over only their
    selected keys `indices` [T, NK] (int; < 0 = none) of k [S, Hk, D], v [S, Hk, DV] (Hk divides H: each KV
    head serves H / Hk query heads; v may be a view of k's rows, as MLA's latent). Returns [T, H * DV] in
    q's dtype, as `kernels_attention.causal_attention` with `keep = index_mask(indices, S)` does."""
    t, h, d = q.shape
    s, hk, dv = k.shape[0], k.shape[1], v.shape[-1]
    split = split_head_dim(d)
    if split is None or dv < 16 or dv & (dv - 1) or h % hk or k.shape[-1] != d or v.shape[:2] != k.shape[:2]:
        raise ValueError(f"sparse_attention: head dims {d}/{dv}, {h} query and {hk} KV heads are not supported")
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    g = h // hk
    out = torch.empty(t, h, dv, dtype=q.dtype, device=q.device)
    idx = indices.to(torch.int64).contiguous()
    grid = (t, hk, triton.cdiv(g, BLOCK_G))
    _sparse_attention_kernel[grid](
        q, k, v, idx, out, scale, s - t, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0),
        v.stride(1), out.stride(0), out.stride(1), NK=idx.shape[1], G=g, DA=split[0], DB=split[1], DV=dv, BG=BLOCK_G,
        BK=BLOCK_K,
    )  # fmt: skip
    return out.reshape(t, h * dv)


__all__ = ["BLOCK_G", "BLOCK_K", "sparse_attention", "split_head_dim"]
