"""Gemma 3 family (gemma3 text part, gemma3_text): local/global GQA with sandwich norms, dense GeGLU.

What is Gemma-specific, and where it lives:
- attention: the GQA mixer (`gqa`) with q/k norm, softmax scale query_pre_attn_scalar^-0.5, and per
  layer either a sliding window (`sliding_window`, local RoPE base `rope_local_base_freq`, unscaled)
  or full attention (the model's `rope_theta` with its `rope_scaling`); the pattern comes from
  `layer_types` or from `sliding_window_pattern` (every p-th layer global);
- sandwich norms: RMSNorm on each block's output before its residual add (`LayerSpec.sandwich`,
  built by `graph._post_norm`); the pre-MLP norm is `pre_feedforward_layernorm`;
- (1 + w) RMSNorm everywhere (numerics `norm_offset`), embeddings times sqrt(hidden)
  (numerics `embed_scale`), GeGLU MLP (gelu_pytorch_tanh gate).
A `gemma3` config wraps the text model in `text_config` (the vision tower is not modelled);
checkpoint names under `language_model.` are read as the text model's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import Field, StrictBool

from tpplan.models.families import Family, register
from tpplan.models.families._common import GQAFields, layer_windows, text_config, validate
from tpplan.models.spec import DenseMLPSpec, GQASpec, LayerSpec, ModelSpec


class RawGemma3Text(GQAFields):
    head_dim: int = Field(default=256, gt=0)
    intermediate_size: int = Field(gt=0)
    query_pre_attn_scalar: float = Field(default=256, gt=0)
    sliding_window: int | None = Field(default=4096, gt=0)
    sliding_window_pattern: int = Field(default=6, gt=0)
    layer_types: list[str] | None = None
    rope_local_base_freq: float | None = Field(default=None, gt=0)
    hidden_activation: str = "gelu_pytorch_tanh"
    tie_word_embeddings: StrictBool = True
    ACT_FIELD: ClassVar[str] = "hidden_activation"
    ACTS: ClassVar[tuple[str, ...]] = ("gelu_pytorch_tanh", "gelu_tanh")


def _rope_by_layer_type(text: Mapping[str, Any]) -> dict[str, Any]:
    """transformers 5 writes `rope_parameters` per layer type ({full_attention: {...}, ...})."""
    rp = text.get("rope_parameters")
    return rp if isinstance(rp, dict) and "full_attention" in rp else {}


def local_theta(text: Mapping[str, Any]) -> float:
    return float(
        (_rope_by_layer_type(text).get("sliding_attention") or {}).get("rope_theta")
        or text.get("rope_local_base_freq")
        or 10000.0
    )


def build_spec(raw: dict[str, Any], label: str, name: str, model_type: str) -> ModelSpec:
    text = text_config(raw)
    where = f"{label} (text_config)" if text is not raw else label
    c: RawGemma3Text = validate(RawGemma3Text, dict(text), where)
    c.kv_heads(where)
    p = c.sliding_window_pattern
    types = c.layer_types or [
        "sliding_attention" if (i + 1) % p else "full_attention" for i in range(c.num_hidden_layers)
    ]
    mlp = DenseMLPSpec(c.intermediate_size, act="gelu_tanh")
    theta = local_theta(text)

    def attn(window: int | None) -> GQASpec:
        return c.gqa(
            where,
            qk_norm=True,
            window=window,
            scale=c.query_pre_attn_scalar**-0.5,
            rope_theta=theta if window else None,
        )

    layers = tuple(
        LayerSpec(attn(w), mlp, sandwich=True)
        for w in layer_windows(where, types, c.num_hidden_layers, c.sliding_window)
    )
    return c.model_spec(label, name, model_type, "gemma3", layers)


def gemma_numerics(text: Mapping[str, Any]) -> dict[str, Any]:
    """(1 + w) norms, sqrt(hidden) embedding scale, and the global layers' RoPE (theta, scaling)."""
    out: dict[str, Any] = {"norm_offset": 1.0, "embed_scale": float(text["hidden_size"]) ** 0.5}
    out["tie_embeddings"] = bool(text.get("tie_word_embeddings", True))
    full = _rope_by_layer_type(text).get("full_attention")
    scaling = full if full is not None else text.get("rope_scaling")
    if full is not None:
        out["rope_theta"] = float(full.get("rope_theta", 1_000_000.0))
    elif not text.get("rope_theta"):
        out["rope_theta"] = 1_000_000.0  # Gemma 3's default global base
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    out["rope_scaling"] = dict(scaling) if isinstance(scaling, dict) and kind != "default" else None
    return out


SIGNATURE = frozenset(
    {"query_pre_attn_scalar", "sliding_window_pattern", "rope_local_base_freq", "attn_logit_softcapping"}
    | {"final_logit_softcapping"}
)

register(
    Family(
        "gemma3",
        {
            "gemma3": "Gemma 3 (text part: local/global attention, sandwich norms, GeGLU)",
            "gemma3_text": "Gemma 3 text model",
        },
        build_spec,
        numerics=gemma_numerics,
        text_config=text_config,
        signature=SIGNATURE,
    )
)
