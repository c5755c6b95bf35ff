"""The serving loop (`tpplan.simulate.loop`) on hand-worked cases, and against today's closed-loop scheduler."""

from __future__ import annotations

import random
import statistics

import pytest

from tpplan.cost.workload import Workload, simulate_pipeline
from tpplan.errors import TpplanError
from tpplan.mesh import Mesh
from tpplan.simulate.loop import LoopConfig, simulate
from tpplan.simulate.prices import CachedPrices
from tpplan.simulate.requests import ClosedLoop, Request, Shape, Timed, closed_loop, poisson
from tpplan.simulate.results import percentile


def per_100_tokens(stages: int = 1):  # type: ignore[no-untyped-def]
    """Each stage takes 1 s per 100 new tokens of the step."""
    return lambda segs: [sum(n for n, _ in segs) / 100] * stages


def one(prompt: int, cached: int = 0, at: float = 0.0) -> Timed:
    return Timed((Request(0, at, prompt, 1, cached),))


def test_one_request_pays_every_overhead_once() -> None:
    cfg = LoopConfig(1000, step_overhead_s=0.05, request_in_s=0.1, request_out_s=0.2)
    r = simulate(one(100, at=3.0), per_100_tokens(), cfg)
    (t,) = r.timelines
    assert t.ttft_s == pytest.approx(0.1 + 0.05 + 1.0 + 0.2)
    assert (t.queued_s, t.first_step_s, t.wait_s) == pytest.approx((3.1, 3.1, 0.0))
    assert r.p(99) == r.mean_s == t.ttft_s and r.queue_share == 0.0


def test_two_chunks_run_one_after_another_the_second_reading_the_first_as_context() -> None:
    r = simulate(one(300), per_100_tokens(), LoopConfig(200))
    assert [tuple((s.n_tokens, s.start_pos) for s in b.segments) for b in r.steps] == [((200, 0),), ((100, 200),)]
    assert r.timelines[0].ttft_s == pytest.approx(3.0)


def test_a_cached_prefix_is_context_and_costs_no_compute() -> None:
    seen = []
    r = simulate(one(300, cached=200), lambda segs: seen.append(segs) or [1.0], LoopConfig(1000))
    assert seen == [((100, 200),)] and r.prefill_tokens == 100


@pytest.mark.parametrize(("overlap", "ttft"), [(True, 6.0), (False, 8.0)])
def test_two_pp_stages_pipeline_the_chunks_of_one_prompt_only_when_the_engine_does(overlap: bool, ttft: float) -> None:
    """400 tokens in chunks of 200 over 2 stages of 2 s a chunk: (C + P - 1) x 2 s = 6 s pipelined;
    8 s when the second chunk waits for the first to leave the last stage."""
    r = simulate(one(400), per_100_tokens(2), LoopConfig(200, in_flight=2, chunks_overlap=overlap))
    assert r.timelines[0].ttft_s == pytest.approx(ttft)


def test_in_flight_caps_the_steps_in_the_pipeline() -> None:
    """Four 100-token requests at t = 0, chunk 100, 2 stages of 1 s: with 2 in flight the steps start
    at 0, 1, 2, 3 (each stage-0 exit); with 1 in flight at 0, 2, 4, 6 (each last-stage exit)."""
    reqs = closed_loop(4, [Shape(100)], 4)
    two = simulate(reqs, per_100_tokens(2), LoopConfig(100, in_flight=2))
    single = simulate(reqs, per_100_tokens(2), LoopConfig(100, in_flight=1))
    assert [b.start_s for b in two.steps] == [0, 1, 2, 3] and [b.start_s for b in single.steps] == [0, 2, 4, 6]
    assert single.ttfts == [2, 4, 6, 8] and single.queue_share == pytest.approx((0 + 2 + 4 + 6) / 20)


def test_requests_share_a_step_first_come_first_served_and_the_split_one_goes_first_next() -> None:
    reqs = Timed((Request(0, 0.0, 150), Request(1, 0.0, 100), Request(2, 0.0, 30)))
    r = simulate(reqs, per_100_tokens(), LoopConfig(200))
    assert [[(s.request_id, s.start_pos, s.n_tokens) for s in b.segments] for b in r.steps] == [
        [(0, 0, 150), (1, 0, 50)],
        [(1, 50, 50), (2, 0, 30)],
    ]
    assert r.ttfts == pytest.approx([2.0, 2.8, 2.8])


def test_replicas_take_requests_round_robin_and_run_apart() -> None:
    reqs = closed_loop(2, [Shape(100)], 4)
    r = simulate(reqs, per_100_tokens(), LoopConfig(100), Mesh(1, replicas=2))
    assert [t.replica for t in r.timelines] == [0, 1, 0, 1] and r.ttfts == [1.0] * 4
    assert simulate(reqs, per_100_tokens(), LoopConfig(100)).ttfts == [1.0, 2.0, 2.0, 2.0]
    with pytest.raises(TpplanError, match="replicas=3"):
        simulate(reqs, per_100_tokens(), LoopConfig(100), Mesh(1, replicas=3))


def test_a_closed_loop_client_sends_when_its_first_token_arrives() -> None:
    cfg = LoopConfig(1000, request_in_s=0.5, request_out_s=0.25)
    r = simulate(ClosedLoop(1, (Request(0, 0.0, 100), Request(1, 0.0, 100))), per_100_tokens(), cfg)
    assert [t.arrival_s for t in r.timelines] == [0.0, 1.75] and r.ttfts == [1.75, 1.75]


def _linear_stages(coef: list[tuple[int, int]]):  # type: ignore[no-untyped-def]
    return lambda tokens: [a + tokens / k for a, k in coef]


def test_the_loop_agrees_with_todays_closed_loop_scheduler_without_overheads() -> None:
    """`cost.workload.simulate_pipeline` (the scheduler audit/search price today) on random small
    closed loops: the same TTFT for every request."""
    rng = random.Random(7)
    for _ in range(60):
        lens = [rng.randint(1, 40) for _ in range(rng.randint(1, 4))]
        c, n, chunk, stages = rng.randint(1, 5), rng.randint(1, 12), rng.randint(1, 30), rng.randint(1, 3)
        m, overlap = rng.randint(1, stages + 1), rng.random() < 0.5
        coef = [(rng.randint(0, 3), rng.randint(1, 5)) for _ in range(stages)]
        wl = Workload(input_lens=lens, concurrency=c, num_requests=n, chunk_size=chunk)
        linear = _linear_stages(coef)
        old = simulate_pipeline(wl, lambda b, f=linear: f(b.n_tokens), in_flight=m, chunks_overlap=overlap)
        arrivals = closed_loop(c, [Shape(x) for x in lens], n)
        new = simulate(arrivals, lambda segs, f=linear: f(sum(x for x, _ in segs)), LoopConfig(chunk, m, overlap))
        assert new.ttfts == pytest.approx(list(old.ttft_s), abs=1e-9)


def test_poisson_is_deterministic_per_seed_and_refuses_bad_rates() -> None:
    shapes = [Shape(100)]
    a, b, c = poisson(5.0, shapes, 50, seed=1), poisson(5.0, shapes, 50, seed=1), poisson(5.0, shapes, 50, seed=2)
    assert a == b and a != c
    times = [r.arrival_s for r in a.requests]
    assert times == sorted(times) and 2.5 < 49 / times[-1] < 10  # about 5 per second
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(TpplanError, match="arrival_rate"):
            poisson(bad, shapes, 5)


def test_queueing_shows_in_the_tail_at_a_rate_near_capacity() -> None:
    """1 s per 100-token request: at 0.5 req/s the p99 stays near 1 s more often than at 0.95 req/s."""
    light = simulate(poisson(0.5, [Shape(100)], 400, seed=3), per_100_tokens(), LoopConfig(100))
    heavy = simulate(poisson(0.95, [Shape(100)], 400, seed=3), per_100_tokens(), LoopConfig(100))
    assert light.p(50) == pytest.approx(1.0) and heavy.p(99) > 3 * light.p(99) and heavy.queue_share > 0.5


def test_percentiles_interpolate_like_the_inclusive_quantiles() -> None:
    vals = [5.0, 1.0, 4.0, 2.0, 10.0]
    qs = statistics.quantiles(vals, n=100, method="inclusive")
    assert [percentile(vals, q) for q in (50, 90, 99)] == pytest.approx([qs[49], qs[89], qs[98]])
    assert percentile(vals, 50) == statistics.median(vals) and percentile([3.0], 99) == 3.0


def test_cached_prices_ask_once_per_step_shape() -> None:
    calls = []
    prices = CachedPrices(lambda segs: calls.append(segs) or [1.0])
    simulate(closed_loop(1, [Shape(100)], 20), prices, LoopConfig(100))
    assert len(calls) == 1 and prices.distinct_steps == 1


def test_bad_prices_and_configs_name_the_input() -> None:
    with pytest.raises(TpplanError, match="stage prices"):
        simulate(one(10), lambda segs: [-1.0], LoopConfig(10))
    with pytest.raises(TpplanError, match="chunk_tokens=0"):
        LoopConfig(0)
    with pytest.raises(TpplanError, match="overheads"):
        LoopConfig(10, request_in_s=-0.1)


def test_replicas_report_their_shares_as_the_cost_model_does() -> None:
    reqs = closed_loop(4, [Shape(100), Shape(300)], 8)
    res = simulate(reqs, per_100_tokens(), LoopConfig(1000), Mesh(1, replicas=2))
    shares = res.as_ttft().replicas
    assert [(s.requests, s.concurrency, s.prefill_tokens) for s in shares] == [(4, 2, 400), (4, 2, 1200)]
    # replica 0: two 100-token prompts per 2 s step, twice; replica 1: two 300-token prompts per 6 s step, twice
    assert [(s.mean_s, s.makespan_s) for s in shares] == [(2.0, 4.0), (6.0, 12.0)]
    assert simulate(reqs, per_100_tokens(), LoopConfig(1000)).shares == ()
