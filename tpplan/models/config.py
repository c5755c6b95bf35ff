"""Read an HF `config.json` (a user's file or a built-in preset) into a `ModelSpec`.

Presets are ordinary config.json files shipped in `tpplan/models/presets/`, loaded through the
same path as a user's file, so a preset is never a special case. Raw configs are validated with
pydantic; any problem becomes a `TpplanError` naming the file, the field and the fix.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tpplan.errors import TpplanError, from_validation
from tpplan.models.spec import (
    DenseMLPSpec,
    GDNSpec,
    GQASpec,
    KDASpec,
    LayerSpec,
    MLASpec,
    ModelSpec,
    MoESpec,
)

PRESET_DIR = "presets"

SUPPORTED_MODEL_TYPES = {
    "deepseek_v3": "DeepSeek-V3 family (MLA + MoE)",
    "kimi_k2": "Kimi-K2 (DeepSeek-V3 architecture)",
    "kimi_linear": "Kimi-Linear (KDA + MLA hybrid, MoE)",
    "kimi_k3": "Kimi-K3 (a kimi_linear text_config with MLA output gate, latent MoE, AttnRes)",
    "qwen3_next": "Qwen3-Next (gated attention + Gated DeltaNet, MoE)",
    "llama": "plain GQA decoder, dense MLP",
    "qwen3": "plain GQA decoder with q/k norm, dense MLP",
    "qwen3_moe": "GQA decoder with MoE",
    "mistral": "plain GQA decoder, dense MLP",
}


# ----------------------------------------------------------------------------------------------
# Preset lookup


def list_presets() -> list[str]:
    """Names of the built-in presets (file stems under tpplan/models/presets)."""
    folder = resources.files("tpplan.models").joinpath(PRESET_DIR)
    return sorted(p.name.removesuffix(".json") for p in folder.iterdir() if p.name.endswith(".json"))


def _read_source(model: str) -> tuple[str, str]:
    """Return (text, label) for a preset name or a path to a config.json (or its folder)."""
    if model in list_presets():
        path = resources.files("tpplan.models").joinpath(PRESET_DIR).joinpath(f"{model}.json")
        return path.read_text(encoding="utf-8"), f"preset '{model}'"
    p = Path(model)
    if p.is_dir():
        p = p / "config.json"
    if not p.exists():
        raise TpplanError(
            f"--model {model}",
            "no built-in preset has that name and no such file exists",
            f"use one of the presets ({', '.join(list_presets())}) or a path to an HF config.json",
        )
    try:
        return p.read_text(encoding="utf-8"), str(p)
    except OSError as exc:
        raise TpplanError(str(p), f"cannot read the file ({exc.strerror})", "check the path and permissions") from exc
    except UnicodeDecodeError as exc:
        raise TpplanError(
            str(p), "the file is not UTF-8 text", "pass the model's config.json, not a weight file"
        ) from exc


def load_config_dict(model: str) -> tuple[dict[str, Any], str]:
    """Parse the JSON of a preset or config file; malformed JSON names the line and column."""
    text, label = _read_source(model)
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TpplanError(
            label,
            f"malformed or truncated JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})",
            "re-download or repair the config.json; it must be one JSON object",
        ) from exc
    if not isinstance(raw, dict):
        raise TpplanError(label, f"expected a JSON object, got {type(raw).__name__}", "pass an HF config.json")
    return raw, label


def load_model(model: str) -> ModelSpec:
    """Load a preset name or config.json path into a validated `ModelSpec`."""
    raw, label = load_config_dict(model)
    name = model if model in list_presets() else str(raw.get("_name_or_path") or Path(model).stem)
    return spec_from_config(raw, label=label, name=name)


# ----------------------------------------------------------------------------------------------
# Raw config schemas (only the fields tpplan reads; everything else is ignored)


class _Raw(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True, frozen=True)


class RawMLAMoE(_Raw):
    """deepseek_v3 / kimi_k2 (DeepseekV3ForCausalLM)."""

    hidden_size: int = Field(gt=0)
    num_hidden_layers: int = Field(gt=0)
    num_attention_heads: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    intermediate_size: int = Field(gt=0)
    q_lora_rank: int | None = Field(default=None, gt=0)
    kv_lora_rank: int = Field(gt=0)
    qk_rope_head_dim: int = Field(ge=0)
    qk_nope_head_dim: int = Field(ge=0)
    v_head_dim: int = Field(gt=0)
    n_routed_experts: int | None = Field(default=None, ge=0)
    num_experts_per_tok: int | None = Field(default=None, gt=0)
    moe_intermediate_size: int | None = Field(default=None, gt=0)
    n_shared_experts: int | None = Field(default=0, ge=0)
    first_k_dense_replace: int = Field(default=0, ge=0)
    moe_layer_freq: int = Field(default=1, gt=0)
    n_group: int | None = Field(default=1, gt=0)
    topk_group: int | None = Field(default=1, gt=0)
    scoring_func: str = "sigmoid"
    tie_word_embeddings: bool = False


class RawLinearAttnConfig(_Raw):
    num_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    short_conv_kernel_size: int = Field(default=4, gt=0)
    use_full_rank_gate: bool = False
    kda_layers: list[int] = Field(default_factory=list)
    full_attn_layers: list[int] = Field(default_factory=list)


class RawKimiLinear(_Raw):
    """kimi_linear, also K3's text_config."""

    hidden_size: int = Field(gt=0)
    num_hidden_layers: int = Field(gt=0)
    num_attention_heads: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    intermediate_size: int = Field(gt=0)
    q_lora_rank: int | None = Field(default=None, gt=0)
    kv_lora_rank: int = Field(gt=0)
    qk_rope_head_dim: int = Field(ge=0)
    qk_nope_head_dim: int = Field(ge=0)
    v_head_dim: int = Field(gt=0)
    mla_use_nope: bool = False
    mla_use_output_gate: bool = False
    num_experts: int = Field(default=0, ge=0)
    num_experts_per_token: int = Field(default=1, gt=0)
    moe_intermediate_size: int | None = Field(default=None, gt=0)
    num_shared_experts: int = Field(default=0, ge=0)
    first_k_dense_replace: int = Field(default=0, ge=0)
    moe_layer_freq: int = Field(default=1, gt=0)
    num_expert_group: int = Field(default=1, gt=0)
    topk_group: int = Field(default=1, gt=0)
    moe_router_activation_func: str = "sigmoid"
    # K3's latent MoE: SGLang and the released config say routed_expert_hidden_size.
    moe_latent_size: int | None = Field(default=None, gt=0, alias="routed_expert_hidden_size")
    latent_moe_use_norm: bool = True
    attn_res_block_size: int | None = Field(default=None, gt=0)
    linear_attn_config: RawLinearAttnConfig
    tie_word_embeddings: bool = False

    @model_validator(mode="before")
    @classmethod
    def _accept_both_latent_names(cls, data: Any) -> Any:
        if isinstance(data, dict) and "moe_latent_size" in data and "routed_expert_hidden_size" not in data:
            data = dict(data)
            data["routed_expert_hidden_size"] = data.pop("moe_latent_size")
        return data


class RawQwen3Next(_Raw):
    hidden_size: int = Field(gt=0)
    num_hidden_layers: int = Field(gt=0)
    num_attention_heads: int = Field(gt=0)
    num_key_value_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    intermediate_size: int = Field(gt=0)
    full_attention_interval: int = Field(default=4, gt=0)
    layer_types: list[str] | None = None
    linear_num_key_heads: int = Field(gt=0)
    linear_num_value_heads: int = Field(gt=0)
    linear_key_head_dim: int = Field(gt=0)
    linear_value_head_dim: int = Field(gt=0)
    linear_conv_kernel_dim: int = Field(default=4, gt=0)
    num_experts: int = Field(default=0, ge=0)
    num_experts_per_tok: int = Field(default=1, gt=0)
    moe_intermediate_size: int | None = Field(default=None, gt=0)
    shared_expert_intermediate_size: int = Field(default=0, ge=0)
    decoder_sparse_step: int = Field(default=1, gt=0)
    mlp_only_layers: list[int] = Field(default_factory=list)
    partial_rotary_factor: float = Field(default=0.25, gt=0, le=1)
    tie_word_embeddings: bool = False


class RawGQA(_Raw):
    """llama / qwen3 / qwen3_moe / mistral."""

    hidden_size: int = Field(gt=0)
    num_hidden_layers: int = Field(gt=0)
    num_attention_heads: int = Field(gt=0)
    num_key_value_heads: int | None = Field(default=None, gt=0)
    head_dim: int | None = Field(default=None, gt=0)
    vocab_size: int = Field(gt=0)
    intermediate_size: int = Field(gt=0)
    num_experts: int = Field(default=0, ge=0)
    num_experts_per_tok: int = Field(default=1, gt=0)
    moe_intermediate_size: int | None = Field(default=None, gt=0)
    decoder_sparse_step: int = Field(default=1, gt=0)
    mlp_only_layers: list[int] = Field(default_factory=list)
    tie_word_embeddings: bool = False


# ----------------------------------------------------------------------------------------------
# Raw config -> ModelSpec


def _validate(schema: type[_Raw], raw: dict[str, Any], label: str) -> Any:
    try:
        return schema.model_validate(raw)
    except ValidationError as exc:
        fix = "add or correct '{field}' in the config (see the model card's config.json)"
        raise from_validation(exc, label, fix) from None


def _moe_layer(index: int, first_dense: int, freq: int, experts: int, explicit_dense: set[int] | None = None) -> bool:
    if experts <= 0 or index < first_dense:
        return False
    if explicit_dense and index in explicit_dense:
        return False
    return (index - first_dense) % freq == 0 if freq > 1 else True


def _mla_moe_spec(raw: dict[str, Any], label: str, name: str) -> ModelSpec:
    c: RawMLAMoE = _validate(RawMLAMoE, raw, label)
    mla = MLASpec(
        heads=c.num_attention_heads,
        q_lora_rank=c.q_lora_rank,
        kv_lora_rank=c.kv_lora_rank,
        rope_dim=c.qk_rope_head_dim,
        nope_dim=c.qk_nope_head_dim,
        v_dim=c.v_head_dim,
    )
    dense = DenseMLPSpec(c.intermediate_size)
    moe = None
    if c.n_routed_experts:
        if not c.num_experts_per_tok or not c.moe_intermediate_size:
            raise TpplanError(
                label,
                "n_routed_experts is set but num_experts_per_tok or moe_intermediate_size is missing",
                "add both fields, or set n_routed_experts to 0 for a dense model",
            )
        _check_group(label, c.n_routed_experts, c.n_group or 1, c.topk_group or 1, c.num_experts_per_tok)
        moe = MoESpec(
            experts=c.n_routed_experts,
            top_k=c.num_experts_per_tok,
            expert_intermediate=c.moe_intermediate_size,
            shared_intermediate=(c.n_shared_experts or 0) * c.moe_intermediate_size,
            scoring="sigmoid" if c.scoring_func == "sigmoid" else "softmax",
            n_group=c.n_group or 1,
            topk_group=c.topk_group or 1,
        )
    if c.first_k_dense_replace > c.num_hidden_layers:
        raise TpplanError(
            label,
            f"first_k_dense_replace={c.first_k_dense_replace} exceeds num_hidden_layers={c.num_hidden_layers}",
            "set first_k_dense_replace to at most num_hidden_layers",
        )
    layers = tuple(
        LayerSpec(mla, moe if moe and _moe_layer(i, c.first_k_dense_replace, c.moe_layer_freq, moe.experts) else dense)
        for i in range(c.num_hidden_layers)
    )
    return ModelSpec(
        name=name,
        model_type=raw["model_type"],
        family="deepseek_v3",
        hidden=c.hidden_size,
        vocab=c.vocab_size,
        layers=layers,
        tie_embeddings=c.tie_word_embeddings,
        source=label,
    )


def _check_group(label: str, experts: int, n_group: int, topk_group: int, top_k: int) -> None:
    if top_k > experts:
        raise TpplanError(label, f"top-k ({top_k}) exceeds the number of experts ({experts})", "lower the top-k")
    if experts % n_group:
        raise TpplanError(
            label, f"{experts} experts do not split into n_group={n_group} equal groups", "correct n_group"
        )
    if topk_group > n_group:
        raise TpplanError(label, f"topk_group={topk_group} exceeds n_group={n_group}", "correct topk_group")


def _layer_kinds_from_lists(label: str, n_layers: int, kda: list[int], full: list[int], prefix: str) -> list[str]:
    """Turn 1-based `kda_layers`/`full_attn_layers` into a per-layer list, checking coverage."""
    if not kda and not full:
        raise TpplanError(
            f"{label}: field '{prefix}'",
            "neither kda_layers nor full_attn_layers is given, so the layer kinds are unknown",
            "list every layer (1-based) in exactly one of kda_layers / full_attn_layers",
        )
    kinds: list[str | None] = [None] * n_layers
    for name, lst, kind in (("kda_layers", kda, "kda"), ("full_attn_layers", full, "mla")):
        for layer in lst:
            if not 1 <= layer <= n_layers:
                raise TpplanError(
                    f"{label}: field '{prefix}.{name}'",
                    f"layer {layer} is outside 1..{n_layers} (these lists are 1-based)",
                    f"use layer numbers between 1 and num_hidden_layers={n_layers}",
                )
            if kinds[layer - 1] is not None:
                raise TpplanError(
                    f"{label}: field '{prefix}.{name}'",
                    f"layer {layer} is listed as both KDA and full attention",
                    "list each layer in exactly one of kda_layers / full_attn_layers",
                )
            kinds[layer - 1] = kind
    missing = [i + 1 for i, k in enumerate(kinds) if k is None]
    if missing:
        shown = ", ".join(map(str, missing[:8])) + (" ..." if len(missing) > 8 else "")
        raise TpplanError(
            f"{label}: field '{prefix}'",
            f"kda_layers and full_attn_layers do not cover all {n_layers} layers; missing 1-based layers {shown}",
            "list every layer in exactly one of the two lists",
        )
    return [k for k in kinds if k is not None]


def _kimi_linear_spec(raw: dict[str, Any], label: str, name: str, model_type: str, prefix: str) -> ModelSpec:
    c: RawKimiLinear = _validate(RawKimiLinear, raw, label)
    la = c.linear_attn_config
    kinds = _layer_kinds_from_lists(
        label, c.num_hidden_layers, la.kda_layers, la.full_attn_layers, f"{prefix}linear_attn_config"
    )
    mla = MLASpec(
        heads=c.num_attention_heads,
        q_lora_rank=c.q_lora_rank,
        kv_lora_rank=c.kv_lora_rank,
        rope_dim=c.qk_rope_head_dim,
        nope_dim=c.qk_nope_head_dim,
        v_dim=c.v_head_dim,
        output_gate=c.mla_use_output_gate,
        use_rope=not c.mla_use_nope,
    )
    kda = KDASpec(la.num_heads, la.head_dim, la.short_conv_kernel_size, la.use_full_rank_gate)
    dense = DenseMLPSpec(c.intermediate_size)
    moe = None
    if c.num_experts:
        if not c.moe_intermediate_size:
            raise TpplanError(
                label, "num_experts is set but moe_intermediate_size is missing", "add moe_intermediate_size"
            )
        _check_group(label, c.num_experts, c.num_expert_group, c.topk_group, c.num_experts_per_token)
        moe = MoESpec(
            experts=c.num_experts,
            top_k=c.num_experts_per_token,
            expert_intermediate=c.moe_intermediate_size,
            shared_intermediate=c.num_shared_experts * c.moe_intermediate_size,
            scoring="sigmoid" if c.moe_router_activation_func == "sigmoid" else "softmax",
            n_group=c.num_expert_group,
            topk_group=c.topk_group,
            latent=c.moe_latent_size,
            latent_norm=bool(c.moe_latent_size) and c.latent_moe_use_norm,
        )
    layers = tuple(
        LayerSpec(
            mla if kind == "mla" else kda,
            moe if moe and _moe_layer(i, c.first_k_dense_replace, c.moe_layer_freq, moe.experts) else dense,
        )
        for i, kind in enumerate(kinds)
    )
    return ModelSpec(
        name=name,
        model_type=model_type,
        family="kimi_k3" if model_type == "kimi_k3" else "kimi_linear",
        hidden=c.hidden_size,
        vocab=c.vocab_size,
        layers=layers,
        attn_res_block_size=c.attn_res_block_size,
        tie_embeddings=c.tie_word_embeddings,
        source=label,
    )


def _qwen3_next_spec(raw: dict[str, Any], label: str, name: str) -> ModelSpec:
    c: RawQwen3Next = _validate(RawQwen3Next, raw, label)
    if c.layer_types is not None:
        if len(c.layer_types) != c.num_hidden_layers:
            raise TpplanError(
                f"{label}: field 'layer_types'",
                f"has {len(c.layer_types)} entries for {c.num_hidden_layers} layers",
                "give one entry per layer, or drop layer_types to use full_attention_interval",
            )
        bad = sorted({t for t in c.layer_types if t not in ("full_attention", "linear_attention")})
        if bad:
            raise TpplanError(
                f"{label}: field 'layer_types'",
                f"unknown layer type(s) {bad}",
                "use 'full_attention' or 'linear_attention'",
            )
        full = [t == "full_attention" for t in c.layer_types]
    else:
        full = [(i + 1) % c.full_attention_interval == 0 for i in range(c.num_hidden_layers)]
    if c.linear_num_value_heads % c.linear_num_key_heads:
        raise TpplanError(
            label,
            "linear_num_value_heads must be a multiple of linear_num_key_heads",
            "correct the Gated DeltaNet head counts",
        )
    gqa = GQASpec(
        heads=c.num_attention_heads,
        kv_heads=c.num_key_value_heads,
        head_dim=c.head_dim,
        output_gate=True,
        qk_norm=True,
        rotary_dim=int(c.head_dim * c.partial_rotary_factor),
    )
    gdn = GDNSpec(
        c.linear_num_key_heads,
        c.linear_num_value_heads,
        c.linear_key_head_dim,
        c.linear_value_head_dim,
        c.linear_conv_kernel_dim,
    )
    dense = DenseMLPSpec(c.intermediate_size)
    moe = None
    if c.num_experts:
        if not c.moe_intermediate_size:
            raise TpplanError(
                label, "num_experts is set but moe_intermediate_size is missing", "add moe_intermediate_size"
            )
        _check_group(label, c.num_experts, 1, 1, c.num_experts_per_tok)
        moe = MoESpec(
            experts=c.num_experts,
            top_k=c.num_experts_per_tok,
            expert_intermediate=c.moe_intermediate_size,
            shared_intermediate=c.shared_expert_intermediate_size,
            scoring="softmax",
            shared_gate=c.shared_expert_intermediate_size > 0,
        )
    dense_only = set(c.mlp_only_layers)
    layers = tuple(
        LayerSpec(
            gqa if full[i] else gdn,
            moe if moe and i not in dense_only and (i + 1) % c.decoder_sparse_step == 0 else dense,
        )
        for i in range(c.num_hidden_layers)
    )
    return ModelSpec(
        name=name,
        model_type="qwen3_next",
        family="qwen3_next",
        hidden=c.hidden_size,
        vocab=c.vocab_size,
        layers=layers,
        tie_embeddings=c.tie_word_embeddings,
        source=label,
    )


def _gqa_spec(raw: dict[str, Any], label: str, name: str, model_type: str) -> ModelSpec:
    c: RawGQA = _validate(RawGQA, raw, label)
    head_dim = c.head_dim or c.hidden_size // c.num_attention_heads
    if not c.head_dim and c.hidden_size % c.num_attention_heads:
        raise TpplanError(
            label, "hidden_size is not divisible by num_attention_heads and head_dim is not given", "add head_dim"
        )
    kv = c.num_key_value_heads or c.num_attention_heads
    if c.num_attention_heads % kv:
        raise TpplanError(
            label,
            f"num_attention_heads={c.num_attention_heads} is not a multiple of num_key_value_heads={kv}",
            "correct num_key_value_heads",
        )
    gqa = GQASpec(
        heads=c.num_attention_heads,
        kv_heads=kv,
        head_dim=head_dim,
        qk_norm=model_type.startswith("qwen3"),
        rotary_dim=head_dim,
    )
    dense = DenseMLPSpec(c.intermediate_size)
    moe = None
    if model_type == "qwen3_moe" and c.num_experts:
        if not c.moe_intermediate_size:
            raise TpplanError(
                label, "num_experts is set but moe_intermediate_size is missing", "add moe_intermediate_size"
            )
        _check_group(label, c.num_experts, 1, 1, c.num_experts_per_tok)
        moe = MoESpec(
            experts=c.num_experts,
            top_k=c.num_experts_per_tok,
            expert_intermediate=c.moe_intermediate_size,
            shared_intermediate=0,
        )
    dense_only = set(c.mlp_only_layers)
    layers = tuple(
        LayerSpec(gqa, moe if moe and i not in dense_only and (i + 1) % c.decoder_sparse_step == 0 else dense)
        for i in range(c.num_hidden_layers)
    )
    return ModelSpec(
        name=name,
        model_type=model_type,
        family="gqa",
        hidden=c.hidden_size,
        vocab=c.vocab_size,
        layers=layers,
        tie_embeddings=c.tie_word_embeddings,
        source=label,
    )


def spec_from_config(raw: dict[str, Any], *, label: str = "config", name: str = "model") -> ModelSpec:
    """Dispatch on `model_type` and build the spec; K3 unwraps its `text_config`."""
    model_type = raw.get("model_type")
    if model_type is None:
        raise TpplanError(
            label,
            "required field 'model_type' is missing",
            f'add "model_type" (one of: {", ".join(SUPPORTED_MODEL_TYPES)})',
        )
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise TpplanError(
            f"{label}: field 'model_type'",
            f"unknown model_type {model_type!r}",
            f"tpplan supports {', '.join(SUPPORTED_MODEL_TYPES)}; for another architecture add a graph "
            "builder in tpplan/models",
        )
    if model_type in ("deepseek_v3", "kimi_k2"):
        return _mla_moe_spec(raw, label, name)
    if model_type == "kimi_linear":
        return _kimi_linear_spec(raw, label, name, "kimi_linear", "")
    if model_type == "kimi_k3":
        text = raw.get("text_config")
        if not isinstance(text, dict):
            raise TpplanError(
                f"{label}: field 'text_config'",
                "a kimi_k3 config must wrap a text_config object",
                "add the kimi_linear text_config",
            )
        if text.get("model_type", "kimi_linear") != "kimi_linear":
            raise TpplanError(
                f"{label}: field 'text_config.model_type'",
                f"expected 'kimi_linear', got {text.get('model_type')!r}",
                "K3's text_config is a kimi_linear config",
            )
        spec = _kimi_linear_spec(text, f"{label} (text_config)", name, "kimi_k3", "text_config.")
        return spec
    if model_type == "qwen3_next":
        return _qwen3_next_spec(raw, label, name)
    return _gqa_spec(raw, label, name, model_type)
