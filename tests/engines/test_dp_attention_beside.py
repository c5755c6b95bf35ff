"""vLLM's attention DP (`--data-parallel-size` at TP 1) beside PP and prefill CP (issues 30/32), read in the
0.34.0 wheel: no argument or config check refuses it (EngineArgs.create_engine_config,
ParallelConfig.__post_init__), the groups are laid out ExternalDP x DP x PP x PCP x TP with a MoE's EP group the
DP x PCP x TP ranks of one PP stage (initialize_model_parallel), and the fused MoE shards over DP x PCP x TP
(FusedMoEParallelConfig.flatten_tp_across_dp_and_pcp). So 0.34.0's launch lines carry the PP / PCP flags (PCP
still MLA-only, and its MoE group differs from tpplan's); 0.33.0 and SGLang were not read and say so."""

from __future__ import annotations

import pytest

from tpplan.engines import Launch, select, select_pair
from tpplan.engines.recipes import recipes
from tpplan.mesh import Mesh
from tpplan.models.config import load_model
from tpplan.models.graph import build_model_graph
from tpplan.plans.named import make_plan


def _pair(model: str, plan: str, mesh: Mesh, engines: list[str] | None = None):
    g = build_model_graph(load_model(model))
    return recipes(make_plan(plan, g, mesh.tp), Launch(g.spec, mesh), engines=select_pair(engines))


def test_the_fact_is_read_at_0_34_0_and_cited() -> None:
    read = select("vllm@0.34.0").dp_attention_beside
    assert read is not None and read.pp and read.cp and read.ep_spans_cp
    assert {f.source.function for f in read.facts} >= {"EngineArgs.create_engine_config", "initialize_model_parallel"}
    assert all(f.source.ref == "0.34.0 (PyPI wheel)" for f in read.facts)
    assert select("vllm@0.33.0").dp_attention_beside is None and select("sglang@0.5.23").dp_attention_beside is None


@pytest.mark.parametrize("plan", ["vllm-dp-ep", "vllm-dp"])
def test_dp_attention_beside_pp_prints_the_pp_flag(plan: str) -> None:
    sgl, vll = _pair("tiny-deepseek-v3", plan, Mesh(2, pp=2))
    assert vll.realises == "yes", vll.summary
    assert "--data-parallel-size 2" in vll.args and "--pipeline-parallel-size 2" in vll.args
    assert "--tensor-parallel-size 1" in vll.args
    cites = " ".join(c.source for c in vll.conditions)
    assert "`initialize_model_parallel` @ 0.34.0" in cites and "`EngineArgs.create_engine_config` @ 0.34.0" in cites
    assert vll.conditions[0].text.startswith("the model's vLLM class supports --pipeline-parallel-size (deepseek_v3")
    assert sgl.realises == "no" and "not read DP attention beside PP or CP for sglang@0.5.23" in sgl.summary


def test_dp_attention_beside_prefill_cp_is_partly_where_mla_and_no_flag_otherwise() -> None:
    _, mla = _pair("tiny-deepseek-v3", "vllm-dp-ep", Mesh(2, cp=2))
    assert mla.realises == "partly" and "--prefill-context-parallel-size 2" in mla.args
    assert "spans DP x PCP (4 ranks)" in mla.summary
    _, gqa = _pair("tiny-mixtral", "vllm-dp-ep", Mesh(2, cp=2))
    assert gqa.realises == "no" and "MLA models only" in gqa.summary  # PCPManager.validate_config


def test_a_version_not_read_says_so() -> None:
    _, old = _pair("tiny-deepseek-v3", "vllm-dp-ep", Mesh(2, pp=2), ["vllm@0.33.0"])
    assert old.realises == "no" and "not read DP attention beside PP or CP for vllm@0.33.0" in old.summary
