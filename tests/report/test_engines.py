"""Engine flags per plan, judged against the versioned engine data (tpplan/engines, docs/engines.md)."""

from __future__ import annotations

from tpplan.engines import Launch, select
from tpplan.engines.recipes import family, recipes, sglang_recipe, vllm_recipe
from tpplan.mesh import Mesh
from tpplan.models.config import load_model
from tpplan.models.graph import build_model_graph
from tpplan.plans.named import make_plan


def _setup(model: str, tp: int, plan: str):
    graph = build_model_graph(load_model(model))
    return make_plan(plan, graph, tp), graph.spec


def _failed(r):
    return [c for c in r.conditions if c.met is False]


def test_k3_input_scattered_does_nothing_and_says_so_with_its_source():
    """kimi_k3.py never enters maybe_input_scattered: whatever input-scattered plan tpplan names, the
    SGLang flag runs the all-reduce baseline on K3, and the recipe says so before anything else."""
    for name in ("sglang-input-scattered", "input-scattered", "input-scattered+restore"):
        plan, spec = _setup("kimi-k3", 32, name)
        r = sglang_recipe(plan, spec, mesh=Mesh(32), nodes=4)
        assert r.realises == "no" and "does nothing on kimi_k3" in r.summary
        assert "does not wire --enable-attn-tp-input-scattered for kimi_k3" in r.path
        assert "kimi_k3.py" in r.path and "0.5.23" in r.path


def test_deepseek_v3_runs_sglang_input_scattered_not_tpplans():
    plan, spec = _setup("deepseek-v3", 8, "sglang-input-scattered")
    r = sglang_recipe(plan, spec, mesh=Mesh(8))
    assert r.realises == "yes" and not r.blocked
    assert "--enable-attn-tp-input-scattered" in r.args and "--moe-a2a-backend none" in r.args
    assert "AR(hidden)" in r.summary and "wires --enable-attn-tp-input-scattered for deepseek_v3" in r.path
    mine, _ = _setup("deepseek-v3", 8, "input-scattered")
    m = sglang_recipe(mine, spec, mesh=Mesh(8))
    assert m.realises == "no" and "runs `sglang-input-scattered`" in m.summary


def test_input_scattered_gates_decided_from_the_deployment():
    plan, spec = _setup("deepseek-v3", 8, "sglang-input-scattered")
    cp = sglang_recipe(plan, spec, mesh=Mesh(8, cp=2))
    assert (
        cp.blocked and [c.effect for c in _failed(cp)] == ["runs baseline"] and "prefill context" in _failed(cp)[0].text
    )
    odd = sglang_recipe(plan, spec, mesh=Mesh(8), chunk=8190)  # SGLang pads the batch to a multiple of TP
    assert not odd.blocked and any("8192 rows" in c.text and c.met for c in odd.conditions)
    dsa_plan, dsa = _setup("deepseek-v3.2", 8, "sglang-input-scattered")
    r = sglang_recipe(dsa_plan, dsa, mesh=Mesh(8))
    assert r.blocked and any("DSA" in c.text for c in _failed(r))  # not "no q_lora_rank"
    assert not any("q_lora" in c.text for c in _failed(r))


def test_sp_moe_flags_derivations_and_k3_variants():
    plan, spec = _setup("kimi-k3", 32, "sp-moe")
    sgl, vl = recipes(plan, Launch(spec, Mesh(32), nodes=4, gpu="NVIDIA H200"))
    assert "--moe-a2a-backend deepep" in sgl.args
    assert any("_a2a_ep_size" in c.source and c.effect == "adjusts" for c in sgl.conditions)
    # On H200 the fused SP collectives are off, so tpplan's norm-on-shard sp-moe is not what SGLang runs.
    assert sgl.realises == "partly" and "default path" in sgl.summary and not sgl.env
    tp8, _ = _setup("kimi-k3", 8, "sp-moe")
    on = sglang_recipe(tp8, spec, mesh=Mesh(8), gpu="NVIDIA GB300", chunk=4096)  # GB300 TP8 ships a tuning table
    assert on.env == ("SGLANG_K3_SP_ATTN_RES=1",) and on.command().startswith("SGLANG_K3_SP_ATTN_RES=1 python")
    hgx = sglang_recipe(tp8, spec, mesh=Mesh(8), gpu="NVIDIA B300 SXM6", chunk=4096)  # no table for HGX B300: NCCL
    assert not hgx.env and "default path" in hgx.summary
    assert "--enable-expert-parallel" in vl.args and "--all2all-backend deepep_high_throughput" in vl.args


def test_ep_without_a2a_and_pipeline():
    plan, spec = _setup("kimi-k3", 32, "baseline")
    ep4 = plan.with_(name="ep4", moe="ep", ep_size=4)
    s = sglang_recipe(ep4, spec, mesh=Mesh(32))
    assert "--ep-size 4" in s.args and "--moe-a2a-backend none" in s.args
    v = vllm_recipe(ep4, Launch(spec, Mesh(32)))
    assert v.realises == "partly"  # vLLM's EP size is TP x DP
    pp = sglang_recipe(plan, spec, mesh=Mesh(8, pp=4), nodes=4)
    assert "--tp-size 8" in pp.args and "--pp-size 4" in pp.args
    assert "--pipeline-parallel-size 4" in vllm_recipe(plan, Launch(spec, Mesh(8, pp=4))).args


def test_plans_no_engine_ships():
    for name in ("gate-aware", "latent-scattered"):
        plan, spec = _setup("kimi-k3", 32, name)
        assert all(r.realises == "no" for r in recipes(plan, Launch(spec, Mesh(32))))


def test_layernorm_sp_allowlist_refuses_other_architectures():
    plan, spec = _setup("qwen3-32b", 8, "sequence-parallel")
    assert sglang_recipe(plan, spec, mesh=Mesh(8)).realises == "yes"
    plan, spec = _setup("llama-3-70b", 8, "sequence-parallel")
    r = sglang_recipe(plan, spec, mesh=Mesh(8))
    assert r.realises == "no" and r.blocked and "refuses to start" in r.path
    pp = sglang_recipe(plan, load_model("qwen3-32b"), mesh=Mesh(8, pp=2))
    assert any(c.effect == "refuses" and "pipeline" in c.text for c in _failed(pp))


def test_vllm_sequence_parallel_pass_by_version():
    """0.33.0 has no pass (its config refuses enable_sp); the older revision gates it by GPU, hidden
    size and tokens per batch, with the sp_min_token_num override and the warning named."""
    plan, spec = _setup("llama-3-70b", 8, "sequence-parallel")
    now = vllm_recipe(plan, Launch(spec, Mesh(8), gpu="NVIDIA H200"))
    assert now.realises == "no" and "no sequence-parallelism compile pass" in now.summary
    old = select("vllm@main@000fc94b")
    h200 = vllm_recipe(plan, Launch(spec, Mesh(8), gpu="NVIDIA H200", chunk=8192), engine=old)
    assert h200.realises == "yes" and any("sp_min_token_num" in c.text for c in h200.conditions)
    small = vllm_recipe(plan, Launch(spec, Mesh(8), gpu="NVIDIA H200", chunk=2048), engine=old)
    assert small.realises == "no" and any("does not reach" in c.text for c in _failed(small))
    rtx = vllm_recipe(plan, Launch(spec, Mesh(8), gpu="NVIDIA RTX PRO 6000"), engine=old)
    assert rtx.realises == "no" and any("no threshold for sm120" in c.text for c in _failed(rtx))
    qwen, q = _setup("qwen3-32b", 8, "sequence-parallel")
    warn = vllm_recipe(qwen, Launch(q, Mesh(8), gpu="NVIDIA H200"), engine=old)
    assert any("hidden_size too small" in c.text for c in warn.conditions) and warn.realises == "no"


def test_found_plans_that_replicate_attention_projections_need_code():
    plan, spec = _setup("kimi-k3", 8, "gate-aware")
    r = sglang_recipe(plan, spec, mesh=Mesh(8))
    assert r.realises == "no" and "needs code" in r.summary


def test_a2a_plan_with_input_scattered_attention_is_not_sglang_sp_moe():
    plan, spec = _setup("deepseek-v3", 8, "sp-moe")
    mixed = plan.with_(gather=frozenset({"mla+moe/mla.qkv_a"}))
    assert family(mixed) == "custom" and sglang_recipe(mixed, spec, mesh=Mesh(8)).realises == "no"
    exact = plan.with_(
        name="x", gather=frozenset({"mla+moe/layer.attn_in"}), replicate=frozenset({"mla+moe/moe.router"})
    )
    assert family(exact) == "sp-moe"


def test_vllm_moe_sp_needs_dp_tp_and_pp_1():
    plan, spec = _setup("deepseek-v3", 8, "sp-moe")
    dp1 = vllm_recipe(plan, Launch(spec, Mesh(8)))
    assert dp1.blocked and ["data-parallel size > 1" in c.text for c in _failed(dp1)] == [True]
    dp2 = vllm_recipe(plan, Launch(spec, Mesh(4), dp=2))
    assert not dp2.blocked and "--data-parallel-size 2" in dp2.args and dp2.realises == "partly"
    assert any("dense layers" in n for n in dp2.notes)  # where tpplan's sp-moe differs from vLLM's
    pp = vllm_recipe(plan, Launch(spec, Mesh(4, pp=2), dp=2))
    assert pp.blocked and any("pipeline-parallel size 1" in c.text for c in _failed(pp))


def test_report_passes_prefill_cp_dp_and_engine_versions_to_the_recipes():
    from dataclasses import replace

    from tpplan.cost.topology import load_topology
    from tpplan.report.analysis import analyse
    from tpplan.report.memo_ask import MemoAsk, ServerSettings
    from tpplan.search.grid import MeshAsk

    topo = load_topology("h200x8-ib400", nodes=1)
    ask = MemoAsk(deployment=MeshAsk(tp=2), plans=("sglang-input-scattered", "sp-moe"), search_top=0)
    plain = analyse("tiny-deepseek-v3", topo, [], ask)
    server = ServerSettings(prefill_cp=2, data_parallel=2)
    cp = analyse("tiny-deepseek-v3", topo, [], replace(ask, server=server, engines=("sglang@main@7665ff96",)))
    assert plain.engines == ("sglang@0.5.23", "vllm@0.34.0") and cp.engines == ("sglang@main@7665ff96", "vllm@0.34.0")

    def pair(a, name):
        v = next(v for v in a.variants if v.plan.name == name and v.pp == 1)
        return next(r for r in v.engines if r.engine == "SGLang"), next(r for r in v.engines if r.engine == "vLLM")

    (s0, _), (s1, _) = pair(plain, "sglang-input-scattered"), pair(cp, "sglang-input-scattered")
    assert not s0.blocked and s1.blocked and s1.version == "sglang@main@7665ff96"
    (_, v0), (_, v1) = pair(plain, "sp-moe"), pair(cp, "sp-moe")
    assert "--data-parallel-size 2" in " ".join(v1.args) and "--data-parallel-size" not in " ".join(v0.args)


def test_an_ep_plan_that_also_replicates_or_gathers_needs_code():
    """A search plan with expert parallelism and its own gathers/replications is no engine's EP path:
    `--ep-size` realises only EP on the baseline's stream (the K3 TP16xPP2 best needed code)."""
    plan, spec = _setup("deepseek-v3", 8, "baseline")
    ep = plan.with_(name="x", moe="ep", ep_size=8)
    assert family(ep) == "ep"
    mixed = ep.with_(replicate=frozenset({"mla+moe/moe.shared_up_proj"}), gather=frozenset({"mla+moe/mla.qkv_a"}))
    assert family(mixed) == "custom" and sglang_recipe(mixed, spec, mesh=Mesh(8)).realises == "no"
