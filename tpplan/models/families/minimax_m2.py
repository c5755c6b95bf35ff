"""MiniMax-M2 family (minimax_m2): GQA whose q/k RMSNorm spans the whole projection, with MoE.

`q_norm` normalises each token's whole query row (heads x head_dim, 6144 wide on M2) and `k_norm`
its whole key row, not each head. Under head-sharded TP a rank holds only its heads, so the norm's
statistic is a reduction over a split dimension: the graph states it as a MEAN_SQ op (each rank's
share of the per-token mean square, a partial sum) read by RMS_SCALE ops, and the propagation
derives the all-reduce of that [T, 2] statistic (q and k together) and prices it like any other
collective. Partial rotary (`rotary_dim`, or `partial_rotary_factor`) rotates the first dims of
each head; the router scores with a sigmoid and picks experts by score + `e_score_correction_bias`.
MTP modules (`use_mtp`, `num_mtp_modules`) are not part of prefill and are not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field

from tpplan.errors import TpplanError
from tpplan.models.families import Family, register
from tpplan.models.families._common import EXPERTS, TOP_K, GQAFields, Scoring, routed_experts, validate
from tpplan.models.families.gqa import gqa_kv_bytes
from tpplan.models.opkinds import Mixer, register_mixer
from tpplan.models.ops import Builder, OpKind, WeightSplit
from tpplan.models.spec import GQASpec, LayerSpec, ModelSpec


@dataclass(frozen=True)
class WideNormGQASpec:
    """GQA with one RMSNorm over all heads of q and one over all heads of k (MiniMax-M2)."""

    heads: int
    kv_heads: int
    head_dim: int
    rotary_dim: int
    qk_norm: bool = True

    kind: Literal["gqa_wide_norm"] = "gqa_wide_norm"


def build_wide_norm_gqa(b: Builder, a: WideNormGQASpec, x: str) -> str:
    b.prefix = "gqa"  # roles as plain GQA's
    n, kv, d = a.heads, a.kv_heads, a.head_dim
    for name, out, heads in (("q_proj", "q", n), ("k_proj", "k", kv), ("v_proj", "v", kv)):
        b.linear(
            name,
            x,
            out,
            heads * d,
            WeightSplit.COL,
            heads=heads,
            weight=f"self_attn.{name}.weight",
            note=f"{out} projection, split by {'KV ' if heads == kv else ''}head",
        )
    q, k = "q", "k"
    if a.qk_norm:
        b.op(
            "qk_norm_stat",
            OpKind.MEAN_SQ,
            ("q", "k"),
            "qk_ms",
            2,
            flops_per_token=2.0 * (n + kv) * d,
            note="mean square of each token's whole q row and whole k row (a sum over every head)",
        )
        for name, src, out, heads, col in (("q_norm", "q", "q_n", n, 0), ("k_norm", "k", "k_n", kv, 1)):
            b.op(
                name,
                OpKind.RMS_SCALE,
                (src, "qk_ms"),
                out,
                heads * d,
                heads,
                weight=f"self_attn.{name}.weight",
                weight_shape=(heads * d,),
                split_heads=heads,
                flops_per_token=2.0 * heads * d,
                attrs={"column": col},
                note=f"RMSNorm of the whole {src} row (all heads), from the shared statistic",
            )
        q, k = "q_n", "k_n"
    b.op(
        "attention",
        OpKind.TOKEN_MIX,
        (q, k, "v"),
        "attn",
        n * d,
        n,
        ctx_flops_per_token=4.0 * n * d,
        attrs={"impl": "gqa", "heads": n, "kv_heads": kv, "head_dim": d, "qk_norm": False, "rotary_dim": a.rotary_dim},
        note="causal softmax attention over all tokens of its heads",
    )
    return b.out_proj("attn", n)


def _kv_bytes(attn: WideNormGQASpec, shards: int, b: float) -> float:
    return gqa_kv_bytes(GQASpec(attn.heads, attn.kv_heads, attn.head_dim), shards, b)


register_mixer(
    Mixer("gqa_wide_norm", "attention", lambda *a: None, build=build_wide_norm_gqa, kv_bytes=_kv_bytes, head_kv=True)
)

# ----------------------------------------------------------------------------------------------
# Config


class RawMiniMaxM2(GQAFields):
    intermediate_size: int = Field(gt=0)  # per routed expert
    num_local_experts: int = Field(gt=0, validation_alias=EXPERTS)
    num_experts_per_tok: int = Field(gt=0, validation_alias=TOP_K)
    shared_intermediate_size: int = Field(default=0, ge=0)
    rotary_dim: int | None = Field(default=None, gt=0)
    partial_rotary_factor: float | None = Field(default=None, gt=0, le=1)
    rope_parameters: dict[str, Any] | None = None
    use_qk_norm: bool = True
    qk_norm_type: str = "per_layer"
    attn_type_list: list[int] | None = None
    scoring_func: Scoring = "sigmoid"
    use_mtp: bool = False
    num_mtp_modules: int = Field(default=0, ge=0)


def build_spec(raw: dict[str, Any], label: str, name: str, model_type: str) -> ModelSpec:
    c: RawMiniMaxM2 = validate(RawMiniMaxM2, raw, label)
    d = c.dim
    c.kv_heads(label)
    if c.attn_type_list is not None and any(t != 1 for t in c.attn_type_list):
        raise TpplanError(
            f"{label}: field 'attn_type_list'",
            "has linear-attention layers (0); MiniMax-M2 is all softmax attention (1) and only that is modelled",
            "use a minimax_m2 config whose attn_type_list is all 1",
        )
    if c.use_qk_norm and c.qk_norm_type != "per_layer":
        raise TpplanError(
            f"{label}: field 'qk_norm_type'",
            f"{c.qk_norm_type!r} is not modelled (MiniMax-M2 normalises the whole projection: 'per_layer')",
            "use qk_norm_type 'per_layer'",
        )
    factor = c.partial_rotary_factor or (c.rope_parameters or {}).get("partial_rotary_factor")
    rotary = c.rotary_dim or (int(d * float(factor)) if factor else d)
    if rotary > d or rotary % 2:
        raise TpplanError(
            f"{label}: field 'rotary_dim'", f"{rotary} must be even and at most head_dim={d}", "correct rotary_dim"
        )
    if c.shared_intermediate_size:
        raise TpplanError(
            f"{label}: field 'shared_intermediate_size'",
            "a shared expert is not modelled for minimax_m2 (the released models have none)",
            "set shared_intermediate_size to 0",
        )
    moe = routed_experts(label, c.num_local_experts, c.num_experts_per_tok, c.intermediate_size, scoring=c.scoring_func)
    attn = WideNormGQASpec(c.num_attention_heads, c.num_key_value_heads, d, rotary, c.use_qk_norm)
    return c.model_spec(
        label,
        name,
        model_type,
        "minimax_m2",
        tuple(LayerSpec(attn, moe) for _ in range(c.num_hidden_layers)),
        notes=(
            (f"{c.num_mtp_modules} MTP module(s) (use_mtp) are not part of prefill: not planned, not in memory",)
            if c.use_mtp and c.num_mtp_modules
            else ()
        ),
    )


register(
    Family(
        "minimax_m2",
        {"minimax_m2": "MiniMax-M2 / M2.5 / M2.7 (GQA with whole-projection q/k norm, MoE)"},
        build_spec,
        numerics=lambda text: {"router_bias": bool(text.get("use_routing_bias", True))},
        signature=frozenset({"attn_type_list", "qk_norm_type", "use_routing_bias", "rotary_dim", "use_mtp"}),
    )
)
