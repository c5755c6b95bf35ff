"""Logits of the graph executor equal transformers' own modeling code on the tiny presets.

The HF models are built from the preset config dicts (no download), in fp32 eval mode, with the
pure-PyTorch KDA / Gated DeltaNet paths; their state dicts go through `normalize_names` (stacked
experts, fused KDA conv, forget_gate.*). Tolerance: 1e-4 absolute on logits of magnitude ~1, i.e.
float32 reordering noise (measured diffs are ~1e-6).
"""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

from hf_models import build_hf_model  # noqa: E402

from tpplan.models.config import load_config_dict, spec_from_config  # noqa: E402
from tpplan.models.graph import build_model_graph  # noqa: E402
from tpplan.runtime.executor import run_reference  # noqa: E402
from tpplan.runtime.weights import check_weights, normalize_names, numerics_from_config  # noqa: E402

TOL = 1e-4

MODELS = {
    "tiny-deepseek-v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM"),
    "tiny-kimi-linear": ("KimiLinearConfig", "KimiLinearForCausalLM"),
    "tiny-qwen3-next": ("Qwen3NextConfig", "Qwen3NextForCausalLM"),
    "tiny-gpt-oss": ("GptOssConfig", "GptOssForCausalLM"),
    "tiny-gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM"),
    "tiny-llama4": ("Llama4TextConfig", "Llama4ForCausalLM"),
    "tiny-mixtral": ("MixtralConfig", "MixtralForCausalLM"),
    "tiny-kimi-k25": ("Kimi_K25Config", "Kimi_K25ForConditionalGeneration"),  # text model of the wrapper
    "tiny-deepseek-v2": ("DeepseekV2Config", "DeepseekV2ForCausalLM"),  # V2-Lite: no q_lora, greedy
    "tiny-qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),  # q/k/v biases
    # the wrappers: model.language_model.* names, separate in_proj_qkv/z/b/a, M-RoPE on text positions
    "tiny-qwen3-5-moe": ("Qwen3_5MoeConfig", "Qwen3_5MoeForConditionalGeneration"),
    "tiny-qwen3-5": ("Qwen3_5Config", "Qwen3_5ForConditionalGeneration"),
    "tiny-qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),  # q/k norm
    "tiny-mistral": ("MistralConfig", "MistralForCausalLM"),
}


def _hf_model(preset: str, overrides: dict | None = None) -> torch.nn.Module:
    raw, _ = load_config_dict(preset)
    return build_hf_model(transformers, {**raw, **(overrides or {})}, MODELS[preset])


YARN = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 8,
    "mscale": 1.0,
    "mscale_all_dim": 0.707,
    "beta_fast": 32,
    "beta_slow": 1,
}
CASES = [(p, None) for p in MODELS] + [
    ("tiny-deepseek-v3", {"rope_interleave": False}),
    ("tiny-deepseek-v3", {"rope_parameters": YARN}),
    # full DeepSeek-V2: q_lora and group_limited_greedy routing (groups ranked by their best score)
    ("tiny-deepseek-v2", {"q_lora_rank": 24, "topk_method": "group_limited_greedy", "n_group": 4, "topk_group": 2}),
    ("tiny-deepseek-v2", {"rope_scaling": {k: v for k, v in YARN.items() if k != "rope_theta"}}),
    ("tiny-gpt-oss", {"swiglu_limit": 0.3}),  # most gate/up values clamped
    ("tiny-mistral", {"sliding_window": 5}),  # every layer sees its last 5 keys (13 tokens run)
    ("tiny-mixtral", {"sliding_window": 4}),
]


IDS = ["ds3", "kimi-linear", "qwen3-next", "gpt-oss", "gemma3", "llama4", "mixtral", "kimi-k25", "ds2-lite", "qwen2"]
IDS += ["qwen3.5-moe", "qwen3.5", "qwen3", "mistral"]
IDS += ["ds3-noninterleave", "ds3-yarn", "ds2-grouped", "ds2-yarn", "gpt-oss-clamp", "mistral-swa", "mixtral-swa"]


@pytest.mark.parametrize(("preset", "overrides"), CASES, ids=IDS)
def test_logits_match_transformers(preset: str, overrides: dict | None) -> None:
    model = _hf_model(preset, overrides)
    raw, _ = load_config_dict(preset)
    graph = build_model_graph(spec_from_config({**raw, **(overrides or {})}, name=preset))
    nu = numerics_from_config({**raw, **(overrides or {})})
    weights = normalize_names({k: v.detach() for k, v in model.state_dict().items()})
    check_weights(weights, graph, nu)
    ids = torch.randint(0, graph.spec.vocab, (13,), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = model(input_ids=ids[None]).logits[0]
    ours = run_reference(graph, weights, ids, numerics=nu)
    diff = (ours - ref).abs().max().item()
    print(f"{preset} {overrides}: max |diff| = {diff:.2e} (|logits| max {ref.abs().max().item():.2f})")
    assert diff < TOL, f"{preset}: max |logits diff| = {diff:.3e}"
