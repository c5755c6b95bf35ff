"""`tpplan calibrate --quick`: a seconds-long GEMM probe that scales the packaged shape table to this GPU.

Why: the GEMM table (`cost/presets/h200_gemm_shapes.json`) was timed on one H200; another H200
(clocks, power cap, driver) runs the same shapes a few percent faster or slower, uniformly enough
that one factor carries the table over. The probe times a handful of the table's own shapes
(large and small M, wide and narrow N), takes measured / table per shape, and the median is the
machine's `gemm_scale` (`GpuSpec.gemm_scale`, applied to every table rate). The per-shape spread
says how well one factor holds; it is printed beside it.

Two variants per shape answer why isolated and in-model GEMMs differ: `warm` (back-to-back calls
on the same operands, as the table was timed) and `cold` (a 512 MiB copy between calls evicts L2
and lets the clock settle as other kernels of a layer do). The scale uses `warm`, like the table.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# (M, K, N): rows of the packaged table, spanning its M values and narrow to wide N.
PROBE_SHAPES: tuple[tuple[int, int, int], ...] = (
    (8192, 7168, 12288),
    (8192, 7168, 2112),
    (8192, 3584, 6144),
    (8192, 3584, 768),
    (2048, 7168, 2112),
    (256, 7168, 2112),
)


@dataclass(frozen=True)
class ProbePoint:
    """One probed shape: measured TFLOP/s warm and cold, and the table's rate for it."""

    m: int
    k: int
    n: int
    warm_tflops: float
    cold_tflops: float
    table_tflops: float

    @property
    def ratio(self) -> float:
        return self.warm_tflops / self.table_tflops


def probe(reps: int = 20) -> list[ProbePoint]:
    """Time every PROBE_SHAPES GEMM on the current CUDA device (random bf16 operands, events, median)."""
    import torch

    from tpplan.cost.gemm import default_gemm_table, table_tflops

    _, table = default_gemm_table()
    flush = torch.empty(512 * 2**20, dtype=torch.uint8, device="cuda")
    out = []
    for m, k, n in PROBE_SHAPES:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        flops = 2.0 * m * k * n

        def gemm(_a: Any = a, _b: Any = b) -> None:
            _a @ _b

        warm = _median_s(gemm, reps)
        cold = _median_s(gemm, reps, before=lambda: flush.add_(1))  # evicts L2 before each timed call
        rate = table_tflops(m, k, n, [p for p in table if p.dtype == "bf16"])
        out.append(ProbePoint(m, k, n, flops / warm / 1e12, flops / cold / 1e12, rate))
    return out


def _median_s(fn: Callable[[], None], reps: int, before: Callable[[], Any] | None = None) -> float:
    """Median seconds of `fn` between two events; `before` runs ahead of the start event, untimed."""
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        if before is not None:
            before()
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return statistics.median(times)


def machine_scale(points: list[ProbePoint]) -> tuple[float, float, float]:
    """(median, min, max) of measured / table over the probed shapes: the scale and its spread."""
    r = [p.ratio for p in points]
    return statistics.median(r), min(r), max(r)


__all__ = ["PROBE_SHAPES", "ProbePoint", "machine_scale", "probe"]
