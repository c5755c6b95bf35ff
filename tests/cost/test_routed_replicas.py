"""Replicas behind the deployment's request router in the cost model (`cost.workload.simulate_routed`): where
the split dealt beforehand (client c to replica c mod R, `replica_workloads`) and the router differ, by hand;
the cost model's routed run against the serving loop's co-simulation (`simulate.replicas`) without fixed costs;
`predict_plan` returning that TTFT (what audit prints) and sizing a replica's KV from the routed run's peak."""

from __future__ import annotations

import random

import pytest

from tpplan.cost.segments import segments_of
from tpplan.cost.workload import Workload, replica_workloads, simulate_routed, simulate_ttft
from tpplan.engines.schema import RouterRule
from tpplan.mesh import Mesh
from tpplan.simulate.engine import workload_arrivals
from tpplan.simulate.loop import LoopConfig
from tpplan.simulate.replicas import simulate

TWO = Mesh(1, replicas=2)
LEAST = RouterRule("least_loaded", "least_loaded", True, ())


def ten_ms_and_1ms_per_token(batch) -> float:
    return 0.01 + batch.n_tokens / 1000


def dealt(wl: Workload, mesh: Mesh) -> list[float]:
    """Mean TTFT of each replica's dealt share, each its own closed loop (what the split assumed)."""
    return [simulate_ttft(share, ten_ms_and_1ms_per_token).mean_s for share in replica_workloads(wl, mesh)]


def test_unequal_prompts_round_robin_is_not_the_dealt_split_by_hand():
    """2 clients, prompts cycled 2000, 100 tokens, 2 replicas, a batch 10 ms + 1 ms per token.
    Dealt: replica 0 serves client 0's 2000-token prompts (2.01 s each), replica 1 client 1's 100-token ones
    (0.11 s): mean (2.01 + 0.11) / 2 = 1.06 s, one request in flight at each.
    Round-robin: requests 0 (2000) and 1 (100) to replicas 0 and 1 at t = 0; request 1 ends at 0.11 s and its
    client sends request 3 (ids are given as batches are formed: replica 0's batch at t = 0 gave id 2 to
    request 0's client, sent at 2.01 s), the router's third pick: replica 0, busy with request 0 until 2.01 s:
    TTFT 2.01 + 0.11 - 0.11 = 2.01 s, 2 requests in flight there. Request 2 (2000) at 2.01 s goes to replica 1
    (2.01 s). Least-loaded sends request 3 to the idle replica 1 and equals the dealt split here."""
    wl = Workload(name="hand", input_lens=[2000, 100], concurrency=2, num_requests=8, chunk_size=4096)
    assert sum(dealt(wl, TWO)) / 2 == pytest.approx(1.06)
    rr = simulate_routed(wl, lambda b: (ten_ms_and_1ms_per_token(b),), TWO, None)
    assert rr.ttft_s == pytest.approx([2.01, 0.11, 2.01, 2.01, 2.01, 0.11, 2.01, 0.11])
    assert rr.mean_s == pytest.approx(1.2975)
    assert [s.concurrency for s in rr.replicas] == [2, 1]
    assert rr.replicas[0].peak_held == (2001, 101)  # prompt + output of requests 0 and 3, both in flight
    ll = simulate_routed(wl, lambda b: (ten_ms_and_1ms_per_token(b),), TWO, LEAST)
    assert ll.mean_s == pytest.approx(1.06) and [s.concurrency for s in ll.replicas] == [1, 1]


def test_replicas_not_dividing_the_clients_by_hand():
    """3 clients of 1000-token prompts (1.01 s a batch alone) on 2 replicas. Dealt: replica 0 has clients 0 and 2
    (one batch of both, 2.01 s), replica 1 client 1 (1.01 s). Routed round-robin: requests 0, 1, 2 go to 0, 1, 0
    as dealt; request 1 ends at 1.01 s and its client's next request (3) goes to replica 1, the next (4, sent at
    2.01 s) to replica 0, and so on: the clients move between replicas, and request 4 waits 0.01 s less
    (1.02 s beside request 3's 1.02 s at replica 1 instead of 2.01 s)."""
    wl = Workload(name="hand", input_len=1000, concurrency=3, num_requests=9, chunk_size=4096)
    d = simulate_ttft(replica_workloads(wl, TWO)[0], ten_ms_and_1ms_per_token)
    assert d.ttft_s[:2] == pytest.approx([2.01, 2.01])
    rr = simulate_routed(wl, lambda b: (ten_ms_and_1ms_per_token(b),), TWO, None)
    assert rr.ttft_s == pytest.approx([2.01, 1.01, 2.01, 1.01, 1.02, 1.01, 2.01, 1.02, 2.01])
    assert [s.concurrency for s in rr.replicas] == [2, 2]  # dealt: 2 and 1 clients


def _case(rng: random.Random) -> tuple[Workload, Mesh, RouterRule | None, int, int, bool]:
    lens = [rng.choice([100, 700, 1500, 3000, 5000]) for _ in range(rng.randint(1, 4))]
    c = rng.randint(1, 9)
    wl = Workload(name="r", input_lens=lens, concurrency=c, num_requests=rng.randint(c, 3 * c + 3),
                  chunk_size=rng.choice([512, 2048, 8192]), cached_share=rng.choice([0.0, 0.5]))  # fmt: skip
    policy = rng.choice(["round_robin", "least_loaded", "cache_aware"])
    rule = None if policy == "round_robin" else RouterRule(policy, policy, rng.random() < 0.5, ())  # type: ignore[arg-type]
    stages = rng.choice([1, 2, 3])
    return wl, Mesh(1, replicas=rng.randint(1, min(c, 4))), rule, stages, rng.randint(1, 3), rng.random() < 0.7


def test_the_cost_models_routed_run_is_the_serving_loops_without_fixed_costs():
    """80 random closed loops (prompts, clients, replicas, the three policies, PP stages with micro-batches in
    flight, chunks overlapping or not, cached prefixes): every request's TTFT and each replica's peak in flight
    equal the serving loop's co-simulation (`simulate.replicas`, no fixed costs)."""
    rng = random.Random(7)
    for _ in range(80):
        wl, mesh, rule, stages, in_flight, overlap = _case(rng)

        def prices(segs, stages=stages):  # type: ignore[no-untyped-def]
            base = 0.003 + sum(n for n, _ in segs) / 20000 + sum(n * x for n, x in segs) / 4e8
            return [base * (1 + 0.3 * k) for k in range(stages)]

        m = in_flight if stages > 1 else 1
        cost = simulate_routed(wl, lambda b, p=prices: p(segments_of(b)), mesh, rule, in_flight=m,
                               chunks_overlap=overlap or stages == 1)  # fmt: skip
        cfg = LoopConfig(wl.chunk_size, in_flight=m, chunks_overlap=overlap or stages == 1,
                         router=rule.prefill if rule else "round_robin", router_rule=rule)  # fmt: skip
        loop = simulate(workload_arrivals(wl), prices, cfg, mesh)
        assert cost.ttft_s == pytest.approx([t.ttft_s for t in loop.timelines], abs=1e-12)
        assert [s.concurrency for s in cost.replicas] == [s.concurrency for s in loop.shares]


MIXED = Workload(name="mixed", input_lens=[3000, 500, 500, 500, 3000, 500], concurrency=3, num_requests=12,
                 chunk_size=1024)  # fmt: skip


@pytest.mark.parametrize("router", [None, "dp:total_requests"])
def test_predict_plan_alone_returns_the_routed_ttft(router):
    """`predict_plan` called alone (no audit around it) on 2 replicas of mixed prompts: its TTFT is the serving
    loop's without fixed costs behind the deployment's router, request by request (audit prints this one)."""
    from tpplan.cost.predict import predict_plan
    from tpplan.cost.predictor import cached_predictor
    from tpplan.cost.topology import load_topology
    from tpplan.models.config import load_model
    from tpplan.models.graph import build_model_graph
    from tpplan.plans.named import baseline
    from tpplan.simulate.engine import engine_loop, serve

    graph, topo = build_model_graph(load_model("tiny-llama")), load_topology("h100x8-ib400")
    mesh = Mesh(2, replicas=2, router=router)
    pred = predict_plan(graph, baseline(), topo, mesh=mesh, workload=MIXED)
    p = cached_predictor(graph, baseline(), topo, mesh, "bf16", None)
    loop = engine_loop(p.pipeline, mesh, MIXED.chunk_size, topo.gpus_per_node, fixed_costs=False)
    want = serve(p, workload_arrivals(MIXED), loop)
    assert pred.ttft is not None
    assert list(pred.ttft.ttft_s) == pytest.approx([t.ttft_s for t in want.timelines], rel=1e-12)
    dealt_mean = sum(simulate_ttft(w, lambda b: p.latency(segments_of(b))).mean_s * w.total_requests
                     for w in replica_workloads(MIXED, mesh)) / MIXED.total_requests  # fmt: skip
    assert pred.ttft.mean_s != pytest.approx(dealt_mean, rel=1e-6)  # the case differs from the dealt split


def test_a_replicas_kv_pool_holds_what_the_router_sent_it_at_once():
    """The round-robin case by hand above on tiny-llama, at 16,000 and 100 tokens (there the short prompt is
    done first, as by hand): replica 0 holds a 16,000- and a 100-token request at once, where its dealt share is
    one client's 16,000: the KV per rank is of both prompts and their output tokens, what the routed run's peak
    held. SGLang's total_requests (fewest in flight) keeps one per replica: the dealt share's."""
    from tpplan.cost.predict import predict_plan
    from tpplan.cost.predictor import cached_predictor
    from tpplan.cost.topology import load_topology
    from tpplan.models.config import load_model
    from tpplan.models.graph import build_model_graph
    from tpplan.plans.named import baseline

    graph, topo = build_model_graph(load_model("tiny-llama")), load_topology("h100x8-ib400")
    wl = Workload(name="hand", input_lens=[16000, 100], concurrency=2, num_requests=8, chunk_size=16384)
    rr = predict_plan(graph, baseline(), topo, mesh=Mesh(2, replicas=2), workload=wl).memory
    p = cached_predictor(graph, baseline(), topo, Mesh(2, replicas=2), "bf16", None)
    per_token = p._memory([1], 4096).kv_cache
    assert rr.kv_cache == pytest.approx(per_token * (16001 + 101))
    fewest = Mesh(2, replicas=2, router="dp:total_requests")
    kv = predict_plan(graph, baseline(), topo, mesh=fewest, workload=wl).memory.kv_cache
    assert kv == pytest.approx(per_token * 16001)
