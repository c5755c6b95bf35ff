"""quantization_config sets the bytes of every weight group: memory per rank equals the checkpoint."""

import math

import pytest

from tpplan.cost.predict import predict_plan
from tpplan.cost.topology import load_topology
from tpplan.errors import TpplanError
from tpplan.mesh import Mesh
from tpplan.models.config import load_config_dict, load_model, spec_from_config
from tpplan.models.graph import build_model_graph
from tpplan.plans.named import make_plan


def _fp8_block(rows: int, cols: int) -> int:
    """One FP8 e4m3 byte per weight plus one fp32 scale per 128x128 block (DeepSeek-V3's format)."""
    return rows * cols + math.ceil(rows / 128) * math.ceil(cols / 128) * 4


def _deepseek_v3_checkpoint_bytes(n: int) -> tuple[float, float]:
    """(bytes rank 0 holds under Megatron TP over n ranks, bytes of it the planner leaves out),
    counted from DeepSeek-V3's config.json by hand: every Linear FP8 block-wise, except the router
    gate (a bf16 parameter) and the LM head; norms and the embedding bf16 (MTP layer not served)."""
    raw, _ = load_config_dict("deepseek-v3")
    h, v, heads = raw["hidden_size"], raw["vocab_size"], raw["num_attention_heads"]
    q_lora, kv_lora, rope = raw["q_lora_rank"], raw["kv_lora_rank"], raw["qk_rope_head_dim"]
    qk, vd = raw["qk_nope_head_dim"] + rope, raw["v_head_dim"]
    e, inter, dense_inter = raw["n_routed_experts"], raw["moe_intermediate_size"], raw["intermediate_size"]
    shared = raw["n_shared_experts"] * inter
    layers, dense = raw["num_hidden_layers"], raw["first_k_dense_replace"]
    attn = (
        _fp8_block(q_lora, h) + _fp8_block(kv_lora + rope, h)  # replicated down-projections
        + (_fp8_block(heads * qk, q_lora) + _fp8_block(heads * (qk - rope + vd), kv_lora)) / n  # by head
        + _fp8_block(h, heads * vd) / n
        + 2 * (2 * h + q_lora + kv_lora)  # four RMSNorm vectors, bf16
    )  # fmt: skip
    dense_mlp = 3 * _fp8_block(dense_inter, h) / n
    moe = (e * 3 * _fp8_block(inter, h) + 3 * _fp8_block(shared, h)) / n + e * h * 2 + e * 4  # + router, bias
    total = layers * attn + dense * dense_mlp + (layers - dense) * moe + 2 * v * h * 2 / n + h * 2
    # Not counted by the planner (28 KiB per GPU in 673 GB): each MoE layer's fp32 router
    # e_score_correction_bias and the final norm's bf16 vector.
    return total, (layers - dense) * e * 4 + h * 2


@pytest.mark.parametrize("n", [1, 8])
def test_deepseek_v3_fp8_memory_per_rank_matches_the_checkpoint(n):
    graph = build_model_graph(load_model("deepseek-v3"))
    topo = load_topology("h200x8-ib400")
    pred = predict_plan(graph, make_plan("baseline", graph, n), topo, mesh=Mesh(n), tokens=16)
    expected, left_out = _deepseek_v3_checkpoint_bytes(n)
    assert pred.memory.weights == pytest.approx(expected - left_out, rel=1e-12)
    # The same model without its quantization_config holds every weight in bf16: about twice as much.
    raw, _ = load_config_dict("deepseek-v3")
    bf16 = build_model_graph(spec_from_config({k: v for k, v in raw.items() if k != "quantization_config"}))
    unq = predict_plan(bf16, make_plan("baseline", bf16, n), topo, mesh=Mesh(n), tokens=16)
    assert 1.9 < unq.memory.weights / pred.memory.weights < 2.0


def test_fp8_gemms_run_at_the_fp8_rate_and_expert_dtype_overrides():
    graph = build_model_graph(load_model("deepseek-v3"))
    raw, _ = load_config_dict("deepseek-v3")
    bf16 = build_model_graph(spec_from_config({k: v for k, v in raw.items() if k != "quantization_config"}))
    topo = load_topology("h200x8-ib400")
    fp8 = predict_plan(graph, make_plan("baseline", graph, 8), topo, mesh=Mesh(8), tokens=8192)
    ref = predict_plan(bf16, make_plan("baseline", bf16, 8), topo, mesh=Mesh(8), tokens=8192)

    def op_s(p, name):
        return next(o.seconds for kt in p.kinds for o in kt.ops if o.op == name and kt.kind == "mla+moe")

    # compute-bound GEMM at the FP8 rate: faster than bf16, not twice (K = 1536: fp8_factor ~0.65, issue 25)
    from tpplan.cost.gemm import fp8_factor

    ratio = op_s(fp8, "q_b_proj") / op_s(ref, "q_b_proj")
    assert ratio == pytest.approx(1 / (2 * fp8_factor(1536, 3072)), rel=0.05) and ratio < 0.8
    over = predict_plan(graph, make_plan("baseline", graph, 8), topo, mesh=Mesh(8), tokens=16, expert_dtype="bf16")
    small = predict_plan(graph, make_plan("baseline", graph, 8), topo, mesh=Mesh(8), tokens=16)
    experts = graph.kinds["mla+moe"].mlp.ops
    numel = next(o.weight_numel for o in experts if o.name == "experts")
    moe_layers = graph.counts()["mla+moe"]
    # --expert-dtype bf16 prices the routed experts at 2 bytes, the checkpoint's at ~1 byte + scales
    extra = over.memory.weights - small.memory.weights
    assert extra == pytest.approx(moe_layers * numel / 8 * (2 - (1 + 4 / 128**2)), rel=1e-9)


def test_k3_preset_fits_at_tp32_with_its_expert_format():
    graph = build_model_graph(load_model("kimi-k3"))
    topo = load_topology("h200x8-ib400", nodes=4)
    pred = predict_plan(graph, make_plan("baseline", graph, 32), topo, mesh=Mesh(32), tokens=8192)
    assert pred.memory.total < topo.gpu.memory_GiB * 2**30  # the README's first command: plans that fit
    bf16 = predict_plan(graph, make_plan("baseline", graph, 32), topo, mesh=Mesh(32), tokens=8192, expert_dtype="bf16")
    assert bf16.memory.weights > 2.5 * pred.memory.weights


def test_quantization_formats_and_skipped_modules():
    base = load_config_dict("tiny-qwen3-moe")[0]
    gptoss = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "lm_head"]}
    spec = load_model_from(base, gptoss)
    from tpplan.models.quant import op_weights

    ws = op_weights(build_model_graph(spec))
    assert {name for _, name in ws} == {"experts"}  # attention left out by the glob
    (w,) = ws.values()
    assert w.fmt.name == "mxfp4" and w.fmt.matrix_bytes(8, 64) == 8 * 64 / 2 + 8 * 2  # 4 bits + e8m0 per 32
    int4 = {
        "quant_method": "compressed-tensors",
        "config_groups": {"g0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "group_size": 32}}},
        "ignore": ["lm_head", "re:.*self_attn.*"],
    }
    ws = op_weights(build_model_graph(load_model_from(base, int4)))
    (w,) = ws.values()
    assert w.fmt.name == "int4" and w.fmt.compute == "bf16" and w.fmt.matrix_bytes(8, 64) == 8 * 64 / 2 + 8 * 2 * 2
    with pytest.raises(TpplanError, match="quant_method"):
        load_model_from(base, {"quant_method": "gguf"})


def load_model_from(base, quant):
    return spec_from_config({**base, "quantization_config": quant})


def test_kimi_k25_int4_experts_match_the_published_checkpoint():
    """Kimi-K2.5 ships compressed-tensors int4 (group 32, bf16 scales) routed experts and bf16
    elsewhere. Counted by hand from its config; the expert bytes also equal the checkpoint's
    published tensor listing (per projection, 60 layers x 384 experts: weight_packed 157.50 GiB +
    weight_scale 19.69 GiB)."""
    text = load_config_dict("kimi-k25")[0]["text_config"]
    h, v, heads = text["hidden_size"], text["vocab_size"], text["num_attention_heads"]
    q_lora, kv_lora, rope = text["q_lora_rank"], text["kv_lora_rank"], text["qk_rope_head_dim"]
    qk, vd = text["qk_nope_head_dim"] + rope, text["v_head_dim"]
    e, inter = text["n_routed_experts"], text["moe_intermediate_size"]
    layers, dense = text["num_hidden_layers"], text["first_k_dense_replace"]
    moe_layers = layers - dense
    int4 = inter * h // 2 + inter * (h // 32) * 2  # one [2048, 7168] or [7168, 2048] projection
    assert moe_layers * e * inter * h // 2 / 2**30 == pytest.approx(157.50, abs=0.005)
    assert moe_layers * e * inter * (h // 32) * 2 / 2**30 == pytest.approx(19.69, abs=0.005)
    bf16 = 2 * (
        layers * (q_lora * h + (kv_lora + rope) * h + heads * qk * q_lora + heads * (qk - rope + vd) * kv_lora
                  + h * heads * vd + 2 * h + q_lora + kv_lora)
        + dense * 3 * text["intermediate_size"] * h
        + moe_layers * (e * h + 3 * inter * h)  # router, shared expert
        + 2 * v * h
    )  # fmt: skip
    expected = bf16 + moe_layers * e * 3 * int4
    graph = build_model_graph(load_model("kimi-k25"))
    pred = predict_plan(graph, make_plan("baseline", graph, 1), load_topology("h200x8-ib400"), mesh=Mesh(1), tokens=16)
    assert pred.memory.weights == pytest.approx(expected, rel=1e-12)
