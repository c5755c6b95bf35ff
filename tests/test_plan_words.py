"""A plan's words come from what the model has (issue 33): a dense model's plans never speak of MoE
experts, and only a model with K3's attention residuals hears of their aggregation."""

from __future__ import annotations

from tpplan.models.config import load_model
from tpplan.models.graph import build_model_graph
from tpplan.plans.named import make_plan
from tpplan.search import MeshAsk, search_plans


def _graph(name: str):
    return build_model_graph(load_model(name))


def test_a_dense_models_found_plans_do_not_speak_of_moe():
    outcome = search_plans(_graph("tiny-llama"), None, ask=MeshAsk(tp=2), top=5, objective="volume")
    found = [r.plan for r in outcome.ranked]
    assert found and not [p for p in found if "MoE" in p.summary + p.title or "expert" in p.summary], found
    moe = search_plans(_graph("tiny-qwen3-moe"), None, ask=MeshAsk(tp=2), top=5, objective="volume")
    assert any("MoE experts" in r.plan.summary for r in moe.ranked)


def test_named_plans_name_only_the_blocks_the_model_has():
    assert "after the MLP;" in make_plan("baseline", _graph("tiny-llama"), 2).summary
    assert "after the MoE;" in make_plan("baseline", _graph("tiny-mixtral"), 2).summary
    assert "after the MLP/MoE;" in make_plan("baseline", _graph("tiny-deepseek-v3"), 2).summary


def test_k3_only_steps_only_in_k3_words():
    k3 = make_plan("sglang-sp-moe", _graph("tiny-kimi-k3"), 2)
    ds = make_plan("sglang-sp-moe", _graph("tiny-deepseek-v3"), 2)
    assert "attention-residual aggregation" in k3.summary
    assert "aggregation" not in ds.summary and "bank" not in ds.title
    assert k3.describe() == ds.describe()  # the same decisions, in other words


def test_a_pp_stage_boundary_speaks_of_k3s_bank_only_for_k3():
    from tpplan.engines import select

    for key in ("sglang@0.5.23", "vllm@0.33.0"):
        p = select(key).pipeline
        k3, llama = p.boundary_for("kimi_k3"), p.boundary_for("llama")
        assert "bank" not in llama and "bank" in k3 and k3.startswith(llama), key
        assert p.boundary_for() == p.boundary_for("kimi_k3")  # docs/engines.md lists every model's


def test_a_dense_memo_never_speaks_of_k3_steps_or_moe_experts():
    from tpplan.cost.predict import predict_plan
    from tpplan.cost.topology import load_topology
    from tpplan.cost.workload import load_workload
    from tpplan.report.analysis import analyse
    from tpplan.report.memo import build_memo

    a = analyse("tiny-llama", load_topology("h200x2"), [load_workload("prompt16k-c8")], predictor=predict_plan)
    md = build_memo(a).markdown
    assert "stage boundary" in md  # the memo has a PP deployment, so the engines' PP boundary is printed
    for words in ("attention-residual", "attn_res_bank", "MoE experts"):
        assert words not in md, words
