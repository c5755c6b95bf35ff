"""Reference short convolution and gated delta rules (KDA, Gated DeltaNet) with carried state.

Part of `tpplan.runtime.kernels` (the module the executor calls, which re-exports these); the
conventions are its docstring's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from tpplan.runtime import fast_kernels as _fast  # GPU fast paths: one-line hooks marked `# fast:`
from tpplan.runtime.activations import unary
from tpplan.runtime.kernels_local import head_rms_norm

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
    r, dk, dv = v_per_k, k_head_dim, v_head_dim
    qc, kc, vc, z, b, a = gdn_conv_inputs(qkvz, ba, conv_weight, dk, dv, r, state)
    rule = _fast.gdn_delta_rule if _fast.use(qkvz, "gdn") else gdn_delta_rule  # fast:
    o = rule(qc, kc, vc, b, a, a_log, dt_bias, r, state, chunk_size)
    o = head_rms_norm(o, norm_weight, eps, dv, gate=z, gate_fn="silu")
    return o.to(qkvz.dtype)


def gdn_delta_rule(
    q: Tensor, k: Tensor, v: Tensor, b: Tensor, a: Tensor, a_log: Tensor, dt_bias: Tensor, v_per_k: int,
    state: dict[str, Tensor] | None, chunk_size: int,
) -> Tensor:  # fmt: skip
    """Gated DeltaNet's recurrence on `gdn_conv_inputs`' post-conv q, k [T, g*dk], v [T, g*r*dv] and
    beta / decay logits b, a [T, g*r]: scalar decay per v head, v head h reads key head h // r,
    fp32 state [g*r, dk, dv] carried in `state`. Returns [T, g*r*dv] (fp32)."""
    t, hv, r = q.shape[0], b.shape[1], v_per_k
    ng = hv // r
    dk, dv = q.shape[1] // ng, v.shape[1] // hv
    qh = l2norm(q.float().reshape(t, ng, dk)).repeat_interleave(r, dim=1) * dk**-0.5
    kh = l2norm(k.float().reshape(t, ng, dk)).repeat_interleave(r, dim=1)
    vh = v.float().reshape(t, hv, dv)
    g = -a_log.float().exp() * F.softplus(a.float() + dt_bias.float())  # [T, Hv]
    prev = state.get("recurrent") if state is not None else None
    o, s = chunk_gated_delta_rule(qh, kh, vh, g, torch.sigmoid(b.float()), prev, chunk_size)
    if state is not None:
        state["recurrent"] = s
    return o.reshape(t, -1)


__all__ = [
    "chunk_gated_delta_rule",
    "gdn",
    "gdn_conv_inputs",
    "gdn_delta_rule",
    "kda",
    "l2norm",
    "naive_gated_delta_rule",
    "short_conv",
]
