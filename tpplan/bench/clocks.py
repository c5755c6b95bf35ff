"""SM clock, power and temperature sampled in the background while the GPU works (NVML, GPU only).

Why: on one H200 the same flash-attention kernels ran 24-26% slower inside Kimi-K3's run than in
an isolated sweep, and the readings taken here showed why: the run holds the GPU at its power
limit, where the SM clock drops ~25% (docs/benchmarks.md, "Clock state"). A `Sampler` reads NVML
every few milliseconds on its own thread; `window(spans)` summarises the samples inside spans of
`time.perf_counter()`, so a sweep point and a whole profiled pass can each report the clock they
ran at, and `clock_state` names the state a pass ran in.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

Reading = tuple[float, float, float]  # (SM MHz, power W, temperature C)


def _nvml(index: int) -> tuple[Any, Any] | None:
    """(the pynvml module, GPU `index`'s handle), or None without NVML, a driver or that GPU."""
    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
        return pynvml, pynvml.nvmlDeviceGetHandleByIndex(index)
    except Exception:  # not installed, no driver, no GPU
        return None


def nvml_reader(index: int = 0) -> Callable[[], Reading] | None:
    """A reader of GPU `index`'s SM clock, power and temperature, or None without NVML."""
    got = _nvml(index)
    if got is None:
        return None
    pynvml, h = got

    def read() -> Reading:
        sm = pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)
        mw = pynvml.nvmlDeviceGetPowerUsage(h)
        temp = pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
        return float(sm), mw / 1000.0, float(temp)

    return read


class Sampler:
    """Background samples of `read()` every `period_s`, time-stamped with `time.perf_counter()`."""

    def __init__(self, read: Callable[[], Reading], period_s: float = 0.005) -> None:
        self.read, self.period_s = read, period_s
        self.samples: list[tuple[float, Reading]] = []
        self.error: str | None = None  # why sampling stopped early, if it did
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                reading = self.read()
            except Exception as exc:  # e.g. NVML_ERROR_NOT_SUPPORTED: stop sampling, keep what was read
                self.error = f"{type(exc).__name__}: {exc}"
                return
            self.samples.append((time.perf_counter(), reading))
            self._stop.wait(self.period_s)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def window(self, spans: list[tuple[float, float]]) -> dict[str, Any] | None:
        """Mean and minimum SM clock, mean power and peak temperature of the samples in the spans
        ((t0, t1) pairs of `time.perf_counter()`; a sample a period before a span still counts, so a
        span shorter than the period gets the reading the GPU ran at when it began)."""
        pad = self.period_s * 1.5
        got = [r for t, r in list(self.samples) if any(t0 - pad <= t <= t1 for t0, t1 in spans)]
        if not got:
            return None
        sm = [r[0] for r in got]
        return {"sm_mhz_mean": statistics.fmean(sm), "sm_mhz_min": min(sm),
                "power_w_mean": statistics.fmean(r[1] for r in got), "temp_c_max": max(r[2] for r in got),
                "samples": len(got)}  # fmt: skip


def nvml_limits(index: int = 0) -> dict[str, float]:
    """GPU `index`'s highest SM clock and enforced power limit ({} without NVML): what `clock_state`
    judges a pass's readings against."""
    got = _nvml(index)
    if got is None:
        return {}
    pynvml, h = got
    try:
        return {"sm_mhz_max": float(pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM)),
                "power_limit_w": pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0}  # fmt: skip
    except Exception:  # not supported on this GPU: no limits
        return {}


CAPPED_BELOW = 0.9  # a pass whose mean SM clock is under 90% of the GPU's highest ran power-capped


def clock_state(clocks: dict[str, float] | None) -> str | None:
    """The clock state, "power-capped" or "boost", from a pass's readings (`sm_mhz_mean` against
    `sm_mhz_max`); None where they were not recorded. Why it matters: the serving-kernel models come in both states
    (`h200-serving`, `h200-serving-capped`), and the same kernels differ by 8-40% between them."""
    if not clocks or "sm_mhz_max" not in clocks or "sm_mhz_mean" not in clocks:
        return None
    return "power-capped" if clocks["sm_mhz_mean"] < CAPPED_BELOW * clocks["sm_mhz_max"] else "boost"


@contextmanager
def sampling(index: int = 0) -> Iterator[Sampler | None]:
    """A running `Sampler` of GPU `index` for the block, or None where NVML is not there."""
    read = nvml_reader(index)
    if read is None:
        yield None
        return
    with Sampler(read) as sampler:
        yield sampler


__all__ = ["CAPPED_BELOW", "Reading", "Sampler", "clock_state", "nvml_limits", "nvml_reader", "sampling"]
