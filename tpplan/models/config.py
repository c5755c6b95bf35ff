"""Read an HF `config.json` (a user's file or a built-in preset) into a `ModelSpec`.

Presets are ordinary config.json files shipped in `tpplan/models/presets/`, loaded through the
same path as a user's file, so a preset is never a special case. The family registered for the
config's `model_type` (`tpplan.models.families`) validates it with pydantic and builds the spec;
any problem becomes a `TpplanError` naming the file, the field and the fix.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any

from tpplan.errors import TpplanError, unknown_name, validated
from tpplan.inputs import NAME_CHARS, check_path, parse_json, read_text
from tpplan.models.families import Family, closest_family, family_for, supported_model_types
from tpplan.models.families._common import EXPERT_COUNT_KEYS
from tpplan.models.hf_defaults import with_transformers_defaults
from tpplan.models.numerics import Numerics, NumericsFields, check_rope
from tpplan.models.quant import parse_quantization
from tpplan.models.spec import ModelSpec, MoESpec

PRESET_DIR = "presets"


# ----------------------------------------------------------------------------------------------
# Preset lookup


def list_presets() -> list[str]:
    """Names of the built-in presets (file stems under tpplan/models/presets)."""
    folder = resources.files("tpplan.models").joinpath(PRESET_DIR)
    return sorted(p.name.removesuffix(".json") for p in folder.iterdir() if p.name.endswith(".json"))


_CONFIG_FIX = "pass a preset name or an HF config.json (or the folder holding one)"


def _config_path(model: str) -> Path:
    """The config.json a `--model` value names (a file, or a folder holding config.json)."""
    check_path(model, f"--model {model}", _CONFIG_FIX)
    p = Path(model)
    if p.is_dir():
        if not (p / "config.json").exists():
            raise TpplanError(f"--model {model}", f"no config.json in folder {p}", _CONFIG_FIX)
        return p / "config.json"
    if not p.exists() and not p.is_symlink():
        raise unknown_name("an HF config.json", model, list_presets(), "--model", "tpplan models")
    return p


def load_config_dict(model: str) -> tuple[dict[str, Any], str]:
    """The parsed JSON object of a preset or config file, read through `tpplan.inputs` (regular
    files only, bounded size and nesting); every problem is a TpplanError naming the file."""
    if model in list_presets():
        label = f"preset '{model}'"
        text = resources.files("tpplan.models").joinpath(PRESET_DIR).joinpath(f"{model}.json").read_text("utf-8")
    else:
        path = _config_path(model)
        label = str(path)
        text = read_text(path, label, _CONFIG_FIX)
    raw = parse_json(text, label, "re-download or repair the config.json; it must be one JSON object")
    if not isinstance(raw, dict):
        raise TpplanError(label, f"expected a JSON object, got {type(raw).__name__}", "pass an HF config.json")
    return raw, label


def load_model(model: str) -> ModelSpec:
    """Load a preset name or config.json path into a validated `ModelSpec`."""
    raw, label = load_config_dict(model)
    name = model if model in list_presets() else str(raw.get("_name_or_path") or Path(model).stem)
    if len(name) > 5 * NAME_CHARS:  # a checkpoint path is its name: longer than any real one
        raise TpplanError(f"{label}: _name_or_path", f"is {len(name):,} characters; tpplan takes at most "
                          f"{5 * NAME_CHARS}", "shorten it (it is the name tables and plots show)")  # fmt: skip
    return spec_from_config(raw, label=label, name=name)


# ----------------------------------------------------------------------------------------------
# Raw config -> ModelSpec, by the family registered for its model_type


def spec_from_config(raw: dict[str, Any], *, label: str = "config", name: str = "model") -> ModelSpec:
    """Look the config's `model_type` up in the family registry and build its spec."""
    model_type = raw.get("model_type")
    if model_type is None:
        raise TpplanError(
            label,
            "required field 'model_type' is missing",
            f'add "model_type" (one of: {", ".join(supported_model_types())})',
        )
    family = family_for(str(model_type))
    if family is None:
        closest, why = closest_family(raw)
        raise TpplanError(
            f"{label}: field 'model_type'",
            f"unknown model_type {model_type!r}; the closest supported family is {closest.name} "
            f"({', '.join(closest.model_types)}: {why})",
            f"tpplan reads {', '.join(supported_model_types())}; to add {model_type}, see docs/adding-a-family.md",
        )
    stated = family.text_config(raw).get("max_position_embeddings")  # the file's own, before defaults fill it
    raw, defaulted = with_transformers_defaults(raw, wrapped=family.text_config(raw) is not raw)
    check_numerics(raw, label)  # before the family's builder reads rope_parameters
    spec = family.build_spec(raw, label, name, str(model_type))
    _check_experts_planned(family.text_config(raw), spec, label)
    quant = parse_quantization(raw, label)
    numerics = replace(numerics_from_config(raw, label), stated_context=stated if isinstance(stated, int) else None)
    return replace(spec, quant=quant or spec.quant, numerics=numerics, defaulted=defaulted)


def _check_experts_planned(text: Mapping[str, Any], spec: ModelSpec, label: str) -> None:
    """A config that names routed experts is never planned as a dense model."""
    named = {k: text[k] for k in EXPERT_COUNT_KEYS if isinstance(text.get(k), int) and text[k] > 0}
    if named and not any(isinstance(layer.mlp, MoESpec) for layer in spec.layers):
        key, count = next(iter(named.items()))
        raise TpplanError(
            f"{label}: field '{key}'",
            f"the config names {count} routed experts but no layer of the {spec.family} reader became a MoE layer",
            "check the fields that place MoE layers (first_k_dense_replace, moe_layer_freq, decoder_sparse_step, "
            "mlp_only_layers); tpplan never plans a model with experts as dense",
        )


# ----------------------------------------------------------------------------------------------
# Runtime numerics, with the family's own defaults


def check_numerics(raw: Mapping[str, Any], label: str = "config") -> None:
    """Refuse bad runtime fields before a family reads its config (its builder reads `rope_parameters`)."""
    _validated(raw, label)


def _validated(raw: Mapping[str, Any], label: str) -> tuple[Family | None, Mapping[str, Any], NumericsFields, bool]:
    """(family, text config, its validated numerics fields, whether rope_parameters is per layer type)."""
    family = family_for(str(raw.get("model_type")))
    c = family.text_config(raw) if family is not None else raw
    where = f"{label} (text_config)" if c is not raw else label
    f = validated(NumericsFields, dict(c), where, "correct '{field}' in the config (see the model card's config.json)")
    check_rope(f.rope_scaling, f"{where}: field 'rope_scaling'")
    params = f.rope_parameters or {}
    by_layer = "full_attention" in params or "sliding_attention" in params  # Gemma 3: one per layer type
    for key, sub in params.items() if by_layer else [("", params)] if f.rope_parameters is not None else []:
        check_rope(sub, f"{where}: field 'rope_parameters{'.' + key if key else ''}'")
    return family, c, f, by_layer


def numerics_from_config(raw: Mapping[str, Any], label: str = "config") -> Numerics:
    """Validated `Numerics` from a raw HF config dict (a wrapper such as K3: its `text_config`)."""
    family, c, f, by_layer = _validated(raw, label)
    params = f.rope_parameters or {}
    scaling = f.rope_scaling or (None if by_layer else f.rope_parameters)
    if isinstance(scaling, dict) and scaling.get("rope_type", scaling.get("type", "default")) == "default":
        scaling = None
    theta = f.rope_theta or (None if by_layer else params.get("rope_theta")) or 10000.0
    fields: dict[str, Any] = {
        "eps": f.rms_norm_eps,
        "rope_theta": float(theta),
        "rope_scaling": dict(scaling) if scaling is not None else None,
        "max_position_embeddings": f.max_position_embeddings or 4096,
        "routed_scaling_factor": f.routed_scaling_factor or 1.0,
        "renormalize": True if f.renormalize is None else f.renormalize,
        "tie_embeddings": f.tie_word_embeddings,
    }
    if family is not None:
        fields.update(family.numerics(c))
    return Numerics(**fields)
