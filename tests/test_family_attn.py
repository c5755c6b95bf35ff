"""Attention-variant families (gpt_oss): specs from the real configs, biased projections' cuts,
sliding-window / chunked attention priced by the keys a query really sees, and the real presets
audited at every TP their heads allow."""

import itertools
import json
import random
import subprocess
import sys

import pytest

from tpplan.cost.predict import cached_tokens, masked_pairs, predict_plan
from tpplan.cost.topology import load_topology
from tpplan.layout.placement import S_COL, P
from tpplan.models.config import load_config_dict, load_model, spec_from_config
from tpplan.models.cuts import FULL
from tpplan.models.graph import build_model_graph
from tpplan.models.numerics import numerics_from_config
from tpplan.models.opkinds import ShardCtx, op_kind, params_for_op
from tpplan.plans.named import make_plan


def _op(graph, kind, name):
    return next(o for o in graph.kinds[kind].ops if o.name == name)


def test_gpt_oss_specs_follow_the_configs():
    for preset, layers, experts in (("gpt-oss-20b", 24, 32), ("gpt-oss-120b", 36, 128)):
        spec = load_model(preset)
        assert spec.family == "gpt_oss" and spec.num_layers == layers
        assert [layer.attn.window for layer in spec.layers] == [128, None] * (layers // 2)
        g = build_model_graph(spec)
        assert g.counts() == {"swa+moe": layers // 2, "gqa+moe": layers // 2}
        attn = _op(g, "swa+moe", "attention")
        assert attn.attrs["window"] == 128 and attn.attrs["sinks"] and "sink" in attn.note
        assert _op(g, "gqa+moe", "attention").attrs["window"] is None
        assert _op(g, "swa+moe", "q_proj").weight_shape == (64 * 64, 2880)
        assert _op(g, "swa+moe", "o_proj").attrs["bias"] == "self_attn.o_proj.bias"
        ex = _op(g, "swa+moe", "experts")
        assert ex.attrs["experts"] == experts and ex.attrs["top_k"] == 4 and ex.attrs["intermediate"] == 2880
        assert ex.attrs["clamp"] == (1.702, 7.0) and ex.attrs["bias"]
        assert _op(g, "swa+moe", "router").weight == "mlp.router.weight"


def test_gpt_oss_bad_layer_types_are_named():
    raw, _ = load_config_dict("tiny-gpt-oss")
    from tpplan.errors import TpplanError

    with pytest.raises(TpplanError, match="layer_types"):
        spec_from_config({**raw, "layer_types": ["sliding_attention"]})
    with pytest.raises(TpplanError, match="unknown layer type"):
        spec_from_config({**raw, "layer_types": ["sliding_attention", "local"]})


def _cuts(op, split, output, n, rank, ep=None):
    nu = numerics_from_config(load_config_dict("tiny-gpt-oss")[0])
    return op_kind(op.kind).cuts(op, params_for_op(op, nu), ShardCtx(split, output, n, rank, ep))


def test_bias_enters_a_partial_sum_once():
    """Row-parallel o_proj (output P) keeps its bias on rank 0 only; column-parallel q_proj keeps its
    heads' part; experts' down bias lives on the ranks holding slice 0 of each expert's intermediate."""
    g = build_model_graph(load_model("tiny-gpt-oss"))
    o, q, ex = (_op(g, "swa+moe", n) for n in ("o_proj", "q_proj", "experts"))
    assert "bias" in _cuts(o, "row", P, 2, 0) and "bias" not in _cuts(o, "row", P, 2, 1)
    assert "bias" not in _cuts(o, "replicated", P, 4, 3)  # a replicated weight applied to a partial sum
    assert _cuts(o, "replicated", S_COL, 4, 3)["bias"] == FULL
    assert _cuts(q, "col", S_COL, 2, 1)["bias"].ranges == ((64, 128),)  # heads 4..7 of 8, 16 wide
    tp1 = _cuts(ex, "tp", P, 2, 1)
    assert "down_bias.0" not in tp1 and tp1["gate_bias.0"].ranges == ((16, 32),)
    assert "down_bias.0" in _cuts(ex, "tp", P, 2, 0)
    a2a = _cuts(ex, "a2a", P, 2, 1)
    assert {k for k in a2a if k.startswith("down_bias")} == {f"down_bias.{j}" for j in range(4, 8)}
    ep = [_cuts(ex, "ep", P, 4, r, ep=2) for r in range(4)]  # ranks 0,1: experts 0-3; 2,3: 4-7
    assert [sorted(k for k in c if k.startswith("down_bias")) for c in ep] == [
        [f"down_bias.{j}" for j in range(4)], [], [f"down_bias.{j}" for j in range(4, 8)], []
    ]


def _brute(segs, window=None, chunk=None):
    def sees(p, k):  # the mask, as transformers' sliding-window / chunked overlays write it
        return k <= p and (window is None or k > p - window) and (chunk is None or k // chunk == p // chunk)

    pairs = sum(sees(p, k) for n, c in segs for p in range(c, c + n) for k in range(p + 1))
    read = sum(sees(c, k) for _, c in segs for k in range(c))  # cached keys the first new query reads
    return pairs, read


def test_masked_pairs_equal_counting_the_mask():
    rng = random.Random(0)
    for _ in range(60):
        segs = tuple((rng.randint(1, 40), rng.randint(0, 50)) for _ in range(rng.randint(1, 3)))
        for window, chunk in ((None, None), (rng.randint(1, 20), None), (None, rng.randint(1, 20))):
            assert masked_pairs(segs, window, chunk) == _brute(segs, window, chunk), (segs, window, chunk)


def test_sliding_window_prices_attention_and_kv_by_the_window():
    """gpt-oss-20b at TP8: a sliding layer's attention sees 128 keys per query, so on an 8192-token
    batch its attention FLOPs are 128-key rows, not the causal triangle; its KV cache holds 128 tokens."""
    g = build_model_graph(load_model("gpt-oss-20b"))
    topo = load_topology("h200x8-ib400")
    pred = predict_plan(g, make_plan("baseline", g, 8), topo, tp=8, tokens=8192)
    flops = {k.kind: next(o.flops_per_rank for o in k.ops if o.op == "attention") for k in pred.kinds}
    full_pairs, swa_pairs = 8192 * 8193 // 2, 128 * 129 // 2 + (8192 - 128) * 128
    assert flops["gqa+moe"] / flops["swa+moe"] == pytest.approx(full_pairs / swa_pairs)
    kv_per_token = 2 * 1 * 64 * 2  # one of 8 KV heads per rank, K and V, head_dim 64, bf16
    assert pred.memory.kv_cache == pytest.approx(12 * kv_per_token * (8192 + 128))
    spec = load_model("gpt-oss-20b")
    assert cached_tokens(spec.layers[0].attn, [100, 5000]) == 100 + 128
    assert cached_tokens(spec.layers[1].attn, [100, 5000]) == 5100


def test_real_presets_audit_at_every_tp_their_heads_allow():
    for preset, tps in (("gpt-oss-20b", (1, 2, 4, 8)), ("gpt-oss-120b", (8,))):
        for tp in tps:
            out = subprocess.run(
                [sys.executable, "-m", "tpplan", "audit", "--model", preset, "--tp", str(tp), "--json",
                 "--topology", "h200x8-ib400", "--workload", "seed-c8"],
                capture_output=True, text=True,
            )  # fmt: skip
            assert out.returncode == 0, out.stderr
            plans = {p["name"]: p for p in json.loads(out.stdout)["plans"]}
            assert plans["baseline"]["legal"] and plans["gate-aware"]["legal"]


def test_gpt_oss_numerics():
    raw, _ = load_config_dict("gpt-oss-20b")
    nu = numerics_from_config(raw)
    assert nu.rope_scaling["rope_type"] == "yarn" and nu.rope_theta == 150000 and nu.renormalize
    assert list(itertools.islice(raw["layer_types"], 2)) == ["sliding_attention", "full_attention"]
