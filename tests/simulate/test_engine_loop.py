"""The serving loop on real step prices: an engine's loop settings from its data, and the fixed costs."""

from __future__ import annotations

import functools

import pytest

from tpplan.cost.deployment import Deployment
from tpplan.cost.pipeline import pipeline_model
from tpplan.cost.predict import pipeline_ttft
from tpplan.cost.predictor import Predictor, cached_predictor
from tpplan.cost.topology import load_topology
from tpplan.cost.workload import Workload
from tpplan.engines.scheduling import RULES, scheduler_rules
from tpplan.errors import TpplanError
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
    return cached_predictor(graph, make_plan("baseline", graph, tp), topo, tp, pp, "bf16", None,
                            pipeline=pipeline_model(engine), replicas=replicas)  # fmt: skip


@pytest.mark.parametrize(("tp", "pp", "replicas"), [(2, 1, 1), (1, 2, 1), (1, 1, 2), (1, 2, 2)])
@pytest.mark.parametrize("engine", ["sglang@0.5.23", "vllm@0.33.0"])
def test_without_fixed_costs_the_loop_prices_ttft_as_the_cost_model_does(tp, pp, replicas, engine) -> None:  # type: ignore[no-untyped-def]
    p = predictor(tp, pp, replicas, engine)
    wl = Workload(input_lens=[3000, 700, 5000], concurrency=4, num_requests=9, chunk_size=2048)
    loop = engine_loop(p.pipeline, p.deployment, wl.chunk_size, 8, fixed_costs=False)
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
    assert cpu_overlaps(sgl, Deployment(8), 8) and not cpu_overlaps(sgl, Deployment(8, pp=2), 8)
    assert cpu_overlaps(vll, Deployment(4, pp=2), 8) and not cpu_overlaps(vll, Deployment(8, pp=2), 8)
    p = predictor(1, 2)
    assert engine_loop(p.pipeline, p.deployment, 8192, 8).costs.step_s == STEP_CPU.value_s


def test_engine_rules_cite_a_read_source_and_derive_the_budget_by_gpu() -> None:
    for rules in RULES.values():
        facts = [rules.budget.fact, rules.admission, rules.prefill_decode, rules.cpu_overlap_fact, rules.graph_fact,
                 rules.max_running, *rules.more]  # fmt: skip
        assert all(f.source.read and rules.key.split("@")[1] in f.source.ref for f in facts)
    sgl, vll = RULES["sglang@0.5.23"].budget, RULES["vllm@0.34.0"].budget
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
