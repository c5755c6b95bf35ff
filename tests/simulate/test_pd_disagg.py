"""P/D deployments on real step prices (tiny-llama on one H200 node): the bound, what binds, the served
result, and the ratio choice against brute force (every ratio simulated)."""

from __future__ import annotations

import functools
import math

import pytest

from tpplan.cost.pipeline import pipeline_model
from tpplan.cost.predictor import Predictor, cached_predictor
from tpplan.cost.topology import load_topology
from tpplan.errors import TpplanError
from tpplan.mesh import Mesh
from tpplan.models.config import load_model
from tpplan.models.graph import build_model_graph
from tpplan.plans.named import make_plan
from tpplan.simulate.disagg import (
    DisaggDeployment,
    PoolSpec,
    _output_rate,
    capacity,
    choose_ratio,
    handoff_seconds,
    ratios,
    serve_disaggregated,
)
from tpplan.simulate.pd import kv_bytes_per_rank
from tpplan.simulate.requests import Shape, poisson


@functools.cache
def mesh(tp: int, engine: str = "sglang@0.5.23", nodes: int = 1) -> Predictor:
    graph = build_model_graph(load_model("tiny-llama"))
    topo = load_topology("h200x8-ib400", nodes=nodes) if nodes > 1 else load_topology("h200x8-ib400")
    return cached_predictor(graph, make_plan("baseline", graph, tp), topo, Mesh(tp, pp=1), "bf16", None,
                            pipeline=pipeline_model(engine))  # fmt: skip


ARR = poisson(400.0, [Shape(2000, 64), Shape(6000, 32)], 120, seed=3)


def test_the_bound_names_the_lowest_side_and_scales_with_instances() -> None:
    dep = DisaggDeployment(PoolSpec(mesh(1), 1), PoolSpec(mesh(2), 1))
    cap = capacity(dep, ARR)
    sides = cap.sides(1, 1)
    assert cap.binding(1, 1) == min(sides, key=sides.__getitem__)
    assert cap.sides(3, 2) == pytest.approx({"prefill": 3 * sides["prefill"], "decode": 2 * sides["decode"],
                                             "transfer": 3 * sides["transfer"]})  # fmt: skip
    assert cap.of(3, 2) == min(cap.sides(3, 2).values())


def test_a_tpot_target_shrinks_the_decode_batch_to_the_steps_within_it() -> None:
    dep = DisaggDeployment(PoolSpec(mesh(1), 1), PoolSpec(mesh(1), 1))
    free = capacity(dep, ARR)
    tight = capacity(dep, ARR, tpot_s=free.decode_step_s / 2)
    assert tight.decode_batch < free.decode_batch and tight.decode_step_s <= free.decode_step_s / 2
    assert tight.decode_rps < free.decode_rps
    # one more request per step would break the target: the bisection found the largest batch
    bigger = capacity(dep, ARR, tpot_s=free.decode_step_s / 2 * 1.5)
    assert bigger.decode_batch > tight.decode_batch


def test_the_handoff_is_the_larger_share_per_rank_on_one_link() -> None:
    wide = DisaggDeployment(PoolSpec(mesh(1), 1), PoolSpec(mesh(2), 1))
    assert kv_bytes_per_rank(mesh(1), 4000) == pytest.approx(2 * kv_bytes_per_rank(mesh(2), 4000))  # 2 KV heads
    narrow = DisaggDeployment(PoolSpec(mesh(2), 1), PoolSpec(mesh(1), 1))
    assert handoff_seconds(wide, 4000) == pytest.approx(handoff_seconds(narrow, 4000))  # the TP1 side's share
    both = DisaggDeployment(PoolSpec(mesh(2), 1), PoolSpec(mesh(2), 1))
    assert handoff_seconds(both, 4000) < handoff_seconds(wide, 4000)


@pytest.mark.parametrize("engine", ["sglang@0.5.23", "vllm@0.34.0"])
def test_serving_a_p_d_deployment_reports_ttft_tpot_and_what_binds(engine: str) -> None:
    dep = DisaggDeployment(PoolSpec(mesh(1, engine), 2), PoolSpec(mesh(2, engine), 1))
    got = serve_disaggregated(dep, ARR)
    js = got.to_json()
    assert js["ratio"] == "2:1" and js["gpus"] == 4 and js["engine"] == engine
    dec = js["decode_summary"]
    assert isinstance(dec, dict) and dec["output_tokens"] == sum(r.output_tokens for r in ARR.requests)
    assert dec["tpot_s"]["p50"] > 0 and dec["output_tok_s_per_gpu"] == pytest.approx(dec["output_tok_s"] / 4)
    assert js["binding"] in ("prefill", "decode", "transfer") and str(js["binding"]) in str(js["binding_text"])
    ttft = js["ttft"]
    assert isinstance(ttft, dict)
    # every first token waits at least for its prefill and its KV hand-off
    least = min(handoff_seconds(dep, r.prompt_tokens) for r in ARR.requests)
    assert min(got.result.ttfts) > least
    assert all(t.first_token_s >= t.prefill_end_s + least for t in got.result.timelines)
    assert any("disaggregation" in s or "nixl" in s for s in js["sources"])  # type: ignore[union-attr]


def test_mixed_engines_and_too_many_gpus_are_refused() -> None:
    with pytest.raises(TpplanError, match="engines="):
        DisaggDeployment(PoolSpec(mesh(1), 1), PoolSpec(mesh(1, "vllm@0.34.0"), 1))
    with pytest.raises(TpplanError, match="needs 33 GPUs"):  # four nodes of 8
        DisaggDeployment(PoolSpec(mesh(1), 25), PoolSpec(mesh(2), 4))
    with pytest.raises(TpplanError, match="gpus and rate"):
        choose_ratio(PoolSpec(mesh(1)), PoolSpec(mesh(1)), ARR)


def test_for_a_rate_the_fewest_gpus_whose_bound_carries_it() -> None:
    pre, dec = PoolSpec(mesh(1)), PoolSpec(mesh(2))
    one = DisaggDeployment(pre, dec)
    cap = capacity(one, ARR)
    rate = 2.5 * min(cap.prefill_rps, cap.decode_rps)
    got = choose_ratio(pre, dec, ARR, rate=rate)
    n_p, n_d = got.chosen.prefill.instances, got.chosen.decode.instances
    assert cap.of(n_p, n_d) >= rate
    assert cap.of(n_p - 1, n_d) < rate or n_p == 1
    assert cap.of(n_p, n_d - 1) < rate or n_d == 1


@pytest.mark.slow
def test_the_chosen_ratio_is_the_brute_force_best_on_a_gpu_budget() -> None:
    """Every ratio of TP1 prefill and TP1 decode instances on 5 GPUs, each simulated at an arrival rate
    past any of them: the choice serves within 3% of the best output rate, on fewer or as many GPUs."""
    pre, dec = PoolSpec(mesh(1)), PoolSpec(mesh(1))
    one = DisaggDeployment(pre, dec)
    cap = capacity(one, ARR)
    heavy = poisson(3 * 4 * max(cap.prefill_rps, cap.decode_rps), [Shape(2000, 64), Shape(6000, 32)], 160, seed=1)
    every = {(p, d): _output_rate(serve_disaggregated(one.with_ratio(p, d), heavy)) for p, d in ratios(one, 5)}
    assert len(every) == 10
    best = max(every.values())
    got = choose_ratio(pre, dec, heavy, gpus=5)
    key = (got.chosen.prefill.instances, got.chosen.decode.instances)
    assert every[key] >= 0.97 * best
    assert not math.isclose(min(every.values()), best, rel_tol=0.1)  # the ratio matters on this workload


@pytest.mark.slow
def test_for_a_rate_the_chosen_ratio_keeps_up_and_one_fewer_does_not() -> None:
    """Poisson at 1.5x one prefill instance's bound: the chosen ratio's TTFT stays flat from the first
    quarter of the requests to the last; with one prefill instance fewer the queue grows."""
    pre, dec = PoolSpec(mesh(1)), PoolSpec(mesh(1))
    one = DisaggDeployment(pre, dec)
    shapes = [Shape(3000, 48)]
    rate = 1.5 * capacity(one, poisson(1.0, shapes, 10)).prefill_rps
    arr = poisson(rate, shapes, 2000, seed=2)
    got = choose_ratio(pre, dec, arr, rate=rate)
    assert got.binding == "prefill" and got.chosen.prefill.instances == 2

    def growth(n_p: int, n_d: int) -> float:
        ttfts = serve_disaggregated(one.with_ratio(n_p, n_d), arr).result.ttfts
        q = len(ttfts) // 4
        return sum(ttfts[-q:]) / sum(ttfts[:q])

    assert growth(2, got.chosen.decode.instances) < 1.5  # 1.03 when written
    assert growth(1, got.chosen.decode.instances) > 3  # 4.6 when written


def test_a_trace_of_many_lengths_is_bounded_on_a_grid_of_few_shapes() -> None:
    """300 distinct prompt lengths: the bound prices a few dozen grid shapes and stays within the grid's
    spacing of the exact mix's (prefill seconds per request grow with the prompt)."""
    from tpplan.simulate.disagg import MAX_SHAPES, _shapes
    from tpplan.simulate.requests import Request, Timed

    many = Timed(tuple(Request(i, 0.0, 3000 + 7 * i, 40) for i in range(300)))
    grid = _shapes(many)
    assert len(grid) < MAX_SHAPES and sum(grid.values()) == 300
    assert all(p <= 3000 + 7 * 299 and p >= 0.95 * 3000 for p, _, _ in grid)
    dep = DisaggDeployment(PoolSpec(mesh(1), 1), PoolSpec(mesh(1), 1))
    few = Timed(tuple(Request(i, 0.0, 3000 + 7 * (i * 300 // 60), 40) for i in range(60)))  # <= 64 shapes: exact
    assert capacity(dep, many).prefill_rps == pytest.approx(capacity(dep, few).prefill_rps, rel=0.06)


def test_the_pools_cache_keys_on_the_predictors_values_not_their_identity() -> None:
    """Two predictors built apart from equal inputs share one entry of the pools' cache; a model whose key is
    the same (layer kinds, width) but whose MLP is wider gets its own, priced on its own graph."""
    from dataclasses import replace

    from tpplan.simulate import disagg

    spec = load_model("tiny-llama")
    topo = load_topology("h200x8-ib400")

    def fresh(intermediate: int) -> Predictor:
        mlp = replace(spec.layers[0].mlp, intermediate=intermediate)
        graph = build_model_graph(replace(spec, layers=tuple(replace(la, mlp=mlp) for la in spec.layers)))
        return Predictor(graph, make_plan("baseline", graph, 1), topo, Mesh(1, pp=1), "bf16", None,
                         pipeline=pipeline_model("sglang@0.5.23"))  # fmt: skip

    a, b, wide = fresh(96), fresh(96), fresh(96 * 64)
    assert a is not b and a.key == b.key == wide.key and a.graph != wide.graph
    first = disagg._pools(DisaggDeployment(PoolSpec(a, 1), PoolSpec(a, 1)))
    assert disagg._pools(DisaggDeployment(PoolSpec(b, 1), PoolSpec(b, 1))) is first
    other = disagg._pools(DisaggDeployment(PoolSpec(wide, 1), PoolSpec(wide, 1)))
    assert other is not first and other.built_from == (wide, wide)
    segs = ((2048, 0),)
    assert other.prefill_prices(segs)[0] > first.prefill_prices(segs)[0]  # priced on the wider MLP
