"""Qwen3.5 family (qwen3_5 dense, qwen3_5_moe): Qwen3-Next's hybrid under a multimodal wrapper.

What differs from `qwen3_next` (transformers 5.24, modeling_qwen3_5.py / modeling_qwen3_5_moe.py):
- the text model sits under `text_config` (`model.language_model.*` in the checkpoint); the vision
  tower and the MTP head (`mtp_num_hidden_layers`) are not modelled: text prefill does not run them;
- Gated DeltaNet reads four head-major projections (in_proj_qkv = [q | k | v], in_proj_z,
  in_proj_b, in_proj_a) instead of in_proj_qkvz / in_proj_ba laid out per key-head group; after the
  split the math is Qwen3-Next's, so the `gdn` mixer runs it (`GDNSpec.split_proj`: the loader
  regroups the rows per key head, and a rank keeps its key heads' rows of every block);
- RoPE is interleaved M-RoPE (`mrope_section`); with text-only positions (the same index on the
  temporal, height and width axes) it equals 1-D RoPE over the partial rotary dims, which is what
  runs; `partial_rotary_factor` may sit in `rope_parameters`;
- qwen3_5_moe: every layer is MoE (the config drops `mlp_only_layers` and `decoder_sparse_step`)
  and the router always renormalises its top-k (no `norm_topk_prob`); qwen3_5: every layer dense.
Same as Qwen3-Next: gated attention (doubled q_proj, sigmoid gate; `attn_output_gate` and
`output_gate_type` are not read by transformers), q/k norm, zero-centred RMSNorm (1 + w), the
GDN conv / decay / gated norm, the sigmoid-gated shared expert.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field

from tpplan.errors import TpplanError
from tpplan.models.families import Family, register
from tpplan.models.families._common import EXPERTS, TOP_K, Raw, check_group, validate
from tpplan.models.families.qwen3_next import check_gdn_heads, full_attention_layers
from tpplan.models.spec import DenseMLPSpec, GDNSpec, GQASpec, LayerSpec, ModelSpec, MoESpec

WRAPPERS = {"qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text"}


class RawQwen35(Raw):
    hidden_size: int = Field(gt=0)
    num_hidden_layers: int = Field(gt=0)
    num_attention_heads: int = Field(gt=0)
    num_key_value_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    intermediate_size: int | None = Field(default=None, gt=0)  # qwen3_5 (dense) only
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
    partial_rotary_factor: float | None = Field(default=None, gt=0, le=1)
    rope_parameters: dict[str, Any] | None = None
    tie_word_embeddings: bool = False


def text_config(raw: Mapping[str, Any]) -> Mapping[str, Any]:
    """The text model's config: `text_config` of the wrapper (the wrapper's tie_word_embeddings,
    which transformers reads at the top level, unless the text config states its own)."""
    text = raw.get("text_config")
    if not isinstance(text, dict):
        return raw
    return {"tie_word_embeddings": raw.get("tie_word_embeddings", False), **text}


def build_spec(raw: dict[str, Any], label: str, name: str, model_type: str) -> ModelSpec:
    moe_family = model_type.startswith("qwen3_5_moe")
    if model_type in WRAPPERS:
        text = raw.get("text_config")
        if not isinstance(text, dict):
            raise TpplanError(
                f"{label}: field 'text_config'",
                f"a {model_type} config must wrap a text_config object",
                f"add the {WRAPPERS[model_type]} text_config from the checkpoint's config.json",
            )
        if text.get("model_type", WRAPPERS[model_type]) != WRAPPERS[model_type]:
            raise TpplanError(
                f"{label}: field 'text_config.model_type'",
                f"{text.get('model_type')!r} under a {model_type} wrapper",
                f"use {WRAPPERS[model_type]!r}",
            )
        label = f"{label}: text_config"
    c: RawQwen35 = validate(RawQwen35, dict(text_config(raw)), label)
    full = full_attention_layers(c.layer_types, c.num_hidden_layers, c.full_attention_interval, label)
    check_gdn_heads(label, c.linear_num_key_heads, c.linear_num_value_heads)
    rope = c.rope_parameters or {}
    factor = c.partial_rotary_factor or float(rope.get("partial_rotary_factor", 0.25))
    gqa = GQASpec(
        heads=c.num_attention_heads,
        kv_heads=c.num_key_value_heads,
        head_dim=c.head_dim,
        output_gate=True,
        qk_norm=True,
        rotary_dim=int(c.head_dim * factor),
    )
    gdn = GDNSpec(
        c.linear_num_key_heads,
        c.linear_num_value_heads,
        c.linear_key_head_dim,
        c.linear_value_head_dim,
        c.linear_conv_kernel_dim,
        split_proj=True,
    )
    mlp: MoESpec | DenseMLPSpec
    if moe_family:
        if not (c.num_experts and c.moe_intermediate_size):
            raise TpplanError(
                label,
                "a qwen3_5_moe text config needs num_experts and moe_intermediate_size",
                "add them from the checkpoint's config.json",
            )
        check_group(label, c.num_experts, 1, 1, c.num_experts_per_tok)
        mlp = MoESpec(
            experts=c.num_experts,
            top_k=c.num_experts_per_tok,
            expert_intermediate=c.moe_intermediate_size,
            shared_intermediate=c.shared_expert_intermediate_size,
            scoring="softmax",
            shared_gate=c.shared_expert_intermediate_size > 0,
        )
    else:
        if not c.intermediate_size:
            raise TpplanError(label, "a qwen3_5 text config needs intermediate_size", "add intermediate_size")
        mlp = DenseMLPSpec(c.intermediate_size)
    return ModelSpec(
        name=name,
        model_type=model_type,
        family="qwen3_5",
        hidden=c.hidden_size,
        vocab=c.vocab_size,
        layers=tuple(LayerSpec(gqa if f else gdn, mlp) for f in full),
        tie_embeddings=c.tie_word_embeddings,
        source=label,
    )


register(
    Family(
        "qwen3_5",
        {
            "qwen3_5": "Qwen3.5 dense (gated attention + Gated DeltaNet; text model of the wrapper)",
            "qwen3_5_text": "Qwen3.5 dense text model",
            "qwen3_5_moe": "Qwen3.5 MoE (gated attention + Gated DeltaNet, MoE; text model of the wrapper)",
            "qwen3_5_moe_text": "Qwen3.5 MoE text model",
        },
        build_spec,
        # zero-centred RMSNorm; the router always renormalises its top-k (no norm_topk_prob)
        numerics=lambda text: {"norm_offset": 1.0, "renormalize": True},
        text_config=text_config,
        signature=frozenset({"attn_output_gate", "mtp_num_hidden_layers", "linear_num_value_heads", "mamba_ssm_dtype"}),
    )
)
