"""PP decode kept per step (`loop._Cohorts`: requests that left the pipeline together decode together, the
engine's micro-batches in flight) gives the per-token path's results: every timeline and step identical, the
same inter-token gaps, on several workloads (both engines' step forming, 2 to 4 steps in flight, a running
cap, a KV pool, a closed loop, replicas, a budget that cuts the free batch, speculative steps)."""

from __future__ import annotations

import pytest

from tpplan.mesh import Mesh
from tpplan.simulate import loop
from tpplan.simulate.loop import LoopConfig, simulate
from tpplan.simulate.prices import CachedPrices
from tpplan.simulate.requests import Shape, closed_loop, poisson

SHAPES = [Shape(2000, 40), Shape(500, 20, 0.5), Shape(8000, 60), Shape(3001, 2), Shape(700, 1)]


def stages(segs):  # type: ignore[no-untyped-def]
    """Two stages, each a fixed cost and a cost per token and per context token read."""
    t = 0.002 + sum(n * 2e-6 + (2e-9 * c if n == 1 else 0.0) for n, c in segs)
    return [t * 0.6, t * 0.4]


CASES = [
    (poisson(30.0, SHAPES, 300, seed=1), LoopConfig(8192, 2, decode=True, max_running=32), 1),
    (poisson(30.0, SHAPES, 300, seed=2), LoopConfig(8192, 2, decode=True, mixed=False, max_running=32), 1),
    (poisson(60.0, SHAPES, 300, seed=3), LoopConfig(3000, 3, decode=True, kv_tokens=60_000), 1),
    (closed_loop(16, SHAPES, 200), LoopConfig(4096, 4, decode=True, mixed=False), 2),
    (closed_loop(64, SHAPES, 120), LoopConfig(40, 2, decode=True), 1),  # budget 40 < free requests: cuts
    (closed_loop(8, SHAPES, 100), LoopConfig(2048, 3, decode=True, chunks_overlap=False), 1),
    (closed_loop(12, SHAPES, 100), LoopConfig(2048, 2, decode=True, mixed=False, verify_tokens=3, accepted=2.2), 1),
]


@pytest.mark.parametrize(("arrivals", "cfg", "replicas"), CASES)
def test_pp_decode_per_step_equals_per_token(monkeypatch, arrivals, cfg, replicas) -> None:  # type: ignore[no-untyped-def]
    mesh = Mesh(1, replicas=replicas)
    fast = simulate(arrivals, CachedPrices(stages), cfg, mesh)
    monkeypatch.setattr(loop._Replica, "FAST_DECODE", False)
    slow = simulate(arrivals, CachedPrices(stages), cfg, mesh)
    assert fast.timelines == slow.timelines
    assert fast.steps == slow.steps
    assert sorted(fast.itl) == pytest.approx(sorted(slow.itl))
    f, g = fast.decode_summary(8), slow.decode_summary(8)
    assert f is not None and g is not None and f.keys() == g.keys()
    for k, v in f.items():
        assert v == (pytest.approx(g[k]) if not isinstance(v, dict) else {q: pytest.approx(x) for q, x in g[k].items()})


def test_the_per_step_path_runs_under_pp(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The cohorts do the decode (not a silent fall-back to per token): `decode_each` is never called."""
    calls = {"n": 0}
    plain = loop._Replica.decode_each

    def counted(self, dec, t):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        return plain(self, dec, t)

    merged = {"n": 0}
    take = loop._Cohorts.take

    def counting_merges(self, now):  # type: ignore[no-untyped-def]
        merged["n"] += len(self.free(now)) > 1
        return take(self, now)

    monkeypatch.setattr(loop._Replica, "decode_each", counted)
    monkeypatch.setattr(loop._Cohorts, "take", counting_merges)
    res = simulate(closed_loop(16, SHAPES, 200), CachedPrices(stages), LoopConfig(4096, 4, decode=True, mixed=False))
    assert calls["n"] == 0 and res.decode_summary(1) is not None
    assert merged["n"] > 0  # cohorts that left the pipeline apart were merged into one step


@pytest.mark.parametrize("in_flight", [2, 3])
def test_a_pp_decode_instance_of_a_pd_deployment_too(monkeypatch, in_flight: int) -> None:  # type: ignore[no-untyped-def]
    """SGLang's P/D decode instance (its prefill gives the first token) keeps PP decode per step as well."""
    from tpplan.simulate.disagg_loop import SGLANG_RULE, PoolLoop, simulate_disaggregated

    def run():  # type: ignore[no-untyped-def]
        return simulate_disaggregated(
            poisson(40.0, SHAPES, 200, seed=7),
            PoolLoop(CachedPrices(stages), LoopConfig(8192), 2),
            PoolLoop(CachedPrices(stages), LoopConfig(8192, in_flight, decode=True, max_running=48), 2),
            lambda r: r.prompt_tokens * 1e-6,
            SGLANG_RULE,
        ).result

    calls = {"n": 0}
    plain = loop._Replica.decode_each

    def counted(self, dec, t):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        return plain(self, dec, t)

    monkeypatch.setattr(loop._Replica, "decode_each", counted)
    fast = run()
    assert calls["n"] == 0  # the decode instances' steps went through the cohorts
    monkeypatch.setattr(loop._Replica, "FAST_DECODE", False)
    slow = run()
    assert calls["n"] > 0
    assert fast.timelines == slow.timelines
    assert fast.steps == slow.steps
    assert sorted(fast.itl) == pytest.approx(sorted(slow.itl))
