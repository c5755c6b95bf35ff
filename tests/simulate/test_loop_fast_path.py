"""The loop's decode kept per step (`loop._Rounds`) gives the same results as per token: every timeline,
step and ITL identical, on several workloads (both engines' step forming, a running cap, a KV pool, a
closed loop, replicas, a budget that cuts the running batch, one-token prefill remainders)."""

from __future__ import annotations

import pytest

from tpplan.mesh import Mesh
from tpplan.simulate.loop import LoopConfig, simulate
from tpplan.simulate.prices import CachedPrices
from tpplan.simulate.requests import Shape, closed_loop, poisson

SHAPES = [Shape(2000, 40), Shape(500, 20, 0.5), Shape(8000, 60), Shape(3001, 2), Shape(700, 1)]


def linear(segs):  # type: ignore[no-untyped-def]
    return [0.002 + sum(n * 2e-6 + (2e-9 * c if n == 1 else 0.0) for n, c in segs)]


def per_token(prices: CachedPrices):  # type: ignore[no-untyped-def]
    """The same prices without `price_step`: the loop builds a segment per decode token, per token."""
    return lambda segs: prices(segs)


CASES = [
    (poisson(30.0, SHAPES, 400, seed=1), LoopConfig(8192, decode=True, max_running=32), 1),
    (poisson(30.0, SHAPES, 400, seed=2), LoopConfig(8192, decode=True, mixed=False, max_running=32), 1),
    (poisson(60.0, SHAPES, 300, seed=3), LoopConfig(3000, decode=True, kv_tokens=60_000), 1),
    (closed_loop(16, SHAPES, 300), LoopConfig(4096, decode=True, mixed=False), 2),
    (closed_loop(64, SHAPES, 120), LoopConfig(40, decode=True), 1),  # budget 40 < running: cuts the batch
    (closed_loop(8, SHAPES, 100), LoopConfig(2048, 3, decode=True), 1),  # PP: per token throughout
]


@pytest.mark.parametrize(("arrivals", "cfg", "replicas"), CASES)
def test_per_step_decode_equals_per_token(arrivals, cfg, replicas) -> None:  # type: ignore[no-untyped-def]
    mesh = Mesh(1, replicas=replicas)
    fast = simulate(arrivals, CachedPrices(linear), cfg, mesh)
    slow = simulate(arrivals, per_token(CachedPrices(linear)), cfg, mesh)
    assert fast.timelines == slow.timelines
    assert fast.steps == slow.steps
    assert fast.itl == slow.itl
    assert fast.decode_summary(8) == slow.decode_summary(8)


def test_leaving_the_per_step_path_midway_keeps_the_results(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """`_Rounds.materialize` hands each running request its own counts: forced after 200 decode steps, the
    rest of the run per token gives the same results as per token throughout."""
    from tpplan.simulate import loop

    arrivals, cfg = poisson(30.0, SHAPES, 300, seed=4), LoopConfig(8192, decode=True, mixed=False)
    slow = simulate(arrivals, per_token(CachedPrices(linear)), cfg)
    plain = loop._Rounds.decode
    seen = {"steps": 0, "left": 0}

    def decode_then_leave(self, rep, t):  # type: ignore[no-untyped-def]
        plain(self, rep, t)
        seen["steps"] += 1
        if seen["steps"] == 200:
            self.materialize(rep)
            rep.rounds = None
            seen["left"] += 1

    monkeypatch.setattr(loop._Rounds, "decode", decode_then_leave)
    fast = simulate(arrivals, CachedPrices(linear), cfg)
    assert seen["left"] == 1 and len(slow.steps) > 400
    assert fast.timelines == slow.timelines and fast.itl == slow.itl and fast.steps == slow.steps


def test_a_p_d_decode_pool_gives_the_same_results_per_step() -> None:
    from tpplan.simulate.disagg_loop import SGLANG_RULE, PoolLoop, simulate_disaggregated

    arrivals = poisson(30.0, SHAPES, 300, seed=5)
    pre = PoolLoop(CachedPrices(linear), LoopConfig(8192), 2)
    runs = [simulate_disaggregated(arrivals, pre, PoolLoop(p, LoopConfig(8192, decode=True, max_running=24), 2),
                                   lambda r: r.prompt_tokens * 1e-6, SGLANG_RULE)
            for p in (CachedPrices(linear), per_token(CachedPrices(linear)))]  # fmt: skip
    assert runs[0].result.timelines == runs[1].result.timelines and runs[0].result.itl == runs[1].result.itl
