"""Helpers every family's config reader shares: the pydantic bases (the fields every decoder has,
GQA's and MLA's attention fields, the routed-expert fields), validation, the `ModelSpec` a family
returns, text_config unwrapping, MoE layer layout, sliding/full layer types.

A family's schema derives from the bases whose fields its config spells the common way and adds or
overrides only what is its own (a different default, a required field, a family-only spelling)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal, TypeVar

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from tpplan.errors import TpplanError, from_validation
from tpplan.models.numerics import MAX_POSITIONS
from tpplan.models.spec import GQASpec, LayerSpec, MLASpec, ModelSpec, MoESpec

# MoE keys as different releases spell them; every family reads all of them (a config that names
# experts is never planned as dense: `config.spec_from_config` checks that too).
EXPERT_COUNT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")
EXPERTS = AliasChoices(*EXPERT_COUNT_KEYS)
TOP_K = AliasChoices("num_experts_per_tok", "num_experts_per_token")
SHARED_EXPERTS = AliasChoices("n_shared_experts", "num_shared_experts")

# Generous maxima for the integers of a config: the largest real checkpoints are far below (hidden
# 16384, intermediate ~53k, vocab ~262k, 128 layers, 512 experts); past these a value is nonsense
# that would make the planner build absurd graphs or the cost model run for minutes.
MAX_WIDTH = 2**24  # any width, head count, rank, window, expert count or layer index
MAX_VOCAB = 2**22
MAX_LAYERS = 2**12
INT_MAXIMA = {"vocab_size": MAX_VOCAB, "num_hidden_layers": MAX_LAYERS, "max_position_embeddings": MAX_POSITIONS}
# the router scorings the runtime implements (MoESpec.scoring); any other value is refused
Scoring = Literal["sigmoid", "softmax"]
# the MLP gate activations tpplan's runtime implements (HF spells SiLU both ways)
SILU_ACTS = ("silu", "swish")


class Raw(BaseModel):
    """Base of raw config schemas: only the fields tpplan reads; everything else is ignored.

    Strict: a value of the wrong type is refused, never coerced ("no" is not a boolean, "4096" not
    an integer, 1e30 not an integer); floats must be finite; integers stay under `INT_MAXIMA`."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True, frozen=True, strict=True, allow_inf_nan=False)

    @field_validator("*", mode="after")
    @classmethod
    def _bounded(cls, value: Any, info: ValidationInfo) -> Any:
        limit = INT_MAXIMA.get(info.field_name or "", MAX_WIDTH)
        values = value if isinstance(value, list) else [value]
        for v in values:
            if isinstance(v, int) and not isinstance(v, bool) and abs(v) > limit:
                raise ValueError(f"{v} exceeds the largest value tpplan accepts here ({limit})")
        return value


class Decoder(Raw):
    """The fields every decoder config has."""

    hidden_size: int = Field(gt=0)
    num_hidden_layers: int = Field(gt=0)
    num_attention_heads: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    tie_word_embeddings: StrictBool = False
    hidden_act: str = "silu"
    ACT_FIELD: ClassVar[str] = "hidden_act"  # Gemma: hidden_activation
    ACTS: ClassVar[tuple[str, ...]] = SILU_ACTS  # what the runtime implements for this family

    def check_act(self, label: str) -> None:
        """The MLP activation must be one the runtime implements (refused, never run as another)."""
        got = getattr(self, self.ACT_FIELD)
        if got not in self.ACTS:
            raise TpplanError(
                f"{label}: field '{self.ACT_FIELD}'",
                f"{got!r} is not an activation tpplan's runtime implements for this family ({', '.join(self.ACTS)})",
                f"use {self.ACTS[0]}",
            )

    def model_spec(
        self, label: str, name: str, model_type: str, family: str, layers: tuple[LayerSpec, ...], **more: Any
    ) -> ModelSpec:
        """The family's `ModelSpec` from these fields, its layers and any further `ModelSpec` fields."""
        return ModelSpec(
            name=name,
            model_type=model_type,
            family=family,
            hidden=self.hidden_size,
            vocab=self.vocab_size,
            layers=layers,
            tie_embeddings=self.tie_word_embeddings,
            source=label,
            **more,
        )


class GQAFields(Decoder):
    """Grouped-query attention's head counts (head_dim defaults to hidden_size / heads)."""

    num_key_value_heads: int = Field(gt=0)
    head_dim: int | None = Field(default=None, gt=0)

    def kv_heads(self, label: str) -> int:
        """The KV heads, checked to divide the query heads."""
        kv = self.num_key_value_heads or self.num_attention_heads
        if self.num_attention_heads % kv:
            raise TpplanError(
                label,
                f"num_attention_heads={self.num_attention_heads} is not a multiple of num_key_value_heads={kv}",
                "correct num_key_value_heads",
            )
        return kv

    @property
    def dim(self) -> int:
        """Per-head width: head_dim, or hidden_size / num_attention_heads."""
        return self.head_dim or self.hidden_size // self.num_attention_heads

    def gqa(self, label: str, **more: Any) -> GQASpec:
        """A `GQASpec` from the head fields (rotary over the whole head unless `more` says otherwise)."""
        kv = self.kv_heads(label)
        return GQASpec(**{"heads": self.num_attention_heads, "kv_heads": kv, "head_dim": self.dim,
                          "rotary_dim": self.dim, **more})  # fmt: skip


class MLAFields(Decoder):
    """Multi-head latent attention's fields (DeepSeek-V3 spelling; Kimi-Linear and K3 reuse it)."""

    q_lora_rank: int | None = Field(default=None, gt=0)
    kv_lora_rank: int = Field(gt=0)
    qk_rope_head_dim: int = Field(ge=0)
    qk_nope_head_dim: int = Field(ge=0)
    v_head_dim: int = Field(gt=0)

    def mla(self, **more: Any) -> MLASpec:
        return MLASpec(
            heads=self.num_attention_heads,
            q_lora_rank=self.q_lora_rank,
            kv_lora_rank=self.kv_lora_rank,
            rope_dim=self.qk_rope_head_dim,
            nope_dim=self.qk_nope_head_dim,
            v_dim=self.v_head_dim,
            **more,
        )


class MoEFields(Raw):
    """Routed experts under any of their spellings; no experts (0) means a dense model."""

    num_experts: int = Field(default=0, ge=0, validation_alias=EXPERTS)
    num_experts_per_tok: int = Field(default=1, gt=0, validation_alias=TOP_K)
    moe_intermediate_size: int | None = Field(default=None, gt=0)

    def routed(self, label: str, n_group: int = 1, topk_group: int = 1, **more: Any) -> MoESpec | None:
        """The `MoESpec` (router checked), or None for a dense model."""
        if not self.num_experts:
            return None
        if not self.moe_intermediate_size:
            raise TpplanError(
                label, "num_experts is set but moe_intermediate_size is missing", "add moe_intermediate_size"
            )
        return routed_experts(
            label, self.num_experts, self.num_experts_per_tok, self.moe_intermediate_size, n_group, topk_group, **more
        )


def routed_experts(
    label: str, experts: int, top_k: int, width: int, n_group: int = 1, topk_group: int = 1, **more: Any
) -> MoESpec:
    """A `MoESpec` of `experts` experts `width` wide picking `top_k`, its router checked (`check_group`);
    no shared expert unless `more` gives `shared_intermediate`."""
    check_group(label, experts, n_group, topk_group, top_k)
    return MoESpec(**{"experts": experts, "top_k": top_k, "expert_intermediate": width, "shared_intermediate": 0,
                      "n_group": n_group, "topk_group": topk_group, **more})  # fmt: skip


def text_config(raw: Mapping[str, Any]) -> Mapping[str, Any]:
    """A multimodal wrapper's text model (its `text_config`), or the config itself when it is one."""
    text = raw.get("text_config")
    return text if isinstance(text, dict) else raw


def wrapped_text(
    raw: Mapping[str, Any], label: str, model_type: str, inner: tuple[str, ...], fix: str
) -> dict[str, Any]:
    """The `text_config` a `model_type` wrapper must hold, whose own model_type (default `inner[0]`)
    is one of `inner`; `fix` says where to find it."""
    text = raw.get("text_config")
    if not isinstance(text, dict):
        raise TpplanError(f"{label}: field 'text_config'", f"a {model_type} config must wrap a text_config object", fix)
    got = text.get("model_type", inner[0])
    if got not in inner:
        raise TpplanError(
            f"{label}: field 'text_config.model_type'",
            f"{got!r} under a {model_type} wrapper",
            f"use {' or '.join(map(repr, inner))}",
        )
    return text


RawT = TypeVar("RawT", bound=Raw)


def validate(schema: type[RawT], raw: dict[str, Any], label: str) -> RawT:
    """`schema` from `raw`, or a `TpplanError` naming the file, the field and the fix."""
    try:
        out = schema.model_validate(raw)
    except ValidationError as exc:
        fix = "add or correct '{field}' in the config (see the model card's config.json)"
        raise from_validation(exc, label, fix) from None
    if isinstance(out, Decoder):
        out.check_act(label)
    return out


def qwen_moe_layer(index: int, step: int, dense_only: list[int]) -> bool:
    """Whether layer `index` is a MoE layer under Qwen's `decoder_sparse_step` / `mlp_only_layers`."""
    return index not in dense_only and (index + 1) % step == 0


def first_k_dense(label: str, first: int, layers: int) -> None:
    """`first_k_dense_replace` must leave the model no more dense layers than it has."""
    if first > layers:
        raise TpplanError(
            f"{label}: field 'first_k_dense_replace'",
            f"{first} exceeds num_hidden_layers={layers}",
            "set it to at most num_hidden_layers",
        )


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
