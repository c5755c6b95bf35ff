"""Shared MLP blocks of the layer graph: the dense SwiGLU MLP and routed experts (MoE).

Every family that has a SwiGLU MLP or routed experts builds them here, by the MLP spec's `kind`
(`mlp_builder`); a family with a different MLP (biased experts, clamped SwiGLU) registers its own
builder with `register_mlp`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tpplan.models.ops import Builder, OpKind, WeightSplit
from tpplan.models.spec import DenseMLPSpec, MoESpec


def dense_mlp(
    b: Builder, m: DenseMLPSpec, x: str, out: str, prefix: str, weight_prefix: str, intermediate: int | None = None
) -> str:
    i = intermediate or m.intermediate
    g, u = (
        b.linear(
            f"{prefix}{part}_proj",
            x,
            f"{prefix}{part}",
            i,
            WeightSplit.COL,
            heads=i,
            weight=f"{weight_prefix}.{part}_proj.weight",
            note=f"{part} projection, split by column",
        )
        for part in ("gate", "up")
    )
    act = {"act": m.act} if m.act != "silu" else {}
    b.op(f"{prefix}act", OpKind.SWIGLU, (g, u), f"{prefix}act", i, i, flops_per_token=4.0 * i, attrs=act)
    return b.linear(
        f"{prefix}down_proj",
        f"{prefix}act",
        out,
        b.hidden,
        WeightSplit.ROW,
        heads=i,
        weight=f"{weight_prefix}.down_proj.weight",
        note="down projection, split by row",
    )


def moe(b: Builder, m: MoESpec, x: str, prefix_hf: str) -> str:
    """A MoE block as ops: router, routed experts (through a latent where the model has one), and the
    shared experts beside them; returns the block output's name."""
    h = b.hidden
    _router(b, m, x, prefix_hf)
    ew = h
    xin = x
    if m.latent:
        xin = b.linear(
            "latent_down",
            x,
            "x_latent",
            m.latent,
            WeightSplit.REPLICATED,
            weight=f"{prefix_hf}.routed_expert_down_proj.weight",
            note="latent MoE down-projection (replicated)",
        )
        ew = m.latent
    per_expert = 3 * ew * m.expert_intermediate
    last = "mlp_out" if not m.shared_intermediate else None  # the routed sum may be the block output
    b.op(
        "experts",
        OpKind.EXPERTS,
        (xin, "routing"),
        (last if not m.latent and last else "routed"),
        ew,
        weight=f"{prefix_hf}.experts",
        weight_shape=(m.experts, 3, ew, m.expert_intermediate),
        split=WeightSplit.EXPERT,
        split_heads=m.expert_intermediate,
        flops_per_token=2.0 * per_expert * m.top_k,
        attrs={
            "experts": m.experts,
            "top_k": m.top_k,
            "width": ew,
            "intermediate": m.expert_intermediate,
            "bias": m.expert_bias,
            "clamp": m.clamp,
            "scale_inputs": m.scale_inputs,
        },
        note=f"{m.experts} routed experts, {m.top_k} per token, "
        f"{'clamped ' if m.clamp else ''}SwiGLU {ew}->{m.expert_intermediate}->{ew}"
        + (" with biases" if m.expert_bias else ""),
    )
    routed = _latent_up(b, m, prefix_hf, last) if m.latent else b.ops[-1].output
    if last:
        return last
    shared = _shared_experts(b, m, x, prefix_hf)
    b.op("moe_sum", OpKind.ADD, (routed, shared), "mlp_out", h, flops_per_token=h, note="routed + shared experts")
    return "mlp_out"


def _router(b: Builder, m: MoESpec, x: str, prefix_hf: str) -> None:
    """The router: scores over the experts, replicated on every rank."""
    h = b.hidden
    b.op(
        "router",
        OpKind.ROUTER,
        (x,),
        "routing",
        m.experts,
        weight=f"{prefix_hf}.{m.router}.weight",
        weight_shape=(m.experts, h),
        split=WeightSplit.REPLICATED,
        flops_per_token=2.0 * h * m.experts,
        attrs={
            "top_k": m.top_k,
            "scoring": m.scoring,
            "n_group": m.n_group,
            "topk_group": m.topk_group,
            "logit_bias": m.router_bias,
        }
        | ({"group_score": m.group_score} if m.group_score != "top2_sum" else {}),
        note=f"router: {m.scoring} scores over {m.experts} experts, top-{m.top_k}",
    )


def _latent_up(b: Builder, m: MoESpec, prefix_hf: str, last: str | None) -> str:
    """The routed sum, normed where the model norms it, up from the latent to the hidden."""
    h = b.hidden
    routed = b.ops[-1].output
    if m.latent_norm:
        b.norm(
            "latent_norm",
            "routed",
            "routed_n",
            f"{prefix_hf}.routed_expert_norm.weight",
            note="RMSNorm of the summed expert output in the latent",
        )
        routed = "routed_n"
    routed = b.linear(
        "latent_up",
        routed,
        last or "routed_h",
        h,
        WeightSplit.REPLICATED,
        weight=f"{prefix_hf}.routed_expert_up_proj.weight",
        note="latent MoE up-projection (replicated)",
    )
    return routed


def _shared_experts(b: Builder, m: MoESpec, x: str, prefix_hf: str) -> str:
    """The shared experts (a dense MLP), scaled by their gate where the model has one; the output's name."""
    h = b.hidden
    shared = dense_mlp(
        b,
        DenseMLPSpec(m.shared_intermediate),
        x,
        "shared_out",
        "shared_",
        f"{prefix_hf}.{m.shared_module or ('shared_expert' if m.shared_gate else 'shared_experts')}",
        intermediate=m.shared_intermediate,
    )
    if m.shared_gate:
        b.op(
            "shared_gate",
            OpKind.ROUTER,
            (x,),
            "shared_gate_logit",
            1,
            weight=f"{prefix_hf}.shared_expert_gate.weight",
            weight_shape=(1, h),
            split=WeightSplit.REPLICATED,
            flops_per_token=2.0 * h,
            attrs={"scalar_gate": True},
            note="shared-expert gate: sigmoid of one logit per token",
        )
        shared = b.op(
            "shared_scale",
            OpKind.MUL,
            ("shared_out", "shared_gate_logit"),
            "shared_scaled",
            h,
            attrs={"sigmoid_second": True, "broadcast": True},
            note="scale shared expert",
        )
    return shared


MlpBuilder = Callable[[Builder, Any, str], str]
_MLP_BUILDERS: dict[str, MlpBuilder] = {
    "dense": lambda b, m, x: dense_mlp(b, m, x, "mlp_out", "", "mlp"),
    "moe": lambda b, m, x: moe(b, m, x, "mlp"),
}


def register_mlp(kind: str, build: MlpBuilder) -> None:
    """Add an MLP builder for MLP specs of `kind` (writes `mlp_out` from input `x`)."""
    _MLP_BUILDERS[kind] = build


def mlp_builder(kind: str) -> MlpBuilder:
    """The builder of MLP specs of `kind`."""
    import tpplan.models.families  # noqa: F401 - families may register their own MLPs

    return _MLP_BUILDERS[kind]
