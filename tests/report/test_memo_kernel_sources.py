"""The memo shows how its answer depends on the kernel-price source (issue 33, item 2): today's
deployment and the bottom line's target priced from the GPU model's own kernels and from each
engine's tables, the memo's source named with its reason, and a sentence in the answer where the
sources disagree by more than their bands."""

from __future__ import annotations

from dataclasses import replace
from functools import cache

import pytest

from tpplan.cost.topology import load_topology
from tpplan.cost.workload import load_workload
from tpplan.report.analysis import analyse, load_predictor
from tpplan.report.kernel_sources import KernelSensitivity, SourceAnswer
from tpplan.report.memo_ask import MemoAsk
from tpplan.report.prose import answer
from tpplan.search.grid import MeshAsk


def _sens(*answers: SourceAnswer) -> KernelSensitivity:
    return KernelSensitivity("baseline", ("sp-moe",), "w", "default", answers, "reason")


def test_a_gpu_model_without_engine_tables_says_why_not_compared() -> None:
    a = analyse(
        "tiny-deepseek-v3", load_topology("h200x2"), [load_workload("prompt16k-c8")], MemoAsk(prompt_lengths=None)
    )
    ks = a.kernel_sources
    assert ks is not None and ks.sources == ["default"]
    assert any("names no kernel-database system" in x for x in ks.skipped) and ks.sentence() is None


def test_sources_disagree_only_beyond_both_bands() -> None:
    mine = SourceAnswer("default", "own", "sp-moe", 6.0, 3.3, 0.08)  # -45%
    near = SourceAnswer("trtllm", "trt", "sp-moe", 4.8, 2.5, 0.33)  # -48%: inside the bands
    far = SourceAnswer("sglang", "sgl", "sp-moe", 4.5, 5.9, 0.28)  # +31%: 76 points apart, bands sum to 36
    edge = SourceAnswer("vllm", "vl", "sp-moe", 1.0, 0.45 + 0.08 + 0.2, 0.2)  # exactly the bands apart: agrees
    s = _sens(mine, near, far, edge)
    assert s.disagreeing() == [far]
    assert s.sentence() is not None and "+31.1%" in s.sentence() and "sgl" in s.sentence()
    assert _sens(mine, near).sentence() is None


def test_a_dispute_over_another_plan_does_not_change_the_bottom_line() -> None:
    """The bottom line's plan (the first target) agreed on by every source, another plan at today's shape
    disputed: the sentence says the bottom line stands and which plan the source decides, not that it changes
    the answer (the DeepSeek-V3 2x8 memo said 'changes this answer' of a plan it did not recommend)."""
    agreed = [SourceAnswer("default", "own", "sp-moe TP4xPP4", 1.7, 0.68, 0.2),  # -61%
              SourceAnswer("sglang", "sgl", "sp-moe TP4xPP4", 1.6, 1.3, 0.28)]  # -21%: inside both bands  # fmt: skip
    disputed = [SourceAnswer("default", "own", "sp-moe", 1.7, 1.28, 0.2),  # -25%
                SourceAnswer("sglang", "sgl", "sp-moe", 1.6, 2.8, 0.28)]  # +75%  # fmt: skip
    s = KernelSensitivity("baseline", ("sp-moe TP4xPP4", "sp-moe"), "w", "default", (*agreed, *disputed), "reason")
    said = s.sentence()
    assert said is not None and "changes this answer" not in said
    assert "does not change the bottom line** (`sp-moe TP4xPP4`" in said and "`sp-moe` against `baseline`" in said
    flipped = KernelSensitivity("baseline", ("sp-moe",), "w", "default", tuple(disputed), "reason")
    assert "changes this answer" in (flipped.sentence() or "")


@cache
def _tiny():
    topo, wl = load_topology("h200x8-ib400", nodes=1), load_workload("prompt16k-c8")
    return topo, wl, analyse("tiny-deepseek-v3", topo, [wl], MemoAsk(deployment=MeshAsk(tp=2), prompt_lengths=None))


@pytest.mark.slow
def test_the_memo_prices_its_answer_from_every_source_with_each_engines_own_figures() -> None:
    pytest.importorskip("aiconfigurator_core")
    topo, wl, a = _tiny()
    ks = a.kernel_sources
    assert ks is not None and ks.chosen == "default"
    assert ks.sources == ["default", "sglang", "vllm", "trtllm"]
    cur = a.variant(ks.current)
    assert cur is a.current and a.bottom is not None
    predict = load_predictor()  # the memo's: predict_plan with the engine's serving loop
    for key in ks.targets:
        tgt = a.variant(key)
        assert tgt is not None
        own = ks.of(key, "default")
        assert own is not None and own.current_s == cur.predictions[wl.name].ttft.mean_s
        assert own.target_s == tgt.predictions[wl.name].ttft.mean_s
        for name in ks.sources[1:]:  # each engine's figure is the memo's predictor under that engine's tables
            s = ks.of(key, name)
            mesh = replace(tgt.parallel, cp_layers="all")  # as the memo prices it (report/kernel_sources.py)
            p = predict(a.graph, tgt.plan, topo, mesh=mesh, workload=wl, tokens=wl.chunk_size,
                        engine=name, audit=tgt.audit)  # fmt: skip
            assert s is not None and s.target_s == pytest.approx(p.ttft.mean_s, rel=1e-9), name
            assert f"aic:h200_sxm/{name}@" in p.provenance.label  # times say which tables priced them
    said = any("kernel-price source changes this answer" in p for p in answer(a))
    assert said == (ks.targets[0] in {s.target for s in ks.disagreeing()})


@pytest.mark.slow
def test_deepseek_v3_at_tp8_says_the_answer_flips_with_the_engines_tables() -> None:
    """The issue's case: the default kernels make sp-moe much faster than baseline, SGLang's tables slower."""
    pytest.importorskip("aiconfigurator_core")
    wl = load_workload("prompt16k-c8")
    a = analyse("deepseek-v3", load_topology("h200x8-ib400", nodes=1), [wl], MemoAsk(prompt_lengths=None))
    ks = a.kernel_sources
    assert ks is not None and ks.targets[0] == "sp-moe"
    own, sgl = ks.of("sp-moe", "default"), ks.of("sp-moe", "sglang")
    assert own is not None and sgl is not None
    assert own.change < -own.band and sgl.change > 0 and sgl in ks.disagreeing()
    assert any("kernel-price source changes this answer" in p for p in answer(a))


@pytest.mark.slow
def test_each_source_prices_a_cp_deployment_with_its_own_cp_layers_and_kv(monkeypatch) -> None:
    """Before: the engines' tables priced `search-1 TP4xCP2` (`--cp-layers mla`: CP inside the TP group, 4
    GPUs) as CP on every layer (8 GPUs) with the engines' KV, whatever the memo asked; every source now
    prices each deployment at the memo's own mesh (its CP layers, `--cp-kv`)."""
    pytest.importorskip("aiconfigurator_core")
    import tpplan.cost.predict as predict

    seen: list[tuple[str, object]] = []
    plain = predict.predict_plan

    def recording(graph, plan, topology, **kw):  # type: ignore[no-untyped-def]
        seen.append((topology.name, kw["mesh"]))
        return plain(graph, plan, topology, **kw)

    monkeypatch.setattr(predict, "predict_plan", recording)
    topo, wl = load_topology("h200x8-ib400", nodes=1), load_workload("prompt16k-c8")
    ask = MemoAsk(deployment=MeshAsk(tp=4, cp_layers="mla", cp_kv="sharded"), prompt_lengths=None)
    a = analyse("tiny-deepseek-v3", topo, [wl], ask)
    ks = a.kernel_sources
    assert ks is not None and "sglang" in ks.sources
    priced = {v.key: v for v in a.variants}
    cp = [t for t in ks.targets if priced[t].cp > 1]
    assert cp, ks.targets  # a CP deployment is among those every source prices
    engine_meshes = [m for name, m in seen if name.endswith(("/sglang", "/vllm", "/trtllm"))]
    for key in cp:
        want = replace(priced[key].parallel, cp_kv="sharded")
        assert want.cp_layers == "mla" and want.gpus == 4
        assert engine_meshes.count(want) >= 3, (key, engine_meshes)  # each engine's tables, at the memo's mesh
    assert all(m.cp_layers == "mla" and m.cp_kv == "sharded" for m in engine_meshes if m.cp > 1)


def test_the_way_to_price_from_the_narrowest_source_names_a_real_flag() -> None:
    """The GPU model's own kernel prices are what a memo without `--engine` uses: there is no flag to add."""
    from tpplan.report.kernel_sources import DEFAULT, rerun

    assert rerun(DEFAULT) == "rerun without `--engine`"
    assert rerun("vllm") == "rerun with `--engine vllm`"
