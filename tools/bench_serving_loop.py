"""Time the serving loop (`tpplan.simulate`) on a 10,000-request trace: docs/benchmarks.md, "Serving loop".

Usage: `python tools/bench_serving_loop.py [--requests N]`. Prices are a fixed linear function of the
step's tokens, so this times the loop itself (step formation, pipeline, timelines, percentiles), not
the cost model; each form is run 3 times and the best wall time printed. Prices go through `CachedPrices`
as the CLI's do; the last two cases are P/D deployments (`simulate.disagg_loop`).
"""

from __future__ import annotations

import argparse
import time

from tpplan.engines import DEFAULT_ENGINES
from tpplan.mesh import Mesh
from tpplan.simulate.disagg_loop import SGLANG_RULE, VLLM_RULE, PoolLoop, simulate_disaggregated
from tpplan.simulate.loop import LoopConfig, StagePrices, simulate
from tpplan.simulate.prices import CachedPrices
from tpplan.simulate.requests import Arrivals, Shape, closed_loop, poisson
from tpplan.simulate.results import LoopResult

SHAPES = [Shape(2000), Shape(500, cached_share=0.5), Shape(8000), Shape(30000)]
DECODE_SHAPES = [Shape(2000, 200), Shape(500, 100, 0.5), Shape(8000, 300), Shape(30000, 200)]


def linear(stages: int) -> StagePrices:
    """2 ms per step, 2 us per new token, 2 ns per context token read by a decode token."""
    return lambda segs: [0.002 + sum(n * 2e-6 + (2e-9 * c if n == 1 else 0.0) for n, c in segs)] * stages


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=10_000)
    n = ap.parse_args().requests
    cases: dict[str, tuple[Arrivals, int, LoopConfig]] = {
        "poisson 20/s, 1 stage, 8192-token steps": (poisson(20.0, SHAPES, n, seed=1), 1, LoopConfig(8192, 1)),
        "poisson 20/s, 4 stages, 5 in flight": (poisson(20.0, SHAPES, n, seed=1), 4, LoopConfig(8192, 5)),
        "closed loop C=64, 2 replicas x 4 stages": (closed_loop(64, SHAPES, n), 4, LoopConfig(8192, 5)),
        "decode (200 output tokens avg), poisson 20/s, 1 stage, vLLM mixed steps": (
            poisson(20.0, DECODE_SHAPES, n, seed=1),
            1,
            LoopConfig(8192, 1, decode=True, max_running=256),
        ),
        "decode, poisson 20/s, 1 stage, SGLang prefill first": (
            poisson(20.0, DECODE_SHAPES, n, seed=1),
            1,
            LoopConfig(8192, 1, decode=True, mixed=False, max_running=256),
        ),
        "decode, closed loop C=64, 2 replicas x 4 stages, mixed": (
            closed_loop(64, DECODE_SHAPES, n),
            4,
            LoopConfig(8192, 5, decode=True),
        ),
    }
    for name, (arrivals, stages, cfg) in cases.items():
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            # CachedPrices as the CLI prices (decode steps at grid points of the mean context, per step)
            mesh = Mesh(1, replicas=2 if "replicas" in name else 1)
            res = simulate(arrivals, CachedPrices(linear(stages)), cfg, mesh)
            best = min(best, time.perf_counter() - t0)
        report(name, n, res, best)
    for engine, rule in ((DEFAULT_ENGINES[0], SGLANG_RULE), (DEFAULT_ENGINES[1], VLLM_RULE)):
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            run = simulate_disaggregated(
                poisson(20.0, DECODE_SHAPES, n, seed=1),
                PoolLoop(CachedPrices(linear(1)), LoopConfig(8192), 2),
                PoolLoop(CachedPrices(linear(1)), LoopConfig(8192, decode=True, max_running=256), 2),
                lambda r: r.prompt_tokens * 1e-6,
                rule,
            )
            best = min(best, time.perf_counter() - t0)
        report(f"P/D {engine}, poisson 20/s, 2 prefill + 2 decode instances", n, run.result, best)


def report(name: str, n: int, res: LoopResult, best: float) -> None:
    dec = res.decode_summary(1)
    tpot = "" if dec is None else f", p99 TPOT {dec['tpot_s']['p99'] * 1e3:.2f} ms"  # type: ignore[index]
    print(f"{name}: {n} requests, {len(res.steps)} steps, {best:.3f} s (p99 TTFT {res.p(99):.3f} s{tpot})")


if __name__ == "__main__":
    main()
