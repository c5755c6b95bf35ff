"""Micro-batch overlap records per engine version (issues 30/32): each release module states its own
(`EngineVersion.overlaps`). vLLM 0.34.0 refuses --enable-dbo at startup beside PP, prefill CP and for hybrid
model classes (VllmConfig._get_dbo_unsupported_features / _validate_model_runner). vLLM 0.33.0, read in its
wheel: with VLLM_USE_V2_MODEL_RUNNER unset, _get_dbo_unsupported_features returns ['dual batch overlap'], so
use_v2_model_runner falls back to the V1 model runner with a warning, and __post_init__ then validates the V1
runner (_validate_v1_model_runner), which refuses prefill CP only; the V1 GPUModelRunner runs DBO through
UBatchWrapper. So 0.33.0 prints --enable-dbo beside PP and for hybrids, says it runs on the V1 runner, and
refuses it beside prefill CP."""

from __future__ import annotations

from tpplan.engines import Launch, overlap_named, overlaps, select_pair
from tpplan.engines.launch import deployment_flags
from tpplan.engines.recipes import recipes
from tpplan.mesh import Mesh
from tpplan.models.config import load_model
from tpplan.models.graph import build_model_graph
from tpplan.plans.named import make_plan


def test_each_release_states_its_own_overlaps() -> None:
    new, old = overlaps("vllm@0.34.0")["dbo"], overlaps("vllm@0.33.0")["dbo"]
    assert (new.engine, old.engine) == ("vLLM 0.34.0", "vLLM 0.33.0")
    assert all(g.source.ref == "0.33.0 (PyPI wheel)" for g in old.gates)
    assert old.refused is not None and old.refused.axes == ("cp",) and old.refused.model_types == ()
    assert new.refused is not None and new.refused.axes == ("pp", "cp") and "kimi_k3" in new.refused.model_types
    assert "V1 model runner" in old.runs_on and not new.runs_on
    assert overlap_named("dbo") is new and overlap_named("tbo") is overlaps("sglang@0.5.23")["tbo"]
    assert overlaps("vllm@main@000fc94b") == {}  # not read for that revision


def test_vllm_s_shared_experts_run_before_the_combine_wait_as_read() -> None:
    """FusedMoEKernelModularImpl._finalize (the same in 0.33.0 and 0.34.0): with DeepEP's async finalize it issues
    the combine, runs the shared experts, then yields to the other micro-batch; cited per release, no assumption."""
    for key in ("vllm@0.34.0", "vllm@0.33.0"):
        dbo = overlaps(key)["dbo"]
        src = dbo.shared_experts_source
        assert dbo.shared_experts_before_combine_wait and not dbo.assumption
        assert src is not None and src.read and src.ref.startswith(key.split("@")[1])
        assert "_finalize" in src.function


def test_0_33_0_prints_dbo_beside_pp_and_for_hybrids_on_its_v1_runner() -> None:
    for model_type, mesh in (("kimi_k3", Mesh(8)), ("deepseek_v3", Mesh(8, pp=4))):
        new = deployment_flags("vLLM", model_type, model_type != "kimi_k3", mesh, "dbo", "vllm@0.34.0")
        old = deployment_flags("vLLM", model_type, model_type != "kimi_k3", mesh, "dbo", "vllm@0.33.0")
        assert not new.realised and "refuses it at startup" in new.why
        assert old.realised and old.args[-1] == "--enable-dbo", old
        assert "V1 model runner" in old.why and "VllmConfig.use_v2_model_runner" in old.why and "@ 0.33.0" in old.why


def test_0_33_0_refuses_dbo_beside_prefill_cp() -> None:
    old = deployment_flags("vLLM", "deepseek_v3", True, Mesh(8, cp=2), "dbo", "vllm@0.33.0")
    assert not old.realised
    assert "'does not support: prefill context parallel'" in old.why and "_validate_v1_model_runner" in old.why
    assert "@ 0.33.0" in old.why


def test_a_version_without_overlap_records_says_so() -> None:
    flags = deployment_flags("vLLM", "deepseek_v3", True, Mesh(8), "dbo", "vllm@main@000fc94b")
    assert not flags.realised and "has not read --enable-dbo for vllm@main@000fc94b" in flags.why
    other = deployment_flags("SGLang", "deepseek_v3", True, Mesh(8), "dbo", "sglang@0.5.23")
    assert not other.realised and "--enable-dbo is vLLM 0.34.0's" in other.why


def test_the_launch_line_follows_the_engine_version() -> None:
    """`--engine vllm@0.33.0` on a PP deployment: the recipe prints --enable-dbo and says where it runs."""
    graph = build_model_graph(load_model("tiny-deepseek-v3"))
    mesh = Mesh(2, pp=2)
    plan = make_plan("sp-moe+dbo", graph, mesh.tp)
    launch = Launch(graph.spec, mesh)
    _, new = recipes(plan, launch, engines=select_pair(None))
    _, old = recipes(plan, launch, engines=select_pair(["vllm@0.33.0"]))
    assert new.realises == "no" and "dual batch overlap with pipeline parallelism" in new.summary
    assert "--enable-dbo" in old.args and "--pipeline-parallel-size 2" in old.args
    assert "V1 model runner" in old.deployment_note
