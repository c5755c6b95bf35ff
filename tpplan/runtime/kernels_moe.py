"""Reference MoE routing and routed experts, and K3's block attention residual.

Part of `tpplan.runtime.kernels` (the module the executor calls, which re-exports these); the
conventions are its docstring's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from tpplan.runtime import fast_kernels as _fast  # GPU fast paths: one-line hooks marked `# fast:`

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
    logits = router_logits(x, weight, logit_bias)
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


def router_logits(x: Tensor, weight: Tensor, logit_bias: Tensor | None = None) -> Tensor:
    """[T, E] fp32 router logits from fp32 inputs, as the HF references compute them (the benchmark
    swaps in the serving engines' half-precision GEMM with an fp32 result)."""
    return F.linear(x.float(), weight.float(), None if logit_bias is None else logit_bias.float())


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
    top_k: int | None = None,
) -> Tensor:
    """Sum over selected experts of routing[t,e] * down_e(act(gate_e x, up_e x)), or with
    `scale_inputs` (Llama 4) of down_e(act(gate_e x', up_e x')) with x' = routing[t,e] * x.

    gate/up [E, I, W], down [E, W, I]; `routing` [T, E] holds the experts these weights belong to
    (an EP rank passes its column slice with its own experts). act is silu(g) * u, or with `clamp`
    = (alpha, limit) gpt-oss's g' * sigmoid(alpha g') * (u' + 1), g' = min(g, limit), u' = u clamped
    to [-limit, limit]. Optional biases [E, I] / [E, W] (gpt-oss); the down bias is scaled by the
    routing weight like the rest of the expert's output. `top_k`: given when every token selects
    exactly top_k of `routing`'s columns (a hint for kernels that avoid host syncs; unused here).
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


__all__ = [
    "attn_res",
    "route",
    "routed_experts",
    "router_logits",
]
