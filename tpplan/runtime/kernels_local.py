"""Token-local reference kernels: linear, norms, slices, activations and rotary embeddings.

Part of `tpplan.runtime.kernels` (the module the executor calls, which re-exports these); the
conventions are its docstring's.
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


def mean_square(xs: list[Tensor], widths: list[int], shards: int = 1) -> Tensor:
    """[T, len(xs)]: each input's mean of squares over its whole row (fp32, returned in x's dtype).

    An input narrower than its full `width` is this rank's head slice, one of the `shards` the row is
    split into (the TP group's ranks): its share of the mean is the local mean / `shards`, so the sum over
    ranks is the full row's mean, also where TP exceeds the heads and ranks share a head (each head then
    appears tp/heads times; vLLM's MiniMaxText01RMSNormTP divides the all-reduced variance by the TP size
    the same way).
    """
    cols = []
    for x, width in zip(xs, widths, strict=True):
        m = x.float().pow(2).mean(-1, keepdim=True)
        cols.append(m / shards if x.shape[1] < width else m)
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


_INV_ON_DEVICE: dict[tuple[Any, ...], tuple[Tensor, float]] = {}


def rope_cos_sin(positions: Tensor, dim: int, rope: Rope) -> tuple[Tensor, Tensor]:
    """cos/sin [T, dim/2] for absolute `positions`, so a chunk starting at p0 rotates like one-shot.

    The inverse frequencies are made on the host once per (RoPE parameters, dim, device) and kept there: a copy
    from pageable host memory waits for the GPU to finish everything queued, and one per layer and chunk kept the
    bench's host from getting ahead of the GPU (06e: `torch.cuda.set_sync_debug_mode` named this line)."""
    scaling = repr(sorted((rope.scaling or {}).items()))
    key = (rope.theta, scaling, rope.max_position_embeddings, dim, str(positions.device))
    if key not in _INV_ON_DEVICE:
        inv, factor = rope.inv_freq_and_factor(dim)
        _INV_ON_DEVICE[key] = (inv.to(positions.device), factor)
    inv, factor = _INV_ON_DEVICE[key]
    freqs = positions.float()[:, None] * inv[None, :]
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


__all__ = [
    "Rope",
    "apply_rope",
    "gated_query_split",
    "head_rms_norm",
    "linear",
    "mean_square",
    "rms_norm",
    "rms_scale",
    "rope_cos_sin",
    "slice_cols",
    "swiglu",
]
