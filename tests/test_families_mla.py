"""deepseek_v32 / glm_moe_dsa, minimax_m2 and glm4_moe in the planner: published shapes, and the
legality and collectives the algebra derives from what their new ops read (torch-free)."""

from __future__ import annotations

import pytest

from tpplan.audit import audit
from tpplan.cost.predict import predict_plan
from tpplan.cost.topology import load_topology
from tpplan.errors import TpplanError
from tpplan.mesh import Mesh
from tpplan.models.config import load_config_dict, load_model, spec_from_config
from tpplan.models.graph import OpKind, WeightSplit, build_model_graph
from tpplan.placement import Collective
from tpplan.plans.named import make_plan
from tpplan.report.memo_ask import MemoAsk
from tpplan.search.grid import MeshAsk


def _op(graph, kind, name):
    return next(o for o in graph.kinds[kind].ops if o.name == name)


def _comms(result, kind):
    return [(c.collective, c.value, c.width) for c in result.kinds[kind].result.comms if not c.internal]


def test_published_shapes():
    ds = build_model_graph(load_model("deepseek-v3.2"))
    assert ds.counts() == {"dsa+dense": 3, "dsa+moe": 58}
    assert _op(ds, "dsa+moe", "idx_wq_b").weight_shape == (64 * 128, 1536)
    assert _op(ds, "dsa+moe", "idx_wk").weight_shape == (128, 7168)
    assert _op(ds, "dsa+moe", "idx_weights_proj").weight_shape == (64, 7168)
    assert all(_op(ds, "dsa+moe", n).split is WeightSplit.REPLICATED for n in ("idx_wq_b", "idx_wk"))
    assert _op(ds, "dsa+moe", "attention").inputs[-1] == "topk"
    assert _op(ds, "dsa+moe", "indexer").attrs["interleave"] is False
    glm5 = build_model_graph(load_model("glm-5.1"))
    assert _op(glm5, "dsa+moe", "indexer").attrs["interleave"] is True
    assert _op(glm5, "dsa+moe", "q_b_proj").weight_shape == (64 * 256, 2048)
    mm = build_model_graph(load_model("minimax-m2.7"))
    assert mm.counts() == {"gqa_wide_norm+moe": 62}
    assert _op(mm, "gqa_wide_norm+moe", "q_norm").weight_shape == (48 * 128,)
    assert _op(mm, "gqa_wide_norm+moe", "k_norm").weight_shape == (8 * 128,)
    assert _op(mm, "gqa_wide_norm+moe", "attention").attrs["rotary_dim"] == 64
    assert _op(mm, "gqa_wide_norm+moe", "experts").attrs["experts"] == 256
    air = build_model_graph(load_model("glm-4.5-air"))
    assert air.counts() == {"gqa_qkv_bias+dense": 1, "gqa_qkv_bias+moe": 45}  # MTP layer not planned
    q = _op(air, "gqa_qkv_bias+moe", "q_proj")
    assert q.weight_shape == (96 * 128, 4096) and q.attrs["bias"]
    assert _op(air, "gqa_qkv_bias+moe", "attention").attrs["rotary_dim"] == 64
    assert _op(air, "gqa_qkv_bias+moe", "shared_down_proj").weight_shape == (4096, 1408)


def test_what_is_not_modelled_is_said():
    from tpplan.audit import to_json

    assert any("MTP layer" in n for n in load_model("glm-4.5-air").notes)
    assert any("MTP module" in n for n in load_model("minimax-m2.7").notes)
    ds = load_model("deepseek-v3.2").notes
    assert any("index_topk=2048" in n for n in ds) and any("MTP layer" in n for n in ds)
    assert to_json(audit("glm-4.5-air", 8, ["baseline"]))["not_modelled"] == list(load_model("glm-4.5-air").notes)
    assert "not_modelled" not in to_json(audit("deepseek-v3", 8, ["baseline"]))  # other families: unchanged JSON


def test_dsa_indexer_decides_input_scattered():
    """The indexer reads wk(x) and weights_proj(x) of every token: with the hidden token-sharded
    (input-scattered) they arrive token-sharded, which is illegal; gate-aware gathers exactly those
    two small values (not the hidden), and baseline adds no collective for the indexer."""
    res = audit("deepseek-v3.2", 8, ["baseline", "input-scattered", "gate-aware"])
    by = {pa.plan.name: pa for pa in res.plans}
    bad = by["input-scattered"]
    assert not bad.legal
    first = {(v.op, v.value) for v in bad.violations if not v.consequence_of}
    assert first == {("indexer", "idx_k"), ("indexer", "idx_w")}
    ga = by["gate-aware"]
    gathers = {(v, w) for c, v, w in _comms(ga, "dsa+moe") if c is Collective.ALL_GATHER}
    assert {("idx_k", 128), ("idx_w", 64)} <= gathers and ("x", 7168) not in gathers
    v3 = audit("deepseek-v3", 8, ["baseline"]).plans[0]
    assert _comms(by["baseline"], "dsa+moe") == _comms(v3, "mla+moe")


def test_minimax_qk_norm_is_an_all_reduce_the_algebra_prices():
    """The whole-row q/k norm under a head split reduces a [T, 2] statistic over ranks: one
    all-reduce per layer wherever q/k are head-sharded (also under sp-moe, whose reduce target is
    token-sharded), none where the plan norms local tokens before moving to heads (gate-aware)."""
    res = audit("minimax-m2.7", 8, ["baseline", "sp-moe", "gate-aware"])
    by = {pa.plan.name: pa for pa in res.plans}
    kind = "gqa_wide_norm+moe"
    for name in ("baseline", "sp-moe"):
        assert (Collective.ALL_REDUCE, "qk_ms", 2) in _comms(by[name], kind), name
    assert not [c for c in _comms(by["gate-aware"], kind) if c[1] == "qk_ms"]
    graph = res.graph
    pred = predict_plan(
        graph, make_plan("baseline", graph, 8), load_topology("h200x8-ib400"), mesh=Mesh(8), tokens=8192
    )
    stat = [c for k in pred.kinds for c in k.collectives if "qk_ms" in c.label]
    assert stat and all(c.seconds > 0 and c.nbytes == pytest.approx(8192 * 2 * 2) for c in stat)


def test_config_errors_name_the_field():
    raw = load_config_dict("glm-5.1")[0]
    with pytest.raises(TpplanError, match="indexer_types"):
        spec_from_config({**raw, "indexer_types": ["full", "shared"] * 39})
    mm = load_config_dict("minimax-m2.7")[0]
    with pytest.raises(TpplanError, match="attn_type_list"):
        spec_from_config({**mm, "attn_type_list": [0] + [1] * 61})
    spec = spec_from_config({**mm, "rotary_dim": None, "partial_rotary_factor": 0.25})
    assert spec.layers[0].attn.rotary_dim == 32
    assert all(op.kind is not OpKind.MEAN_SQ for op in build_model_graph(
        spec_from_config({**mm, "use_qk_norm": False})).kinds["gqa_wide_norm+moe"].ops)  # fmt: skip


def test_memo_says_why_the_indexer_breaks_input_scattered():
    """The memo names the indexer and the two values it needs whole, not a column-parallel projection."""
    from tpplan.cost.workload import load_workload
    from tpplan.report.analysis import analyse
    from tpplan.report.memo import build_memo

    topo = load_topology("h200x8-ib400", nodes=1)
    a = analyse(
        "tiny-deepseek-v32",
        topo,
        [load_workload("seed-c8")],
        MemoAsk(deployment=MeshAsk(tp=2), search_top=0),
        use_default_predictor=False,
    )
    md = build_memo(a).markdown
    assert "The edges that break it: indexer (dsa+dense, dsa+moe)." in md
    assert "Each needs every token of its input (`idx_k`, `idx_w`)" in md
    assert "column-parallel projection that needs" not in md
