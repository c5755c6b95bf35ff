"""Engine facts corrected from the wheels (issue 33 item 6): each test states what the release's source
says and fails on the reading tpplan had before. Sources: SGLang 0.5.23 and vLLM 0.33.0 / 0.34.0 wheels."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpplan.engines import ENGINES, Launch, judge, select
from tpplan.engines.sglang_sp_moe import K3_SP_TABLES
from tpplan.mesh import Mesh
from tpplan.models.config import load_model

PRESETS = Path(__file__).resolve().parents[2] / "tpplan" / "models" / "presets"


@pytest.fixture(scope="module")
def k3():
    return load_model("kimi-k3")


def test_sglang_input_scattered_pads_every_batch_to_tp_instead_of_asserting():
    """ForwardBatch.prepare_attn_tp_scatter_input pads an input-scattered extend batch to a multiple of TP,
    so tp_reduce_scatter's assertion cannot fire: no gate of the mode fails for a chunk TP does not divide."""
    mode = select("sglang@0.5.23").mode("input-scattered")
    d = Launch(load_model("deepseek-v3"), Mesh(8), chunk=8190)
    results = judge(mode, d)
    assert not any(r.gate.effect == "asserts" for r in results)
    pads = next(r for r in results if r.gate.check == "input_scattered_pads")
    assert pads.met is True and "8192 rows" in pads.detail and "2 dummy rows" in pads.detail
    assert "prepare_attn_tp_scatter_input" in pads.gate.source.function


def test_the_older_revision_pads_to_tp_as_read_at_a_commit_of_its_package():
    """main@7665ff96's padding is read at 003bbaf9 (the same layers/communicator/ package; the code index holds
    no forward_batch_info.py at 7665ff96): the same rounding up to a multiple of tp_size, cited as read."""
    mode = select("sglang@main@7665ff96").mode("input-scattered")
    pads = next(
        r
        for r in judge(mode, Launch(load_model("deepseek-v3"), Mesh(8), chunk=8190))
        if r.gate.check == "input_scattered_pads"
    )
    assert pads.met is True and "8192 rows" in pads.detail
    assert pads.gate.source.read and pads.gate.source.ref.startswith("commit 003bbaf9")


@pytest.mark.parametrize(
    ("gpu", "tp", "chunk", "fused"),
    [
        ("NVIDIA GB300", 8, 4096, True),  # a table ships, the bucket at or below 4096 is fused
        ("NVIDIA GB300", 8, 8192, False),  # the 8192 bucket picks NCCL
        ("NVIDIA GB300", 4, 8192, True),
        ("NVIDIA GB300", 4, 9364, False),
        ("NVIDIA GB300", 16, 16384, True),
        ("NVIDIA GB200", 16, 8192, True),
        ("NVIDIA GB200", 8, 4096, False),  # GB200 ships only the TP16 table
        ("NVIDIA B300", 8, 4096, False),  # HGX B300: SM103 and TP8 pass the first gate, but no table ships
        ("NVIDIA B200", 8, 4096, False),
    ],
)
def test_k3_fused_sp_collectives_need_the_device_table(k3, gpu, tp, chunk, fused):
    """sp_collective.get_dispatch returns None (NCCL) without configs/sp_collective/world=TP,H=7168,
    device_name=<torch name>.json, and for a bucket whose strategy is nccl."""
    gates = judge(select("sglang@0.5.23").mode("sp-moe"), Launch(k3, Mesh(tp), chunk=chunk, gpu=gpu))
    k3_gates = [r for r in gates if (r.gate.check or "").startswith("k3_sp_collective")]
    assert len(k3_gates) == 3
    assert all(r.met for r in k3_gates) is fused, [(r.gate.check, r.met, r.detail) for r in k3_gates]


def test_k3_sp_tables_are_the_wheel_files():
    """The table data is the four files the 0.5.23 wheel ships (TP 4/8/16 for GB300, TP16 for GB200)."""
    assert set(K3_SP_TABLES) == {("NVIDIA GB300", 4), ("NVIDIA GB300", 8), ("NVIDIA GB300", 16), ("NVIDIA GB200", 16)}


def test_hgx_b300_memo_line_says_nccl(k3):
    from tpplan.engines.recipes.sglang import sglang_recipe
    from tpplan.models.graph import build_model_graph
    from tpplan.plans.named import make_plan

    plan = make_plan("sglang-sp-moe", build_model_graph(k3), 8)
    r = sglang_recipe(plan, k3, mesh=Mesh(8), gpu="NVIDIA B300", chunk=4096)
    assert "run on NCCL, not K3's fused SP collectives" in r.path and "no table ships" in r.path


@pytest.mark.parametrize("key", ["vllm@0.33.0", "vllm@0.34.0"])
def test_vllm_keeps_pp_plus_one_batches_in_flight_with_ray(key):
    """RayExecutorV2 subclasses MultiprocExecutor (supports_async_scheduling True), so async scheduling stays
    on and max_concurrent_batches is pp_size + 1 (0.33.0: on the default V2 model runner)."""
    p = select(key).pipeline
    assert p.extra_in_flight == 1 and p.in_flight_at(Mesh(8, pp=4)) == 5
    assert "Ray executor" in p.in_flight and "turns off" not in p.in_flight
    assert any("RayExecutorV2" in s.function for s in p.more_sources)


def test_tbo_gate_is_the_validators_condition():
    from tpplan.engines.overlap import SGLANG_TBO

    gate = next(g for g in SGLANG_TBO.gates if g.source.function == "check_two_batch_overlap")
    assert "--moe-a2a-backend is none and attention DP is off" in gate.text
    assert "--attn-dp-size" in gate.keys and gate.effect == "refuses"


def test_dp_attention_wording_names_the_plans_tpplan_has():
    from tpplan.engines.doc import render
    from tpplan.plans.named import DP_PLANS

    assert "being added" not in render()
    for key in ("sglang@0.5.23", "vllm@0.34.0"):
        ev = select(key)
        mode = ev.mode("dp-attention") or ev.mode("dp-ep")
        said = " ".join(mode.wiring[0].differences)
        named = [p for p in DP_PLANS if f"`{p}`" in said]
        assert named, said


def test_kimi_k3_pp_support_is_read(k3):
    from tpplan.engines.recipes.sglang import sglang_recipe
    from tpplan.models.graph import build_model_graph
    from tpplan.plans.named import make_plan

    plan = make_plan("baseline", build_model_graph(k3), 8)
    r = sglang_recipe(plan, k3, mesh=Mesh(8, pp=4))
    pp = next(c for c in r.conditions if "--pp-size" in c.text)
    assert pp.met is True and "not checked" not in pp.text and "kimi_k3.py" in pp.source
    assert select("vllm@0.34.0").support("--pipeline-parallel-size", "kimi_k3") is not None


def test_vllm_0_34_0_is_current_and_0_33_0_selectable():
    from tpplan.engines import DEFAULT_ENGINES
    from tpplan.engines.vllm import SP_MOE_BACKENDS, SP_MOE_BACKENDS_0_33

    assert "vllm@0.34.0" in DEFAULT_ENGINES and "vllm@0.33.0" in ENGINES
    new, old = select("vllm@0.34.0"), select("vllm@0.33.0")
    assert new.mode("moe-sp").gates[0].source.ref.startswith("0.34.0")
    assert old.mode("moe-sp").gates[0].source.ref.startswith("0.33.0")
    assert "mori" in SP_MOE_BACKENDS and "mori" not in SP_MOE_BACKENDS_0_33
    assert ", mori," in new.mode("moe-sp").gates[0].text and ", mori," not in old.mode("moe-sp").gates[0].text


def test_sglang_nvls_default_is_recorded():
    c = select("sglang@0.5.23").collectives
    assert c is not None and c.nvls is False and "--enable-nccl-nvls" in c.enable
    assert c.source.function.startswith("_set_envs_and_config")
    assert select("vllm@0.34.0").collectives.nvls is None


def test_vllm_pp_support_is_read_per_model_class(k3):
    from tpplan.engines.recipes.vllm import vllm_recipe
    from tpplan.models.graph import build_model_graph
    from tpplan.plans.named import make_plan

    r = vllm_recipe(make_plan("baseline", build_model_graph(k3), 8), Launch(k3, Mesh(8, pp=4)))
    pp = next(c for c in r.conditions if "--pipeline-parallel-size" in c.text)
    assert pp.met is True and "KimiK3ForConditionalGeneration (SupportsPP)" in pp.source and "0.34.0" in pp.source
    mixtral = load_model("tiny-mixtral")
    r = vllm_recipe(make_plan("baseline", build_model_graph(mixtral), 2), Launch(mixtral, Mesh(2, pp=2)))
    assert next(c for c in r.conditions if "--pipeline-parallel-size" in c.text).met is True
    older = vllm_recipe(make_plan("baseline", build_model_graph(mixtral), 2), Launch(mixtral, Mesh(2, pp=2)),
                        engine=select("vllm@main@000fc94b"))  # fmt: skip
    assert next(c for c in older.conditions if "--pipeline-parallel-size" in c.text).met is None  # not read there
    tp8 = vllm_recipe(make_plan("baseline", build_model_graph(k3), 8), Launch(k3, Mesh(8)))
    assert not any("--pipeline-parallel-size" in c.text for c in tp8.conditions)


def test_sglang_sp_moe_on_a_dense_model_runs_the_all_reduce_path():
    """SGLang 0.5.23 has no argument check that reads the model for --moe-a2a-backend: a dense model starts
    (no expert placement to assert on) and its FFN keeps the attention's rows (`_ffn_on_rank_rows`), the
    baseline, as the mode's not-wired entry says; no gate of the mode says it refuses."""
    results = judge(select("sglang@0.5.23").mode("sp-moe"), Launch(load_model("tiny-llama"), Mesh(2)))
    has_moe = next(r for r in results if r.gate.check == "has_moe")
    assert has_moe.met is False and has_moe.gate.effect == "runs baseline" and has_moe.gate.source.read
    assert not any(r.met is False and r.gate.effect == "refuses" for r in results)


@pytest.mark.parametrize(("tp", "met"), [(8, True), (16, True), (6, False)])
def test_sglang_sp_moe_refuses_experts_that_do_not_divide_over_the_tp_ranks(tp, met):
    """ExpertLocationMetadata._init_common / FusedMoE.__init__ assert routed experts % ep_size == 0, and the
    a2a backend sets ep_size to tp_size: DeepSeek-V3's 256 experts load at TP 8 and 16, not at TP 6."""
    results = judge(select("sglang@0.5.23").mode("sp-moe"), Launch(load_model("deepseek-v3"), Mesh(tp)))
    divide = next(r for r in results if r.gate.check == "experts_divide_tp")
    assert divide.met is met and divide.gate.effect == "refuses" and divide.gate.source.read
    assert "FusedMoE.__init__" in divide.gate.source.function


PRESET_TYPES = sorted({load_model(p.stem).model_type for p in PRESETS.glob("*.json")})


@pytest.mark.parametrize("key", ["sglang@0.5.23", "vllm@0.34.0", "vllm@0.33.0"])
def test_pp_support_is_read_for_every_preset_s_model_type(key):
    """Each release says, read in the model's file, whether its class runs PP, for every model type tpplan ships."""
    option = "--pp-size" if key.startswith("sglang") else "--pipeline-parallel-size"
    missing = [t for t in PRESET_TYPES if select(key).support(option, t) is None]
    assert not missing and len(PRESET_TYPES) >= 20


@pytest.mark.parametrize(
    ("preset", "met"),
    [
        ("tiny-qwen3-next", False),
        ("tiny-gemma3", False),
        ("tiny-llama4", None),
        ("tiny-mixtral", True),
        ("tiny-qwen3", True),
    ],
)
def test_sglang_refuses_pp_for_classes_whose_forward_takes_no_pp_proxy_tensors(preset, met):
    """ModelRunner.__init__ asserts 'Pipeline Parallel is not compatible with this model.' for Gemma 3 and
    Qwen3-Next (whose __init__ asserts PP 1 besides); Llama 4's text class passes the check but does not split
    its layers, which is said, not judged."""
    from tpplan.engines.recipes.sglang import sglang_recipe
    from tpplan.models.graph import build_model_graph
    from tpplan.plans.named import make_plan

    spec = load_model(preset)
    r = sglang_recipe(make_plan("baseline", build_model_graph(spec), 2), spec, mesh=Mesh(2, pp=2))
    pp = next(c for c in r.conditions if "--pp-size" in c.text)
    assert pp.met is met and "unread" not in pp.source and "not checked" not in pp.text
