"""KV capacity per rank against each engine's own formula, worked by hand here from the cited source
(`tpplan.engines.memory`): SGLang 0.5.23's mem_fraction_static and cell, vLLM 0.33.0's and 0.34.0's
profiled budget and blocks, on a dense GQA model, an MLA model, a linear-attention hybrid and a
sliding-window hybrid. The weights and the recurrent state per request are tpplan's own accounting
(inputs here); the per-token cell is written out from the model's config."""

from __future__ import annotations

import math

import pytest

from tpplan.cost.kv_capacity import kv_capacity, kv_engines_for
from tpplan.cost.plan_steps import STATE_BYTES
from tpplan.cost.predictor import cached_predictor
from tpplan.cost.topology import load_topology
from tpplan.engines.memory import sglang_prefill_graph_sizes, sglang_reserve
from tpplan.errors import TpplanError
from tpplan.mesh import Mesh
from tpplan.models.config import load_model
from tpplan.models.graph import build_model_graph
from tpplan.models.opkinds import mixer
from tpplan.plans.named import baseline

GIB = 2**30
LONG = 1_000_000  # a request long enough that the pool, not the running-request cap, binds


def _predictor(model: str, tp: int, topo: str = "h100x8-ib400", pp: int = 1):
    return cached_predictor(
        build_model_graph(load_model(model)), baseline(), load_topology(topo), Mesh(tp, pp=pp), "bf16", None
    )


def _sglang_fraction(gpu_mib: float, tp: int, pp: int, mla: bool) -> float:
    """handle_gpu_memory_settings on a 60-160 GiB GPU (chunk 8192, decode max_bs 256 / 512), by hand."""
    max_bs = 256 if tp < 4 else 512
    prefill = 1.5 * 1024 if mla else 8 * 58  # 58 prefill graph sizes up to 8192 tokens
    reserved = 512 + 1.5 * 8192 + tp * pp / 8 * 1024 + 2 * max_bs + prefill
    return round((gpu_mib - max(reserved, 10 * 1024)) / gpu_mib, 3)


def test_sglang_reserve_is_the_engines_formula_on_h100_and_h200() -> None:
    assert len(sglang_prefill_graph_sizes(8192)) == 58
    h100 = sglang_reserve(79.6 * 1024, Mesh(8), chunk=8192, mla=False)
    assert h100.reserved_mib == 512 + 12288 + 1024 + 1024 + 464
    assert h100.mem_fraction_static == round((79.6 * 1024 - 15312) / (79.6 * 1024), 3)
    h200 = sglang_reserve(140 * 1024, Mesh(8), chunk=8192, mla=True)  # MLA: prefill graphs reserve 1.5 GiB
    assert h200.reserved_mib == 512 + 12288 + 1024 + 1024 + 1536
    assert h200.mem_fraction_static == 0.886
    # TP1 on a card over 60 GiB: the 10 GiB floor does not bind
    small = sglang_reserve(79.6 * 1024, Mesh(1), chunk=8192, mla=False)
    assert small.mem_fraction_static == _sglang_fraction(79.6 * 1024, 1, 1, False)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_sglang_dense_gqa_tokens_and_batch(tp: int) -> None:
    p = _predictor("tiny-llama", tp)
    spec = p.graph.spec
    a = spec.layers[0].attn
    cell = len(spec.layers) * max(1, a.kv_heads // tp) * (a.head_dim + a.head_dim) * 2  # K and V, bf16
    c = kv_capacity(p, "sglang@0.5.23", LONG)
    card = 79.6 * GIB
    frac = _sglang_fraction(79.6 * 1024, tp, 1, False)
    tokens = math.floor((card * frac - c.weights) / cell)
    assert c.bytes_per_token == cell
    assert c.tokens == tokens
    assert c.batch == min(tokens // LONG, 2048) and c.bound == "KV pool"
    assert kv_capacity(p, "sglang@0.5.23", 10).batch == 2048  # short requests: --max-running-requests binds


def test_mla_caches_the_latent_whole_on_every_rank() -> None:
    """Would fail if MLA's KV were counted as full K and V per head (or split over TP)."""
    p = _predictor("tiny-deepseek-v3", 4)
    spec = p.graph.spec
    a = spec.layers[0].attn
    latent = len(spec.layers) * (a.kv_lora_rank + a.rope_dim) * 2
    full_kv = len(spec.layers) * a.heads * (a.nope_dim + a.rope_dim + a.v_dim) * 2 // 4
    assert latent != full_kv
    for engine in ("sglang@0.5.23", "vllm@0.34.0"):
        c = kv_capacity(p, engine, LONG)
        assert c.bytes_per_token == latent
    c = kv_capacity(p, "sglang@0.5.23", LONG)
    frac = _sglang_fraction(79.6 * 1024, 4, 1, True)
    assert c.tokens == math.floor((79.6 * GIB * frac - c.weights) / latent)


def test_sglang_linear_attention_hybrid_splits_state_slots_first() -> None:
    p = _predictor("tiny-qwen3-next", 2)
    spec = p.graph.spec
    full = [layer.attn for layer in spec.layers if layer.attn.kind == "gqa"]
    assert 0 < len(full) < len(spec.layers)
    cell = sum(max(1, a.kv_heads // 2) * 2 * a.head_dim * 2 for a in full)
    slot = sum(mixer(layer.attn.kind).state_bytes(layer.attn, 2, 2, STATE_BYTES) for layer in spec.layers)
    assert slot > 0
    c = kv_capacity(p, "sglang@0.5.23", LONG)
    rest = 79.6 * GIB * _sglang_fraction(79.6 * 1024, 2, 1, False) - c.weights
    slots = int((rest * 0.9 / 1.9 - slot) // slot)  # mamba_full_memory_ratio 0.9
    tokens = math.floor((rest - (slots + 1) * slot) / cell)
    assert c.tokens == tokens
    assert c.max_running == min(2048, tokens // 2, slots // 3)


def test_sliding_window_hybrid_sizes_both_pools() -> None:
    p = _predictor("tiny-gpt-oss", 2)
    spec = p.graph.spec
    windows = [layer.attn.window for layer in spec.layers if layer.attn.window]
    assert windows and len(windows) < len(spec.layers)
    per_layer = max(1, spec.layers[0].attn.kv_heads // 2) * 2 * spec.layers[0].attn.head_dim * 2
    n_swa = len(windows)
    n_full = len(spec.layers) - n_swa
    cell = n_full * per_layer + 0.8 * n_swa * per_layer  # swa_full_tokens_ratio
    c = kv_capacity(p, "sglang@0.5.23", LONG)
    tokens = math.floor((79.6 * GIB * _sglang_fraction(79.6 * 1024, 2, 1, False) - c.weights) / cell)
    assert c.tokens == tokens
    assert c.batch == min(tokens // LONG, int(tokens * 0.8) // min(windows), 2048)
    # vLLM: the window's layers hold cdiv(window, block) + 1 blocks per request, the full ones the whole request
    v = kv_capacity(p, "vllm@0.34.0", LONG)
    need = math.ceil(LONG / 64) * 64 * n_full * per_layer + (math.ceil(min(windows) / 64) + 1) * 64 * n_swa * per_layer
    assert v.batch == min(int(v.pool_bytes // need), 1024)


@pytest.mark.parametrize(("engine", "block"), [("vllm@0.33.0", 16), ("vllm@0.34.0", 64)])
def test_vllm_blocks_from_the_profiled_budget(engine: str, block: int) -> None:
    p = _predictor("tiny-llama", 2)
    spec = p.graph.spec
    a = spec.layers[0].attn
    cell = len(spec.layers) * 1 * 2 * a.head_dim * 2
    c = kv_capacity(p, engine, LONG)
    peak = c.settings["activation_peak_bytes"]
    card = 79.6 * GIB
    # 0.34.0, extensible: headroom - max(1 GiB, 0.75 peak) - peak at utilization 1.0; 0.33.0: ceil(total x 0.92)
    # - weights - peak (CUDA graphs and non-torch memory not estimated)
    extensible = engine == "vllm@0.34.0"
    kv = card - c.weights - max(GIB, 0.75 * peak) - peak if extensible else card * 0.92 - c.weights - peak
    assert c.pool_bytes == pytest.approx(kv)
    assert c.tokens == int(kv // (block * cell)) * block
    assert c.batch == min(int(kv // (math.ceil(LONG / block) * block * cell)), 1024)
    assert kv_capacity(p, engine, 10).bound == "max_num_seqs"


def test_dp_attention_keeps_every_head_of_a_ranks_own_requests() -> None:
    from tpplan.plans.named import make_plan

    g = build_model_graph(load_model("tiny-deepseek-v3"))
    topo = load_topology("h100x8-ib400")
    try:
        plan = make_plan("dp-attention", g, 4)
    except TpplanError:
        pytest.skip("no dp-attention plan for this model")
    p = cached_predictor(g, plan, topo, Mesh(4, pp=1), "bf16", None)
    c = kv_capacity(p, "sglang@0.5.23", LONG)
    a = g.spec.layers[0].attn
    assert c.bytes_per_token == len(g.spec.layers) * (a.kv_lora_rank + a.rope_dim) * 2
    assert c.batch is not None and c.batch % 4 == 0  # each of the 4 attention-DP ranks holds its own batch


def test_engine_choice_and_bad_version() -> None:
    assert kv_engines_for(None) == ("sglang@0.5.23", "vllm@0.34.0")
    assert kv_engines_for("vllm@0.33.0") == ("vllm@0.33.0",)
    assert kv_engines_for("sglang") == ("sglang@0.5.23",)
    assert kv_engines_for("trtllm") == ("sglang@0.5.23", "vllm@0.34.0")
    with pytest.raises(TpplanError, match="no KV-sizing facts"):
        kv_capacity(_predictor("tiny-llama", 1), "vllm@0.1.0")


def test_audit_json_carries_both_engines_capacity(tmp_path, monkeypatch, capsys) -> None:
    import json

    from tests.cli_helpers import run_cli

    out = tmp_path / "a.json"
    args = ("audit", "--model", "tiny-llama", "--tp", "2", "-t", "h100x8-ib400", "-w", "seed-c8", "-p", "baseline")
    code, _, err = run_cli(monkeypatch, capsys, *args, "--json", str(out))
    assert code == 0, err
    caps = json.loads(out.read_text())["plans"][0]["prediction"]["kv_capacity"]
    assert [c["engine"] for c in caps] == ["sglang@0.5.23", "vllm@0.34.0"]
    p = _predictor("tiny-llama", 2)
    want = kv_capacity(p, "sglang@0.5.23", caps[0]["seq_len"])
    assert caps[0]["kv_tokens_per_rank"] == want.tokens and caps[0]["decode_batch"] == want.batch
    assert any("handle_gpu_memory_settings" in s and "0.5.23" in s for s in caps[0]["sources"])


def test_sglang_a_pp_stage_without_kv_layers_does_not_bound_the_pool() -> None:
    """tiny-kimi-k3 at PP3 puts two KDA layers alone on stage 0: SGLang sizes that stage's pool to int64 max
    (has_kv_on_another_pp_stage), so the pool is the MLA stages'. Before, its 0-token cell made the pool 0 tokens
    and the search refused Kimi-K3 TP1xPP32 ('needs 4608 tokens of KV ..., more than the pool's 1')."""
    p = _predictor("tiny-kimi-k3", 1, "h200x8-ib400", pp=3)
    kinds = [[p.graph.spec.layers[j].attn.kind for j in rng] for rng in p.stages]
    assert "mla" not in kinds[0] and all("mla" in k for k in kinds[1:])
    cap = kv_capacity(p, "sglang@0.5.23")
    assert cap.tokens > LONG
