"""The serving loop on real step prices: an engine's loop settings from its data, and the fixed costs."""

from __future__ import annotations

import functools

import pytest

from tpplan.cost.pipeline import pipeline_model
from tpplan.cost.predict import pipeline_ttft
from tpplan.cost.predictor import Predictor, cached_predictor
from tpplan.cost.topology import load_topology
from tpplan.cost.workload import Workload
from tpplan.engines import ENGINES, scheduler_rules
from tpplan.errors import TpplanError
from tpplan.mesh import Mesh
from tpplan.models.config import load_model
from tpplan.models.graph import build_model_graph
from tpplan.plans.named import make_plan
from tpplan.simulate.engine import cpu_overlaps, engine_loop, serve, workload_arrivals
from tpplan.simulate.overheads import REQUEST_ROUND_TRIP, STEP_CPU, STEP_CPU_OVERLAPPED
from tpplan.simulate.requests import Request, Timed


@functools.cache
def predictor(tp: int, pp: int, replicas: int = 1, engine: str = "sglang@0.5.23") -> Predictor:
    graph = build_model_graph(load_model("tiny-llama"))
    topo = load_topology("h200x8-ib400")  # one node of 8
    return cached_predictor(
        graph,
        make_plan("baseline", graph, tp),
        topo,
        Mesh(tp, pp=pp, replicas=replicas),
        "bf16",
        None,
        pipeline=pipeline_model(engine),
    )


@pytest.mark.parametrize(("tp", "pp", "replicas"), [(2, 1, 1), (1, 2, 1), (1, 1, 2), (1, 2, 2)])
@pytest.mark.parametrize("engine", ["sglang@0.5.23", "vllm@0.33.0"])
def test_without_fixed_costs_the_loop_prices_ttft_as_the_cost_model_does(tp, pp, replicas, engine) -> None:  # type: ignore[no-untyped-def]
    p = predictor(tp, pp, replicas, engine)
    wl = Workload(input_lens=[3000, 700, 5000], concurrency=4, num_requests=9, chunk_size=2048, cached_share=0.3)
    loop = engine_loop(p.pipeline, p.deployment, wl.chunk_size, 8, fixed_costs=False)
    # over replicas both run the deployment's request router (SGLang round-robin, vLLM least-loaded), which on
    # these mixed prompts is not the split dealt beforehand (tests/cost/test_routed_replicas.py)
    got = serve(p, workload_arrivals(wl), loop)
    assert got.ttfts == pytest.approx(list(pipeline_ttft(p, wl).ttft_s), rel=1e-12)


def test_a_short_prompt_gets_the_fixed_costs_as_its_floor() -> None:
    p = predictor(2, 1)
    one = Timed((Request(0, 0.0, 16),))
    bare = serve(p, one, engine_loop(p.pipeline, p.deployment, 8192, 8, fixed_costs=False)).mean_s
    loop = engine_loop(p.pipeline, p.deployment, 8192, 8)
    assert loop.costs.cpu_overlap and loop.costs.step_s == STEP_CPU_OVERLAPPED.value_s
    got = serve(p, one, loop).mean_s
    assert got == pytest.approx(bare + REQUEST_ROUND_TRIP.value_s + STEP_CPU_OVERLAPPED.value_s)
    assert got > 5 * bare  # tiny model: the fixed costs dominate a 16-token prompt


def test_which_deployments_overlap_the_scheduler_with_the_gpu() -> None:
    sgl, vll = scheduler_rules("sglang@0.5.23"), scheduler_rules("vllm@0.33.0")
    assert cpu_overlaps(sgl, Mesh(8), 8) and not cpu_overlaps(sgl, Mesh(8, pp=2), 8)
    # vLLM keeps async scheduling under the Ray executor of a two-node replica (RayExecutorV2 is a MultiprocExecutor)
    assert cpu_overlaps(vll, Mesh(4, pp=2), 8) and cpu_overlaps(vll, Mesh(8, pp=2), 8)
    p = predictor(1, 2)
    assert engine_loop(p.pipeline, p.deployment, 8192, 8).costs.step_s == STEP_CPU.value_s


def test_engine_rules_cite_a_read_source_and_derive_the_budget_by_gpu() -> None:
    stated = {key: ev.scheduling for key, ev in ENGINES.items() if ev.scheduling is not None}
    assert set(stated) >= {"sglang@0.5.23", "vllm@0.33.0", "vllm@0.34.0"}
    for key, rules in stated.items():
        assert all(f.source.read and key.split("@")[1] in f.source.ref for f in rules.facts())
    sgl, vll = stated["sglang@0.5.23"].budget, stated["vllm@0.34.0"].budget
    assert [sgl.default_tokens(g) for g in (16, 24, 48, 80, 141, 180)] == [2048, 4096, 4096, 8192, 8192, 16384]
    assert [vll.default_tokens(g) for g in (48, 80, 141, 192)] == [2048, 8192, 8192, 16384]
    assert vll.default_tokens(80, "NVIDIA A100-SXM4-80GB") == 2048
    with pytest.raises(TpplanError, match=r"engine=vllm@0\.1"):
        scheduler_rules("vllm@0.1")


def test_the_cost_model_doc_states_the_fixed_costs_as_the_data_does() -> None:
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "cost-model.md").read_text()
    for m in (REQUEST_ROUND_TRIP, STEP_CPU, STEP_CPU_OVERLAPPED):
        assert f"- {m.quantity}: {m.cite()}" in doc


def test_a_workload_s_cached_share_starts_each_prompt_past_its_cached_prefix() -> None:
    p = predictor(2, 1)
    cold = Workload(input_len=4000, concurrency=2, chunk_size=8192)
    warm = cold.with_overrides("test", cached_share=0.75)
    res = pipeline_ttft(p, warm)
    assert [(s.start_pos, s.n_tokens) for b in res.batches for s in b.segments] == [(3000, 1000)] * 2
    assert res.mean_s < pipeline_ttft(p, cold).mean_s


def test_the_serving_summary_brackets_its_ttft_with_the_fixed_costs_band(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from tpplan.simulate.serving import Arrival, arrivals_for, serving_summary

    p = predictor(1, 2, 2)
    wl = Workload(input_lens=[300, 2000], concurrency=4, chunk_size=1024)
    closed = arrivals_for(Arrival(requests=10), wl)
    rate = arrivals_for(Arrival(rate=50.0, requests=30, seed=3), wl)
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens\n0,100\n0.01,900\n")
    assert (
        len(closed.requests) == 10
        and len(rate.requests) == 30
        and len(arrivals_for(Arrival(trace=str(trace)), None).requests) == 2
    )
    res, out = serving_summary(p, rate, wl.chunk_size, 8, per_request=True)
    ttft, band = out["ttft"], out["ttft_band"]
    assert isinstance(ttft, dict) and isinstance(band, dict)
    for key in ("mean_s", "p50_s", "p90_s", "p99_s"):
        assert band[key][0] < ttft[key] < band[key][1]
    assert out["idealised_mean_s"] < ttft["mean_s"] == res.mean_s
    assert out["settings"]["in_flight"] == 2 and len(out["requests"]) == 30  # type: ignore[index]
    assert any("prefill first" in c or "decode" in c for c in out["conditions"])  # type: ignore[union-attr]
    with pytest.raises(TpplanError, match=r"arrival_rate=1 and trace=x\.csv: are two arrival processes"):
        Arrival(rate=1.0, trace="x.csv")
    with pytest.raises(TpplanError, match="requests=0"):
        Arrival(requests=0)
    with pytest.raises(TpplanError, match="arrival_rate=1: a closed loop or a rate takes its prompts from a workload"):
        arrivals_for(Arrival(rate=1.0), None)
    with pytest.raises(TpplanError, match="context of 500"):
        arrivals_for(Arrival(trace=str(trace)), None, max_context=500)


def test_with_serving_loop_replaces_the_ttft_by_the_loop_s_and_names_its_conditions() -> None:
    from tpplan.cost.predict import predict_plan
    from tpplan.simulate.serving import with_serving_loop

    p = predictor(1, 2)
    wl = Workload(input_lens=[3000, 700], concurrency=3, num_requests=6, chunk_size=2048)
    args = (p.graph, p.plan, p.topo)
    kw = {"mesh": Mesh(1, pp=2), "workload": wl, "tokens": 2048, "pipeline": pipeline_model("sglang@0.5.23")}
    bare = predict_plan(*args, **kw)
    looped = with_serving_loop(predict_plan)(*args, **kw)
    loop = engine_loop(p.pipeline, p.deployment, 2048, p.topo.gpus_per_node)
    assert looped.ttft is not None and bare.ttft is not None and looped.forward_s == bare.forward_s
    assert looped.ttft.mean_s == serve(p, workload_arrivals(wl), loop).mean_s > bare.ttft.mean_s
    words = looped.serving_conditions
    assert words == loop.conditions(figures=False) and not any(ch.isdigit() for ch in words[-1])
    assert any("Pipeline parallelism" in c for c in words) and not bare.serving_conditions
