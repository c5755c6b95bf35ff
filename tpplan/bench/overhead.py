"""Runtime overhead inside a plan's own run: how long the GPU waits on the host (GPU only).

Why: a replay of single calls (`replay.py`) shows the cost of tpplan's wrappers around one kernel,
not what a whole forward pass loses to Python between kernels. Here the plan runs its workload
once more with no probe events, timed by two CUDA events around the pass (`pass_s`), and once
under `torch.profiler` (CUDA activity only), whose kernel and copy intervals give the time the GPU
was busy (`busy_s`, the union of the intervals). The runtime overhead is `pass_s / busy_s - 1`:
the share of the pass the device spent idle waiting for the host to launch the next kernel (and,
with several ranks, for a peer inside a collective, which the busy time counts as busy). The
instrumented passes' batch total over `pass_s` gives the cost of the probe's own events.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any


def busy_seconds(intervals: Iterable[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals (any unit in, same unit out)."""
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s  # type: ignore[operator]
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s  # type: ignore[operator]
    return total


def _device_intervals(prof: Any) -> list[tuple[float, float]]:
    """(start, end) in microseconds of every kernel, copy and set the profiler saw on the GPU."""
    from torch.autograd import DeviceType

    out = []
    for ev in prof.events():
        if ev.device_type == DeviceType.CUDA and ev.time_range.elapsed_us() > 0:
            out.append((float(ev.time_range.start), float(ev.time_range.end)))
    return out


def kernel_table(prof: Any, top: int = 30) -> list[tuple[str, int, float]]:
    """The profiled GPU work by kernel name: (name, calls, total seconds), largest first; names cut to 90
    characters (template arguments make some run to thousands)."""
    from torch.autograd import DeviceType

    acc: dict[str, list[float]] = {}
    for ev in prof.events():
        if ev.device_type == DeviceType.CUDA:
            a = acc.setdefault(ev.name[:90], [0, 0.0])
            a[0] += 1
            a[1] += ev.time_range.elapsed_us() / 1e6
    rows = sorted(((k, int(n), s) for k, (n, s) in acc.items()), key=lambda r: -r[2])
    return rows[:top]


def measure(run_pass: Callable[[], None], gpu_index: int = 0) -> dict[str, Any]:
    """Time `run_pass` (one whole pass of the workload, no probe) by events, then again under the
    profiler for the GPU's busy time; seconds. Where NVML is there, also the SM clock, power and
    temperature of GPU `gpu_index` over the timed pass (`clocks`, `bench.clocks`)."""
    import time

    import torch
    from torch.profiler import ProfilerActivity, profile

    from tpplan.bench.clocks import nvml_limits, sampling

    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with sampling(gpu_index) as sampler:
        t0 = time.perf_counter()
        a.record()
        run_pass()
        b.record()
        b.synchronize()
        clocks = None if sampler is None else sampler.window([(t0, time.perf_counter())])
    if clocks is not None:
        clocks |= nvml_limits(gpu_index)  # the state (`clocks.clock_state`) is judged against these
    pass_s = a.elapsed_time(b) / 1e3
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run_pass()
        torch.cuda.synchronize()
    iv = _device_intervals(prof)
    busy_s = busy_seconds(iv) / 1e6
    span_s = (max(e for _, e in iv) - min(s for s, _ in iv)) / 1e6 if iv else 0.0
    return {"pass_s": pass_s, "busy_s": busy_s, "profiled_span_s": span_s, "kernels": float(len(iv)),
            "by_kernel": kernel_table(prof), "clocks": clocks}  # fmt: skip


__all__ = ["busy_seconds", "kernel_table", "measure"]
