"""How the kernel sweeps time a call: queued back to back, with the host ahead of the GPU, behind an
idle sleep or a GEMM load, and with the SM clock each point ran at (GPU only).

Why apart from the families: every family (`sweep_families`) times through `timed`, and the
sweep's mode (`kernel_sweep.main`) switches it here, in one place.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

# Sweep 2 ("ops" mode) times every call with the host ahead of the GPU (see `timed`).
HOST_AHEAD = [False]
# A running `clocks.Sampler` (ops mode, where NVML is there): each timed point records its clock.
SAMPLER: list[Any] = [None]
_LAST_CLOCKS: list[dict[str, Any] | None] = [None]


def last_clocks() -> dict[str, Any]:
    """The SM clock, power and temperature of the last timed point (empty without a sampler)."""
    c = _LAST_CLOCKS[0]
    return {} if c is None else {"clocks": c}


AHEAD_SLEEP_CYCLES = 40_000_000  # ~20 ms at the H200's 1.98 GHz: longer than the host takes to queue `reps` calls
# What the GPU runs before each timed batch instead of the sleep (the "loaded" families): None = sleep.
PREAMBLE: list[Callable[[], Any] | None] = [None]


def gemm_load(ms: float = 150.0) -> Callable[[], Any]:
    """A preamble of ~`ms` of bf16 8192^3 GEMMs (~1.4 ms each on an H200): the GPU at full power, as
    inside a large model's run, before the timed calls (the sleep preamble leaves it near idle power)."""
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(8192, 8192, device="cuda", dtype=torch.bfloat16)

    def run() -> None:
        for _ in range(max(1, int(ms / 1.4))):
            torch.mm(a, b, out=c)

    return run


def each_call(fn: Callable[..., Any], *args: Any) -> Callable[[int], Any]:
    """`fn(*args)` as `timed` calls it (the set index unused), its arguments bound now: a sweep loop
    passes it on without a default-argument lambda."""
    return partial(_call_bound, fn, args)


def _call_bound(fn: Callable[..., Any], args: tuple[Any, ...], _set: int) -> Any:
    return fn(*args)


def timed(fn: Callable[[int], Any], reps: int, sets: int) -> float:
    """Seconds per call of fn(i % sets), queued back to back as inside a model's run: events around
    `reps` calls (no host sync between them), the median of 3 such batches, after a warm-up per set.

    Timing one call at a time with a host sync between leaves the GPU idle between calls, and small
    kernels then measure launch latency and clock ramp-up too (seen on an H200: a [256, 7168] x
    [7168, 2112] GEMM ran 24% slower timed alone than queued behind another kernel).

    With `HOST_AHEAD` the GPU is first given ~20 ms of sleep, so the host has queued every call
    before the GPU reaches them and the events measure GPU time alone: what an op takes inside a
    run whose large kernels keep the GPU behind the host (a K3 8K pass on one H200 left the GPU
    idle 2.9% of the time). Without it, an op whose Python and launches take longer than its
    kernels measures the host (fla's short conv: 0.4 ms back to back, 0.19 ms inside the model)."""
    import torch

    for i in range(sets):
        fn(i)
    torch.cuda.synchronize()
    per, spans = [], []
    for _ in range(3):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        if PREAMBLE[0] is not None:
            PREAMBLE[0]()
        elif HOST_AHEAD[0]:
            torch.cuda._sleep(AHEAD_SLEEP_CYCLES)
        a.record()
        for i in range(reps):
            fn(i % sets)
        b.record()
        b.synchronize()
        t1, secs = time.perf_counter(), a.elapsed_time(b) / 1e3
        spans.append((t1 - secs, t1))  # when the GPU ran the timed calls (not the preamble), host clock
        per.append(secs / reps)
    _LAST_CLOCKS[0] = None if SAMPLER[0] is None else SAMPLER[0].window(spans)
    return statistics.median(per)


def loaded(points: Callable[[], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """`points()` with the GPU-load preamble (`gemm_load`) before every timed batch, each row tagged
    "preamble": "gemm" -- the same calls as the plain family, so the pair isolates power and clock."""
    PREAMBLE[0] = gemm_load()
    try:
        return [{**r, "preamble": "gemm"} for r in points()]
    finally:
        PREAMBLE[0] = None


__all__ = ["AHEAD_SLEEP_CYCLES", "HOST_AHEAD", "PREAMBLE", "SAMPLER", "gemm_load", "last_clocks", "loaded", "timed"]
