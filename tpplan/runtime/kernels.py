"""Reference PyTorch kernels, one per op kind of the layer graph (`tpplan.models.graph`).

Every kernel takes exactly the tensors it is given and derives head counts from their widths
(`width // head_dim`), never from a global config. That is what lets a TP rank later call the same
function on its head slice (S(col)) or token slice (S(tok)) without a second implementation.
Activations are `[T, W]` (tokens x features); everything runs in the dtype it is given, with
softmax, norms and recurrences computed in fp32 as the HF/FLA references do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from tpplan.runtime import fast_kernels as _fast  # GPU fast paths: one-line hooks marked `# fast:`

# ----------------------------------------------------------------------------------------------
# Elementwise and token-local ops


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """y = x W^T (+ b) with W laid out [out, in] as in HF checkpoints."""
    return F.linear(x, weight.to(x.dtype), None if bias is None else bias.to(x.dtype))


def rms_norm(x: Tensor, weight: Tensor, eps: float, offset: float = 0.0) -> Tensor:
    """RMSNorm over the last dim; `offset=1` gives Qwen3-Next's zero-centred `(1 + w)` scale."""
    if _fast.use(x, "rms_norm"):  # fast:
        return _fast.rms_norm(x, weight, eps, offset)
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return ((offset + weight.float()) * y).to(x.dtype)


def head_rms_norm(
    x: Tensor, weight: Tensor, eps: float, head_dim: int, gate: Tensor | None = None, gate_fn: str = "sigmoid"
) -> Tensor:
    """RMSNorm within each head of `x` [T, n*head_dim], optionally times act(gate) (KDA / GDN output norm)."""
    if _fast.use(x, "head_rms_norm"):  # fast:
        return _fast.head_rms_norm(x, weight, eps, head_dim, gate, gate_fn)
    t = x.shape[0]
    xf = x.float().reshape(t, -1, head_dim)
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    if gate is not None:
        g = gate.float().reshape(t, -1, head_dim)
        y = y * (torch.sigmoid(g) if gate_fn == "sigmoid" else F.silu(g))
    return y.reshape(t, -1).to(x.dtype)


def mean_square(xs: list[Tensor], widths: list[int], tp: int = 1) -> Tensor:
    """[T, len(xs)]: each input's mean of squares over its whole row (fp32, returned in x's dtype).

    An input narrower than its full `width` is this rank's head slice: its share of the mean is
    the local mean / `tp`, so the sum over ranks is the full row's mean, also where TP exceeds the
    heads and ranks share a head (each head then appears tp/heads times; vLLM's
    MiniMaxText01RMSNormTP divides the all-reduced variance by the TP size the same way).
    """
    cols = []
    for x, width in zip(xs, widths, strict=True):
        m = x.float().pow(2).mean(-1, keepdim=True)
        cols.append(m / tp if x.shape[1] < width else m)
    return torch.cat(cols, dim=1).to(xs[0].dtype)


def rms_scale(x: Tensor, mean_sq: Tensor, weight: Tensor, eps: float) -> Tensor:
    """x * rsqrt(mean_sq + eps) * weight: RMSNorm with its statistic computed elsewhere ([T, 1])."""
    return (x.float() * torch.rsqrt(mean_sq.float() + eps) * weight.float()).to(x.dtype)


def slice_cols(x: Tensor, start: int, width: int) -> Tensor:
    """A contiguous feature range (e.g. the q / kv / rope parts of MLA's fused latent)."""
    return x[:, start : start + width]


def gated_query_split(q_full: Tensor, head_dim: int, gate: bool) -> Tensor:
    """Qwen3-Next lays the doubled q_proj out per head as [query(head_dim) | gate(head_dim)]."""
    t = q_full.shape[0]
    per_head = q_full.reshape(t, -1, 2 * head_dim)
    part = per_head[..., head_dim:] if gate else per_head[..., :head_dim]
    return part.reshape(t, -1)


def unary(x: Tensor, fn: str) -> Tensor:
    if fn == "sigmoid":
        return torch.sigmoid(x)
    if fn == "silu":
        return F.silu(x)
    raise ValueError(f"unknown unary fn {fn!r}")


def swiglu(gate: Tensor, up: Tensor, act: str = "silu") -> Tensor:
    """act(gate) * up: SwiGLU (silu), or Gemma's GeGLU (gelu_tanh, HF's gelu_pytorch_tanh)."""
    if act == "gelu_tanh":
        return F.gelu(gate, approximate="tanh") * up
    return F.silu(gate) * up


# ----------------------------------------------------------------------------------------------
# Rotary embeddings


@dataclass(frozen=True)
class Rope:
    """RoPE parameters as HF spells them; `scaling` is the `rope_scaling` dict (YaRN) or None."""

    theta: float = 10000.0
    interleave: bool = False
    scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 4096

    def inv_freq_and_factor(self, dim: int) -> tuple[Tensor, float]:
        """Inverse frequencies for a `dim`-wide rotary part, and the cos/sin multiplier (YaRN mscale)."""
        pos = self.theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
        inv = 1.0 / pos
        kind = (self.scaling or {}).get("rope_type", (self.scaling or {}).get("type", "default"))
        if kind == "linear":  # position interpolation: every frequency divided by the factor
            return inv / float((self.scaling or {})["factor"]), 1.0
        if kind == "llama3":
            return _llama3_inv_freq(inv, self.scaling or {}), 1.0
        if kind != "yarn":
            return inv, 1.0
        s = self.scaling or {}
        factor = float(s["factor"])
        orig = int(s.get("original_max_position_embeddings") or self.max_position_embeddings)
        mscale, mscale_all = s.get("mscale"), s.get("mscale_all_dim")
        attn = s.get("attention_factor")
        if attn is None:
            attn = (
                _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all)
                if mscale and mscale_all
                else _yarn_mscale(factor, 1.0)
            )
        beta_fast, beta_slow = s.get("beta_fast") or 32, s.get("beta_slow") or 1

        def corr(rot: float) -> float:
            return dim * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(self.theta))

        lo, hi = corr(beta_fast), corr(beta_slow)
        if s.get("truncate", True):
            lo, hi = math.floor(lo), math.ceil(hi)
        lo, hi = max(lo, 0), min(hi, dim - 1)
        if lo == hi:
            hi += 0.001
        ramp = ((torch.arange(dim // 2, dtype=torch.float32) - lo) / (hi - lo)).clamp(0, 1)
        keep = 1 - ramp  # 1: extrapolate (high frequency), 0: interpolate
        return (inv / factor) * (1 - keep) + inv * keep, float(attn)

    def softmax_scale_factor(self) -> float:
        """DeepSeek's YaRN multiplies the softmax scale by mscale(factor, mscale_all_dim)^2."""
        s = self.scaling or {}
        if s.get("rope_type", s.get("type")) == "yarn" and s.get("mscale_all_dim"):
            m = _yarn_mscale(float(s["factor"]), s["mscale_all_dim"])
            return m * m
        return 1.0


def _llama3_inv_freq(inv: Tensor, s: dict[str, Any]) -> Tensor:
    """Llama 3.1 / 4 frequency scaling: long wavelengths divided by `factor`, short ones kept, smooth between."""
    factor, low, high = float(s["factor"]), float(s["low_freq_factor"]), float(s["high_freq_factor"])
    old = float(s["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > old / low, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old / high) & (wavelen <= old / low)
    return torch.where(medium, smoothed, scaled)


def _yarn_mscale(scale: float, mscale: float | None) -> float:
    if scale <= 1:
        return 1.0
    return 0.1 * float(mscale or 1.0) * math.log(scale) + 1.0


def rope_cos_sin(positions: Tensor, dim: int, rope: Rope) -> tuple[Tensor, Tensor]:
    """cos/sin [T, dim/2] for absolute `positions`, so a chunk starting at p0 rotates like one-shot."""
    inv, factor = rope.inv_freq_and_factor(dim)
    freqs = positions.float()[:, None] * inv.to(positions.device)[None, :]
    return freqs.cos() * factor, freqs.sin() * factor


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor, interleave: bool) -> Tensor:
    """Rotate x [T, ..., dim]. Interleaved pairs (x0,x1),(x2,x3) come out de-interleaved, as in HF DeepSeek."""
    shape = (cos.shape[0],) + (1,) * (x.dim() - 2) + (cos.shape[1],)
    c, s = cos.reshape(shape), sin.reshape(shape)
    xf = x.float()
    if interleave:
        x1, x2 = xf[..., 0::2], xf[..., 1::2]
    else:
        half = xf.shape[-1] // 2
        x1, x2 = xf[..., :half], xf[..., half:]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(x.dtype)


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
    scores = torch.einsum("tnd,snd->nts", q.float(), k.float()) * scale
    qpos = torch.arange(s - t, s, device=q.device)[:, None]
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


def _append_cache(cache: dict[str, Tensor] | None, name: str, new: Tensor) -> Tensor:
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
    kf = _append_cache(cache, "k", kf)
    v = _append_cache(cache, "v", v)
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
    qh = q.float().reshape(t, -1, head_dim)
    heads = qh.shape[1]
    kf = F.layer_norm(k.float(), (head_dim,), k_norm_weight.float(), k_norm_bias.float(), 1e-6)
    cos, sin = rope_cos_sin(positions, rope_dim, rope)
    qh = torch.cat([apply_rope(qh[..., :rope_dim], cos, sin, rope.interleave), qh[..., rope_dim:]], dim=-1)
    k_rot = apply_rope(kf[:, None, :rope_dim], cos, sin, rope.interleave)[:, 0]
    kf = _append_cache(cache, "k", torch.cat([k_rot, kf[:, rope_dim:]], dim=-1))
    s = kf.shape[0]
    scores = torch.relu(torch.einsum("thd,sd->ths", qh, kf) * head_dim**-0.5)
    index = torch.einsum("th,ths->ts", w.float() * heads**-0.5, scores)
    future = torch.arange(s, device=q.device)[None, :] > positions[:, None]
    index = index.masked_fill(future, float("-inf"))
    return torch.sort(index, dim=-1, descending=True, stable=True).indices[:, : min(topk, s)]


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
    kh = _append_cache(cache, "k", kh)
    vh = _append_cache(cache, "v", vh)
    rep = qh.shape[1] // kh.shape[1]
    if rep > 1:
        kh, vh = kh.repeat_interleave(rep, dim=1), vh.repeat_interleave(rep, dim=1)
    s = head_dim**-0.5 if scale is None else scale
    return causal_attention(qh, kh, vh, s, window=window, chunk=chunk, sinks=sinks)


# ----------------------------------------------------------------------------------------------
# Short convolution and gated delta rule (KDA, Gated DeltaNet)


def short_conv(x: Tensor, weight: Tensor, state: dict[str, Tensor] | None = None, activation: str = "silu") -> Tensor:
    """Depthwise causal conv over tokens: x [T, C], weight [C, 1, K] (or [C, K]); SiLU after.

    `state["conv"]` keeps the last K-1 input rows so the next chunk sees its left context.
    """
    if _fast.use(x, "short_conv"):  # fast:
        return _fast.short_conv(x, weight, state, activation)
    w = weight.reshape(weight.shape[0], -1)
    kernel = w.shape[1]
    prev = state.get("conv") if state is not None else None
    if prev is None:
        prev = x.new_zeros(kernel - 1, x.shape[1])
    xx = torch.cat([prev, x], dim=0)
    if state is not None:
        state["conv"] = xx[-(kernel - 1) :] if kernel > 1 else xx[:0]
    y = F.conv1d(xx.t().unsqueeze(0).float(), w.unsqueeze(1).float(), groups=w.shape[0])[0].t()
    return unary(y, activation).to(x.dtype) if activation else y.to(x.dtype)


def l2norm(x: Tensor, eps: float = 1e-6) -> Tensor:
    """FLA's l2norm: x / sqrt(sum(x^2) + eps)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def naive_gated_delta_rule(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Token-by-token reference. q,k [T,H,dk] (already normalised and scaled), v [T,H,dv],
    g [T,H,dk] log-decay (or [T,H], broadcast over dk), beta [T,H]. State [H, dk, dv]."""
    t, h, dk = k.shape
    dv = v.shape[-1]
    s = k.new_zeros(h, dk, dv, dtype=torch.float32) if state is None else state.float().clone()
    g = g.float() if g.dim() == 3 else g.float()[..., None].expand(t, h, dk)
    out = k.new_empty(t, h, dv, dtype=torch.float32)
    for i in range(t):
        s = s * g[i].exp()[..., None]
        pred = torch.einsum("hk,hkv->hv", k[i].float(), s)
        delta = (v[i].float() - pred) * beta[i].float()[:, None]
        s = s + k[i].float()[..., None] * delta[:, None, :]
        out[i] = torch.einsum("hk,hkv->hv", q[i].float(), s)
    return out, s


def chunk_gated_delta_rule(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor | None = None, chunk_size: int = 64
) -> tuple[Tensor, Tensor]:
    """Chunked (WY-form) gated delta rule with per-key-channel decay; same contract as the naive loop.

    Within a chunk with cumulative log-decay G, the written values U solve a unit lower-triangular
    system (I + L) U = beta*V - beta*(e^G * K) S0, where L[t,s] = beta_t sum_c k_t k_s e^(G_t - G_s);
    outputs and the carried state follow in closed form. Only exponents of non-positive numbers
    are taken, so it is stable for any chunk length.
    """
    t, h, dk = k.shape
    dv = v.shape[-1]
    g = g.float() if g.dim() == 3 else g.float()[..., None].expand(t, h, dk)
    s = k.new_zeros(h, dk, dv, dtype=torch.float32) if state is None else state.float().clone()
    out = k.new_empty(t, h, dv, dtype=torch.float32)
    for c0 in range(0, t, chunk_size):
        sl = slice(c0, min(t, c0 + chunk_size))
        qc, kc, vc = (x[sl].float().transpose(0, 1) for x in (q, k, v))  # [H, C, d]
        bc = beta[sl].float().t()  # [H, C]
        gc = g[sl].transpose(0, 1).cumsum(1)  # [H, C, dk]
        c = qc.shape[1]
        diff = gc[:, :, None, :] - gc[:, None, :, :]  # [H, Ct, Cs, dk]: G_t - G_s
        lower_incl = torch.ones(c, c, dtype=torch.bool, device=k.device).tril()
        decay = diff.masked_fill(~lower_incl[None, :, :, None], float("-inf")).exp()
        a = torch.einsum("htc,hsc,htsc->hts", kc, kc, decay)  # sum_c k_t k_s e^(G_t-G_s)
        m = torch.einsum("htc,hsc,htsc->hts", qc, kc, decay)  # same with q_t, incl. diagonal
        lmat = (bc[:, :, None] * a).tril(-1) + torch.eye(c, device=k.device)
        rhs = bc[..., None] * (vc - torch.einsum("htc,hcv->htv", kc * gc.exp(), s))
        u = torch.linalg.solve_triangular(lmat, rhs, upper=False, unitriangular=True)  # [H, C, dv]
        o = torch.einsum("htc,hcv->htv", qc * gc.exp(), s) + torch.einsum("hts,hsv->htv", m, u)
        out[sl] = o.transpose(0, 1)
        g_last = gc[:, -1:, :]  # [H, 1, dk]
        s = s * g_last[:, 0, :, None].exp() + torch.einsum("hsc,hsv->hcv", kc * (g_last - gc).exp(), u)
    return out, s


def kda(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    f: Tensor,
    beta_logits: Tensor,
    *,
    head_dim: int,
    a_log: Tensor,
    dt_bias: Tensor,
    state: dict[str, Tensor] | None = None,
    chunk_size: int = 64,
) -> Tensor:
    """Kimi Delta Attention on post-conv q/k/v [T, n*d]: per-channel forget gate
    g = -exp(A_log) * softplus(f + dt_bias), beta = sigmoid, L2-normalised q/k, q scaled by d^-1/2."""
    if _fast.use(q, "kda"):  # fast:
        return _fast.kda(**locals())  # locals() here are exactly the arguments
    t = q.shape[0]
    qh, kh, vh = (x.float().reshape(t, -1, head_dim) for x in (q, k, v))
    n = qh.shape[1]
    f = (f.float() + dt_bias.float().reshape(1, -1)).reshape(t, n, head_dim)
    g = -a_log.float().reshape(1, n, 1).exp() * F.softplus(f)
    beta = torch.sigmoid(beta_logits.float())
    qh, kh = l2norm(qh) * head_dim**-0.5, l2norm(kh)
    prev = state.get("recurrent") if state is not None else None
    o, s = chunk_gated_delta_rule(qh, kh, vh, g, beta, prev, chunk_size)
    if state is not None:
        state["recurrent"] = s
    return o.reshape(t, -1).to(q.dtype)


def gdn_conv_inputs(
    qkvz: Tensor, ba: Tensor, conv_weight: Tensor, dk: int, dv: int, r: int, state: dict[str, Tensor] | None
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Unpack Gated DeltaNet's per-key-head-group projections and run the short conv over cat(q, k, v).

    Returns post-conv q [T, g*dk], k [T, g*dk], v [T, g*r*dv], the output gate z [T, g*r*dv] and the
    beta / decay logits b, a [T, g*r]. Shared by the reference and the fla path so both read the
    fused layout the same way.
    """
    t = qkvz.shape[0]
    grp = qkvz.reshape(t, -1, 2 * dk + 2 * r * dv)
    ng = grp.shape[1]
    q, k, v, z = torch.split(grp, [dk, dk, r * dv, r * dv], dim=-1)
    bag = ba.reshape(t, ng, 2 * r)
    b, a = bag[..., :r].reshape(t, ng * r), bag[..., r:].reshape(t, ng * r)
    mixed = torch.cat([q.reshape(t, -1), k.reshape(t, -1), v.reshape(t, -1)], dim=-1)
    mixed = short_conv(mixed, conv_weight, state)
    qc, kc, vc = torch.split(mixed, [ng * dk, ng * dk, ng * r * dv], dim=-1)
    return qc, kc, vc, z.reshape(t, -1), b, a


def gdn(
    qkvz: Tensor,
    ba: Tensor,
    *,
    conv_weight: Tensor,
    a_log: Tensor,
    dt_bias: Tensor,
    norm_weight: Tensor,
    eps: float,
    k_head_dim: int,
    v_head_dim: int,
    v_per_k: int,
    state: dict[str, Tensor] | None = None,
    chunk_size: int = 64,
) -> Tensor:
    """Gated DeltaNet (Qwen3-Next) from the raw projections, laid out per key-head group:
    qkvz [T, g*(2dk + 2r*dv)] and ba [T, g*2r] with r = v heads per key head. Conv over
    cat(q, k, v), scalar decay per v head, v-head h reads key head h // r, gated (SiLU) RMSNorm."""
    if _fast.use(qkvz, "gdn"):  # fast:
        return _fast.gdn(**locals())  # locals() here are exactly the arguments
    t = qkvz.shape[0]
    r, dk, dv = v_per_k, k_head_dim, v_head_dim
    qc, kc, vc, z, b, a = gdn_conv_inputs(qkvz, ba, conv_weight, dk, dv, r, state)
    ng = qc.shape[1] // dk
    qh = l2norm(qc.float().reshape(t, ng, dk)).repeat_interleave(r, dim=1) * dk**-0.5
    kh = l2norm(kc.float().reshape(t, ng, dk)).repeat_interleave(r, dim=1)
    vh = vc.float().reshape(t, ng * r, dv)
    g = -a_log.float().exp() * F.softplus(a.float() + dt_bias.float())  # [T, Hv]
    prev = state.get("recurrent") if state is not None else None
    o, s = chunk_gated_delta_rule(qh, kh, vh, g, torch.sigmoid(b.float()), prev, chunk_size)
    if state is not None:
        state["recurrent"] = s
    o = head_rms_norm(o.reshape(t, -1), norm_weight, eps, dv, gate=z, gate_fn="silu")
    return o.to(qkvz.dtype)


# ----------------------------------------------------------------------------------------------
# MoE


def route(
    x: Tensor,
    weight: Tensor,
    *,
    top_k: int,
    scoring: str,
    n_group: int = 1,
    topk_group: int = 1,
    bias: Tensor | None = None,
    logit_bias: Tensor | None = None,
    renormalize: bool = True,
    scaling: float = 1.0,
    group_score: str = "top2_sum",
) -> Tensor:
    """Router as a dense [T, E] matrix of combine weights (zero for unselected experts).

    Groups are ranked by the sum of their top-2 scores (DeepSeek-V3) or by their best score
    (`group_score="max"`, DeepSeek-V2's group_limited_greedy).

    Scores are sigmoid (DeepSeek/Kimi: selection uses scores + e_score_correction_bias, grouped
    top-k by the sum of each group's top-2) or softmax (Qwen). A dense matrix keeps the value a plain
    activation that an expert-parallel rank can slice by columns.
    """
    logits = F.linear(x.float(), weight.float(), None if logit_bias is None else logit_bias.float())
    scores = torch.sigmoid(logits) if scoring == "sigmoid" else torch.softmax(logits, dim=-1)
    choice = scores if bias is None else scores + bias.float()
    e = scores.shape[-1]
    if n_group > 1:
        grouped = choice.reshape(-1, n_group, e // n_group)
        gs = grouped.max(dim=-1).values if group_score == "max" else grouped.topk(2, dim=-1)[0].sum(-1)
        keep = torch.zeros_like(gs).scatter_(1, gs.topk(topk_group, dim=-1)[1], 1.0)
        choice = choice.masked_fill(keep.repeat_interleave(e // n_group, dim=1) == 0, float("-inf"))
    idx = choice.topk(top_k, dim=-1)[1]
    w = scores.gather(1, idx)
    if renormalize:
        w = w / (w.sum(-1, keepdim=True) + (1e-20 if scoring == "sigmoid" else 0.0))
    w = w * scaling
    return torch.zeros_like(scores).scatter_(1, idx, w)


def routed_experts(
    x: Tensor,
    routing: Tensor,
    gate: Tensor,
    up: Tensor,
    down: Tensor,
    *,
    gate_bias: Tensor | None = None,
    up_bias: Tensor | None = None,
    down_bias: Tensor | None = None,
    clamp: tuple[float, float] | None = None,
    scale_inputs: bool = False,
) -> Tensor:
    """Sum over selected experts of routing[t,e] * down_e(act(gate_e x, up_e x)), or with
    `scale_inputs` (Llama 4) of down_e(act(gate_e x', up_e x')) with x' = routing[t,e] * x.

    gate/up [E, I, W], down [E, W, I]; `routing` [T, E] holds the experts these weights belong to
    (an EP rank passes its column slice with its own experts). act is silu(g) * u, or with `clamp`
    = (alpha, limit) gpt-oss's g' * sigmoid(alpha g') * (u' + 1), g' = min(g, limit), u' = u clamped
    to [-limit, limit]. Optional biases [E, I] / [E, W] (gpt-oss); the down bias is scaled by the
    routing weight like the rest of the expert's output.
    """
    out = torch.zeros(x.shape[0], down.shape[1], dtype=torch.float32, device=x.device)
    xf = x.float()
    for e in torch.nonzero(routing.abs().sum(0) > 0).flatten().tolist():
        tok = torch.nonzero(routing[:, e] != 0).flatten()
        xe = xf[tok]
        scale = routing[tok, e, None].float()
        if scale_inputs:
            xe, scale = xe * scale, torch.ones_like(scale)
        g, u = xe @ gate[e].float().t(), xe @ up[e].float().t()
        if gate_bias is not None and up_bias is not None:
            g, u = g + gate_bias[e].float(), u + up_bias[e].float()
        if clamp is None:
            h = F.silu(g) * u
        else:
            alpha, limit = clamp
            g, u = g.clamp(max=limit), u.clamp(-limit, limit)
            h = g * torch.sigmoid(alpha * g) * (u + 1)
        y = h @ down[e].float().t()
        if down_bias is not None:
            y = y + down_bias[e].float()
        out.index_add_(0, tok, y * scale)
    return out.to(x.dtype)


# ----------------------------------------------------------------------------------------------
# K3 block attention residual


def attn_res(prefix: Tensor, bank: Tensor, proj: Tensor, score_norm: Tensor, eps: float) -> Tensor:
    """Softmax over depth: rows = [bank snapshots..., prefix] per token ([T, nb, H] and [T, H]).

    score_j = (score_norm * proj) . (row_j / rms(row_j)), softmax over rows, weighted sum of the raw
    rows (fp32). The caller applies the output RMSNorm; token-local, so any token slice works.
    """
    if _fast.use(prefix, "attn_res"):  # fast:
        return _fast.attn_res(prefix, bank, proj, score_norm, eps)
    rows = torch.cat([bank.float(), prefix.float()[:, None, :]], dim=1)
    k = rows * torch.rsqrt(rows.pow(2).mean(-1, keepdim=True) + eps)
    w = score_norm.float() * proj.float().reshape(-1)
    p = torch.softmax(torch.einsum("trh,h->tr", k, w), dim=-1)
    return torch.einsum("tr,trh->th", p, rows).to(prefix.dtype)
