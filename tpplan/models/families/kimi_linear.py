"""Kimi-Linear family (kimi_linear) and its wrapper Kimi-K3 (kimi_k3): KDA + MLA hybrid with MoE.

Owns Kimi Delta Attention (KDA) and its depthwise short convolution: the graph (q/k/v projections
each followed by a short conv, low-rank or K3's full-rank forget and output gates, the gated
delta-rule recurrence, a gated per-head RMSNorm), the HF names of the recurrence's per-head
parameters (A_log, dt_bias) and how a head slice cuts them, the kernel calls and the recurrent
state bytes. The full-attention layers are MLA (`deepseek_v3`); K3 adds the MLA output gate,
latent MoE and block attention residuals, all read from its `text_config`.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from tpplan.errors import TpplanError
from tpplan.models.cuts import head_cut
from tpplan.models.families import Family, register
from tpplan.models.families._common import (
    SHARED_EXPERTS,
    MLAFields,
    MoEFields,
    Raw,
    Scoring,
    moe_layer,
    text_config,
    validate,
    wrapped_text,
)
from tpplan.models.families.deepseek_v3 import mla_numerics
from tpplan.models.opkinds import Cuts, Kernels, Mixer, Params, RunCtx, ShardCtx, State, Tensor, Weights, register_mixer
from tpplan.models.ops import Builder, Op, OpKind, WeightSplit
from tpplan.models.spec import DenseMLPSpec, KDASpec, LayerSpec, ModelSpec

STATE_ELEM_BYTES = 4  # the delta-rule state is kept in fp32

# ----------------------------------------------------------------------------------------------
# Short convolution (a TOKEN_MIX op inside KDA)


def _conv_cuts(op: Op, params: Params, sc: ShardCtx) -> Cuts:
    return {"weight": head_cut(0, op.weight_shape[0], op.split_heads, sc.shards, sc.rank)}


register_mixer(
    Mixer(
        "short_conv",
        "elementwise",
        lambda op, inputs, w, state, ctx, K: K.short_conv(inputs[0], w["weight"], state),
        cuts=_conv_cuts,
        cp="conv_halo",
        kernel_shape=lambda op, values: {"channels": values[op.inputs[0]].width},
    )
)

# ----------------------------------------------------------------------------------------------
# Kimi Delta Attention


def build_kda(b: Builder, a: KDASpec, x: str) -> str:
    """Kimi Delta Attention as ops: q/k/v with their short convs, the gates, the recurrence and its gated norm."""
    n, d, w = a.heads, a.head_dim, a.width
    _kda_qkv(b, a, x)
    _kda_gates(b, a, x)
    b.op(
        "kda",
        OpKind.TOKEN_MIX,
        ("q_c", "k_c", "v_c", "f", "beta_logits"),
        "o",
        w,
        n,
        weight="self_attn.A_log",
        weight_shape=(n,),
        split=WeightSplit.COL,
        split_heads=n,
        flops_per_token=8.0 * n * d * d,
        attrs={"impl": "kda", "heads": n, "head_dim": d},
        note="chunked gated delta-rule recurrence over all tokens of its heads",
    )
    _kda_output_gate(b, a, x)
    b.op(
        "o_norm",
        OpKind.HEAD_NORM,
        ("o", "g_out"),
        "o_n",
        w,
        n,
        weight="self_attn.o_norm.weight",
        weight_shape=(d,),
        flops_per_token=6.0 * w,
        attrs={"gate": "sigmoid", "head_dim": d},
        note="gated RMSNorm per head",
    )
    b.out_proj("o_n", n)
    return "attn_out"


def _kda_qkv(b: Builder, a: KDASpec, x: str) -> None:
    """q, k and v projected from the full hidden (split by head), each through its causal short conv."""
    n, w = a.heads, a.width
    for p in ("q", "k", "v"):
        b.linear(
            f"{p}_proj",
            x,
            p,
            w,
            WeightSplit.COL,
            heads=n,
            weight=f"self_attn.{p}_proj.weight",
            note=f"{p} projection from the full hidden, split by head",
        )
        b.op(
            f"{p}_conv1d",
            OpKind.TOKEN_MIX,
            (p,),
            f"{p}_c",
            w,
            n,
            weight=f"self_attn.{p}_conv1d.weight",
            weight_shape=(w, 1, a.conv_kernel),
            split=WeightSplit.COL,
            split_heads=n,
            flops_per_token=2.0 * w * a.conv_kernel,
            attrs={"impl": "short_conv", "kernel": a.conv_kernel},
            note=f"depthwise causal short conv over {a.conv_kernel} neighbouring tokens",
        )


def _kda_gates(b: Builder, a: KDASpec, x: str) -> None:
    """The forget gate (low rank) and the per-head write strength beta."""
    n, d, w = a.heads, a.head_dim, a.width
    b.linear(
        "f_a_proj",
        x,
        "f_low",
        d,
        WeightSplit.REPLICATED,
        weight="self_attn.f_a_proj.weight",
        note="forget-gate low-rank down-projection",
    )
    b.linear(
        "f_b_proj",
        "f_low",
        "f",
        w,
        WeightSplit.COL,
        heads=n,
        weight="self_attn.f_b_proj.weight",
        note="forget-gate up-projection, split by head",
    )
    b.linear(
        "b_proj",
        x,
        "beta_logits",
        n,
        WeightSplit.COL,
        heads=n,
        weight="self_attn.b_proj.weight",
        note="per-head write strength beta",
    )


def _kda_output_gate(b: Builder, a: KDASpec, x: str) -> None:
    """The output gate `g_out`: full rank, or low rank down and up."""
    n, d, w = a.heads, a.head_dim, a.width
    if a.full_rank_gate:
        b.linear(
            "g_proj",
            x,
            "g_out",
            w,
            WeightSplit.COL,
            heads=n,
            weight="self_attn.g_proj.weight",
            note="full-rank output gate from the full hidden, split by head",
        )
    else:
        b.linear(
            "g_a_proj",
            x,
            "g_low",
            d,
            WeightSplit.REPLICATED,
            weight="self_attn.g_a_proj.weight",
            note="output-gate low-rank down-projection",
        )
        b.linear(
            "g_b_proj",
            "g_low",
            "g_out",
            w,
            WeightSplit.COL,
            heads=n,
            weight="self_attn.g_b_proj.weight",
            note="output-gate up-projection, split by head",
        )


def _kda_params(op: Op, numerics: Any) -> Params:
    n, d = op.int_attr("heads"), op.int_attr("head_dim")
    base = op.weight.rsplit(".", 1)[0]
    return {"A_log": (op.weight, (n,)), "dt_bias": (f"{base}.dt_bias", (n * d,))}


def _kda_cuts(op: Op, params: Params, sc: ShardCtx) -> Cuts:
    heads, d = op.int_attr("heads"), op.int_attr("head_dim")
    return {
        "A_log": head_cut(0, heads, heads, sc.shards, sc.rank),
        "dt_bias": head_cut(0, heads * d, heads, sc.shards, sc.rank),
    }


def _kda_run(op: Op, inputs: list[Tensor], w: Weights, state: State, ctx: RunCtx, K: Kernels) -> Tensor:
    return K.kda(*inputs, head_dim=op.int_attr("head_dim"), a_log=w["A_log"], dt_bias=w["dt_bias"], state=state)


def _kda_state_bytes(attn: KDASpec, shards: int, b: float, state_bytes: float) -> float:
    """Delta-rule state d x d per head (fp32) plus the q/k/v short-conv tails (K-1 inputs), heads split over
    `shards` ranks (TP)."""
    heads = attn.heads / shards
    conv = 3 * attn.width / shards * (attn.conv_kernel - 1) * b
    return heads * attn.head_dim * attn.head_dim * state_bytes + conv


register_mixer(
    Mixer(
        "kda", "recurrence", _kda_run, build=build_kda, params=_kda_params, cuts=_kda_cuts,
        state_bytes=_kda_state_bytes, channel_gated=True, cp="state",
        state_dims=lambda op: (op.int_attr("heads"), op.int_attr("head_dim"), op.int_attr("head_dim")),
        kernel_shape=lambda op, values: {"heads": op.int_attr("heads"), "d": op.int_attr("head_dim")},
    )
)  # fmt: skip

# ----------------------------------------------------------------------------------------------
# Config


class RawLinearAttnConfig(Raw):
    num_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    short_conv_kernel_size: int = Field(default=4, gt=0)
    use_full_rank_gate: bool = False
    kda_layers: list[int] = Field(default_factory=list)
    full_attn_layers: list[int] = Field(default_factory=list)


class RawKimiLinear(MLAFields, MoEFields):
    """kimi_linear, also K3's text_config."""

    intermediate_size: int = Field(gt=0)
    mla_use_nope: bool = False
    mla_use_output_gate: bool = False
    num_shared_experts: int = Field(default=0, ge=0, validation_alias=SHARED_EXPERTS)
    first_k_dense_replace: int = Field(default=0, ge=0)
    moe_layer_freq: int = Field(default=1, gt=0)
    num_expert_group: int = Field(default=1, gt=0)
    topk_group: int = Field(default=1, gt=0)
    moe_router_activation_func: Scoring = "sigmoid"
    # K3's latent MoE: SGLang and the released config say routed_expert_hidden_size.
    moe_latent_size: int | None = Field(default=None, gt=0, alias="routed_expert_hidden_size")
    latent_moe_use_norm: bool = True
    attn_res_block_size: int | None = Field(default=None, gt=0)
    linear_attn_config: RawLinearAttnConfig

    @model_validator(mode="before")
    @classmethod
    def _accept_both_latent_names(cls, data: Any) -> Any:
        if isinstance(data, dict) and "moe_latent_size" in data and "routed_expert_hidden_size" not in data:
            data = dict(data)
            data["routed_expert_hidden_size"] = data.pop("moe_latent_size")
        return data


def _layer_kinds_from_lists(label: str, n_layers: int, kda: list[int], full: list[int], prefix: str) -> list[str]:
    """Turn 1-based `kda_layers`/`full_attn_layers` into a per-layer list, checking coverage."""
    if not kda and not full:
        raise TpplanError(
            f"{label}: field '{prefix}'",
            "neither kda_layers nor full_attn_layers is given, so the layer kinds are unknown",
            "list every layer (1-based) in exactly one of kda_layers / full_attn_layers",
        )
    kinds: list[str | None] = [None] * n_layers
    for name, lst, kind in (("kda_layers", kda, "kda"), ("full_attn_layers", full, "mla")):
        for layer in lst:
            if not 1 <= layer <= n_layers:
                raise TpplanError(
                    f"{label}: field '{prefix}.{name}'",
                    f"layer {layer} is outside 1..{n_layers} (these lists are 1-based)",
                    f"use layer numbers between 1 and num_hidden_layers={n_layers}",
                )
            if kinds[layer - 1] is not None:
                raise TpplanError(
                    f"{label}: field '{prefix}.{name}'",
                    f"layer {layer} is listed as both KDA and full attention",
                    "list each layer in exactly one of kda_layers / full_attn_layers",
                )
            kinds[layer - 1] = kind
    missing = [i + 1 for i, k in enumerate(kinds) if k is None]
    if missing:
        shown = ", ".join(map(str, missing[:8])) + (" ..." if len(missing) > 8 else "")
        raise TpplanError(
            f"{label}: field '{prefix}'",
            f"kda_layers and full_attn_layers do not cover all {n_layers} layers; missing 1-based layers {shown}",
            "list every layer in exactly one of the two lists",
        )
    return [k for k in kinds if k is not None]


def _kimi_linear_spec(raw: dict[str, Any], label: str, name: str, model_type: str, prefix: str) -> ModelSpec:
    c: RawKimiLinear = validate(RawKimiLinear, raw, label)
    la = c.linear_attn_config
    kinds = _layer_kinds_from_lists(
        label, c.num_hidden_layers, la.kda_layers, la.full_attn_layers, f"{prefix}linear_attn_config"
    )
    mla = c.mla(output_gate=c.mla_use_output_gate, use_rope=not c.mla_use_nope)
    kda = KDASpec(la.num_heads, la.head_dim, la.short_conv_kernel_size, la.use_full_rank_gate)
    dense = DenseMLPSpec(c.intermediate_size)
    moe = c.routed(
        label,
        c.num_expert_group,
        c.topk_group,
        shared_intermediate=c.num_shared_experts * (c.moe_intermediate_size or 0),
        scoring=c.moe_router_activation_func,
        latent=c.moe_latent_size,
        latent_norm=bool(c.moe_latent_size) and c.latent_moe_use_norm,
    )
    layers = tuple(
        LayerSpec(
            mla if kind == "mla" else kda,
            moe if moe and moe_layer(i, c.first_k_dense_replace, c.moe_layer_freq, moe.experts) else dense,
        )
        for i, kind in enumerate(kinds)
    )
    family = "kimi_k3" if model_type == "kimi_k3" else "kimi_linear"
    return c.model_spec(label, name, model_type, family, layers, attn_res_block_size=c.attn_res_block_size)


def build_kimi_linear(raw: dict[str, Any], label: str, name: str, model_type: str) -> ModelSpec:
    return _kimi_linear_spec(raw, label, name, "kimi_linear", "")


def build_kimi_k3(raw: dict[str, Any], label: str, name: str, model_type: str) -> ModelSpec:
    """Unwrap K3's `text_config` and read it as kimi_linear, with K3's extra fields."""
    text = wrapped_text(raw, label, model_type, ("kimi_linear",), "add the kimi_linear text_config")
    return _kimi_linear_spec(text, f"{label} (text_config)", name, "kimi_k3", "text_config.")


_SIGNATURE = frozenset({"linear_attn_config", "kda_layers", "num_experts_per_token", "mla_use_nope"})
register(
    Family(
        "kimi_linear",
        {"kimi_linear": "Kimi-Linear (KDA + MLA hybrid, MoE)"},
        build_kimi_linear,
        numerics=mla_numerics,
        signature=_SIGNATURE,
    )
)
register(
    Family(
        "kimi_k3",
        {"kimi_k3": "Kimi-K3 (a kimi_linear text_config with MLA output gate, latent MoE, AttnRes)"},
        build_kimi_k3,
        numerics=mla_numerics,
        text_config=text_config,
        signature=_SIGNATURE | {"attn_res_block_size", "routed_expert_hidden_size", "text_config"},
    )
)
