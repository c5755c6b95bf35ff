"""KV capacity against each engine's own formula on more configurations (issue 32): MoE (GQA) on B200, the
mem_fraction_static derivation where prefill CUDA graphs are off by default (PP > 1, KDA hybrids), and vLLM
on H200 and B200 for MLA and MoE. Every expected value is worked here from the engine source as read in the
wheels (sglang 0.5.23: python/sglang/srt/arg_groups/memory_hook.py handle_gpu_memory_settings and
reserve_for_graph_mb, arg_groups/cuda_graph_hook.py apply_cuda_graph_compatibility /
disable_breakable_cudagraph_if_incompatible / generate_prefill_cuda_graph_batch_sizes, arg_groups/pipeline.py
(handle_cuda_graph_config runs before handle_gpu_memory_settings); vllm 0.34.0: config/cache.py,
v1/worker/extensible_kv_cache.py measure_kv_cache_bytes, engine/arg_utils.py get_batch_defaults). Weights,
recurrent state and vLLM's activation peak are tpplan's own accounting (read from the result as inputs)."""

from __future__ import annotations

import math

import pytest

from tpplan.cost.kv_capacity import kv_capacity
from tpplan.cost.plan_steps import STATE_BYTES
from tpplan.cost.predictor import cached_predictor
from tpplan.cost.topology import select_topology
from tpplan.mesh import Mesh
from tpplan.models.config import load_model
from tpplan.models.graph import build_model_graph
from tpplan.models.opkinds import mixer
from tpplan.plans.named import baseline

GIB = 2**30
LONG = 1_000_000
# generate_prefill_cuda_graph_batch_sizes: 8 + 14 + 8 + 8 + 12 sizes up to 4096, then 4608.. step 512
PREFILL_SIZES = {8192: 8 + 14 + 8 + 8 + 12 + 8, 16384: 8 + 14 + 8 + 8 + 12 + 24}


def _predictor(model: str, tp: int, gpu: str, pp: int = 1):
    topo = select_topology("h100x8-ib400", max(1, tp * pp // 8), gpu=gpu)
    return cached_predictor(build_model_graph(load_model(model)), baseline(), topo, Mesh(tp, pp=pp), "bf16", None)


def _fraction(gpu_mib: float, reserved_mib: float) -> float:
    """handle_gpu_memory_settings: the 10 GiB floor on GPUs over 60 GiB, then round(.., 3)."""
    return round((gpu_mib - max(reserved_mib, 10 * 1024)) / gpu_mib, 3)


@pytest.mark.parametrize("tp", [1, 4])
def test_sglang_moe_on_b200_takes_the_over_160_gib_defaults(tp: int) -> None:
    """B200 (180 GiB): chunked_prefill_size 16384 and decode max_bs 512 at every TP; 74 prefill graph sizes."""
    p = _predictor("tiny-mixtral", tp, "b200-datasheet")
    a = p.graph.spec.layers[0].attn
    gpu_mib = 180.0 * 1024
    reserved = 512 + 16384 * 1.5 + tp / 8 * 1024 + 2 * 512 + 8 * PREFILL_SIZES[16384]
    c = kv_capacity(p, "sglang@0.5.23", LONG)
    assert c.settings["chunked_prefill_size"] == 16384 and c.settings["cuda_graph_max_bs"] == 512
    assert c.settings["mem_fraction_static"] == _fraction(gpu_mib, reserved)
    cell = len(p.graph.spec.layers) * max(1, a.kv_heads // tp) * 2 * a.head_dim * 2  # K and V, bf16
    assert c.bytes_per_token == cell
    assert c.tokens == math.floor((180.0 * GIB * _fraction(gpu_mib, reserved) - c.weights) / cell)


def test_sglang_pp_reserves_no_prefill_graphs() -> None:
    """PP 2 on H100: apply_cuda_graph_compatibility turns breakable prefill graphs off, so only the decode
    graphs (2 x 256 at TP 2) are reserved; TP 2 x PP 2 adds 4 / 8 GiB."""
    p = _predictor("tiny-llama", 2, "h100-measured", pp=2)
    gpu_mib = 79.6 * 1024
    reserved = 512 + 8192 * 1.5 + 2 * 2 / 8 * 1024 + 2 * 256
    with_prefill_graphs = reserved + 8 * PREFILL_SIZES[8192]
    assert _fraction(gpu_mib, reserved) != _fraction(gpu_mib, with_prefill_graphs)  # the case can tell them apart
    c = kv_capacity(p, "sglang@0.5.23", LONG)
    assert c.settings["mem_fraction_static"] == _fraction(gpu_mib, reserved)
    assert c.settings["reserved_mib"] == max(reserved, 10 * 1024)


def test_sglang_kda_hybrid_reserves_no_prefill_graphs_and_splits_state_slots() -> None:
    """Kimi-Linear's KDA layers: disable_breakable_cudagraph_if_incompatible turns prefill graphs off (its MLA
    layers' 1.5 GiB is not reserved); the pool then splits into state slots and the MLA layers' latent cache."""
    p = _predictor("tiny-kimi-linear", 2, "h200-measured")
    spec = p.graph.spec
    gpu_mib = 140.0 * 1024
    reserved = 512 + 8192 * 1.5 + 2 / 8 * 1024 + 2 * 256
    c = kv_capacity(p, "sglang@0.5.23", LONG)
    frac = _fraction(gpu_mib, reserved)
    assert c.settings["mem_fraction_static"] == frac
    mla = [layer.attn for layer in spec.layers if layer.attn.kind == "mla"]
    cell = sum(a.kv_lora_rank + a.rope_dim for a in mla) * 2
    slot = sum(mixer(layer.attn.kind).state_bytes(layer.attn, 2, 2, STATE_BYTES) for layer in spec.layers)
    rest = 140.0 * GIB * frac - c.weights
    slots = int((rest * 0.9 / 1.9 - slot) // slot)  # mamba_full_memory_ratio 0.9: (K + 1) slots come off first
    assert c.bytes_per_token == cell
    assert c.tokens == math.floor((rest - (slots + 1) * slot) / cell)


@pytest.mark.parametrize(("model", "tp", "gpu", "gib"), [("tiny-deepseek-v3", 4, "h200-measured", 140.0),
                                                          ("tiny-mixtral", 4, "b200-datasheet", 180.0)])  # fmt: skip
def test_vllm_034_blocks_on_h200_and_b200(model: str, tp: int, gpu: str, gib: float) -> None:
    """vLLM 0.34.0: extensible KV cache at utilization 1.0 (headroom - max(1 GiB, 0.75 peak) - peak), 64-token
    blocks, max_num_seqs 1024 on GPUs of 70 GiB and more; MLA caches the latent once (one KV head)."""
    p = _predictor(model, tp, gpu)
    spec = p.graph.spec
    a = spec.layers[0].attn
    if a.kind == "mla":
        cell = len(spec.layers) * (a.kv_lora_rank + a.rope_dim) * 2
    else:
        cell = len(spec.layers) * max(1, a.kv_heads // tp) * 2 * a.head_dim * 2
    c = kv_capacity(p, "vllm@0.34.0", LONG)
    peak = c.settings["activation_peak_bytes"]
    kv = gib * GIB - c.weights - max(GIB, 0.75 * peak) - peak
    assert c.bytes_per_token == cell and c.pool_bytes == pytest.approx(kv)
    assert c.tokens == int(kv // (64 * cell)) * 64
    assert c.max_running == 1024
    assert c.batch == min(int(kv // (math.ceil(LONG / 64) * 64 * cell)), 1024)
