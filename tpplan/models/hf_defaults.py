"""The defaults transformers gives the config fields tpplan reads but checkpoints may leave out.

A real config.json may omit a field its transformers config class defaults (Gemma-3-27B's lacks
`vocab_size`; `Gemma3TextConfig` makes it 262208), and transformers, vLLM and SGLang then load it
with that default. tpplan fills the same value before a family validates the config and says so in
the audit's notes. Only fields that do not define the model's shape are filled: a config without
its hidden size or layer count is not that model, and stays refused.

Read from transformers 5.24.0 (the installed source, never imported here):
`src/transformers/models/<module>/configuration_<module>.py`, the class-level field defaults of the
class named below (`rope_theta`: its `rope_parameters` default, Gemma 3: `default_theta["global"]`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# model_type -> (transformers config class, {field: default})
TRANSFORMERS_DEFAULTS: dict[str, tuple[str, dict[str, Any]]] = {
    "deepseek_v3": ("DeepseekV3Config", {"vocab_size": 129280, "rms_norm_eps": 1e-06,
                                         "max_position_embeddings": 4096, "tie_word_embeddings": False,
                                         "rope_theta": 10000.0}),
    "deepseek_v2": ("DeepseekV2Config", {"vocab_size": 102400, "rms_norm_eps": 1e-06,
                                         "max_position_embeddings": 2048, "tie_word_embeddings": False,
                                         "rope_theta": 10000.0}),
    "deepseek_v32": ("DeepseekV32Config", {"vocab_size": 129280, "rms_norm_eps": 1e-06,
                                           "max_position_embeddings": 163840, "tie_word_embeddings": False,
                                           "rope_theta": 10000.0}),
    "glm_moe_dsa": ("GlmMoeDsaConfig", {"vocab_size": 154880, "rms_norm_eps": 1e-05,
                                        "max_position_embeddings": 202752, "tie_word_embeddings": False,
                                        "rope_theta": 10000.0}),
    "gemma3_text": ("Gemma3TextConfig", {"vocab_size": 262208, "rms_norm_eps": 1e-06,
                                         "max_position_embeddings": 131072, "tie_word_embeddings": True}),
    "llama": ("LlamaConfig", {"vocab_size": 32000, "rms_norm_eps": 1e-06, "max_position_embeddings": 2048,
                              "tie_word_embeddings": False, "rope_theta": 10000.0}),
    "qwen3": ("Qwen3Config", {"vocab_size": 151936, "rms_norm_eps": 1e-06, "max_position_embeddings": 32768,
                              "tie_word_embeddings": False, "rope_theta": 10000.0}),
    "qwen3_moe": ("Qwen3MoeConfig", {"vocab_size": 151936, "rms_norm_eps": 1e-06,
                                     "max_position_embeddings": 32768, "tie_word_embeddings": False,
                                     "rope_theta": 10000.0}),
    "mistral": ("MistralConfig", {"vocab_size": 32000, "rms_norm_eps": 1e-06, "max_position_embeddings": 131072,
                                  "tie_word_embeddings": False, "rope_theta": 10000.0}),
    "mixtral": ("MixtralConfig", {"vocab_size": 32000, "rms_norm_eps": 1e-05, "max_position_embeddings": 131072,
                                  "tie_word_embeddings": False, "rope_theta": 1000000.0}),
    "qwen2": ("Qwen2Config", {"vocab_size": 151936, "rms_norm_eps": 1e-06, "max_position_embeddings": 32768,
                              "tie_word_embeddings": False, "rope_theta": 10000.0}),
    "glm4_moe": ("Glm4MoeConfig", {"vocab_size": 151552, "rms_norm_eps": 1e-05, "max_position_embeddings": 131072,
                                   "tie_word_embeddings": False, "rope_theta": 10000.0}),
    "gpt_oss": ("GptOssConfig", {"vocab_size": 201088, "rms_norm_eps": 1e-05, "max_position_embeddings": 131072,
                                 "tie_word_embeddings": False, "rope_theta": 150000.0}),
    "kimi_linear": ("KimiLinearConfig", {"vocab_size": 163840, "rms_norm_eps": 1e-05, "tie_word_embeddings": False}),
    "llama4_text": ("Llama4TextConfig", {"vocab_size": 202048, "rms_norm_eps": 1e-05,
                                         "max_position_embeddings": 131072, "tie_word_embeddings": False,
                                         "rope_theta": 500000.0}),
    "minimax_m2": ("MiniMaxM2Config", {"vocab_size": 200064, "rms_norm_eps": 1e-06,
                                       "max_position_embeddings": 196608, "tie_word_embeddings": False,
                                       "rope_theta": 5000000.0}),
    "qwen3_next": ("Qwen3NextConfig", {"vocab_size": 151936, "rms_norm_eps": 1e-06,
                                       "max_position_embeddings": 32768, "tie_word_embeddings": False,
                                       "rope_theta": 10000.0}),
    "qwen3_5_text": ("Qwen3_5TextConfig", {"vocab_size": 248320, "rms_norm_eps": 1e-06,
                                           "max_position_embeddings": 32768, "tie_word_embeddings": False,
                                           "rope_theta": 10000.0}),
    "qwen3_5_moe_text": ("Qwen3_5MoeTextConfig", {"vocab_size": 248320, "rms_norm_eps": 1e-06,
                                                  "max_position_embeddings": 32768, "tie_word_embeddings": False,
                                                  "rope_theta": 10000.0}),
}  # fmt: skip

# a wrapper's text model when its text_config does not name its own model_type
WRAPPED_TEXT = {"gemma3": "gemma3_text", "llama4": "llama4_text", "qwen3_5": "qwen3_5_text",
                "qwen3_5_moe": "qwen3_5_moe_text"}  # fmt: skip


def _has_theta(text: Mapping[str, Any]) -> bool:
    params = text.get("rope_parameters")
    return "rope_theta" in text or (isinstance(params, dict) and "rope_theta" in params)


def _filled(text: Mapping[str, Any], model_type: str) -> tuple[dict[str, Any], str]:
    cls, defaults = TRANSFORMERS_DEFAULTS.get(model_type, ("", {}))
    fill = {k: v for k, v in defaults.items() if k not in text and (k != "rope_theta" or not _has_theta(text))}
    return fill, cls


def with_transformers_defaults(raw: dict[str, Any], wrapped: bool) -> tuple[dict[str, Any], tuple[str, ...]]:
    """`raw` with the missing fields transformers defaults filled in (in its `text_config` when
    `wrapped`), and one note per filled field for the audit (`ModelSpec.defaulted`)."""
    outer = str(raw.get("model_type"))
    text = raw.get("text_config")
    if wrapped and isinstance(text, dict):
        fill, cls = _filled(text, str(text.get("model_type") or WRAPPED_TEXT.get(outer, "")))
        new = {**raw, "text_config": {**text, **fill}}
    else:
        fill, cls = _filled(raw, outer)
        new = {**raw, **fill}
    if not fill:
        return raw, ()
    return new, tuple(f"{k} = {v!r} (absent from the config; transformers' {cls} default)" for k, v in fill.items())
