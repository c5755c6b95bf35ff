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
}
TP = 8


@cache
def _walk(model_type: str, plan: str):
    spec = load_model(PRESET[model_type])
    graph = build_model_graph(spec)
    return spec, propagate_model(graph, make_plan(plan, graph, TP), TP)


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
}
# Which layers of tpplan's graph the engine's per-layer table describes, and their entry placement.
LAYERS = {
    "input-scattered": ("*", "P"),
    "layernorm-sp": ("*", "P"),
    "sp-pass": ("*", "P"),
    "moe-sp": ("*+moe", "S(tok)"),
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
    from tpplan.engines import Deployment, judge

    k3 = load_model("kimi-k3")
    for key, gpu, tp, met in (
        ("sglang@0.5.23", "B200", 16, True),
        ("sglang@main@7665ff96", "B200", 16, False),
        ("sglang@main@7665ff96", "GB300", 8, True),
        ("sglang@0.5.23", "H200", 8, False),
    ):
        gates = judge(select(key).mode("sp-moe"), Deployment(k3, tp, gpu=gpu))
        fused = next(r for r in gates if (r.gate.check or "").startswith("k3_sp_collective"))
        assert fused.met is met, (key, gpu, tp)
    assert not select("vllm@0.33.0").mode("sp-pass").exists
    assert select("vllm@main@000fc94b").mode("sp-pass").exists


def test_engine_selection_rejects_unknown_versions():
    from tpplan.errors import TpplanError

    assert select("sglang").key == "sglang@0.5.23" and select("VLLM").key == "vllm@0.33.0"
    with pytest.raises(TpplanError, match=r"sglang@0\.5\.23"):
        select("sglang@0.4.0")


def test_docs_engines_md_is_rendered_from_the_data():
    from pathlib import Path

    from tpplan.engines.doc import render

    doc = Path(__file__).resolve().parents[2] / "docs" / "engines.md"
    assert doc.read_text() == render(), "stale docs/engines.md: run `python -m tpplan.engines.doc > docs/engines.md`"
    assert "RS(hidden) + AG(QKV latent) + AR(hidden)" in render()
