"""Config facts the graph leaves out but exact execution needs (eps, RoPE, router scaling).

Torch-free so a family can state its numerics next to its schema; the runtime reads them through
`numerics_from_config`. Family-specific defaults (Qwen3-Next's zero-centred norm, MLA's
interleaved RoPE and router bias) come from the family's `numerics` hook, not from an if-chain.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Numerics:
    """Config facts the graph leaves out but exact execution needs (eps, RoPE, router scaling)."""

    eps: float = 1e-6
    latent_eps: float = 1e-6  # MLA q_a/kv_a_layernorm: DeepSeek's and HF's code use the 1e-6 default, not eps
    norm_offset: float = 0.0  # 1.0: Qwen3-Next's zero-centred RMSNorm scale (1 + w)
    rope_theta: float = 10000.0
    rope_interleave: bool = False
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 4096
    routed_scaling_factor: float = 1.0
    renormalize: bool = True
    router_bias: bool = False  # DeepSeek/Kimi: e_score_correction_bias in the router
    tie_embeddings: bool = False
    embed_scale: float = 1.0  # Gemma: embeddings are multiplied by sqrt(hidden)


def numerics_from_config(raw: Mapping[str, Any]) -> Numerics:
    """Read `Numerics` from a raw HF config dict (a wrapper such as K3: its `text_config`)."""
    from tpplan.models.families import family_for

    family = family_for(str(raw.get("model_type")))
    c = family.text_config(raw) if family is not None else raw
    scaling = c.get("rope_scaling") or c.get("rope_parameters")
    if isinstance(scaling, dict) and scaling.get("rope_type", scaling.get("type", "default")) == "default":
        scaling = None
    theta = c.get("rope_theta") or (c.get("rope_parameters") or {}).get("rope_theta") or 10000.0
    fields: dict[str, Any] = {
        "eps": float(c.get("rms_norm_eps", 1e-6)),
        "rope_theta": float(theta),
        "rope_scaling": dict(scaling) if isinstance(scaling, dict) else None,
        "max_position_embeddings": int(c.get("max_position_embeddings", 4096) or 4096),
        "routed_scaling_factor": float(c.get("routed_scaling_factor", 1.0) or 1.0),
        "renormalize": bool(c.get("norm_topk_prob", c.get("moe_renormalize", True))),
        "tie_embeddings": bool(c.get("tie_word_embeddings", False)),
    }
    if family is not None:
        fields.update(family.numerics(c))
    return Numerics(**fields)
