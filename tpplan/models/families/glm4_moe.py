"""GLM-4.5 family (glm4_moe: GLM-4.5, 4.5-Air, 4.6, 4.7): biased GQA with partial rotary, MoE.

Attention is GQA (`gqa` mixer) with a bias on q/k/v (`attention_bias`), optional per-head q/k
RMSNorm (`use_qk_norm`: on for the 355B models, off for Air) and rotary on the first half of each
head (`partial_rotary_factor`, default 0.5 as transformers assumes). The MLP is DeepSeek-V3's:
`first_k_dense_replace` dense layers, then routed experts with a sigmoid router that picks by
score + `e_score_correction_bias` (grouped top-k), routed scaling, and shared experts.
MTP layers (`num_nextn_predict_layers`) are not part of prefill and are not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field

from tpplan.models.families import Family, register
from tpplan.models.families._common import (
    EXPERTS,
    SHARED_EXPERTS,
    TOP_K,
    GQAFields,
    MoEFields,
    first_k_dense,
    moe_layer,
    validate,
)
from tpplan.models.families.deepseek_v32 import mtp_note
from tpplan.models.families.gqa import build_gqa, gqa_kv_bytes
from tpplan.models.opkinds import Mixer, register_mixer
from tpplan.models.ops import Builder
from tpplan.models.spec import DenseMLPSpec, GQASpec, LayerSpec, ModelSpec


@dataclass(frozen=True)
class BiasedGQASpec:
    """GQA whose q/k/v projections carry a bias (GLM-4.5's `attention_bias`)."""

    gqa: GQASpec

    kind: Literal["gqa_qkv_bias"] = "gqa_qkv_bias"

    @property
    def heads(self) -> int:
        return self.gqa.heads


def build_biased_gqa(b: Builder, a: BiasedGQASpec, x: str) -> str:
    b.prefix = "gqa"  # roles as plain GQA's
    out = build_gqa(b, a.gqa, x)
    for op in b.ops:
        if op.name in ("q_proj", "k_proj", "v_proj"):
            op.attrs["bias"] = True  # column-parallel: each rank adds its heads' slice of the bias
    return out


register_mixer(
    Mixer(
        "gqa_qkv_bias", "attention", lambda *a: None, build=build_biased_gqa,
        kv_bytes=lambda attn, shards, b: gqa_kv_bytes(attn.gqa, shards, b), head_kv=True,
    )
)  # fmt: skip

# ----------------------------------------------------------------------------------------------
# Config


class RawGlm4Moe(GQAFields, MoEFields):
    intermediate_size: int = Field(gt=0)
    moe_intermediate_size: int = Field(gt=0)
    num_experts: int = Field(gt=0, validation_alias=EXPERTS)
    num_experts_per_tok: int = Field(gt=0, validation_alias=TOP_K)
    n_shared_experts: int = Field(default=1, ge=0, validation_alias=SHARED_EXPERTS)
    first_k_dense_replace: int = Field(default=1, ge=0)
    n_group: int = Field(default=1, gt=0)
    topk_group: int = Field(default=1, gt=0)
    attention_bias: bool = False
    use_qk_norm: bool = False
    partial_rotary_factor: float | None = Field(default=None, gt=0, le=1)
    rope_parameters: dict[str, Any] | None = None
    num_nextn_predict_layers: int = Field(default=0, ge=0)


def build_spec(raw: dict[str, Any], label: str, name: str, model_type: str) -> ModelSpec:
    c: RawGlm4Moe = validate(RawGlm4Moe, raw, label)
    c.kv_heads(label)
    first_k_dense(label, c.first_k_dense_replace, c.num_hidden_layers)
    factor = c.partial_rotary_factor or (c.rope_parameters or {}).get("partial_rotary_factor") or 0.5
    gqa = c.gqa(label, qk_norm=c.use_qk_norm, rotary_dim=int(c.dim * float(factor)))
    attn = BiasedGQASpec(gqa) if c.attention_bias else gqa
    shared = c.n_shared_experts * c.moe_intermediate_size
    moe = c.routed(label, c.n_group, c.topk_group, shared_intermediate=shared, scoring="sigmoid")
    assert moe is not None  # num_experts > 0
    dense = DenseMLPSpec(c.intermediate_size)
    layers = tuple(
        LayerSpec(attn, moe if moe_layer(i, c.first_k_dense_replace, 1, moe.experts) else dense)
        for i in range(c.num_hidden_layers)
    )
    return c.model_spec(
        label,
        name,
        model_type,
        "glm4_moe",
        layers,
        notes=mtp_note(c.num_nextn_predict_layers),
        mtp_layers=c.num_nextn_predict_layers,
    )


register(
    Family(
        "glm4_moe",
        {"glm4_moe": "GLM-4.5 / 4.5-Air / 4.6 / 4.7 (biased GQA, partial rotary, MoE with shared expert)"},
        build_spec,
        numerics=lambda text: {"router_bias": True},
        signature=frozenset({"use_qk_norm", "partial_rotary_factor", "attention_bias", "first_k_dense_replace"}),
    )
)
