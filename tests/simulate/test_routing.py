"""The routers by hand (`tpplan.cost.routing`): round-robin, least-loaded with rotating ties (vLLM's DP
client), SGLang's cache-aware policy; and in the P/D loop, routing by load beating round-robin on TTFT when
the prompts are uneven, and vLLM's proxy picking the decode server when the prefill answers."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tpplan.cost.routing import Router
from tpplan.engines import ENGINES
from tpplan.engines.schema import RouterRule
from tpplan.mesh import Mesh
from tpplan.simulate.disagg_loop import SGLANG_RULE, VLLM_RULE, PoolLoop, router_sources, simulate_disaggregated
from tpplan.simulate.loop import LoopConfig
from tpplan.simulate.loop import simulate as simulate_dealt
from tpplan.simulate.replicas import simulate, simulate_routed
from tpplan.simulate.requests import ClosedLoop, Request, Timed


def req(i: int, prompt: int, cached: int = 0, prefix: str | None = None, t: float = 0.0) -> Request:
    return Request(i, t, prompt, 2, cached, prefix)


def test_round_robin_cycles() -> None:
    r = Router("round_robin", 3)
    assert [r.pick(req(i, 100)) for i in range(5)] == [0, 1, 2, 0, 1]


def test_least_loaded_fewest_in_flight_ties_rotate() -> None:
    """vLLM: all idle -> 0, 1, 2 (the scan start moves on each request); with 1 finished it gets the next;
    then all at 1, the scan starts at 1 and the first least-loaded from there is 1."""
    r = Router("least_loaded", 3)
    assert [r.pick(req(i, 100)) for i in range(3)] == [0, 1, 2]
    r.release(1)
    assert r.pick(req(3, 100)) == 1  # loads [1, 0, 1]
    assert r.pick(req(4, 100)) == 1  # loads [1, 1, 1], scan from 1
    assert r.load == [1, 2, 1]
    r.release(0)
    assert r.pick(req(5, 100)) == 0  # loads [0, 2, 1]: the least wherever the scan starts


def test_cache_aware_distinct_prompts_go_to_the_least_loaded() -> None:
    """sglang-router 0.3.2: a prompt no instance holds goes to the least-loaded instance, the first of the least
    at a tie (the smallest-tree rule of older commits is gone): idle -> 0, then 1; with 1's released, 1 again;
    at loads [1, 1], 0. Round-robin would give 0, 1, 0, 1."""
    r = Router("cache_aware", 2, SGLANG_RULE.router)
    assert [r.pick(req(0, 100)), r.pick(req(1, 5000))] == [0, 1]
    r.release(1)
    assert [r.pick(req(2, 5000)), r.pick(req(3, 10))] == [1, 0]


def test_cache_aware_follows_a_shared_prefix_above_the_threshold() -> None:
    """A prefix covering 80% of the prompt (> 0.3) goes back to its holder though another instance is less
    loaded; one covering 20% goes to the least-loaded instance."""
    r = Router("cache_aware", 2, SGLANG_RULE.router)
    assert r.pick(req(0, 100, 0, "a")) == 0
    assert r.pick(req(1, 100)) == 1
    assert r.pick(req(2, 500)) == 0  # loads [1, 1]: the first of the least
    assert r.pick(req(3, 100, 80, "a")) == 0  # 0 holds "a": 80 / 100 > 0.3, at loads [2, 1]
    assert r.pick(req(4, 100, 20, "a")) == 1  # 20 / 100 <= 0.3: the least loaded, at loads [3, 1]
    assert r.load == [3, 2]


def test_cache_aware_imbalanced_loads_go_to_the_least_loaded() -> None:
    """Four requests sharing prefix "a" (80%): by the prefix all go to 0; at balance_abs 1 the third sees loads
    [2, 0] imbalanced (2 - 0 > 1, 2 > 0 x 1.5) and goes to 1, the least loaded, which then holds "a" and keeps
    the fourth (loads [2, 1]: balanced); at the default thresholds (64, 1.5) all stay with 0."""
    shared = [req(0, 100, 0, "a"), *(req(i, 100, 80, "a") for i in (1, 2, 3))]
    tight = Router("cache_aware", 2, RouterRule("cache_aware", "cache_aware", False, (), balance_abs=1))
    assert [tight.pick(q) for q in shared] == [0, 0, 1, 1]
    default = Router("cache_aware", 2, SGLANG_RULE.router)
    assert [default.pick(q) for q in shared] == [0, 0, 0, 0]


def one_s_per_100(segs):  # type: ignore[no-untyped-def]
    return [sum(n for n, _ in segs) / 100]


def ten_ms_step(segs):  # type: ignore[no-untyped-def]
    return [0.01]


PRE2 = PoolLoop(one_s_per_100, LoopConfig(100), 2)
DEC1 = PoolLoop(ten_ms_step, LoopConfig(1000, decode=True), 1)


def test_least_loaded_beats_round_robin_on_ttft_with_uneven_prompts() -> None:
    """Two prefill instances, 1 s per 100 tokens, no hand-off time. A 400-token prompt and a 100-token one at
    t = 0, then 100-token prompts at 1.5 s and 1.6 s. Round-robin sends the third behind the long prompt
    (prefill ends 5 s: TTFT 3.5 s) and the fourth to the idle one (1 s); least-loaded sends the third to the
    idle instance (TTFT 1 s) and the fourth, at a tie of one in flight each with the scan starting at 1, after
    it (ends 3.5 s: 1.9 s). Mean TTFT: round-robin 9.5 / 4 = 2.375 s, least-loaded 7.9 / 4 = 1.975 s."""
    reqs = Timed((req(0, 400), req(1, 100), req(2, 100, t=1.5), req(3, 100, t=1.6)))
    rr = replace(SGLANG_RULE, router=None)
    ll = replace(SGLANG_RULE, router=RouterRule("least_loaded", "least_loaded", False, ()))

    def ttfts(rule):  # type: ignore[no-untyped-def]
        run = simulate_disaggregated(reqs, PRE2, DEC1, lambda r: 0.0, rule)
        return [t.ttft_s for t in run.result.timelines]

    assert ttfts(rr) == pytest.approx([4.0, 1.0, 3.5, 1.0])
    assert ttfts(ll) == pytest.approx([4.0, 1.0, 1.0, 1.9])


def test_sglang_cache_aware_with_distinct_prompts_at_once_is_round_robin() -> None:
    """All at t = 0, prompts 400, 100, 100, 100: loads 0, then 1 each, so the least-loaded rule alternates
    (ties to the first) and cache-aware equals round-robin here: the third waits behind the 400 (5 s). Mean
    TTFT 3.0 s either way (the smallest-tree rule of older router commits gave 2.5 s)."""
    reqs = Timed((req(0, 400), req(1, 100), req(2, 100), req(3, 100)))
    mean = {}
    for name, rule in (("rr", replace(SGLANG_RULE, router=None)), ("ca", SGLANG_RULE)):
        run = simulate_disaggregated(reqs, PRE2, DEC1, lambda r: 0.0, rule)
        mean[name] = sum(t.ttft_s for t in run.result.timelines) / 4
    assert mean == pytest.approx({"rr": 3.0, "ca": 3.0})


def test_sglang_router_counts_a_request_at_its_prefill_instance_until_it_ends() -> None:
    """sglang-router 0.3.2 holds a request's load on its prefill worker until the decode answer ends. Requests 0
    and 1 share prefix "a" (80%), so both prefill on P0 and then decode for 5 s; an 800-token prompt at 2.5 s
    and a 100-token one at 2.6 s. Load held to the end: P0 counts 2, so the 800 goes to P1 and the 100 behind
    it (prefill ends 2.5 + 8 + 1 = 11.5 s: TTFT 8.9 s, + 10 ms for the first token's decode step). Released at
    prefill end: the 800 goes to P0 (loads [0, 0]) and the 100 to the idle P1 (TTFT 1.0 s + 20 ms: it joins
    the decode steps in flight)."""
    reqs = Timed((Request(0, 0.0, 100, 500, 0, "a"), Request(1, 0.0, 100, 500, 80, "a"), req(2, 800, t=2.5),
                  req(3, 100, t=2.6)))  # fmt: skip
    dec = PoolLoop(ten_ms_step, LoopConfig(4000, decode=True), 1)
    assert SGLANG_RULE.router is not None and SGLANG_RULE.router.prefill_load_to_end
    ttft = {}
    for held in (True, False):
        rule = replace(SGLANG_RULE, router=replace(SGLANG_RULE.router, prefill_load_to_end=held))
        ttft[held] = [t.ttft_s for t in simulate_disaggregated(reqs, PRE2, dec, lambda r: 0.0, rule).result.timelines]
    assert ttft[True] == pytest.approx([1.0, 1.2, 8.01, 8.91])
    assert ttft[False] == pytest.approx([1.0, 1.2, 8.01, 1.02])


def test_vllm_proxy_picks_the_decode_server_when_the_prefill_answers() -> None:
    """vLLM's proxy: prefill in turn at arrival (0 -> P0, 1 -> P1); the short prompt answers first and takes
    the first decode server in turn, the long one the second."""
    reqs = Timed((req(0, 400), req(1, 100)))
    dec2 = PoolLoop(ten_ms_step, LoopConfig(1000, decode=True), 2)
    run = simulate_disaggregated(reqs, PRE2, dec2, lambda r: 0.0, VLLM_RULE)
    assert [t.replica for t in run.result.timelines] == [1, 0]
    unread = simulate_disaggregated(reqs, PRE2, dec2, lambda r: 0.0, replace(VLLM_RULE, router=None))
    assert [t.replica for t in unread.result.timelines] == [0, 1]


def test_release_routers_are_read_and_cited() -> None:
    sgl, vllm = ENGINES["sglang@0.5.23"].handoff, ENGINES["vllm@0.34.0"].handoff
    assert sgl is not None and sgl.router is not None and vllm is not None and vllm.router is not None
    assert (sgl.router.prefill, sgl.router.decode, sgl.router.decode_at_prefill_end) == (
        "cache_aware", "cache_aware", False)  # fmt: skip
    assert (vllm.router.prefill, vllm.router.decode, vllm.router.decode_at_prefill_end) == (
        "round_robin", "round_robin", True)  # fmt: skip
    for rule in (sgl, vllm):
        assert all(s.read for s in router_sources(rule))
    assert not any(s.read for s in router_sources(replace(sgl, router=None)))


def steps_of(segs):  # type: ignore[no-untyped-def]
    return [sum(n for n, _ in segs) / 100]


def test_replicas_least_loaded_beats_round_robin_on_ttft() -> None:
    """Two aggregated replicas, 1 s per 100 tokens, the P/D case's arrivals: round-robin (dealt beforehand)
    puts the third prompt behind the 400-token one (TTFT 3.5 s); vLLM's least-loaded router sends it to the
    idle replica (1 s) and the fourth, at a tie, after it (1.9 s)."""
    reqs = Timed((req(0, 400), req(1, 100), req(2, 100, t=1.5), req(3, 100, t=1.6)))
    two = Mesh(1, replicas=2)
    rr = simulate_dealt(reqs, steps_of, LoopConfig(100), two)
    ll = simulate(reqs, steps_of, LoopConfig(100, router="least_loaded"), two)
    assert [t.ttft_s for t in rr.timelines] == pytest.approx([4.0, 1.0, 3.5, 1.0])
    assert [t.ttft_s for t in ll.timelines] == pytest.approx([4.0, 1.0, 1.0, 1.9])
    assert [t.replica for t in ll.timelines] == [0, 1, 1, 1]
    assert [(s.requests, s.concurrency) for s in ll.shares] == [(1, 1), (3, 2)]


def test_replicas_least_loaded_equals_round_robin_on_alike_prompts() -> None:
    """A closed loop of 4 clients, 8 alike prompts with 3 output tokens, on 2 replicas: each finished request
    frees the replica its client's next one then goes to, as the dealt split assumes."""
    reqs = ClosedLoop(4, tuple(Request(i, 0.0, 100, 3) for i in range(8)))
    two = Mesh(1, replicas=2)
    rr = simulate_dealt(reqs, steps_of, LoopConfig(200, decode=True), two)
    ll = simulate(reqs, steps_of, LoopConfig(200, decode=True, router="least_loaded"), two)
    assert [t.ttft_s for t in ll.timelines] == pytest.approx([t.ttft_s for t in rr.timelines])
    assert [t.done_s for t in ll.timelines] == pytest.approx([t.done_s for t in rr.timelines])


def test_the_routed_co_simulation_reproduces_the_dealt_loop_under_round_robin() -> None:
    """The co-simulation with a round-robin router against the dealt loop (`simulate.loop.simulate`): equal
    on timed arrivals of mixed prompts, and on a closed loop of alike prompts with R dividing C (a request
    sent at t is queued at its replica at t: the router acts first at a tie)."""
    sizes = (100, 300, 700, 300, 100, 700)
    timed = Timed(tuple(Request(i, 0.3 * i, sizes[i % 6], 5) for i in range(18)))
    closed = ClosedLoop(4, tuple(Request(i, 0.0, 200, 5) for i in range(12)))
    for reqs, r in ((timed, 3), (closed, 2)):
        cfg = LoopConfig(256, decode=True)
        dealt = simulate_dealt(reqs, steps_of, cfg, Mesh(1, replicas=r))
        routed = simulate_routed(reqs, steps_of, cfg, Mesh(1, replicas=r))
        assert [t.ttft_s for t in routed.timelines] == pytest.approx([t.ttft_s for t in dealt.timelines])
        assert [t.done_s for t in routed.timelines] == pytest.approx([t.done_s for t in dealt.timelines])
        assert [t.replica for t in routed.timelines] == [t.replica for t in dealt.timelines]
