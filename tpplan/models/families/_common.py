"""Helpers every family's config reader shares: the pydantic base, validation, MoE layer layout,
sliding/full layer types."""

from __future__ import annotations

from typing import Any

from pydantic import AliasChoices, BaseModel, ConfigDict, ValidationError

from tpplan.errors import TpplanError, from_validation

# MoE keys as different releases spell them; every family reads all of them (a config that names
# experts is never planned as dense: `config.spec_from_config` checks that too).
EXPERT_COUNT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")
EXPERTS = AliasChoices(*EXPERT_COUNT_KEYS)
TOP_K = AliasChoices("num_experts_per_tok", "num_experts_per_token")
SHARED_EXPERTS = AliasChoices("n_shared_experts", "num_shared_experts")


class Raw(BaseModel):
    """Base of raw config schemas: only the fields tpplan reads; everything else is ignored."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True, frozen=True)


def validate(schema: type[Raw], raw: dict[str, Any], label: str) -> Any:
    """`schema` from `raw`, or a `TpplanError` naming the file, the field and the fix."""
    try:
        return schema.model_validate(raw)
    except ValidationError as exc:
        fix = "add or correct '{field}' in the config (see the model card's config.json)"
        raise from_validation(exc, label, fix) from None


def moe_layer(index: int, first_dense: int, freq: int, experts: int, explicit_dense: set[int] | None = None) -> bool:
    """Whether layer `index` is a MoE layer under DeepSeek-style first_k_dense / layer-frequency keys."""
    if experts <= 0 or index < first_dense:
        return False
    if explicit_dense and index in explicit_dense:
        return False
    return (index - first_dense) % freq == 0 if freq > 1 else True


def check_group(label: str, experts: int, n_group: int, topk_group: int, top_k: int) -> None:
    """Router sanity: top-k within the experts, groups that split the experts evenly."""
    if top_k > experts:
        raise TpplanError(label, f"top-k ({top_k}) exceeds the number of experts ({experts})", "lower the top-k")
    if experts % n_group:
        raise TpplanError(
            label, f"{experts} experts do not split into n_group={n_group} equal groups", "correct n_group"
        )
    if topk_group > n_group:
        raise TpplanError(label, f"topk_group={topk_group} exceeds n_group={n_group}", "correct topk_group")


LAYER_TYPES = ("sliding_attention", "full_attention")


def layer_windows(label: str, layer_types: list[str] | None, layers: int, window: int | None) -> list[int | None]:
    """The sliding window of every layer (None: full attention), from `layer_types` or HF's default
    (even layers sliding, odd layers full)."""
    types = layer_types or ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
    if len(types) != layers:
        raise TpplanError(
            f"{label}: field 'layer_types'",
            f"has {len(types)} entries for {layers} layers",
            "give one entry per layer",
        )
    bad = sorted({t for t in types if t not in LAYER_TYPES})
    if bad:
        raise TpplanError(
            f"{label}: field 'layer_types'", f"unknown layer type(s) {bad}", f"use {' or '.join(LAYER_TYPES)}"
        )
    if "sliding_attention" in types and not window:
        raise TpplanError(label, "layer_types has sliding layers but sliding_window is not set", "add sliding_window")
    return [window if t == "sliding_attention" else None for t in types]
