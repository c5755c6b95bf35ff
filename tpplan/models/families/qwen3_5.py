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
from tpplan.models.families._common import validate, wrapped_text
from tpplan.models.families.qwen3_next import RawGatedHybrid
from tpplan.models.spec import DenseMLPSpec, LayerSpec, ModelSpec, MoESpec

WRAPPERS = {"qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text"}


class RawQwen35(RawGatedHybrid):
    intermediate_size: int | None = Field(default=None, gt=0)  # qwen3_5 (dense) only
    partial_rotary_factor: float | None = Field(default=None, gt=0, le=1)
    rope_parameters: dict[str, Any] | None = None


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
        fix = f"add the {WRAPPERS[model_type]} text_config from the checkpoint's config.json"
        wrapped_text(raw, label, model_type, (WRAPPERS[model_type],), fix)
        label = f"{label}: text_config"
    c: RawQwen35 = validate(RawQwen35, dict(text_config(raw)), label)
    rope = c.rope_parameters or {}
    mixers = c.mixers(label, c.partial_rotary_factor or float(rope.get("partial_rotary_factor", 0.25)), True)
    mlp: MoESpec | DenseMLPSpec
    if moe_family:
        moe = c.moe(label) if c.moe_intermediate_size else None
        if moe is None:
            raise TpplanError(
                label,
                "a qwen3_5_moe text config needs num_experts and moe_intermediate_size",
                "add them from the checkpoint's config.json",
            )
        mlp = moe
    else:
        if not c.intermediate_size:
            raise TpplanError(label, "a qwen3_5 text config needs intermediate_size", "add intermediate_size")
        mlp = DenseMLPSpec(c.intermediate_size)
    return c.model_spec(label, name, model_type, "qwen3_5", tuple(LayerSpec(m, mlp) for m in mixers))


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
