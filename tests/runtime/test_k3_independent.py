"""tiny-kimi-k3 logits against an independent, loop-level formulation written here.

Covers what no HF model has: the MLA output gate (sigmoid(g_proj(x)) on the attention output),
the full-rank KDA gate, the latent MoE (down-proj, experts in the latent, RMSNorm, up-proj) and
block attention residuals (SGLang's formulation: a per-token bank of block snapshots, b_0 = the
embedding, the running prefix restarting at each block boundary, softmax over depth with a
pseudo-query, output AttnRes before the final norm). Nothing here calls tpplan's kernels; only
the checkpoint names are shared. Conventions fixed by the runtime and restated here: eps =
rms_norm_eps except MLA's q_a/kv_a norms (1e-6), RoPE theta 10000 on interleaved pairs.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from tpplan.models.config import load_model
from tpplan.models.graph import build_model_graph
from tpplan.runtime.executor import numerics_for, run_reference
from tpplan.runtime.weights import random_weights

EPS = 1e-5


def rms(x: torch.Tensor, w: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def rope_pairs(x: torch.Tensor, pos: int) -> torch.Tensor:
    """Rotate consecutive pairs (x0,x1),(x2,x3).. in place order (dot products match any layout)."""
    d = x.shape[-1]
    out = x.clone()
    for j in range(d // 2):
        ang = pos * 10000.0 ** (-2 * j / d)
        c, s = math.cos(ang), math.sin(ang)
        a, b = x[..., 2 * j], x[..., 2 * j + 1]
        out[..., 2 * j], out[..., 2 * j + 1] = a * c - b * s, b * c + a * s
    return out


def mla_block(x, W, p, n=4, nope=16, rope=8, vd=16, qr=24, kvr=16):
    t = x.shape[0]
    q = rms(x @ W[p + "q_a_proj.weight"].T, W[p + "q_a_layernorm.weight"], 1e-6) @ W[p + "q_b_proj.weight"].T
    q = q.reshape(t, n, nope + rope)
    ckv = x @ W[p + "kv_a_proj_with_mqa.weight"].T
    kv = rms(ckv[:, :kvr], W[p + "kv_a_layernorm.weight"], 1e-6) @ W[p + "kv_b_proj.weight"].T
    kv = kv.reshape(t, n, nope + vd)
    kr = ckv[:, kvr:]
    out = torch.zeros(t, n, vd)
    for i in range(t):
        for h in range(n):
            qi = torch.cat([q[i, h, :nope], rope_pairs(q[i, h, nope:], i)])
            scores = torch.stack([qi @ torch.cat([kv[s, h, :nope], rope_pairs(kr[s], s)]) for s in range(i + 1)])
            p_ = torch.softmax(scores / math.sqrt(nope + rope), 0)
            out[i, h] = sum(p_[s] * kv[s, h, nope:] for s in range(i + 1))
    gate = torch.sigmoid(x @ W[p + "g_proj.weight"].T)
    return (out.reshape(t, -1) * gate) @ W[p + "o_proj.weight"].T


def kda_block(x, W, p, n=4, d=16, kern=4):
    t = x.shape[0]

    def conv(name):
        y = x @ W[p + f"{name}_proj.weight"].T
        w = W[p + f"{name}_conv1d.weight"][:, 0, :]
        out = torch.zeros_like(y)
        for i in range(t):
            for j in range(kern):
                src = i - (kern - 1) + j
                if src >= 0:
                    out[i] += w[:, j] * y[src]
        return F.silu(out).reshape(t, n, d)

    q, k, v = conv("q"), conv("k"), conv("v")
    f = (x @ W[p + "f_a_proj.weight"].T @ W[p + "f_b_proj.weight"].T + W[p + "dt_bias"]).reshape(t, n, d)
    decay = torch.exp(-torch.exp(W[p + "A_log"]).reshape(n, 1) * torch.log1p(torch.exp(f)))
    beta = torch.sigmoid(x @ W[p + "b_proj.weight"].T)
    o = torch.zeros(t, n, d)
    for h in range(n):
        S = torch.zeros(d, d)
        for i in range(t):
            qi = q[i, h] / q[i, h].norm() / math.sqrt(d)
            ki = k[i, h] / k[i, h].norm()
            S = decay[i, h][:, None] * S
            S = S + beta[i, h] * torch.outer(ki, v[i, h] - S.T @ ki)
            o[i, h] = S.T @ qi
    gate = (x @ W[p + "g_proj.weight"].T).reshape(t, n, d)
    o = rms(o, W[p + "o_norm.weight"]) * torch.sigmoid(gate)
    return o.reshape(t, -1) @ W[p + "o_proj.weight"].T


def swiglu_mlp(x, W, p):
    return (F.silu(x @ W[p + "gate_proj.weight"].T) * (x @ W[p + "up_proj.weight"].T)) @ W[p + "down_proj.weight"].T


def latent_moe(x, W, p, experts=8, top_k=2, scale=2.5):
    lat = x @ W[p + "routed_expert_down_proj.weight"].T
    scores = torch.sigmoid(x @ W[p + "gate.weight"].T)
    routed = torch.zeros_like(lat)
    for i in range(x.shape[0]):
        chosen = sorted(range(experts), key=lambda e: -(scores[i, e] + W[p + "gate.e_score_correction_bias"][e]))
        chosen = chosen[:top_k]
        total = sum(scores[i, e] for e in chosen)
        for e in chosen:
            routed[i] += scale * scores[i, e] / total * swiglu_mlp(lat[i], W, p + f"experts.{e}.")
    up = rms(routed, W[p + "routed_expert_norm.weight"]) @ W[p + "routed_expert_up_proj.weight"].T
    return up + swiglu_mlp(x, W, p + "shared_experts.")


def depth_softmax(prefix, bank, proj, norm_w):
    rows = [*bank, prefix]
    scores = torch.stack([(r / torch.sqrt((r * r).mean(-1, keepdim=True) + EPS)) @ (norm_w * proj[0]) for r in rows], 1)
    p = torch.softmax(scores, 1)
    return sum(p[:, j : j + 1] * rows[j] for j in range(len(rows)))


def k3_forward(W, ids, kinds, block=2):
    prefix = W["model.embed_tokens.weight"][ids]
    bank: list[torch.Tensor] = []
    for i, kind in enumerate(kinds):
        L = f"model.layers.{i}."
        h = depth_softmax(
            prefix, bank, W[L + "self_attention_res_proj.weight"], W[L + "self_attention_res_norm.weight"]
        )
        if i % block == 0:
            bank, prefix = [*bank, prefix], torch.zeros_like(prefix)
        x = rms(h, W[L + "input_layernorm.weight"])
        prefix = prefix + (
            mla_block(x, W, L + "self_attn.") if kind.startswith("mla") else kda_block(x, W, L + "self_attn.")
        )
        y = rms(
            depth_softmax(prefix, bank, W[L + "mlp_res_proj.weight"], W[L + "mlp_res_norm.weight"]),
            W[L + "post_attention_layernorm.weight"],
        )
        prefix = prefix + (latent_moe(y, W, L + "mlp.") if kind.endswith("moe") else swiglu_mlp(y, W, L + "mlp."))
    out = depth_softmax(prefix, bank, W["model.output_attn_res_proj.weight"], W["model.output_attn_res_norm.weight"])
    return rms(out, W["model.norm.weight"]) @ W["lm_head.weight"].T


def test_k3_logits_match_independent_formulation() -> None:
    graph = build_model_graph(load_model("tiny-kimi-k3"))
    nu = numerics_for(graph)
    W = random_weights(graph, nu, seed=4, std=0.1)  # larger std: gates and routing matter
    ids = torch.randint(0, graph.spec.vocab, (9,), generator=torch.Generator().manual_seed(5))
    ours = run_reference(graph, W, ids)
    with torch.no_grad():
        ref = k3_forward(W, ids, graph.layer_kinds, graph.spec.attn_res_block_size)
    diff = (ours - ref).abs().max().item()
    assert ref.abs().max() > 0.1
    assert diff < 1e-4 * ref.abs().max().item(), f"max |diff| = {diff:.2e}"  # measured 4.4e-5 on |logits| 2.8
