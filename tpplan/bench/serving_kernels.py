"""Serving-class kernels for the benchmark, swapped in for six of the runtime's reference kernels.

The runtime's kernels (`tpplan.runtime.kernels`) are written to be obviously right, not fast:
attention materialises the [heads, T, S] fp32 score matrix (tens of GB at 8K tokens of K3), and
the routed experts run one fp32 GEMM chain per expert with a host sync each. The cost model
prices a FlashAttention-class kernel and bf16 grouped expert GEMMs, so timing the reference
kernels would measure the reference, not the plan. `installed()` replaces, for the duration of a
benchmark, with the same semantics (tests compare them on CPU):

- `causal_attention` -> `tpplan.runtime.fast_kernels.causal_attention` (SDPA, flash on H100/H200
  with MLA's narrower V zero-padded), which the runtime itself uses only on CUDA; installed here
  it also runs on CPU, so the CPU tests exercise the same attention the GPU bench times. A
  sliding window (Gemma 3, gpt-oss), an attention chunk (Llama 4) and gpt-oss's sinks run kernels
  that read only the keys each query may see (`bench.masked_attention`: on CUDA fla's Triton window
  kernel, which skips key blocks outside the window, else windowed query blocks; flash per chunk;
  sinks in fla's denominator or from the kernel's log-sum-exp); attention under DSA's top-k on CUDA by
  `bench.sparse_attention` (each query's selected keys gathered by index, online softmax; the indices kept
  by the installed `index_mask`), else the reference kernel (its scores a block of queries at a time), and
  the results record which ran (`attention_variants_used`).
- `dsa_indexer` -> on CUDA the fused Triton index-score kernel and `torch.topk` (`bench.fused_indexer`,
  as the engines' DeepGEMM MQA-logits path), else the reference (`indexer_variants_used`).
- `routed_experts` -> every keyword the runtime passes (gpt-oss's biases and clamped SwiGLU, Llama 4's
  routing-scaled inputs: `ExpertVariant`); tokens sorted by expert once, bf16 grouped GEMMs (`torch._grouped_mm`;
  a per-expert loop for the shapes where it is unavailable), each token's rows weighted and summed in one batched
  product with fp32 accumulation (the fused-MoE engines' combine); with no host sync when the rank
  holds every expert (the caller's `top_k` hint).
- `router_logits` -> the router GEMM in the activations' half precision with an fp32 result, as
  engines run it (the reference, like HF, upcasts the activations first).
- `chunk_gated_delta_rule` (KDA, Gated DeltaNet) -> `chunked_delta_rule`: the same chunked WY
  algorithm with everything that does not depend on the carried state batched over all chunks
  (the reference loops over chunks and builds a [heads, C, C, dk] decay tensor per chunk). Plain
  torch: it runs only where fla is missing, since on CUDA with fla the runtime's own fast path
  (`runtime.fast_kernels.kda`, fla's chunk_kda) is taken before this reference is reached.

The runtime's fast paths (`runtime.fast_kernels`: fla's RMSNorm, causal_conv1d, chunk_kda and fused
AttnRes on CUDA) apply inside the benchmark as everywhere else; `worker.implementations` records
which of all these ran.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from tpplan.bench import gpu_kernels as GK
from tpplan.bench import masked_attention as MA
from tpplan.bench.gpu_kernels import FLA_WINDOW, FUSED_INDEXER, REFERENCE_INDEXER
from tpplan.runtime import fast_kernels as runtime_fast
from tpplan.runtime import kernels as K
from tpplan.runtime import kernels_attention as KA
from tpplan.runtime.kernels_moe import router_logits as _reference_router_logits


@dataclass(frozen=True)
class ExpertVariant:
    """What a family's routed experts add to the plain SwiGLU: the runtime's `routed_experts` keywords.

    gpt-oss: gate/up/down biases and the clamped SwiGLU (`clamp` = (alpha, limit)); Llama 4: the
    routing weight scales each expert's input, not its output (`scale_inputs`)."""

    gate_bias: Tensor | None = None
    up_bias: Tensor | None = None
    down_bias: Tensor | None = None
    clamp: tuple[float, float] | None = None
    scale_inputs: bool = False

    def features(self) -> list[str]:
        """The names `worker.implementations` records, for the variants that ran."""
        out = ["biases"] if self.gate_bias is not None and self.up_bias is not None else []
        out += ["down bias"] if self.down_bias is not None else []
        out += ["clamped SwiGLU"] if self.clamp is not None else []
        return out + (["routing-scaled inputs"] if self.scale_inputs else [])


def grouped_routed_experts(
    x: Tensor, routing: Tensor, gate: Tensor, up: Tensor, down: Tensor, *, gate_bias: Tensor | None = None,
    up_bias: Tensor | None = None, down_bias: Tensor | None = None, clamp: tuple[float, float] | None = None,
    scale_inputs: bool = False, top_k: int | None = None,
) -> Tensor:  # fmt: skip
    """Same contract as `kernels.routed_experts` (every keyword included): x [T, W], routing [T, E]
    combine weights (0 = not selected), gate/up [E, I, W], down [E, W, I]; returns [T, W] in x's dtype.

    As the serving engines' fused MoE does it: rows gathered in expert order, grouped GEMMs in x's
    dtype (biases gathered per row, the activation `clamp` picks), then each row weighted and the k
    rows of a token summed with fp32 accumulation (one batched [1, k] x [k, W] product per token, in
    place of an fp32 copy of every row and a scatter-add); with `scale_inputs` the weight scales the
    row before the GEMMs and the sum is unweighted. With `top_k` (every token selects exactly top_k
    columns: this rank holds every expert) the routing comes from `topk` and never waits for the
    host; without it `torch.nonzero` syncs once, and a batch whose tokens select different numbers
    of experts here (an expert-parallel rank's columns) takes the scatter-add."""
    variant = ExpertVariant(gate_bias, up_bias, down_bias, clamp, scale_inputs)
    _VARIANTS.update(variant.features())
    ws = (gate.to(x.dtype), up.to(x.dtype), down.to(x.dtype))
    if top_k is not None and 0 < top_k <= routing.shape[1]:
        return _routed_without_sync(x, routing, ws, top_k, variant)
    mask = routing != 0
    per_token = mask.sum(1)
    tok, exp = torch.nonzero(mask, as_tuple=True)  # token-major: a token's rows are adjacent
    k = tok.numel() // max(1, x.shape[0])
    uniform = k > 0 and tok.numel() == k * x.shape[0] and bool((per_token == k).all())
    order = torch.argsort(exp, stable=True)
    counts = torch.bincount(exp, minlength=routing.shape[1])
    w = routing[tok, exp]
    xs = _expert_inputs(x[tok[order]], w[order], variant)
    ys = expert_ffn(xs, counts, *ws, row_expert=exp[order], variant=variant)
    if variant.scale_inputs:
        w = torch.ones_like(w)
    if uniform:
        return _weighted_sum(ys, order, w.reshape(-1, k), x.dtype)
    out = torch.zeros(x.shape[0], down.shape[1], dtype=torch.float32, device=x.device)
    out.index_add_(0, tok[order], ys.float() * w[order, None].float())
    return out.to(x.dtype)


_SYNC_FREE: list[bool] = [False]  # whether the host-sync-free routing ran in this process
_VARIANTS: set[str] = set()  # ExpertVariant.features() of the calls in this process


def _expert_inputs(xs: Tensor, row_w: Tensor, variant: ExpertVariant) -> Tensor:
    """Rows in expert order, scaled by their routing weight (in fp32) when the family scales inputs."""
    return (xs.float() * row_w[:, None].float()).to(xs.dtype) if variant.scale_inputs else xs


def _routed_without_sync(x: Tensor, routing: Tensor, ws: tuple[Tensor, Tensor, Tensor], k: int,
                         variant: ExpertVariant) -> Tensor:  # fmt: skip
    """The uniform case with every shape known on the host: top-k indices per token, rows sorted by
    expert with a stable argsort, per-expert counts by scatter-add (no host sync anywhere)."""
    w, idx = routing.topk(k, dim=1)  # the selected weights are the k largest (all > 0)
    flat = idx.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(routing.shape[1], dtype=torch.int64, device=x.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    xs = _expert_inputs(x.index_select(0, order // k), w.reshape(-1)[order], variant)
    ys = expert_ffn(xs, counts, *ws, row_expert=flat[order], variant=variant)
    _SYNC_FREE[0] = True
    return _weighted_sum(ys, order, torch.ones_like(w) if variant.scale_inputs else w, x.dtype)


def _weighted_sum(ys: Tensor, order: Tensor, w: Tensor, dtype: torch.dtype) -> Tensor:
    """Rows `ys` in expert order back to token order, then each token's k rows weighted by `w` [T, k]
    and summed in one batched product."""
    k = w.shape[1]
    rows = torch.empty_like(ys).index_copy_(0, order, ys)
    wk = w.reshape(-1, 1, k).to(torch.float32 if dtype == torch.float32 else dtype)
    return torch.bmm(wk, rows.reshape(-1, k, ys.shape[1])).reshape(-1, ys.shape[1]).to(dtype)


def sync_free_routing_used() -> bool:
    """Whether the routed experts ran the host-sync-free path (`top_k` given) in this process."""
    return _SYNC_FREE[0]


def expert_variants_used() -> list[str]:
    """The family variants the routed experts ran with in this process (biases, clamped SwiGLU, ...)."""
    return sorted(_VARIANTS)


def serving_router_logits(x: Tensor, weight: Tensor, logit_bias: Tensor | None = None) -> Tensor:
    """`kernels.router_logits` as engines run the router: one GEMM in x's half precision with an fp32
    result (no fp32 copy of the activations); fp32 inputs keep the reference."""
    if x.dtype == torch.float32:
        return _reference_router_logits(x, weight, logit_bias)
    y = F.linear(x, weight.to(x.dtype)).float()
    return y if logit_bias is None else y + logit_bias.float()


_PATHS: dict[str, set[str]] = {}  # device type -> the expert paths that ran there ("grouped", "loop")
_REFUSED: set[tuple[str, tuple[int, ...]]] = set()  # (device, gate/down shapes) torch._grouped_mm refused
_LOOP_ONLY = [False]  # tests: take the per-expert loop everywhere


def expert_ffn(
    xs: Tensor, counts: Tensor, gate: Tensor, up: Tensor, down: Tensor, row_expert: Tensor | None = None,
    variant: ExpertVariant | None = None,
) -> Tensor:  # fmt: skip
    """The expert MLP on rows sorted by expert (`counts[e]` rows for expert e; `row_expert` names each
    row's expert, needed for `variant`'s biases): SwiGLU, or the variant's clamped form.

    One grouped GEMM per projection (`torch._grouped_mm`, CUTLASS on Hopper: no host sync, no
    per-expert launch), or, where that op is missing or refuses these weight shapes (an expert slice
    not a multiple of 8 wide: gpt-oss's 2880 / 32 = 90), a loop of per-expert GEMMs (one host sync for
    the counts). A refusal holds for its shapes only: the next shape tries the grouped GEMM again
    (it used to turn the loop on for the rest of the process)."""
    v = variant or ExpertVariant()
    biased = v.gate_bias is not None and v.up_bias is not None and row_expert is not None
    dev = xs.device.type
    key = (dev, (*gate.shape, *down.shape))
    if hasattr(torch, "_grouped_mm") and not _LOOP_ONLY[0] and key not in _REFUSED:
        try:
            offs = counts.cumsum(0).to(torch.int32)
            g = torch._grouped_mm(xs, gate.transpose(-2, -1), offs=offs)
            u = torch._grouped_mm(xs, up.transpose(-2, -1), offs=offs)
            if biased:
                g = g + v.gate_bias[row_expert].to(g.dtype)  # type: ignore[index]
                u = u + v.up_bias[row_expert].to(u.dtype)  # type: ignore[index]
            y = torch._grouped_mm(_activation(g, u, v.clamp), down.transpose(-2, -1), offs=offs)
            if v.down_bias is not None and row_expert is not None:
                y = y + v.down_bias[row_expert].to(y.dtype)
            _PATHS.setdefault(dev, set()).add("grouped")
            return y
        except (RuntimeError, NotImplementedError, TypeError):
            _REFUSED.add(key)
    _PATHS.setdefault(dev, set()).add("loop")
    ys = xs.new_empty(xs.shape[0], down.shape[1])
    start = 0
    for e, c in enumerate(counts.tolist()):
        if c:
            xe = xs[start : start + c]
            g, u = xe @ gate[e].t(), xe @ up[e].t()
            if biased:
                g, u = g + v.gate_bias[e].to(g.dtype), u + v.up_bias[e].to(u.dtype)  # type: ignore[index]
            y = _activation(g, u, v.clamp) @ down[e].t()
            ys[start : start + c] = y if v.down_bias is None else y + v.down_bias[e].to(y.dtype)
            start += c
    return ys


@contextmanager
def per_expert_loop() -> Iterator[None]:
    """Run every expert FFN by the per-expert loop inside the block (tests of that path)."""
    was = _LOOP_ONLY[0]
    _LOOP_ONLY[0] = True
    try:
        yield
    finally:
        _LOOP_ONLY[0] = was


def reset_expert_paths() -> None:
    """Forget which expert paths ran (a sweep's case records its own)."""
    _PATHS.clear()


def _activation(g: Tensor, u: Tensor, clamp: tuple[float, float] | None) -> Tensor:
    """silu(g) * u, or gpt-oss's g' * sigmoid(alpha g') * (u' + 1) with g' = min(g, limit), u' in
    [-limit, limit] (`kernels.routed_experts`' two activations)."""
    if clamp is None:
        return F.silu(g) * u
    alpha, limit = clamp
    g, u = g.clamp(max=limit), u.clamp(-limit, limit)
    return g * torch.sigmoid(alpha * g) * (u + 1)


def grouped_gemm_used() -> dict[str, bool]:
    """Per device type, whether every expert FFN there ran the grouped GEMM (False: the loop ran at least once)."""
    return {dev: "loop" not in paths for dev, paths in _PATHS.items()}


def refused_expert_shapes() -> list[str]:
    """The gate/down weight shapes torch._grouped_mm refused (they ran the per-expert loop), as text."""
    return sorted(f"{dev} {'x'.join(map(str, shape))}" for dev, shape in _REFUSED)


def chunked_delta_rule(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor | None = None, chunk_size: int = 64,
    sub: int = 16,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """Same contract and math as `kernels.chunk_gated_delta_rule`, with the work that does not depend on
    the carried state done for every chunk at once (as fla's kernels split it):

    - within each chunk, A = k k^T and M = q k^T weighted by e^(G_t - G_s) per key channel: across
      sub-chunks as two factors each <= 1 (e^(G_t - G_r) and e^(G_r - G_s) with r between them),
      inside a sub-chunk by the explicit [B, B, dk] decay, so no exponent is ever positive;
    - the unit lower-triangular solves for the written values, split as U = W_v - W_k S0;
    - only U and the state update run chunk after chunk (two batched GEMMs each), the outputs
      Q e^G S0 + M U again for all chunks at once. Zero padding to whole chunks changes nothing.
    """
    t, h, dk = k.shape
    dv = v.shape[-1]
    c = chunk_size
    n = -(-t // c)
    pad = n * c - t
    g = g.float() if g.dim() == 3 else g.float()[..., None].expand(t, h, dk)

    def blocks(x: Tensor) -> Tensor:  # [T, H, d] -> [H, N, C, d] (zero-padded)
        x = x.float()
        if pad:
            x = torch.cat([x, x.new_zeros(pad, *x.shape[1:])])
        return x.reshape(n, c, h, -1).permute(2, 0, 1, 3)

    qb, kb, vb, gb = blocks(q), blocks(k), blocks(v), blocks(g)
    bb = blocks(beta.float()[..., None])[..., 0]  # [H, N, C]
    G = gb.cumsum(2)
    A = kb.new_zeros(h, n, c, c)
    M = kb.new_zeros(h, n, c, c)
    for i in range(0, c, sub):
        j = i + sub
        gi = G[:, :, i:j]  # [H,N,B,dk]
        if i:
            ref = G[:, :, i - 1 : i]  # last position before this sub-chunk: s <= ref < t
            left_k = kb[:, :, i:j] * (gi - ref).exp()
            left_q = qb[:, :, i:j] * (gi - ref).exp()
            right = kb[:, :, :i] * (ref - G[:, :, :i]).exp()
            A[:, :, i:j, :i] = left_k @ right.transpose(-1, -2)
            M[:, :, i:j, :i] = left_q @ right.transpose(-1, -2)
        diff = gi[:, :, :, None, :] - gi[:, :, None, :, :]  # [H,N,B,B,dk]
        low = torch.ones(sub, sub, dtype=torch.bool, device=k.device).tril()
        decay = diff.masked_fill(~low[:, :, None], float("-inf")).exp()
        kk = kb[:, :, i:j]
        A[:, :, i:j, i:j] = torch.einsum("hntc,hnsc,hntsc->hnts", kk, kk, decay)
        M[:, :, i:j, i:j] = torch.einsum("hntc,hnsc,hntsc->hnts", qb[:, :, i:j], kk, decay)
    eye = torch.eye(c, device=k.device)
    lmat = (bb[..., None] * A).tril(-1) + eye
    eg = G.exp()
    wv = torch.linalg.solve_triangular(lmat, bb[..., None] * vb, upper=False, unitriangular=True)
    wk = torch.linalg.solve_triangular(lmat, bb[..., None] * kb * eg, upper=False, unitriangular=True)
    glast = G[:, :, -1:]  # [H,N,1,dk]
    kd = kb * (glast - G).exp()  # [H,N,C,dk]
    dlast = glast[:, :, 0].exp()  # [H,N,dk]
    s = k.new_zeros(h, dk, dv, dtype=torch.float32) if state is None else state.float().clone()
    hist = kb.new_empty(h, n, dk, dv)
    u = kb.new_empty(h, n, c, dv)
    for b in range(n):
        hist[:, b] = s
        ub = torch.baddbmm(wv[:, b], wk[:, b], s, alpha=-1)
        u[:, b] = ub
        s = torch.baddbmm(s * dlast[:, b, :, None], kd[:, b].transpose(1, 2), ub)
    o = (qb * eg) @ hist + M @ u  # [H,N,C,dv]
    out = o.permute(1, 2, 0, 3).reshape(n * c, h, dv)[:t]
    return out, s


def cascade_attention(q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
    """Same contract as `kernels.causal_attention` (q [T, n, dqk] are the last T of k/v's S positions):
    the flash kernel twice, as serving engines split a prefill chunk over a KV cache, then merged.

    SDPA's lower-right causal mask (what the runtime passes when S > T) dispatches to the
    memory-efficient kernel, at about half flash's rate on an H200 (docs/benchmarks.md). Here the
    cached prefix is attended without a mask and the chunk itself with the plain causal mask, both
    by `aten._scaled_dot_product_flash_attention`, which also returns each row's log-sum-exp; the two
    partial outputs are combined by those weights (exact up to rounding). v is zero-padded to the q/k
    head dim when narrower (MLA), as flash needs one head dim."""
    t, s = q.shape[0], k.shape[0]
    ctx = s - t
    dq, dv = q.shape[-1], v.shape[-1]
    qh, kh, vh = (z.transpose(0, 1).unsqueeze(0).to(q.dtype) for z in (q, k, v))  # [1, n, T|S, d]
    if dv < dq:
        vh = F.pad(vh, (0, dq - dv))
    flash = torch.ops.aten._scaled_dot_product_flash_attention
    with torch.no_grad():
        o2, lse2 = flash(qh, kh[:, :, ctx:], vh[:, :, ctx:], 0.0, True, False, scale=scale)[:2]
        if ctx > 0:
            o1, lse1 = flash(qh, kh[:, :, :ctx], vh[:, :, :ctx], 0.0, False, False, scale=scale)[:2]
            m = torch.maximum(lse1, lse2)
            w1, w2 = (lse1 - m).exp(), (lse2 - m).exp()
            o2 = ((o1.float() * w1[..., None] + o2.float() * w2[..., None]) / (w1 + w2)[..., None]).to(q.dtype)
    return o2[0, ..., :dv].transpose(0, 1).reshape(t, -1)


def _attention(q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
    """The runtime's SDPA path; `cascade_attention` on CUDA in bf16/fp16 when env TPPLAN_CASCADE_ATTN=1.

    Off by default: on an H200 with torch 2.11 SDPA's own choice ran 1.1-2x faster than the cascade
    (docs/benchmarks/h200-2026-12-01/kernel-sweep.json, impl "cascade" vs "sdpa")."""
    ok = q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) and q.shape[-1] <= 256
    if ok and os.environ.get("TPPLAN_CASCADE_ATTN", "0") == "1":
        return cascade_attention(q, k, v, scale)
    return runtime_fast.causal_attention(q, k, v, scale)


MASKED_SDPA = "window and chunk: torch SDPA with a boolean mask"
WINDOWED = "window: SDPA per query block over its window's keys (band mask)"
WINDOWED_FLASH = (
    "window: flash per block of window-1 queries over its own and the previous block (merged by log-sum-exp)"
)
CHUNKED = "chunk: SDPA flash per attention chunk"
SINKS = "sinks: flash with log-sum-exp, sinks applied after"
REFERENCE_FOR_TOPK = "top-k (DSA): reference, scores in query blocks"
_ATTENTION: set[str] = set()  # the attention variants that ran in this process ("causal", the names above)


def masked_attention(
    q: Tensor, k: Tensor, v: Tensor, scale: float, *, window: int | None = None, chunk: int | None = None
) -> Tensor:  # fmt: skip
    """`kernels.causal_attention` with `window` and/or `chunk` by SDPA with a [T, S] boolean mask (the
    same positions the reference masks), shared by every head: the whole T x S work, used only where a
    layer has both a window and a chunk (no family does today; `masked_attention` module for the rest)."""
    t, s = q.shape[0], k.shape[0]
    qpos = torch.arange(s - t, s, device=q.device)[:, None]
    kpos = torch.arange(s, device=q.device)[None, :]
    allowed = kpos <= qpos
    if window is not None:
        allowed &= kpos > qpos - window
    if chunk is not None:
        allowed &= kpos >= (qpos // chunk) * chunk
    qh, kh, vh = (z.transpose(0, 1).unsqueeze(0).to(q.dtype) for z in (q, k, v))  # [1, n, T|S, d]
    with torch.no_grad():
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=allowed, scale=scale)
    return out[0].transpose(0, 1).reshape(t, -1)


def serving_attention(
    q: Tensor, k: Tensor, v: Tensor, scale: float, window: int | None, chunk: int | None, sinks: Tensor | None
) -> tuple[str, Tensor] | None:  # fmt: skip
    """The serving-class kernel for a window, a chunk and/or sinks (`masked_attention` module), with the
    name `attention_variants_used` records; None for a call none of them expresses. The engines' FA3 first where
    `gpu_kernels.try_engine_attention` runs it (k and v may hold fewer heads: GQA in the kernel); a window runs
    fla's `parallel_attn` where `gpu_kernels.fla_window` allows (k and v may then hold fewer heads than q: GQA in
    the kernel), else the band-mask SDPA (or flash blocks on request)."""
    engine = GK.try_engine_attention(q, k, v, scale, window, chunk, sinks)
    if engine is not None:
        return engine
    fla = GK.try_fla_window(q, k, v, scale, window, sinks) if window is not None and chunk is None else None
    if fla is not None:
        return fla
    k, v = KA.repeat_kv(k, v, q.shape[1])  # the kernels below take one k/v head per q head (GQA repeated)
    if window is not None and chunk is None:
        # Without fla: the band mask by default: 0.82 / 1.00 ms against flash blocks' 1.26 / 1.57 ms at Gemma 3's /
        # gpt-oss's window on an H100 (docs/benchmarks/h100-2026-12-06b/window-probe.txt); TPPLAN_WINDOW_FLASH=1
        # for those.
        flash = os.environ.get("TPPLAN_WINDOW_FLASH", "0") == "1"
        name = (WINDOWED_FLASH if flash else WINDOWED) + (" + " + SINKS if sinks is not None else "")
        run = MA.windowed_attention if flash else MA.banded_attention
        return name, run(q, k, v, scale, window, sinks)
    if sinks is not None:
        return (SINKS, MA.sink_attention(q, k, v, scale, sinks)) if window is None and chunk is None else None
    if chunk is not None and window is None:
        return CHUNKED, MA.chunked_attention(q, k, v, scale, chunk, _attention)
    if chunk is not None:
        return MASKED_SDPA, masked_attention(q, k, v, scale, window=window, chunk=chunk)
    return None


_INDEXER: set[str] = set()  # the DSA indexer variants that ran in this process


def indexer_variants_used() -> list[str]:
    """Which DSA indexer kernels ran in this process under `installed`."""
    return sorted(_INDEXER)


def attention_variants_used() -> list[str]:
    """Which attention variants ran in this process under `installed`: "causal" (the serving path)
    and the masked ones, each saying how it ran."""
    return sorted(_ATTENTION)


_REFERENCE_ATTENTION = KA.causal_attention


def _installed_attention(
    q: Tensor, k: Tensor, v: Tensor, scale: float, keep: Tensor | None = None, *, window: int | None = None,
    chunk: int | None = None, sinks: Tensor | None = None,
) -> Tensor:  # fmt: skip
    """`causal_attention` under `installed`: the serving path (`_attention`: SDPA, the cascade split on
    request) for plain causal attention; windows, chunks and sinks by kernels that skip the hidden keys
    (`serving_attention`); DSA's top-k `keep` by `gpu_kernels.try_sparse_attention` on CUDA, else the
    reference (scores in query blocks). Recorded
    (`attention_variants_used`)."""
    if keep is None:
        if window is None and chunk is None and sinks is None:
            _ATTENTION.add("causal")
            return _attention(q, k, v, scale)
        fast = serving_attention(q, k, v, scale, window, chunk, sinks)
        if fast is not None:
            _ATTENTION.add(fast[0])
            return fast[1]
    sparse = (
        None if keep is None or window or chunk or sinks is not None else GK.try_sparse_attention(q, k, v, scale, keep)
    )
    if sparse is not None:  # DSA's top-k by the kernel that gathers only the selected keys
        _ATTENTION.add(sparse[0])
        return sparse[1]
    _ATTENTION.add(REFERENCE_FOR_TOPK if keep is not None else "reference")
    k, v = KA.repeat_kv(k, v, q.shape[1])
    return _REFERENCE_ATTENTION(q, k, v, scale, keep, window=window, chunk=chunk, sinks=sinks)


def _installed_gqa(
    q: Tensor, k: Tensor, v: Tensor, *, head_dim: int, window: int | None = None, chunk: int | None = None,
    sinks: Tensor | None = None, scale: float | None = None, **kw: Any,
) -> Tensor:  # fmt: skip
    """`gqa_attention` under `installed`: the runtime's heads (`kernels_attention.gqa_heads`), then the
    attention above with the KV heads unrepeated where fla's window kernel takes GQA itself (engines read
    each KV head once), repeated to the query heads everywhere else, as the runtime does."""
    qh, kh, vh = KA.gqa_heads(q, k, v, head_dim=head_dim, **kw)
    if not GK.takes_gqa(qh, vh, window, chunk, sinks):
        kh, vh = KA.repeat_kv(kh, vh, qh.shape[1])
    s = head_dim**-0.5 if scale is None else scale
    return _installed_attention(qh, kh, vh, s, window=window, chunk=chunk, sinks=sinks)


def _installed_indexer(q: Tensor, k: Tensor, w: Tensor, **kw: Any) -> Tensor:
    """`dsa_indexer` under `installed`: `gpu_kernels.serving_indexer`, recorded (`indexer_variants_used`)."""
    name, out = GK.serving_indexer(q, k, w, **kw)
    _INDEXER.add(name)
    return out


@contextmanager
def installed(enabled: bool = True) -> Iterator[None]:
    """Swap the fast kernels into `tpplan.runtime.kernels` (which the executor and the plan runner
    call through the module), restoring the reference ones on exit. What ran is recorded from the
    start of the block (`attention_variants_used`, `expert_variants_used`, `sync_free_routing_used`)."""
    if not enabled:
        yield
        return
    _ATTENTION.clear()
    _VARIANTS.clear()
    _INDEXER.clear()
    _SYNC_FREE[0] = False
    swaps = {"causal_attention": _installed_attention, "gqa_attention": _installed_gqa,
             "routed_experts": grouped_routed_experts, "dsa_indexer": _installed_indexer,
             "chunk_gated_delta_rule": chunked_delta_rule, "router_logits": serving_router_logits,
             "index_mask": GK.selected_keys}  # fmt: skip
    # Each kernel is patched in `kernels` (what the executor calls) and in its home module (whose
    # other kernels call it: MLA/GQA call causal_attention, KDA/GDN the delta rule).
    saved = [
        (mod, name, getattr(mod, name))
        for name in swaps
        for mod in (K, importlib.import_module(getattr(K, name).__module__))
    ]
    for mod, name, _ in saved:
        setattr(mod, name, swaps[name])
    try:
        yield
    finally:
        for mod, name, fn in reversed(saved):
            setattr(mod, name, fn)


__all__ = [
    "FLA_WINDOW",
    "FUSED_INDEXER",
    "REFERENCE_INDEXER",
    "ExpertVariant",
    "attention_variants_used",
    "chunked_delta_rule",
    "expert_ffn",
    "expert_variants_used",
    "grouped_gemm_used",
    "grouped_routed_experts",
    "indexer_variants_used",
    "installed",
    "masked_attention",
    "per_expert_loop",
    "refused_expert_shapes",
    "reset_expert_paths",
    "serving_attention",
    "serving_router_logits",
    "sync_free_routing_used",
]
