"""Config facts the graph leaves out but exact execution needs (eps, RoPE, router scaling).

Torch-free so a family can state its numerics next to its schema. `numerics_from_config` (in
`tpplan.models.config`, which knows the family registry) validates these fields (the runtime is the
only stage that reads them, so nothing else would) with the same strictness as the family schemas:
finite positive eps and RoPE base, a rope_scaling object whose type the runtime implements and which
carries that type's parameters, strict booleans. The result lives on the `ModelSpec`
(`spec.numerics`), so the runtime never re-reads a config by name.
Family-specific defaults (Qwen3-Next's zero-centred norm, MLA's interleaved RoPE and router bias)
come from the family's `numerics` hook, not from an if-chain.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, StrictBool

from tpplan.errors import TpplanError, shown

MAX_POSITIONS = 2**31  # max_position_embeddings: Llama 4 Scout declares 10M; past 2^31 is nonsense

# the RoPE scalings `tpplan.runtime.kernels_local.Rope` implements, and the parameters each needs
ROPE_PARAMETERS: dict[str, tuple[str, ...]] = {
    "default": (),
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": ("factor",),
}
_ROPE_NUMBERS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings", "beta_fast",
                 "beta_slow", "mscale", "mscale_all_dim", "attention_factor", "rope_theta")  # fmt: skip


@dataclass(frozen=True)
class Numerics:
    """Config facts the graph leaves out but exact execution needs (eps, RoPE, router scaling)."""

    eps: float = 1e-6
    latent_eps: float = 1e-6  # MLA q_a/kv_a_layernorm: DeepSeek's and HF's code use the 1e-6 default, not eps
    norm_offset: float = 0.0  # 1.0: Qwen3-Next's zero-centred RMSNorm scale (1 + w)
    rope_theta: float = 10000.0
    rope_interleave: bool = False
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 4096  # RoPE's scaling reads it; 4,096 where the config gives none
    # the context the config file itself states (max_position_embeddings), None where it states none (a
    # transformers default or the fallback above fills it for RoPE): only a stated context refuses a request
    stated_context: int | None = None
    routed_scaling_factor: float = 1.0
    renormalize: bool = True
    router_bias: bool = False  # DeepSeek/Kimi: e_score_correction_bias in the router
    tie_embeddings: bool = False
    embed_scale: float = 1.0  # Gemma: embeddings are multiplied by sqrt(hidden)


RENORMALIZE = AliasChoices("norm_topk_prob", "moe_renormalize")


class NumericsFields(BaseModel):
    """The runtime-only fields of any family's (text) config, validated strictly: no coercion."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True, frozen=True, strict=True, allow_inf_nan=False)

    rms_norm_eps: float = Field(default=1e-6, gt=0, le=1)
    rope_theta: float | None = Field(default=None, gt=0)
    max_position_embeddings: int | None = Field(default=None, ge=1, le=MAX_POSITIONS)
    routed_scaling_factor: float | None = Field(default=None, gt=0)
    renormalize: StrictBool | None = Field(default=None, validation_alias=RENORMALIZE)
    tie_word_embeddings: StrictBool = False
    rope_interleave: StrictBool | None = None
    use_routing_bias: StrictBool | None = None
    rope_scaling: dict[str, Any] | None = None
    rope_parameters: dict[str, Any] | None = None


def check_rope(value: object, where: str) -> dict[str, Any] | None:
    """A rope_scaling / rope_parameters object the runtime can apply (None: no scaling)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        kind_of = type(value).__name__
        raise TpplanError(where, f"must be an object or null, not a {kind_of}", "copy it from the checkpoint")
    kind = value.get("rope_type", value.get("type", "default"))
    if not isinstance(kind, str) or kind not in ROPE_PARAMETERS:  # a list or dict is no name (and unhashable)
        raise TpplanError(
            f"{where}.rope_type",
            f"{shown(kind)} is not a RoPE scaling tpplan's runtime implements ({', '.join(ROPE_PARAMETERS)})",
            "use one of those, or leave the field out for unscaled RoPE",
        )
    for key in ROPE_PARAMETERS[kind]:
        if key not in value:
            raise TpplanError(f"{where}.{key}", f"a {kind} scaling needs {key} and it is missing", f"add {key}")
    for key in _ROPE_NUMBERS:
        got = value.get(key)
        if key in value and got is None and key not in ROPE_PARAMETERS[kind]:
            continue
        if key in value and not (isinstance(got, int | float) and not isinstance(got, bool) and math.isfinite(got)
                                 and got > 0):  # fmt: skip
            raise TpplanError(f"{where}.{key}", f"must be a finite number > 0 (got {shown(got)})", f"correct {key}")
    frac = value.get("partial_rotary_factor", 1.0)
    if not (isinstance(frac, int | float) and not isinstance(frac, bool) and 0 < frac <= 1):
        raise TpplanError(f"{where}.partial_rotary_factor", f"must be a number in (0, 1] (got {shown(frac)})",
                          "copy it from the checkpoint")  # fmt: skip
    if "truncate" in value and not isinstance(value["truncate"], bool):
        raise TpplanError(f"{where}.truncate", f"must be true or false (got {shown(value['truncate'])})", "correct it")
    return value
