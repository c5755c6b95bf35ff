"""tpplan held to the engines' source: per engine mode and model class, the per-layer collectives
of the plan tpplan names for it equal a table transcribed from the engine's code.

Two independent checks: the tables below are transcribed by hand from the engines' files (source
and version or commit named with each), and the engine data's own dataflow (`tpplan.engines`)
must agree with them; then the plan's propagation must produce them. Models are the presets at
their real widths (no weights are built).
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from functools import cache

import pytest

from tpplan.engines import ENGINES, collectives, path_for, select
from tpplan.layout.propagate import propagate_model
from tpplan.models.config import load_model
from tpplan.models.graph import build_model_graph
from tpplan.plans.named import make_plan

PRESET = {
    "deepseek_v3": "deepseek-v3",
    "kimi_k3": "kimi-k3",
    "kimi_linear": "kimi-linear-48b",
    "qwen3": "qwen3-32b",
    "llama": "llama-3-70b",
    "qwen3_moe": "tiny-qwen3-moe",
}
TP = 8
TP_OF = {"qwen3_moe": 2}  # the tiny preset's 4 heads


@cache
def _walk(model_type: str, plan: str):
    spec = load_model(PRESET[model_type])
    graph = build_model_graph(spec)
    tp = TP_OF.get(model_type, TP)
    return spec, propagate_model(graph, make_plan(plan, graph, tp), tp)


def _layer_collectives(model_type: str, plan: str, kinds: str, entry: str) -> dict[str, list[tuple[str, int]]]:
    """Per (layer kind, entry) matching `kinds`/`entry`: the layer's collectives as (name, width);
    an all-to-all MoE counts once (its combine width: the dispatch adds routing-weight columns)."""
    _, walk = _walk(model_type, plan)
    out = {}
    for (kind, ent), res in walk.by_entry.items():
        if not fnmatchcase(kind, kinds) or (entry and ent != entry):
            continue
        seq = []
        for c in res.comms:
            if c.internal and c.value.endswith(":dispatch"):
                continue
            seq.append((c.collective.short, c.width))
        out[f"{kind} [{ent}]"] = seq
    assert out, f"no layer of {model_type} matches {kinds} entered as {entry!r}"
    return out


# Transcribed from the engines' code (hidden H, QKV latent L = q_lora_rank + kv_lora_rank + rope dim).
# SGLang 0.5.23 (PyPI wheel), DeepSeek-V3 with --enable-attn-tp-input-scattered, every layer:
#   layer_boundary/ops.py tp_reduce_scatter (the previous FFN's sum onto the rank's rows), RS(H);
#   adapters/attention.py AttentionInputs.fetch_qkv_latent -> tp_gather of qkv_a's output, AG(L);
#   prepare.py _tp_all_reduce_with_scattered_residual (residual rows folded into o_proj's sum), AR(H).
SGLANG_DSV3_INPUT_SCATTERED = [("RS", 7168), ("AG", 2112), ("AR", 7168)]
# SGLang 0.5.23 layers/layernorm_sp.py (Qwen3ForCausalLM, EXTEND): RS + AG around each block.
SGLANG_QWEN3_LAYERNORM_SP = [("RS", 5120), ("AG", 5120), ("RS", 5120), ("AG", 5120)]
# vLLM main@7d7e95dc compilation/passes/fusion/sequence_parallelism.py: every AR + RMSNorm becomes
# RS + norm + AG (First/MiddleAllReduceRMSNormPattern).
VLLM_SP_PASS_LLAMA = [("RS", 8192), ("AG", 8192), ("RS", 8192), ("AG", 8192)]
# vLLM 0.33.0 model_executor/models/deepseek_v2.py DeepseekV2DecoderLayer.forward, a MoE layer
# entered sequence-parallel: AG(normed H) before attention, RS(H) after it, MoE all-to-all.
VLLM_DSV3_MOE_SP = [("AG", 7168), ("RS", 7168), ("A2A", 7168)]
# SGLang 0.5.23, Kimi-K3 with --moe-a2a-backend deepep and attention TP, SGLANG_K3_SP_ATTN_RES unset (or
# the fused SP collectives off: H200, TP32), a MoE layer after a MoE layer (tpplan's layer boundary):
#   layer_boundary/boundary.py _select_exit_move -> ops.update_attn_tp_gather_output: the previous MoE
#   output written into the residual on the rank's rows, then gathered, AG(H), because the next
#   attention read needs every row (residual/attn_bank.py _AttnReadout.reads_after_attn_tp_gather =
#   not reads_slices; the index holds the same at attn_bank.py commit 0b306229);
#   models/kimi_k3.py _k3_reduce_scatter_add / boundary.py _attn_tp_reduce_scatter_update_read: o_proj's
#   sum onto the rank's rows, RS(H); the latent MoE's DeepEP dispatch/combine, A2A(3584, K3's latent).
SGLANG_K3_SP_MOE = [("AG", 7168), ("RS", 7168), ("A2A", 3584)]
# SGLang 0.5.23, DeepSeek-V3 (and Kimi-Linear) with --moe-a2a-backend deepep: the generic stage boundaries.
#   layers/moe/utils.py is_moe_input_scattered_across_dp_ranks + layer_boundary/factories.py _resolve_ffn:
#   the sparse FFN on the rank's rows; boundary.py _select_entry_step: input_layernorm on the rank's rows
#   then attn_tp_gather_input, AG(normed H); _attn_tp_reduce_scatter_update_read, RS(H); DeepEP, A2A(H).
SGLANG_DSV3_A2A = [("AG", 7168), ("RS", 7168), ("A2A", 7168)]
SGLANG_KIMI_LINEAR_A2A = [("AG", 2304), ("RS", 2304), ("A2A", 2304)]
SGLANG_QWEN3_MOE_A2A = [("AG", 64), ("RS", 64), ("A2A", 64)]  # Qwen3MoeDecoderLayer.stage_facts, tiny (H = 64)
# vLLM 0.33.0 models/kimi_k3/nvidia/model.py KimiDecoderLayer.forward (use_sequence_parallel), a MoE
# layer: attn_res + input norm on the shard, sp_all_gather AG(H), attention, sp_reduce_scatter RS(H),
# KimiMoE.forward: the latent dispatched from the shard, A2A(3584).
VLLM_K3_SP = [("AG", 7168), ("RS", 7168), ("A2A", 3584)]
# vLLM 0.33.0 model_executor/models/qwen3_moe.py Qwen3MoeSparseMoeBlock.forward (use_sequence_parallel_moe),
# at tpplan's layer boundary: the previous block's tensor_model_parallel_all_gather AG(H); o_proj
# (RowParallelLinear, reduce_results=True) AR(H); sequence_parallel_chunk then the experts' A2A(H).
# tiny-qwen3-moe (H = 64): tpplan has no Qwen3-MoE preset at real widths.
VLLM_QWEN3_MOE_SP = [("AG", 64), ("AR", 64), ("A2A", 64)]
# The engines' all-reduce path (SGLang's and vLLM's Megatron TP): AR after o_proj, AR after the MLP.
BASELINE = {"deepseek_v3": 7168, "qwen3": 5120, "llama": 8192}

TRANSCRIBED = {
    ("sglang@0.5.23", "input-scattered", "deepseek_v3"): SGLANG_DSV3_INPUT_SCATTERED,
    ("sglang@main@7665ff96", "input-scattered", "deepseek_v3"): SGLANG_DSV3_INPUT_SCATTERED,
    ("sglang@0.5.23", "layernorm-sp", "qwen3"): SGLANG_QWEN3_LAYERNORM_SP,
    ("vllm@main@000fc94b", "sp-pass", "llama"): VLLM_SP_PASS_LLAMA,
    ("vllm@0.33.0", "moe-sp", "deepseek_v3"): VLLM_DSV3_MOE_SP,
    # The older revisions reuse the release's reading of these modes (their notes say so).
    ("sglang@main@7665ff96", "layernorm-sp", "qwen3"): SGLANG_QWEN3_LAYERNORM_SP,
    ("vllm@main@000fc94b", "moe-sp", "deepseek_v3"): VLLM_DSV3_MOE_SP,
    ("vllm@main@000fc94b", "sp-pass", "qwen3"): SGLANG_QWEN3_LAYERNORM_SP,  # the same RS + AG pattern at 5120
    ("sglang@0.5.23", "sp-moe", "kimi_k3"): SGLANG_K3_SP_MOE,
    ("sglang@0.5.23", "sp-moe", "deepseek_v3"): SGLANG_DSV3_A2A,
    ("sglang@0.5.23", "sp-moe", "kimi_linear"): SGLANG_KIMI_LINEAR_A2A,
    ("sglang@0.5.23", "sp-moe", "qwen3_moe"): SGLANG_QWEN3_MOE_A2A,
    ("vllm@0.33.0", "moe-sp", "kimi_k3"): VLLM_K3_SP,
    ("vllm@0.33.0", "moe-sp", "qwen3_moe"): VLLM_QWEN3_MOE_SP,
    # vLLM 0.34.0: DeepseekV2DecoderLayer.forward, KimiDecoderLayer.forward, KimiMoE.forward and
    # Qwen3MoeSparseMoeBlock.forward are byte-identical to 0.33.0's (wheels diffed function by function).
    ("vllm@0.34.0", "moe-sp", "deepseek_v3"): VLLM_DSV3_MOE_SP,
    ("vllm@0.34.0", "moe-sp", "kimi_k3"): VLLM_K3_SP,
    ("vllm@0.34.0", "moe-sp", "qwen3_moe"): VLLM_QWEN3_MOE_SP,
    # The older revisions reuse the release's SP-MoE / MoE-SP reading (their notes say so).
    ("sglang@main@7665ff96", "sp-moe", "kimi_k3"): SGLANG_K3_SP_MOE,
    ("sglang@main@7665ff96", "sp-moe", "deepseek_v3"): SGLANG_DSV3_A2A,
    ("sglang@main@7665ff96", "sp-moe", "kimi_linear"): SGLANG_KIMI_LINEAR_A2A,
    ("sglang@main@7665ff96", "sp-moe", "qwen3_moe"): SGLANG_QWEN3_MOE_A2A,
    ("vllm@main@000fc94b", "moe-sp", "kimi_k3"): VLLM_K3_SP,
    ("vllm@main@000fc94b", "moe-sp", "qwen3_moe"): VLLM_QWEN3_MOE_SP,
}
# Which layers of tpplan's graph the engine's per-layer table describes, and their entry placement.
LAYERS = {
    "input-scattered": ("*", "P"),
    "layernorm-sp": ("*", "P"),
    "sp-pass": ("*", "P"),
    "moe-sp": ("*+moe", "S(tok)"),
    "sp-moe": ("*+moe", "S(tok)"),
}


def _cases():
    for key, ev in ENGINES.items():
        for mode in ev.modes:
            for model_type in PRESET:
                yield pytest.param(key, mode.name, model_type, id=f"{key}-{mode.name}-{model_type}")


@pytest.mark.parametrize("engine,mode_name,model_type", list(_cases()))
def test_engine_plan_equals_the_engine_dataflow(engine, mode_name, model_type):
    """Where the data says a model class wires a mode with a tpplan plan, that plan's per-layer
    collectives are the transcribed table; where it does not wire it, the engine runs the baseline
    (or refuses), never a scattered plan."""
    ev = select(engine)
    mode = ev.mode(mode_name)
    spec = load_model(PRESET[model_type])
    path = path_for(mode, spec)
    table = TRANSCRIBED.get((engine, mode_name, model_type))
    if path.wiring is not None and path.wiring.plan is not None:
        assert table is not None, f"no transcribed table for {engine} {mode_name} {model_type}: add one from source"
        assert collectives(path.wiring.dataflow, spec) == table  # the data agrees with the hand transcription
        kinds, entry = LAYERS[mode_name]
        for layer, seq in _layer_collectives(model_type, path.wiring.plan, kinds, entry).items():
            assert seq == table, f"{engine} {mode_name} {model_type} {layer}: tpplan {seq}, engine {table}"
    elif path.wiring is None:
        assert table is None
        assert path.runs_plan in ("baseline", "refused")
        assert path.not_wired.source.read or path.not_wired.source.function.startswith(mode_name)


@pytest.mark.parametrize("model_type", sorted(BASELINE))
def test_the_baseline_is_the_engines_all_reduce_path(model_type):
    h = BASELINE[model_type]
    for layer, seq in _layer_collectives(model_type, "baseline", "*", "P").items():
        assert seq == [("AR", h), ("AR", h)], layer


def test_sglang_input_scattered_is_not_tpplans_input_scattered():
    """The engine's MLP side is one all-reduce over every row; tpplan's own idea reduce-scatters and
    gathers the MLP input (both norms on T/N): different collectives, so different plans."""
    mine = _layer_collectives("deepseek_v3", "input-scattered", "*", "P")
    assert all(seq == [("RS", 7168), ("AG", 2112), ("RS", 7168), ("AG", 7168)] for seq in mine.values())
    assert all(seq != SGLANG_DSV3_INPUT_SCATTERED for seq in mine.values())


@pytest.mark.parametrize("model_type", ["kimi_k3", "kimi_linear", "qwen3", "llama"])
def test_input_scattered_does_nothing_where_the_model_does_not_wire_it(model_type):
    for key in ("sglang@0.5.23", "sglang@main@7665ff96"):
        path = path_for(select(key).mode("input-scattered"), load_model(PRESET[model_type]))
        assert not path.wired and path.runs_plan == "baseline"
        assert path.not_wired.source.read and path.not_wired.source.repo == "sgl-project/sglang"


def test_every_fact_cites_a_file_function_and_version():
    for ev in ENGINES.values():
        for mode in ev.modes:
            sources = [mode.fallback_source, *(g.source for g in mode.gates)]
            for w in mode.wiring:
                sources += [w.source, *(s.source for s in w.dataflow if hasattr(s, "source"))]
            sources += [n.source for n in mode.not_wired]
            for s in sources:
                assert s.repo in ("sgl-project/sglang", "vllm-project/vllm") and s.path and s.function, s
                assert s.read is False or s.ref, s
        pl = ev.pipeline  # each PP-schedule fact read, with its own file and function
        for s in (pl.source, pl.chunks_source, pl.boundary_source, *pl.more_sources):
            assert s.read and s.repo in ("sgl-project/sglang", "vllm-project/vllm") and s.path and s.function, s


def test_versions_differ_where_the_code_differs():
    """The K3 fused SP collectives: SM100/SM103 and TP 4/8/16 in 0.5.23, SM103 and TP 4/8 earlier;
    vLLM 0.33.0 has no sequence-parallelism pass, the older revision has one."""
    from tpplan.engines import Launch, judge
    from tpplan.mesh import Mesh

    k3 = load_model("kimi-k3")
    for key, gpu, tp, met in (
        ("sglang@0.5.23", "NVIDIA GB200", 16, True),
        ("sglang@main@7665ff96", "NVIDIA GB200", 16, False),
        ("sglang@main@7665ff96", "NVIDIA GB300", 8, True),
        ("sglang@0.5.23", "NVIDIA H200", 8, False),
    ):
        gates = judge(select(key).mode("sp-moe"), Launch(k3, Mesh(tp), chunk=4096, gpu=gpu))
        fused = [r.met for r in gates if (r.gate.check or "").startswith("k3_sp_collective")]
        assert all(fused) is met, (key, gpu, tp)
    assert not select("vllm@0.33.0").mode("sp-pass").exists
    assert not select("vllm@0.34.0").mode("sp-pass").exists
    assert select("vllm@main@000fc94b").mode("sp-pass").exists


def test_engine_selection_rejects_unknown_versions():
    from tpplan.errors import TpplanError

    assert select("sglang").key == "sglang@0.5.23" and select("VLLM").key == "vllm@0.34.0"
    assert select("vllm@0.33.0").version == "0.33.0"  # the previous release stays selectable
    with pytest.raises(TpplanError, match=r"sglang@0\.5\.23"):
        select("sglang@0.4.0")


def test_docs_engines_md_is_rendered_from_the_data():
    from pathlib import Path

    from tpplan.engines.doc import render

    doc = Path(__file__).resolve().parents[2] / "docs" / "engines.md"
    assert doc.read_text() == render(), "stale docs/engines.md: run `python -m tpplan.engines.doc > docs/engines.md`"
    assert "RS(hidden) + AG(QKV latent) + AR(hidden)" in render()


def test_sglang_k3_sp_moe_keeps_the_bank_on_every_row():
    """SGLang's default K3 SP-MoE (`sglang-sp-moe`): the attention-side aggregation runs on every row
    against a bank every rank holds whole, the MLP-side one on the rank's rows; dense layers and the
    first MoE layer's entry keep the all-reduce path (kimi_k3.py `_sp_moe` only on MoE layers). The
    norm-on-shard `sp-moe` is the SGLANG_K3_SP_ATTN_RES=1 variant."""
    spec, walk = _walk("kimi_k3", "sglang-sp-moe")
    h, latent = spec.hidden, 3584
    by = {(k, e): [(c.collective.short, c.width) for c in r.comms if not c.value.endswith(":dispatch")]
          for (k, e), r in walk.by_entry.items()}  # fmt: skip
    assert by[("kda+dense", "P")] == [("AR", h), ("AR", h)]
    assert by[("kda+moe", "P")] == [("AR", h), ("RS", h), ("A2A", latent)]  # the first MoE layer
    res = walk.by_entry[("mla+moe", "S(tok)")]
    assert str(res.placements["bank"]) == "R" and str(res.placements["x"]) == "R"  # aggregation on T
    assert str(res.placements["y"]) == "S(tok)"  # post-attention aggregation on T/N
    share = {d.op.name: d.compute_share for d in res.decisions}
    assert share["attn_attn_res"] == 1.0 and share["mlp_attn_res"] == 1 / TP
    # The SGLANG_K3_SP_ATTN_RES=1 variant moves the same bytes but gathers another tensor: the normed
    # input (its aggregation and norm on T/N, the bank on the rank's rows), not the stream.
    variant = path_for(select("sglang@0.5.23").mode("sp-moe"), spec, variant=1).wiring
    assert variant.plan == "sp-moe" and collectives(variant.dataflow, spec) == SGLANG_K3_SP_MOE
    shard = _walk("kimi_k3", "sp-moe")[1].by_entry[("mla+moe", "S(tok)")]
    assert str(shard.placements["x"]) == str(shard.placements["bank"]) == "S(tok)"
    gathered = {r.comms[0].value for r in (res, shard)}
    assert gathered == {"resid_mid", "x"}


def test_every_engine_named_plan_is_a_plan_tpplan_builds():
    """Each wiring's `plan` is one `make_plan` builds (a typo would make the memo name a plan nobody runs)."""
    from tpplan.plans.named import ALL_PLANS

    named = {w.plan for ev in ENGINES.values() for m in ev.modes for w in m.wiring if w.plan}
    named |= {n.runs for ev in ENGINES.values() for m in ev.modes for n in m.not_wired} - {"refused"}
    assert {"sglang-sp-moe", "vllm-moe-chunk", "sp-moe"} <= named and named <= set(ALL_PLANS)


def test_memos_price_the_plans_the_engines_run_on_the_model_class():
    """`engine_plans`: what the memo adds beside its own plans, from the engine data only."""
    from tpplan.engines import engine_plans

    assert "sglang-sp-moe" in engine_plans(load_model("kimi-k3"))
    assert "vllm-moe-chunk" in engine_plans(load_model("tiny-qwen3-moe"))
    assert "sglang-sp-moe" not in engine_plans(load_model("deepseek-v3"))  # SGLang runs sp-moe there
    assert not {"sglang-sp-moe", "vllm-moe-chunk"} & set(engine_plans(load_model("llama-3-70b")))
