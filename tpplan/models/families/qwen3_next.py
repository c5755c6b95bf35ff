"""Qwen3-Next family (qwen3_next): gated softmax attention + Gated DeltaNet hybrid with MoE.

Owns the Gated DeltaNet token mixer: its graph (fused q/k/v/z and b/a projections laid out per
key-head group, one op for short conv + gated delta rule + gated RMSNorm), the HF names of its
conv, A_log, dt_bias and norm, how a key-head slice cuts the fused conv channels, the kernel call
and the recurrent state bytes. Its full-attention layers are GQA (`gqa`) with the doubled q_proj
output gate, q/k norm and partial rotary; its RMSNorms are zero-centred (1 + w).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field

from tpplan.errors import TpplanError
from tpplan.models.cuts import FULL, Cut, head_range
from tpplan.models.families import Family, register
from tpplan.models.families._common import EXPERTS, TOP_K, Raw, check_group, validate
from tpplan.models.graph import Builder, Op, OpKind, WeightSplit
from tpplan.models.opkinds import Cuts, Mixer, Params, ShardCtx, register_mixer
from tpplan.models.spec import DenseMLPSpec, GDNSpec, GQASpec, LayerSpec, ModelSpec, MoESpec

# ----------------------------------------------------------------------------------------------
# Gated DeltaNet


def build_gdn(b: Builder, a: GDNSpec, x: str) -> str:
    nk = a.k_heads
    qkvz = 2 * a.key_dim + 2 * a.value_dim
    b.linear(
        "in_proj_qkvz",
        x,
        "qkvz",
        qkvz,
        WeightSplit.COL,
        heads=nk,
        weight="linear_attn.in_proj_qkvz.weight",
        note="q, k, v and output gate z from the full hidden, split by key-head group",
    )
    b.linear(
        "in_proj_ba",
        x,
        "ba",
        2 * a.v_heads,
        WeightSplit.COL,
        heads=nk,
        weight="linear_attn.in_proj_ba.weight",
        note="beta and decay logits, split by key-head group",
    )
    conv_dim = 2 * a.key_dim + a.value_dim
    b.op(
        "gated_deltanet",
        OpKind.TOKEN_MIX,
        ("qkvz", "ba"),
        "o_n",
        a.value_dim,
        nk,
        weight="linear_attn.conv1d.weight",
        weight_shape=(conv_dim, 1, a.conv_kernel),
        split=WeightSplit.COL,
        split_heads=nk,
        flops_per_token=2.0 * conv_dim * a.conv_kernel + 8.0 * a.v_heads * a.k_head_dim * a.v_head_dim,
        attrs={
            "impl": "gdn",
            "k_heads": nk,
            "v_heads": a.v_heads,
            "k_head_dim": a.k_head_dim,
            "v_head_dim": a.v_head_dim,
            "kernel": a.conv_kernel,
        },
        note="short conv over tokens, gated delta rule and gated RMSNorm per head",
    )
    b.linear(
        "out_proj",
        "o_n",
        "attn_out",
        b.hidden,
        WeightSplit.ROW,
        heads=nk,
        weight="linear_attn.out_proj.weight",
        note="output projection, split by input heads",
    )
    return "attn_out"


def _gdn_params(op: Op, numerics: Any) -> Params:
    hv, dv = op.attrs["v_heads"], op.attrs["v_head_dim"]
    return {
        "conv": (op.weight, op.weight_shape),
        "A_log": ("linear_attn.A_log", (hv,)),
        "dt_bias": ("linear_attn.dt_bias", (hv,)),
        "norm": ("linear_attn.norm.weight", (dv,)),
    }


def _gdn_cuts(op: Op, params: Params, sc: ShardCtx) -> Cuts:
    """The conv's channels are [q (all heads) | k (all heads) | v (all heads)]: three ranges per rank."""
    a = op.attrs
    nk, nv, dk, dv = int(a["k_heads"]), int(a["v_heads"]), int(a["k_head_dim"]), int(a["v_head_dim"])
    lo, hi = head_range(nk, sc.n, sc.rank)
    r = nv // nk
    conv = Cut(0, ((lo * dk, hi * dk), (nk * dk + lo * dk, nk * dk + hi * dk),
                   (2 * nk * dk + lo * r * dv, 2 * nk * dk + hi * r * dv)))  # fmt: skip
    vh = Cut(0, ((lo * r, hi * r),))
    return {"conv": conv, "A_log": vh, "dt_bias": vh, "norm": FULL}


def _gdn_run(op: Op, inputs: list[Any], w: Mapping[str, Any], state: dict[str, Any], ctx: Any, K: Any) -> Any:
    a = op.attrs
    return K.gdn(
        inputs[0], inputs[1], conv_weight=w["conv"], a_log=w["A_log"], dt_bias=w["dt_bias"], norm_weight=w["norm"],
        eps=ctx.numerics.eps, k_head_dim=int(a["k_head_dim"]), v_head_dim=int(a["v_head_dim"]),
        v_per_k=int(a["v_heads"]) // int(a["k_heads"]), state=state,
    )  # fmt: skip


def _gdn_state_bytes(attn: GDNSpec, tp: int, b: float, state_bytes: float) -> float:
    """Delta-rule state dk x dv per v head (fp32) plus the conv tails (K-1 inputs), heads split over TP."""
    heads = attn.v_heads / tp
    conv = (2 * attn.key_dim + attn.value_dim) / tp * (attn.conv_kernel - 1) * b
    return heads * attn.k_head_dim * attn.v_head_dim * state_bytes + conv


register_mixer(
    Mixer(
        "gdn", "recurrence", _gdn_run, build=build_gdn, params=_gdn_params, cuts=_gdn_cuts,
        state_bytes=_gdn_state_bytes,
    )
)  # fmt: skip

# ----------------------------------------------------------------------------------------------
# Config


class RawQwen3Next(Raw):
    hidden_size: int = Field(gt=0)
    num_hidden_layers: int = Field(gt=0)
    num_attention_heads: int = Field(gt=0)
    num_key_value_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    intermediate_size: int = Field(gt=0)
    full_attention_interval: int = Field(default=4, gt=0)
    layer_types: list[str] | None = None
    linear_num_key_heads: int = Field(gt=0)
    linear_num_value_heads: int = Field(gt=0)
    linear_key_head_dim: int = Field(gt=0)
    linear_value_head_dim: int = Field(gt=0)
    linear_conv_kernel_dim: int = Field(default=4, gt=0)
    num_experts: int = Field(default=0, ge=0, validation_alias=EXPERTS)
    num_experts_per_tok: int = Field(default=1, gt=0, validation_alias=TOP_K)
    moe_intermediate_size: int | None = Field(default=None, gt=0)
    shared_expert_intermediate_size: int = Field(default=0, ge=0)
    decoder_sparse_step: int = Field(default=1, gt=0)
    mlp_only_layers: list[int] = Field(default_factory=list)
    partial_rotary_factor: float = Field(default=0.25, gt=0, le=1)
    tie_word_embeddings: bool = False


def build_spec(raw: dict[str, Any], label: str, name: str, model_type: str) -> ModelSpec:
    c: RawQwen3Next = validate(RawQwen3Next, raw, label)
    if c.layer_types is not None:
        if len(c.layer_types) != c.num_hidden_layers:
            raise TpplanError(
                f"{label}: field 'layer_types'",
                f"has {len(c.layer_types)} entries for {c.num_hidden_layers} layers",
                "give one entry per layer, or drop layer_types to use full_attention_interval",
            )
        bad = sorted({t for t in c.layer_types if t not in ("full_attention", "linear_attention")})
        if bad:
            raise TpplanError(
                f"{label}: field 'layer_types'",
                f"unknown layer type(s) {bad}",
                "use 'full_attention' or 'linear_attention'",
            )
        full = [t == "full_attention" for t in c.layer_types]
    else:
        full = [(i + 1) % c.full_attention_interval == 0 for i in range(c.num_hidden_layers)]
    if c.linear_num_value_heads % c.linear_num_key_heads:
        raise TpplanError(
            label,
            "linear_num_value_heads must be a multiple of linear_num_key_heads",
            "correct the Gated DeltaNet head counts",
        )
    gqa = GQASpec(
        heads=c.num_attention_heads,
        kv_heads=c.num_key_value_heads,
        head_dim=c.head_dim,
        output_gate=True,
        qk_norm=True,
        rotary_dim=int(c.head_dim * c.partial_rotary_factor),
    )
    gdn = GDNSpec(
        c.linear_num_key_heads,
        c.linear_num_value_heads,
        c.linear_key_head_dim,
        c.linear_value_head_dim,
        c.linear_conv_kernel_dim,
    )
    dense = DenseMLPSpec(c.intermediate_size)
    moe = None
    if c.num_experts:
        if not c.moe_intermediate_size:
            raise TpplanError(
                label, "num_experts is set but moe_intermediate_size is missing", "add moe_intermediate_size"
            )
        check_group(label, c.num_experts, 1, 1, c.num_experts_per_tok)
        moe = MoESpec(
            experts=c.num_experts,
            top_k=c.num_experts_per_tok,
            expert_intermediate=c.moe_intermediate_size,
            shared_intermediate=c.shared_expert_intermediate_size,
            scoring="softmax",
            shared_gate=c.shared_expert_intermediate_size > 0,
        )
    dense_only = set(c.mlp_only_layers)
    layers = tuple(
        LayerSpec(
            gqa if full[i] else gdn,
            moe if moe and i not in dense_only and (i + 1) % c.decoder_sparse_step == 0 else dense,
        )
        for i in range(c.num_hidden_layers)
    )
    return ModelSpec(
        name=name,
        model_type="qwen3_next",
        family="qwen3_next",
        hidden=c.hidden_size,
        vocab=c.vocab_size,
        layers=layers,
        tie_embeddings=c.tie_word_embeddings,
        source=label,
    )


register(
    Family(
        "qwen3_next",
        {"qwen3_next": "Qwen3-Next (gated attention + Gated DeltaNet, MoE)"},
        build_spec,
        numerics=lambda text: {"norm_offset": 1.0},
        signature=frozenset({"linear_num_key_heads", "linear_key_head_dim", "full_attention_interval"}),
    )
)
