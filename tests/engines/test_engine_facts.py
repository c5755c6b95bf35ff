"""Engine facts corrected from the wheels (issue 33 item 6): each test states what the release's source
says and fails on the reading tpplan had before. Sources: SGLang 0.5.23 and vLLM 0.33.0 / 0.34.0 wheels."""

from __future__ import annotations

import pytest

from tpplan.engines import ENGINES, Launch, judge, select
from tpplan.engines.sglang_sp_moe import K3_SP_TABLES
from tpplan.mesh import Mesh
from tpplan.models.config import load_model


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
    assert next(c for c in r.conditions if "--pipeline-parallel-size" in c.text).met is None
    tp8 = vllm_recipe(make_plan("baseline", build_model_graph(k3), 8), Launch(k3, Mesh(8)))
    assert not any("--pipeline-parallel-size" in c.text for c in tp8.conditions)
