"""deepseek_v32, glm_moe_dsa, minimax_m2 and glm4_moe: the graph executor equals transformers 5.x.

As `test_hf_parity.py`: the HF model is built from the tiny preset's config dict (no download), in
fp32 eval mode with eager attention (`tests/hf_models.py`, shared); its state dict goes through
`normalize_names` and is checked against the graph's names and shapes. Zero-initialised HF buffers
(router bias, norms, biases) get random values so they are exercised. Tolerance 1e-4 absolute on
logits of order one (float32 reordering).

DSA: transformers' eager path folds the indexer's top-k into the attention mask in prefill too
(`DeepseekV32Attention.forward`: `index_mask` scattered from the top-k, `masked_fill` on the mask),
so the tiny preset's `index_topk` (4) is below the test's 13 tokens and the mask is live; the
test checks that it changes the logits, so a runtime ignoring it would fail.
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
CLASSES = {
    "deepseek_v32": ("DeepseekV32Config", "DeepseekV32ForCausalLM"),
    "glm_moe_dsa": ("GlmMoeDsaConfig", "GlmMoeDsaForCausalLM"),
    "minimax_m2": ("MiniMaxM2Config", "MiniMaxM2ForCausalLM"),
    "glm4_moe": ("Glm4MoeConfig", "Glm4MoeForCausalLM"),
}


def _raw(preset: str, overrides: dict | None) -> dict:
    raw, _ = load_config_dict(preset)
    return {**raw, **(overrides or {})}


def _hf_logits(raw: dict, ids: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model = build_hf_model(transformers, raw, CLASSES[raw["model_type"]])
    with torch.no_grad():
        logits = model(input_ids=ids[None]).logits[0]
    return logits, normalize_names({k: v.detach() for k, v in model.state_dict().items()})


def _ours(raw: dict, weights: dict, ids: torch.Tensor, chunk: int | None = None) -> torch.Tensor:
    graph = build_model_graph(spec_from_config(raw, label="test", name="test"))
    nu = numerics_from_config(raw)
    check_weights(weights, graph, nu)
    return run_reference(graph, weights, ids, numerics=nu, chunk=chunk)


CASES = [
    ("tiny-deepseek-v32", None),
    ("tiny-deepseek-v32", {"model_type": "glm_moe_dsa"}),  # interleaved RoPE in the indexer
    ("tiny-deepseek-v32", {"rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8,
                                            "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1}}),
    ("tiny-minimax-m2", None),
    ("tiny-glm4-moe", None),
    ("tiny-glm4-moe", {"use_qk_norm": False, "attention_bias": False, "partial_rotary_factor": 1.0}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("preset", "overrides"), CASES, ids=["ds32", "glm5", "ds32-yarn", "minimax-m2", "glm4-moe", "glm4-moe-plain"]
)
def test_logits_match_transformers(preset: str, overrides: dict | None) -> None:
    raw = _raw(preset, overrides)
    ids = torch.randint(0, raw["vocab_size"], (13,), generator=torch.Generator().manual_seed(3))
    ref, weights = _hf_logits(raw, ids)
    for chunk in (None, 5):  # one shot, and chunked prefill with carried caches (indexer keys too)
        diff = (_ours(raw, weights, ids, chunk) - ref).abs().max().item()
        assert diff < TOL, f"{preset} {overrides} chunk={chunk}: max |logits diff| = {diff:.3e}"


def test_dsa_index_mask_is_live() -> None:
    """The top-k mask changes the logits at 13 tokens (index_topk 4): the parity above tests it."""
    ids = torch.randint(0, 128, (13,), generator=torch.Generator().manual_seed(3))
    sparse, weights = _hf_logits(_raw("tiny-deepseek-v32", None), ids)
    dense = _ours(_raw("tiny-deepseek-v32", {"index_topk": 64}), weights, ids)
    assert (dense - sparse).abs().max().item() > 100 * TOL
