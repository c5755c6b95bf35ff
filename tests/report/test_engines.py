"""Engine flags per plan and the engines' static conditions (sources in tpplan/report/engines/__init__.py)."""

from __future__ import annotations

from tpplan.models.config import load_model
from tpplan.models.graph import build_model_graph
from tpplan.plans.named import make_plan
from tpplan.report.engines import family, recipes, sglang_recipe, vllm_recipe


def _setup(model: str, tp: int, plan: str):
    graph = build_model_graph(load_model(model))
    return make_plan(plan, graph, tp), graph.spec


def test_k3_input_scattered_passes_the_gate_but_regathers_the_hidden():
    plan, spec = _setup("kimi-k3", 32, "input-scattered")
    r = sglang_recipe(plan, spec, tp=32, nodes=4)
    assert "--enable-attn-tp-input-scattered" in r.args and "--moe-a2a-backend none" in r.args
    assert not r.blocked and r.realises == "partly"
    assert any("fetch_hidden_states" in n and "input-scattered+restore" in n for n in r.notes)
    assert "--nnodes 4" in r.command()


def test_input_scattered_without_q_lora_is_silently_skipped():
    plan, spec = _setup("kimi-linear-48b", 4, "input-scattered")
    r = sglang_recipe(plan, spec, tp=4)
    failed = [c for c in r.conditions if c.met is False]
    assert r.blocked and failed[0].effect == "skips silently" and "q_lora_rank" in failed[0].text


def test_deepseek_input_scattered_is_fully_realised():
    plan, spec = _setup("deepseek-v3", 8, "input-scattered")
    r = sglang_recipe(plan, spec, tp=8)
    assert r.realises == "yes" and not r.blocked and not r.notes


def test_moe_a2a_flags_and_ep_adjustment():
    plan, spec = _setup("kimi-k3", 32, "sp-moe")
    sgl, vl = recipes(plan, spec, tp=32, nodes=4)
    assert "--moe-a2a-backend deepep" in sgl.args
    assert any("ep_size is forced to tp_size" in c.text and c.effect == "adjusts" for c in sgl.conditions)
    assert any("input-scattered attention is off" in n for n in sgl.notes)
    assert "--enable-expert-parallel" in vl.args and "--all2all-backend deepep_high_throughput" in vl.args


def test_ep_without_a2a_and_pipeline():
    plan, spec = _setup("kimi-k3", 32, "baseline")
    ep4 = plan.with_(name="ep4", moe="ep", ep_size=4)
    s = sglang_recipe(ep4, spec, tp=32)
    assert "--ep-size 4" in s.args and "--moe-a2a-backend none" in s.args
    v = vllm_recipe(ep4, spec, tp=32)
    assert v.realises == "partly"  # vLLM's EP size is TP x DP
    pp = sglang_recipe(plan, spec, tp=8, pp=4, nodes=4)
    assert "--tp-size 8" in pp.args and "--pp-size 4" in pp.args
    assert "--pipeline-parallel-size 4" in vllm_recipe(plan, spec, tp=8, pp=4).args


def test_plans_no_engine_ships():
    for name in ("gate-aware", "latent-scattered"):
        plan, spec = _setup("kimi-k3", 32, name)
        sgl, vl = recipes(plan, spec, tp=32)
        assert sgl.realises == "no" and vl.realises == "no" and sgl.command() == ""


def test_layernorm_sp_allowlist():
    plan, spec = _setup("kimi-k3", 32, "sequence-parallel")
    r = sglang_recipe(plan, spec, tp=32)
    assert r.blocked and "--enable-layernorm-sp" in r.args
    assert '"enable_sp": true' in " ".join(vllm_recipe(plan, spec, tp=32).args)


def test_found_plans_that_replicate_attention_projections_need_code():
    plan, spec = _setup("kimi-k3", 32, "sp-moe")
    found = plan.with_(name="search-1", found_by="search", a2a=frozenset({"mla+moe/mla.g_proj"}))
    assert sglang_recipe(found, spec, tp=32).realises == "no"
    only_moe = plan.with_(name="search-2", found_by="search")
    assert "--moe-a2a-backend deepep" in sglang_recipe(only_moe, spec, tp=32).args


def test_vllm_sequence_parallel_thresholds_by_gpu_generation():
    """vLLM applies SP only on sm90/sm100 GPUs, for hidden >= 8192 and batches above its token threshold."""
    plan, spec = _setup("llama-3-70b", 8, "sequence-parallel")  # hidden 8192
    h200 = vllm_recipe(plan, spec, tp=8, chunk=8192, gpu="NVIDIA H200")
    assert h200.realises == "partly" and not any(c.met is False for c in h200.conditions)
    assert any("batches of at least 4,096 tokens" in c.text for c in h200.conditions)  # 8 MiB x 8 / (8192 x 2)
    small = vllm_recipe(plan, spec, tp=8, chunk=2048, gpu="NVIDIA H200")
    assert small.realises == "no" and any("does not" in c.text for c in small.conditions if c.met is False)
    pcie = vllm_recipe(plan, spec, tp=8, gpu="NVIDIA RTX PRO 6000 Blackwell")
    assert pcie.realises == "no" and any("sm120" in c.text for c in pcie.conditions if c.met is False)
    plan_k3, spec_k3 = _setup("kimi-k3", 32, "sequence-parallel")  # hidden 7168 < 8192
    assert vllm_recipe(plan_k3, spec_k3, tp=32, gpu="NVIDIA H200").realises == "no"


def test_a2a_plan_with_input_scattered_attention_is_not_sglang_sp_moe():
    """MoE all-to-all beside a scattered attention input is no SGLang path (the a2a backend turns
    input-scattered off): such a plan needs code, whatever it is called."""
    plan, spec = _setup("deepseek-v3", 8, "sp-moe")
    mixed = plan.with_(gather=frozenset({"mla+moe/mla.qkv_a"}))
    assert family(mixed) == "custom" and sglang_recipe(mixed, spec, tp=8).realises == "no"
    exact = plan.with_(
        name="x", gather=frozenset({"mla+moe/layer.attn_in"}), replicate=frozenset({"mla+moe/moe.router"})
    )
    assert family(exact) == "sp-moe"  # exact roles inside SP-MoE's patterns: the same engine path


def test_prefill_cp_skips_input_scattered_and_k3_refuses_it():
    """construction.py builds no input-scattered steps under prefill CP; Kimi-K3's linear-attention
    prefill CP hook rejects the flag outright. Without CP the same gate passes."""
    plan, spec = _setup("kimi-k3", 8, "input-scattered")
    assert not sglang_recipe(plan, spec, tp=8).blocked
    r = sglang_recipe(plan, spec, tp=8, cp=2)
    failed = {c.effect for c in r.conditions if c.met is False}
    assert r.blocked and failed == {"skips silently", "refuses"}
    assert "--enable-prefill-cp" in r.args
    ds_plan, ds = _setup("deepseek-v3", 8, "input-scattered")
    d = sglang_recipe(ds_plan, ds, tp=8, cp=2)
    assert d.blocked and {c.effect for c in d.conditions if c.met is False} == {"skips silently"}


def test_k3_sp_collective_falls_back_to_nccl_outside_sm103_tp4_tp8():
    plan, spec = _setup("kimi-k3", 8, "sp-moe")
    ok = sglang_recipe(plan, spec, tp=8, gpu="NVIDIA B300 SXM6")
    k3 = [c for c in ok.conditions if "K3's fused SP" in c.text]
    assert k3 and all(c.met is not False for c in k3) and not any("NCCL here" in n for n in ok.notes)
    h200 = sglang_recipe(plan, spec, tp=8, gpu="NVIDIA H200")
    failed = [c for c in h200.conditions if c.met is False]
    assert [c.effect for c in failed] == ["falls back"] and "SM103" in failed[0].text
    assert h200.realises == "yes" and not h200.blocked and "NCCL" in h200.summary
    plan32, _ = _setup("kimi-k3", 32, "sp-moe")
    tp32 = sglang_recipe(plan32, spec, tp=32, nodes=4, gpu="NVIDIA GB300")
    assert [c.text for c in tp32.conditions if c.met is False] == [
        "K3's fused SP collectives cover attention-TP groups of 4 or 8 ranks (here 32)"
    ]
    ds_plan, ds = _setup("deepseek-v3", 8, "sp-moe")
    assert not any("K3's fused SP" in c.text for c in sglang_recipe(ds_plan, ds, tp=8, gpu="B300").conditions)


def test_vllm_sequence_parallel_moe_needs_data_parallel():
    plan, spec = _setup("deepseek-v3", 8, "sp-moe")
    dp1 = vllm_recipe(plan, spec, tp=8)
    failed = [c for c in dp1.conditions if c.met is False]
    assert dp1.blocked and len(failed) == 1 and "data-parallel size > 1" in failed[0].text
    assert "replicated batch" in dp1.summary
    dp2 = vllm_recipe(plan, spec, tp=4, dp=2)
    assert not dp2.blocked and "--data-parallel-size 2" in dp2.args
    assert dp2.realises == "partly" and "all-reduced" in dp2.summary  # AR then chunk, not the plan's RS
    tp1 = vllm_recipe(plan, spec, tp=1, dp=8)
    assert [c.text for c in tp1.conditions if c.met is False] == ["tensor-parallel size > 1 (here 1)"]


def test_report_passes_prefill_cp_and_dp_to_the_gates():
    """`tpplan report --prefill-cp/--dp` reach the engines' gates: the memo names the refusal only
    when the server setting triggers it, and a blocked flag keeps the model's own dataflow verdict."""
    from tpplan.cost.topology import load_topology
    from tpplan.report.analysis import analyse

    topo = load_topology("h200x8-ib400", nodes=1)
    plain = analyse("tiny-kimi-k3", topo, [], tp=2, plans=["input-scattered+restore", "sp-moe"], search_top=0)
    cp = analyse("tiny-kimi-k3", topo, [], tp=2, plans=["input-scattered+restore", "sp-moe"], search_top=0,
                 prefill_cp=2, dp=2)  # fmt: skip

    def sgl(a, name):
        v = next(v for v in a.variants if v.plan.name == name and v.pp == 1)
        return next(r for r in v.engines if r.engine == "SGLang"), next(r for r in v.engines if r.engine == "vLLM")

    (s0, _), (s1, _) = sgl(plain, "input-scattered+restore"), sgl(cp, "input-scattered+restore")
    assert not s0.blocked and s1.blocked and s0.realises == s1.realises == "yes"
    assert "--enable-prefill-cp" in " ".join(s1.args) and "--enable-prefill-cp" not in " ".join(s0.args)
    (_, v0), (_, v1) = sgl(plain, "sp-moe"), sgl(cp, "sp-moe")
    assert "--data-parallel-size 2" in " ".join(v1.args) and "--data-parallel-size" not in " ".join(v0.args)
