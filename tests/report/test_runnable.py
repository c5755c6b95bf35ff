"""Issue 33, item 1: the memo recommends only what a named engine version runs with flags, and every launch
line realises the whole deployment (TP, CP, PP, replicas, overlap) or is not printed, with the reason."""

from __future__ import annotations

import re

import pytest

from tpplan.cost.topology import load_topology
from tpplan.cost.workload import load_workload
from tpplan.engines import Launch
from tpplan.engines.recipes import EngineRecipe, recipes
from tpplan.mesh import Mesh
from tpplan.models.config import load_model
from tpplan.models.graph import build_model_graph
from tpplan.plans.named import make_plan
from tpplan.report.analysis import analyse
from tpplan.report.memo_ask import MemoAsk


def _recipes(model: str, plan: str, dep: Mesh) -> list[EngineRecipe]:
    graph = build_model_graph(load_model(model))
    return recipes(make_plan(plan, graph, dep.tp), Launch(graph.spec, dep))


def assert_realises(e: EngineRecipe, dep: Mesh) -> None:
    """A printed launch line holds every size of the deployment, as the engine spells it."""
    args = " ".join(e.args)
    if e.engine == "SGLang":
        assert f"--tp-size {dep.tp * dep.cp} " in args + " ", args  # the world size under CP
        assert ("--attn-cp-size" in args) == (dep.cp > 1) and ("--pp-size" in args) == (dep.pp > 1), args
    else:
        assert f"--tensor-parallel-size {dep.tp} " in args + " ", args
        assert ("--prefill-context-parallel-size" in args) == (dep.cp > 1), args
        assert ("--pipeline-parallel-size" in args) == (dep.pp > 1), args
    assert e.replicas == dep.replicas


def test_cp_on_a_model_no_engine_splits_has_no_launch_line():
    """Llama's SGLang model file never splits prefill tokens and vLLM's PCP is MLA-only: no flags, the reason
    said; before, SGLang's line read `--tp-size 2 --attn-cp-size 4` and vLLM's a 2-GPU TP2 server."""
    sgl, vll = _recipes("tiny-llama", "baseline", Mesh(2, cp=4))
    assert sgl.realises == vll.realises == "no" and not sgl.runs and not vll.runs
    assert "sglang.srt.layers.cp" in sgl.summary and "MLA models only" in vll.summary
    assert sgl.line().startswith("SGLang 0.5.23: no engine flag (") and "`" not in sgl.line().split("(")[0]


def test_cp_where_the_engines_split_it_realises_every_size():
    dep = Mesh(2, cp=2)
    for e in _recipes("tiny-deepseek-v3", "baseline", dep):
        assert e.realises == "yes", e.summary
        assert_realises(e, dep)
        assert "not modelled" in e.deployment_note  # where the engine's CP differs from the priced one


def test_replicas_and_overlap_are_in_the_line():
    dep = Mesh(2, replicas=2)
    sgl, vll = _recipes("tiny-deepseek-v3", "sp-moe+dbo", dep)
    assert sgl.realises == "no" and "--enable-dbo is vLLM" in sgl.summary  # SGLang has no DBO
    assert "--enable-dbo" in vll.args and vll.replicas == 2
    # on this MoE model vLLM's --data-parallel-size would shard the MoE layers over DP x TP: two servers instead
    assert vll.line().startswith("vLLM 0.34.0: 2 servers, each on GPUs of its own")
    assert vll.command().startswith("# 2 servers") and "--data-parallel-size" not in vll.command().splitlines()[-1]
    assert "DPEngineCoreProc" in vll.line()


@pytest.mark.parametrize(
    ("model", "dep", "words"),
    [
        ("tiny-deepseek-v3", Mesh(2, pp=2), "dual batch overlap with pipeline parallelism"),
        ("tiny-deepseek-v3", Mesh(2, cp=2), "dual batch overlap with prefill context parallelism"),
        ("tiny-kimi-k3", Mesh(2), "dual batch overlap with hybrid models (kimi_k3: "),
    ],
)
def test_vllm_refuses_dbo_beside_pp_cp_and_on_hybrid_models(model, dep, words):
    """vLLM 0.34.0's VllmConfig._validate_model_runner raises at startup for --enable-dbo with PP > 1, prefill CP
    > 1 or an IsHybrid model class: no launch line, the reason and its source instead."""
    _, vll = _recipes(model, "sp-moe+dbo", dep)
    assert vll.realises == "no" and not vll.runs and "--enable-dbo" not in vll.args
    assert words in vll.summary and "config/vllm.py `VllmConfig._get_dbo_unsupported_features" in vll.summary
    assert "@ 0.34.0 (PyPI wheel)" in vll.summary


def test_dp_attention_lines_name_the_engine_version():
    for e in _recipes("tiny-deepseek-v3", "vllm-dp-ep", Mesh(2)):
        assert e.version and e.line().startswith(f"{e.engine} {e.version.partition('@')[2]}: ")


def test_cp_layers_mla_has_no_released_flag():
    sgl, vll = _recipes("tiny-deepseek-v3", "baseline", Mesh(2, cp=2, cp_layers="mla"))
    assert sgl.realises == vll.realises == "no" and "PR #38344" in sgl.summary


def _bottom_target(a) -> None:
    """The bottom line's target is run by the engine it names, at its whole deployment; a faster step that
    needs code is named after it as needing code, never recommended."""
    b = a.bottom
    target = a.variant(b.target)
    if b.action == "switch":
        launch = re.search(r" Launch: (SGLang|vLLM) ", b.text)
        assert launch, b.text
        e = next(x for x in target.engines if x.engine == launch[1])
        assert e.runs and f"`{' '.join(e.args)}`" in b.text
        assert_realises(e, target.parallel)
        step = next(s for s in a.next_steps if s.key == b.target)  # its full price: memory against the card
        assert f"price: {step.price}." in b.text and step.price.startswith("memory per rank ")
    top = a.next_steps[0]
    if not top.engine_ok:
        assert f"The fastest predicted, `{top.key}`" in b.text and "needs code" in b.text
    for v in a.variants:  # every launch line the memo prints realises the deployment it is printed for
        for e in v.engines:
            if e.realises != "no":
                assert_realises(e, v.parallel)


def test_llama_3_70b_on_8_h100_recommends_only_what_an_engine_runs():
    """Before: "Switch ... to `baseline TP2xCP4` ... SGLang flags realise it"."""
    a = analyse(
        "llama-3-70b", load_topology("h100x8-ib400"), [load_workload("prompt16k-c8")], MemoAsk(prompt_lengths=None)
    )
    _bottom_target(a)
    assert a.variant(a.bottom.target).cp == 1  # neither engine runs prefill CP on llama
    cp = [v for v in a.variants if v.cp > 1]
    assert cp and all(e.realises == "no" for v in cp for e in v.engines)


def test_qwen3_32b_on_pcie_recommends_only_what_an_engine_runs():
    """Before: "Switch ... to `search-1 TP2xCP4` ... With today's engine flags the best is `baseline TP1xCP8`"."""
    a = analyse(
        "qwen3-32b", load_topology("pcie8-rtxpro6000"), [load_workload("prompt16k-c8")], MemoAsk(prompt_lengths=None)
    )
    _bottom_target(a)
    assert a.variant(a.bottom.target).cp == 1
    assert "TP1xCP8" not in a.bottom.text.split("The fastest predicted")[0]
