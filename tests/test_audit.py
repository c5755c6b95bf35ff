"""The audit reproduces the seed memo's analysis from the graphs, and generalises it."""

import pytest

from tpplan.audit import audit, audit_plan, to_json
from tpplan.errors import TpplanError
from tpplan.models.config import list_presets, load_model
from tpplan.models.graph import build_model_graph
from tpplan.placement import Collective, ring_elements_per_rank
from tpplan.plans.named import EXTRA_PLANS, NAMED_PLANS, make_plan

ALL = list(NAMED_PLANS + EXTRA_PLANS)


@pytest.fixture(scope="module")
def k3():
    return audit("kimi-k3", 32, ALL)


def _plan(a, name):
    return next(p for p in a.plans if p.plan.name == name)


def test_seed_table_at_tp32(k3):
    units = {p.plan.name: p.kinds["mla+moe"].result.units("attn_side") for p in k3.plans}
    assert units["baseline"] == 14336  # hidden all-reduce, 2H
    assert units["input-scattered"] == 9280  # ideal DeepSeek path H + L (computed although illegal on K3)
    assert units["input-scattered+restore"] == 16448  # RS + AG hidden + AG latent
    assert units["latent-scattered"] == 16448  # the seed's prototype: AR + AG latent
    assert round(100 * (9280 - 14336) / 14336, 1) == -35.3
    assert round(100 * (16448 - 14336) / 14336, 1) == 14.7
    data = to_json(k3)
    js = {p["name"]: p["layer_kinds"]["mla+moe"] for p in data["plans"]}
    assert js["input-scattered"]["attn_input_delta_pct"] == pytest.approx(-35.27, abs=0.01)
    assert js["latent-scattered"]["attn_input_delta_pct"] == pytest.approx(14.73, abs=0.01)


def test_whole_model_effect_of_the_prototype(k3):
    """MLA is 24 of 93 layers: the prototype adds exactly 24 latent all-gathers to the whole model."""
    base, proto = _plan(k3, "baseline"), _plan(k3, "latent-scattered")
    extra = 24 * ring_elements_per_rank(Collective.ALL_GATHER, 2112, 32) * 2
    assert proto.comm_bytes_per_token - base.comm_bytes_per_token == pytest.approx(extra)
    # MoE boundaries count: K3's latent MoE all-reduces its 3584-wide latent in every MoE layer.
    moe = base.kinds["mla+moe"].result
    assert [c.width for c in moe.comms if c.region == "mlp_side"] == [7168, 3584]
    assert base.collective_counts() == {"all_reduce": 93 + 93 + 92}
    assert 0 < (proto.comm_bytes_per_token / base.comm_bytes_per_token - 1) < 0.02


def test_input_scattered_on_k3_is_illegal_for_the_right_reasons(k3):
    pa = _plan(k3, "input-scattered")
    assert not pa.legal
    roots = {(v.op, v.value) for v in pa.violations if not v.consequence_of}
    assert ("g_proj", "x") in roots  # the MLA output gate reads the full hidden
    mla = pa.kinds["mla+moe"].result
    gate = next(v for v in mla.violations if v.op == "g_proj")
    assert str(gate.got) == "S(tok)" and str(gate.needs) == "R"
    assert "column-parallel" in gate.reason and any("all-gather `x`" in f for f in gate.fixes)
    assert any("replicate g_proj" in f and "all-to-all" in f for f in gate.fixes)
    kda = pa.kinds["kda+moe"].result
    kda_ops = {v.op for v in kda.violations}
    assert {"q_proj", "k_proj", "v_proj", "q_conv1d", "kda"} <= kda_ops
    conv = next(v for v in kda.violations if v.op == "q_conv1d")
    assert "neighbouring tokens" in conv.reason and conv.consequence_of == "q_proj"
    # the per-layer verdicts: no K3 layer kind is legal under SGLang's rewrite
    assert not any(ks.legal for ks in pa.kinds.values())


def test_deepseek_keeps_the_win():
    a = audit("deepseek-v3", 32, ["input-scattered"])
    pa = _plan(a, "input-scattered")
    assert pa.legal
    assert pa.kinds["mla+moe"].result.units("attn_side") == 9280
    assert pa.comm_bytes_per_token < _plan(a, "baseline").comm_bytes_per_token


def test_gate_aware_is_found_and_priced(k3):
    pa = _plan(k3, "gate-aware")
    assert pa.legal
    assert "*/mla.g_proj" not in pa.plan.replicate  # found per layer kind by the repair, not hand-written
    assert any(p.endswith("mla.g_proj") for p in pa.plan.replicate)
    assert pa.kinds["mla+moe"].result.units("attn_side") == 7168 + 2112 + 12288 / 32
    assert pa.replicated_extra_bytes > 40 * 2**30  # the memory price of replicating K3's projections
    assert pa.comm_bytes_per_token < _plan(k3, "baseline").comm_bytes_per_token


def test_kimi_linear_mla_without_q_lora():
    pa = _plan(audit("kimi-linear-48b", 32, ["input-scattered"]), "input-scattered")
    mla = pa.kinds["mla+moe"].result
    v = next(v for v in mla.violations if v.op == "q_proj")
    assert v.value == "x" and not v.consequence_of


def test_qwen3_next_gated_attention_and_gdn():
    pa = _plan(audit("qwen3-next-80b", 8, ["input-scattered"]), "input-scattered")
    assert {v.op for v in pa.kinds["gqa+moe"].result.violations} >= {"q_proj"}
    assert {v.op for v in pa.kinds["gdn+moe"].result.violations} >= {"in_proj_qkvz", "gated_deltanet"}


@pytest.mark.parametrize("preset", [p for p in list_presets() if p.startswith("tiny-")])
@pytest.mark.parametrize("plan", ALL)
def test_every_family_and_plan_audits(preset, plan):
    graph = build_model_graph(load_model(preset))
    pa = audit_plan(graph, make_plan(plan, graph, 2), 2)
    if plan in ("baseline", "sequence-parallel", "latent-scattered", "gate-aware", "input-scattered+restore"):
        assert pa.legal, [v.sentence() for v in pa.violations]
    assert pa.comm_bytes_per_token > 0
    # one reduction at least per block output (an illegal folded add never reaches its all-reduce: its
    # block output, downstream of the illegal edge, is not a partial sum)
    if pa.legal or not make_plan(plan, graph, 2).fold:
        assert sum(pa.collective_counts().values()) >= graph.spec.num_layers


def test_tp1_moves_nothing():
    pa = _plan(audit("kimi-k3", 1, ["baseline"]), "baseline")
    assert pa.comm_bytes_per_token == 0


def test_json_is_stable(k3):
    data = to_json(k3)
    assert data["schema_version"] == 3 and data["tp"] == 32
    assert data["topology"] is None and all("prediction" not in p for p in data["plans"])
    for p in data["plans"]:
        assert {"name", "legal", "layer_kinds", "comm_bytes_per_token_per_rank", "reasons"} <= set(p)
        for info in p["layer_kinds"].values():
            assert {"legal", "reasons", "attn_input_units"} <= set(info)


def test_sp_moe_and_ep_families(k3):
    graph = k3.graph
    sp, old = make_plan("sp-moe", graph, 32), make_plan("moe-a2a", graph, 32)
    assert sp.describe() == old.describe() and sp.moe == "a2a"  # moe-a2a already was SGLang's SP-MoE
    assert old.name == "sp-moe"  # the alias is accepted but the plan has one printed name
    pa = audit_plan(graph, sp, 32)
    assert pa.legal
    moe = pa.kinds["mla+moe"].result
    kinds = [(c.collective.value, c.value) for c in moe.comms]
    assert kinds[:2] == [("all_gather", "x"), ("reduce_scatter", "attn_out")]  # AG before attention, RS after o_proj
    assert sum(c.internal for c in moe.comms) == 2  # dispatch + combine
    ep = audit_plan(graph, make_plan("ep4", graph, 32), 32)
    assert ep.legal and ep.plan.ep_size == 4 and ep.plan.describe()["moe"] == "ep4"
    assert ep.comm_bytes_per_token == _plan(k3, "baseline").comm_bytes_per_token  # EP without all-to-all
    sp_ep = make_plan("sequence-parallel+ep4", graph, 32)
    assert sp_ep.name == "sequence-parallel+ep4" and sp_ep.stream == make_plan("sequence-parallel", graph, 32).stream
    with pytest.raises(TpplanError, match="already uses MoE mode"):
        make_plan("sp-moe+ep4", graph, 32)
    with pytest.raises(TpplanError, match="EP size 3"):
        audit_plan(graph, make_plan("ep3", graph, 32), 32)


def test_json_with_predictions(k3):
    from tpplan.cost.predict import predict_audit
    from tpplan.cost.topology import load_topology
    from tpplan.cost.workload import load_workload

    small = audit(k3.graph, 32, ["gate-aware"])
    preds = predict_audit(small, load_topology("h200x8-ib400"), workload=load_workload("seed-c8"))
    data = to_json(small, preds)
    assert data["topology"] == "h200x8-ib400" and data["workload"] == "prompt16k-c8" and data["pp"] == 1
    for p in data["plans"]:
        pr = p["prediction"]
        assert pr["forward_s"] > 0 and set(pr["layer_kinds"]) == set(p["layer_kinds"])
        mem = pr["memory_bytes_per_rank"]
        assert mem["replicated_extra"] == p["replicated_extra_bytes_per_rank"]
        assert {"mean_s", "p50_s", "max_s", "throughput_tok_s"} <= set(pr["ttft"])


def test_gated_attention_beside_a_dense_mlp_keeps_its_gate():
    """The output gate and a dense MLP's gate_proj once shared the value name `gate`, so the
    all-to-all of the attention gate was looked up on the MLP's producer and gate-aware was illegal."""
    from tpplan.models.config import load_config_dict, spec_from_config

    raw, _ = load_config_dict("tiny-qwen3-next")
    graph = build_model_graph(spec_from_config({**raw, "mlp_only_layers": [3]}))
    assert "gqa+dense" in graph.kinds
    pa = audit_plan(graph, make_plan("gate-aware", graph, 2), 2)
    assert pa.legal, [v.sentence() for v in pa.violations]
    with pytest.raises(ValueError, match="already produced"):
        from tpplan.models.graph import Builder, OpKind

        b = Builder("x", 8)
        b.value("y", 8)
        b.op("twice", OpKind.UNARY, ("y",), "y", 8)
