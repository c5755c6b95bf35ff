"""How the per-rank sweep (`rank_sweep`) times one call, and builds its inputs, on the GPU (or on the CPU for tests).

Apart from `rank_sweep` and `rank_runners` so that both import it and neither imports the other at load.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

DEVICE = ["cuda"]
Case = dict[str, Any]
Case = dict[str, Any]


def _sync() -> None:
    import torch

    if DEVICE[0] == "cuda":
        torch.cuda.synchronize()


def measure(fn: Callable[[], Any], reps: int = 5, both: bool = True) -> dict[str, Any]:
    """{"seconds": GPU time with the host ahead, "b2b_s": back to back, "spread": (max-min)/median of the
    host-ahead batches}; on the CPU (tests) a wall-clock median."""
    if DEVICE[0] != "cuda":
        fn()
        ts = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return {"seconds": statistics.median(ts), "b2b_s": statistics.median(ts), "spread": 0.0}
    ahead = _batches(fn, reps, ahead=True)
    out = {"seconds": statistics.median(ahead), "spread": (max(ahead) - min(ahead)) / statistics.median(ahead)}
    if both:
        out["b2b_s"] = statistics.median(_batches(fn, reps, ahead=False))
    return out


def _batches(fn: Callable[[], Any], reps: int, ahead: bool) -> list[float]:
    """Seconds per call in each of 3 event-timed batches of `reps` calls (`sweep_timing.timed`'s method)."""
    import torch

    from tpplan.bench.sweep_timing import AHEAD_SLEEP_CYCLES

    fn()
    torch.cuda.synchronize()
    per = []
    for _ in range(3):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if ahead:
            torch.cuda._sleep(AHEAD_SLEEP_CYCLES)
        a.record()
        for _ in range(reps):
            fn()
        b.record()
        b.synchronize()
        per.append(a.elapsed_time(b) / 1e3 / reps)
    return per


def _randn(*shape: int, scale: float = 1.0) -> Any:
    import torch

    dt = torch.bfloat16 if DEVICE[0] == "cuda" else torch.float32
    return torch.randn(*shape, device=DEVICE[0], dtype=dt) * scale


__all__ = ["DEVICE", "Case", "measure"]
