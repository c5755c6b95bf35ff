"""The bench sizes a slice from the card's memory for every weight and the requests' KV caches (issue 34):
gpt-oss-120b and GLM-5.1 fit an 80 GB card by keeping fewer experts or requests, and say so."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from tpplan.bench import slice_memory as SM
from tpplan.bench.config import BenchConfig
from tpplan.bench.model_slice import build_slice
from tpplan.bench.plan_bench import with_sized_requests
from tpplan.cost.workload import load_workload

GIB = 2**30
H100, H200 = 79.2 * GIB, 139.8 * GIB


def test_cache_bytes_are_the_runtimes_caches() -> None:
    """GQA keeps k and v at the KV heads; MLA the per-head keys (nope + rope) and values; DSA's index keys in fp32."""
    oss = build_slice("gpt-oss-120b", None, 8)
    assert SM.cache_bytes_per_token(oss, 2) == 4 * 2 * (8 * 64) * 2  # 4 layers, k and v, 8 KV heads of 64
    glm = build_slice("glm-5.1", None, 8)
    per_layer = (64 * (192 + 64) + 64 * 256) * 2 + 4 * 128  # MLA keys and values (bf16) + index keys (fp32)
    assert SM.cache_bytes_per_token(glm, 2) == 4 * per_layer


@pytest.mark.parametrize("model", ["gpt-oss-120b", "glm-5.1", "deepseek-v3", "kimi-k3"])
def test_every_family_fits_each_card_and_says_what_was_cut(model: str) -> None:
    wl = load_workload("seed-c8")
    for memory in (H100, H200):
        fit = SM.fit_slice(model, None, wl, 1, memory)
        assert fit.bytes_per_rank <= (1 - SM.RESERVE) * memory
        full = build_slice(model, None, None).experts
        if fit.experts != full or fit.requests < wl.total_requests:
            assert "sized to the card's" in fit.note
        else:
            assert fit.note == ""
    small, big = SM.fit_slice(model, None, wl, 1, H100), SM.fit_slice(model, None, wl, 1, H200)
    assert (small.experts or 0) <= (big.experts or 0) and small.requests <= big.requests


def test_requests_shrink_only_when_the_fewest_experts_do_not_fit() -> None:
    wl = load_workload("seed-c8")
    fit = SM.fit_slice("deepseek-v3", None, wl, 1, 40 * GIB)
    top_k = build_slice("deepseek-v3", None, None).top_k
    assert fit.experts == top_k and fit.requests < wl.total_requests  # experts at their floor first
    assert f"{fit.requests} of {wl.total_requests} requests" in fit.note
    roomy = SM.fit_slice("deepseek-v3", None, wl, 1, 400 * GIB)
    assert roomy.requests == wl.total_requests and roomy.experts == 256 and roomy.note == ""


def test_a_cut_workload_is_what_the_results_and_the_recorded_command_carry() -> None:
    cfg = BenchConfig(model="tiny-k3", plans=("baseline",), workload="seed-c8", command="tpplan bench --model tiny-k3")
    wl = load_workload("seed-c8")
    same = with_sized_requests(cfg, wl, wl.total_requests)
    assert same == (cfg, wl)
    cut_cfg, cut_wl = with_sized_requests(cfg, wl, 3)
    assert cut_wl.total_requests == 3 and cut_cfg.command.endswith("--requests 3")
