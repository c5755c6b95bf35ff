"""gpt-oss family (gpt_oss): GQA with sinks, alternating sliding-window / full layers, biased MoE.

What is gpt-oss-specific, and where it lives:
- attention: the GQA mixer (`gqa`) with per-head sinks (a learned logit in the softmax denominator,
  cut by head like the query heads), biases on q/k/v/o (column-parallel q/k/v keep their heads'
  bias; row-parallel o_proj's bias enters its partial sum once, on rank 0: `opkind_defs._linear_cuts`),
  and `layer_types` choosing a sliding window (`sliding_window` keys) or full attention per layer;
- MLP: every layer is MoE: a router with a logit bias (`mlp.router`), top-k of the logits then a
  softmax over them (= softmax renormalised over the top-k), experts with biases and the clamped
  SwiGLU (alpha, limit) (`kernels.routed_experts`).
Checkpoint names: HF's stacked `mlp.experts.gate_up_proj` [E, H, 2I] (gate/up interleaved by
column) and `down_proj` [E, I, H] are split into per-expert canonical tensors by
`weights.normalize_names`; the released MXFP4 blocks (`*_blocks`, `*_scales`) are not read by the
runtime (dequantize to bf16 first); their bytes are the planner's business (quantization_config).
"""

from __future__ import annotations

from typing import Any

from pydantic import AliasChoices, Field

from tpplan.models.families import Family, register
from tpplan.models.families._common import GQAFields, layer_windows, routed_experts, validate
from tpplan.models.spec import LayerSpec, ModelSpec


class RawGptOss(GQAFields):
    intermediate_size: int = Field(gt=0)  # per expert
    num_local_experts: int = Field(gt=0, validation_alias=AliasChoices("num_local_experts", "num_experts"))
    num_experts_per_tok: int = Field(
        default=4, gt=0, validation_alias=AliasChoices("num_experts_per_tok", "experts_per_token")
    )
    sliding_window: int | None = Field(default=128, gt=0)
    layer_types: list[str] | None = None
    attention_bias: bool = True
    swiglu_alpha: float = Field(default=1.702, gt=0)
    swiglu_limit: float = Field(default=7.0, gt=0)


def build_spec(raw: dict[str, Any], label: str, name: str, model_type: str) -> ModelSpec:
    c: RawGptOss = validate(RawGptOss, raw, label)
    c.kv_heads(label)
    moe = routed_experts(
        label,
        c.num_local_experts,
        c.num_experts_per_tok,
        c.intermediate_size,
        scoring="softmax",
        router="router",
        router_bias=True,
        expert_bias=True,
        clamp=(c.swiglu_alpha, c.swiglu_limit),
    )
    windows = layer_windows(label, c.layer_types, c.num_hidden_layers, c.sliding_window)
    bias = c.attention_bias
    layers = tuple(LayerSpec(c.gqa(label, qkv_bias=bias, o_bias=bias, sinks=True, window=w), moe) for w in windows)
    return c.model_spec(label, name, model_type, "gpt_oss", layers)


register(
    Family(
        "gpt_oss",
        {"gpt_oss": "gpt-oss (GQA with sinks, sliding/full layers, biased MoE with clamped SwiGLU)"},
        build_spec,
        # top-k of the logits then softmax over the k = softmax over all experts renormalised over the k
        numerics=lambda text: {"renormalize": True},
        signature=frozenset({"swiglu_limit", "experts_per_token", "num_local_experts", "sliding_window"}),
    )
)
