"""Llama 4 family (llama4 text part, llama4_text): chunked / NoPE GQA, interleaved MoE with a shared expert.

What is Llama-4-specific, and where it lives:
- attention: the GQA mixer (`gqa`). RoPE layers (`no_rope_layers[i] == 1`) rotate interleaved
  pairs (llama3 frequency scaling), RMS-normalise q and k per head without a weight
  (`use_qk_norm`) and attend within their `attention_chunk_size` chunk; NoPE layers attend over
  every token, with log-position query scaling (`attn_temperature_tuning`, `floor_scale`,
  `attn_scale`);
- MLP: MoE on `moe_layers` (default: every `interleave_moe_layer_step`-th layer), dense
  (`intermediate_size_mlp`) elsewhere. The router picks the top-k logits and scales the chosen
  expert's *input* by sigmoid(logit) (`MoESpec.scale_inputs`); a shared expert
  (`intermediate_size`) runs on every token.
A `llama4` config wraps the text model in `text_config` (vision not modelled). Checkpoints spell
the MLP `feed_forward.*` and stack experts as [E, H, 2I] (gate | up halves) and [E, I, H];
`weights.normalize_names` maps them onto the canonical per-expert `mlp.*` names.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field

from tpplan.errors import TpplanError
from tpplan.models.families import Family, register
from tpplan.models.families._common import GQAFields, routed_experts, text_config, validate
from tpplan.models.spec import DenseMLPSpec, GQASpec, LayerSpec, ModelSpec


class RawLlama4Text(GQAFields):
    intermediate_size: int = Field(gt=0)  # routed and shared expert width
    intermediate_size_mlp: int = Field(gt=0)  # dense layers
    num_local_experts: int = Field(gt=0)
    num_experts_per_tok: int = Field(default=1, gt=0)
    moe_layers: list[int] | None = None
    interleave_moe_layer_step: int = Field(default=1, gt=0)
    no_rope_layers: list[int] | None = None
    no_rope_layer_interval: int = Field(default=4, gt=0)
    attention_chunk_size: int | None = Field(default=8192, gt=0)
    use_qk_norm: bool = True
    attn_temperature_tuning: bool = True
    floor_scale: float = Field(default=8192, gt=0)
    attn_scale: float = 0.1
    attention_bias: bool = False


def build_spec(raw: dict[str, Any], label: str, name: str, model_type: str) -> ModelSpec:
    text = text_config(raw)
    where = f"{label} (text_config)" if text is not raw else label
    c: RawLlama4Text = validate(RawLlama4Text, dict(text), where)
    n_layers = c.num_hidden_layers
    c.kv_heads(where)
    if c.attention_bias:
        raise TpplanError(
            f"{where}: field 'attention_bias'", "Llama 4 has no attention bias", "set attention_bias to false"
        )
    rope = c.no_rope_layers or [int((i + 1) % c.no_rope_layer_interval != 0) for i in range(n_layers)]
    if len(rope) != n_layers:
        raise TpplanError(
            f"{where}: field 'no_rope_layers'", f"has {len(rope)} entries for {n_layers} layers", "give one per layer"
        )
    step = c.interleave_moe_layer_step
    moe_at = set(c.moe_layers if c.moe_layers is not None else range(step - 1, n_layers, step))
    moe = routed_experts(
        where,
        c.num_local_experts,
        c.num_experts_per_tok,
        c.intermediate_size,
        shared_intermediate=c.intermediate_size,
        scoring="sigmoid",
        router="router",
        scale_inputs=True,
        shared_module="shared_expert",
    )
    dense = DenseMLPSpec(c.intermediate_size_mlp)

    def attn(use_rope: bool) -> GQASpec:
        return c.gqa(
            where,
            rotary_dim=c.dim if use_rope else 0,
            chunk=c.attention_chunk_size if use_rope else None,
            qk_l2norm=c.use_qk_norm and use_rope,
            temperature=(c.floor_scale, c.attn_scale) if c.attn_temperature_tuning and not use_rope else None,
        )

    layers = tuple(LayerSpec(attn(bool(rope[i])), moe if i in moe_at else dense) for i in range(n_layers))
    return c.model_spec(label, name, model_type, "llama4", layers)


def llama4_numerics(text: Mapping[str, Any]) -> dict[str, Any]:
    """Interleaved-pair RoPE (complex rotation); routing weights are sigmoid(logit), not renormalised."""
    return {"rope_interleave": True, "renormalize": False}


register(
    Family(
        "llama4",
        {
            "llama4": "Llama 4 (text part: chunked/NoPE attention, interleaved MoE with shared expert)",
            "llama4_text": "Llama 4 text model",
        },
        build_spec,
        numerics=llama4_numerics,
        text_config=text_config,
        signature=frozenset({"interleave_moe_layer_step", "attention_chunk_size", "no_rope_layers"}),
    )
)
