"""Attention-variant families (gpt_oss): specs from the real configs, biased projections' cuts,
sliding-window / chunked attention priced by the keys a query really sees (every real preset at
every TP its heads allow: tests/test_every_family.py)."""

import itertools
import random

import pytest

from tpplan.cost.predict import cached_tokens, masked_pairs, predict_plan
from tpplan.cost.topology import load_topology
from tpplan.errors import TpplanError
from tpplan.mesh import Mesh
from tpplan.models.config import load_config_dict, load_model, numerics_from_config, spec_from_config
from tpplan.models.cuts import FULL
from tpplan.models.graph import build_model_graph
from tpplan.models.opkinds import ShardCtx, op_kind, params_for_op
from tpplan.placement import S_COL, P
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
        assert _op(g, "swa+moe", "o_proj").attrs["bias"] and _op(g, "swa+moe", "k_proj").attrs["bias"]
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
    from tpplan.layout.rules import strategies

    assert all(P not in s.inputs for s in strategies(o, "replicated", g.kinds["swa+moe"].values))  # affine
    assert _cuts(o, "replicated", S_COL, 4, 3)["bias"] == FULL
    assert _cuts(q, "col", S_COL, 2, 1)["bias"].ranges == ((64, 128),)  # heads 4..7 of 8, 16 wide
    tp1 = _cuts(ex, "tp", P, 2, 1)
    assert "down_bias.0" not in tp1 and tp1["gate_bias.0"].ranges == ((16, 32),)
    assert "down_bias.0" in _cuts(ex, "tp", P, 2, 0)
    a2a = _cuts(ex, "a2a", P, 2, 1)
    assert {k for k in a2a if k.startswith("down_bias")} == {f"down_bias.{j}" for j in range(4, 8)}
    ep = [_cuts(ex, "ep", P, 4, r, ep=2) for r in range(4)]  # ranks 0,1: experts 0-3; 2,3: 4-7
    assert [sorted(k for k in c if k.startswith("down_bias")) for c in ep] == [
        [f"down_bias.{j}" for j in range(4)],
        [],
        [f"down_bias.{j}" for j in range(4, 8)],
        [],
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
    pred = predict_plan(g, make_plan("baseline", g, 8), topo, mesh=Mesh(8), tokens=8192)
    flops = {k.kind: next(o.flops_per_rank for o in k.ops if o.op == "attention") for k in pred.kinds}
    full_pairs, swa_pairs = 8192 * 8193 // 2, 128 * 129 // 2 + (8192 - 128) * 128
    assert flops["gqa+moe"] / flops["swa+moe"] == pytest.approx(full_pairs / swa_pairs)
    kv_per_token = 2 * 1 * 64 * 2  # one of 8 KV heads per rank, K and V, head_dim 64, bf16
    assert pred.memory.kv_cache == pytest.approx(12 * kv_per_token * (8192 + 128))
    spec = load_model("gpt-oss-20b")
    assert cached_tokens(spec.layers[0].attn, [100, 5000]) == 100 + 128
    assert cached_tokens(spec.layers[1].attn, [100, 5000]) == 5100


def _mistral(**over):
    raw, _ = load_config_dict("mistral-7b-v0.3")
    raw = {k: v for k, v in raw.items() if k != "sliding_window"} if over.pop("drop_window", False) else raw
    return spec_from_config({**raw, **over}, name="m")


def test_mistral_reads_sliding_window_as_transformers_does():
    """Mistral / Mixtral attend within `sliding_window` on every layer (null: full attention, as the
    released Mistral-7B-v0.3 says); an absent key is MistralConfig's default 4096 (Mixtral: none)."""
    assert {layer.attn.window for layer in load_model("mistral-7b-v0.3").layers} == {None}
    assert {layer.attn.window for layer in _mistral(sliding_window=4096).layers} == {4096}
    assert {layer.attn.window for layer in _mistral(drop_window=True).layers} == {4096}
    assert {layer.kind for layer in _mistral(sliding_window=4096).layers} == {"swa+dense"}
    raw, _ = load_config_dict("mixtral-8x7b")
    assert {layer.attn.window for layer in load_model("mixtral-8x7b").layers} == {None}
    assert {layer.attn.window for layer in spec_from_config({**raw, "sliding_window": 64}, name="x").layers} == {64}
    # llama has no sliding window in transformers: the key is ignored; qwen's is refused, not ignored
    raw, _ = load_config_dict("llama-3-70b")
    assert {layer.attn.window for layer in spec_from_config({**raw, "sliding_window": 64}, name="x").layers} == {None}
    raw, _ = load_config_dict("qwen3-32b")
    with pytest.raises(TpplanError, match="use_sliding_window"):
        spec_from_config({**raw, "use_sliding_window": True, "sliding_window": 4096}, name="x")


def test_mistral_sliding_window_is_priced():
    """A windowed Mistral's attention FLOPs and KV cache are those of the window, not the whole context."""
    topo = load_topology("h200x8-ib400")
    full, swa = (build_model_graph(_mistral(sliding_window=w)) for w in (None, 1024))
    pf, ps = (predict_plan(g, make_plan("baseline", g, 8), topo, mesh=Mesh(8), tokens=8192) for g in (full, swa))
    flops_f = next(o.flops_per_rank for o in pf.kinds[0].ops if o.op == "attention")
    flops_s = next(o.flops_per_rank for o in ps.kinds[0].ops if o.op == "attention")
    assert flops_f / flops_s == pytest.approx((8192 * 8193 // 2) / (1024 * 1025 // 2 + (8192 - 1024) * 1024))
    assert ps.memory.kv_cache == pytest.approx(pf.memory.kv_cache * 1024 / 8192)  # one 8192-token sequence


def test_gpt_oss_numerics():
    raw, _ = load_config_dict("gpt-oss-20b")
    nu = numerics_from_config(raw)
    assert nu.rope_scaling["rope_type"] == "yarn" and nu.rope_theta == 150000 and nu.renormalize
    assert list(itertools.islice(raw["layer_types"], 2)) == ["sliding_attention", "full_attention"]


def test_gemma3_spec_reads_the_wrapped_text_config():
    spec = load_model("gemma-3-4b-it")
    assert spec.family == "gemma3" and spec.num_layers == 34 and spec.hidden == 2560
    windows = [layer.attn.window for layer in spec.layers]
    assert windows == [None if (i + 1) % 6 == 0 else 1024 for i in range(34)]
    local, glob = spec.layers[0].attn, spec.layers[5].attn
    assert local.rope_theta == 10000.0 and glob.rope_theta is None and local.scale == 256**-0.5
    assert all(layer.sandwich and layer.mlp.act == "gelu_tanh" for layer in spec.layers)
    nu = numerics_from_config(load_config_dict("gemma-3-4b-it")[0])
    assert nu.norm_offset == 1.0 and nu.embed_scale == pytest.approx(2560**0.5) and nu.tie_embeddings
    assert nu.rope_theta == 1e6 and nu.rope_scaling == {"factor": 8.0, "rope_type": "linear"}
    g = build_model_graph(spec)
    post = _op(g, "swa+dense", "post_attention_layernorm")
    assert post.inputs == ("attn_out_raw",) and post.output == "attn_out" and post.reduces_into_stream
    assert _op(g, "swa+dense", "mlp_norm").weight == "pre_feedforward_layernorm.weight"


def test_sandwich_norm_reduces_to_the_stream():
    """The block output is reduced before its sandwich norm: all-reduce under an R stream,
    reduce-scatter under S(tok), so sequence parallelism costs what it costs without sandwich norms."""
    from tpplan.audit import audit_plan

    g = build_model_graph(load_model("gemma-3-4b-it"))
    for plan, coll in (("baseline", "AR"), ("sequence-parallel", "RS")):
        res = audit_plan(g, make_plan(plan, g, 8), 8).kinds["swa+dense"].result
        assert {c.label for c in res.comms if c.value.endswith("_raw")} == {
            f"{coll} attn_out_raw[2560]",
            f"{coll} mlp_out_raw[2560]",
        }


def test_llama4_specs_follow_the_configs():
    scout, maverick = load_model("llama-4-scout-17b-16e"), load_model("llama-4-maverick-17b-128e")
    for spec in (scout, maverick):
        nope = [i for i, layer in enumerate(spec.layers) if not layer.attn.rotary_dim]
        assert nope == list(range(3, 48, 4))  # every 4th layer has no RoPE and full attention
        assert all((layer.attn.chunk is None) == (i in nope) for i, layer in enumerate(spec.layers))
        assert spec.layers[0].attn.chunk == 8192 and spec.layers[3].attn.temperature == (8192, 0.1)
    assert all(layer.mlp.kind == "moe" for layer in scout.layers) and scout.layers[0].mlp.experts == 16
    assert [layer.mlp.kind for layer in maverick.layers[:4]] == ["dense", "moe", "dense", "moe"]
    assert maverick.layers[0].mlp.intermediate == 16384 and maverick.layers[1].mlp.experts == 128
    assert scout.layers[0].attn.qk_l2norm and not maverick.layers[0].attn.qk_l2norm
    g = build_model_graph(maverick)
    assert g.counts() == {"chunked+dense": 24, "chunked+moe": 12, "nope+moe": 12}
    ex = _op(g, "chunked+moe", "experts")
    assert ex.attrs["scale_inputs"] and ex.attrs["top_k"] == 1
    assert _op(g, "chunked+moe", "shared_gate_proj").weight == "mlp.shared_expert.gate_proj.weight"
    assert _op(g, "chunked+moe", "router").attrs["scoring"] == "sigmoid"
    nu = numerics_from_config(load_config_dict("llama-4-scout-17b-16e")[0])
    assert nu.rope_interleave and not nu.renormalize and nu.rope_scaling["rope_type"] == "llama3"


def test_gpt_oss_memory_follows_its_mxfp4_quantization_config():
    """gpt-oss-120b at TP1: MXFP4 experts (4 bits + one 8-bit scale per 32 values) and bf16 for what
    `modules_to_not_convert` leaves out (attention, router, embedding, head) give the ~65 GB checkpoint."""
    g = build_model_graph(load_model("gpt-oss-120b"))
    pred = predict_plan(g, make_plan("baseline", g, 1), load_topology("h200x8-ib400"), mesh=Mesh(1), tokens=8192)
    h, layers, experts, inter = 2880, 36, 128, 2880
    expert_params = layers * experts * 3 * h * inter
    attn_params = layers * h * (64 * 64 * 2 + 2 * 8 * 64)
    router_params = layers * experts * h
    norms = (2 * layers + 1) * h
    embed_head = 2 * 201088 * h
    expected = expert_params * 4.25 / 8 + 2 * (attn_params + router_params + norms + embed_head)
    assert pred.memory.weights == pytest.approx(expected, rel=1e-3)
