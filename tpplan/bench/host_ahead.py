"""How `tpplan bench` times its batches: with the host ahead of the GPU, or as the host issues them (issue 34).

The probe's events (`probe.Probe`) fire when the GPU reaches them. When the GPU reaches an op with an empty
queue, the op's start event fires as soon as the host records it, and the span then measures the host's
Python and launches, not the kernels (06d call 5, Gemma 3: norms 0.56 ms against 27 us kernels). In
"host-ahead" mode every timed batch is queued behind a GPU sleep (`torch.cuda._sleep`) of `SLEEP_MARGIN`
times the host's time to issue that batch in an untimed pass, so the host has issued the batch before the
GPU leaves the sleep, as the per-rank sweeps do (`sweep_timing.timed`). Each timed run records:

- `host_s`: the host's time to issue the batch;
- `sleep_s`: the sleep the GPU ran (events around it);
- `caught_up`: the sleep's end event had fired when the host finished issuing the batch. Then the GPU may
  have waited for the host inside the batch (the host was slower than the sleep, synchronised inside the
  batch, or blocked on a full launch queue); when it had not, the GPU had queued work throughout.
- `gap_s`: the GPU time between consecutive op spans (`Span.gap_s`): ~0 with the host ahead; the GPU waiting
  for the host, or work outside op spans, otherwise.

"as-issued" (the earlier timing, kept for comparison) queues no sleep and records `host_s` and `gap_s`. On the
CPU every op is synchronous: mode "cpu", nothing queued.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tpplan.bench_results import OpTiming

MODES = ("host-ahead", "as-issued")
SLEEP_MARGIN = (
    3.0  # the sleep / the untimed pass's host time. 1.5 until 06e: on an H100 the timed pass issued Gemma 3's
)
# batches in 1.32-1.56x the untimed pass's time, and the GPU caught up in the 9 of 16 runs at or above 1.5x
MIN_SLEEP_S = 0.002  # a floor for batches the host issues in microseconds
CALIBRATE_CYCLES = 20_000_000  # ~10 ms at 2 GHz: long enough that the events' resolution does not matter


def sleep_seconds(host_s: float, margin: float = SLEEP_MARGIN) -> float:
    """The sleep queued before a batch the host issued in `host_s` in the untimed pass."""
    return max(MIN_SLEEP_S, margin * host_s)


def sleep_cycles(seconds: float, cycles_per_s: float) -> int:
    """`torch.cuda._sleep`'s argument for `seconds` at the measured `cycles_per_s`."""
    if not cycles_per_s > 0:
        raise ValueError(f"cycles_per_s={cycles_per_s}: must be positive (calibrate first)")
    return max(1, math.ceil(seconds * cycles_per_s))


@dataclass
class HostAhead:
    """One plan's timing on one rank: the mode, the sleep per batch index (`size`), and one row per timed run
    of a batch (`runs`), filled by `issue` and `settle`."""

    mode: str  # host-ahead | as-issued | cpu
    sleep_s: dict[int, float] = field(default_factory=dict)
    cycles_per_s: float = 0.0
    runs: list[dict[str, Any]] = field(default_factory=list)
    _open: list[tuple[dict[str, Any], Any]] = field(default_factory=list)

    @classmethod
    def for_device(cls, mode: str, cuda: bool) -> HostAhead:
        return cls(mode if cuda else "cpu")

    @property
    def sleeping(self) -> bool:
        return self.mode == "host-ahead"

    def calibrate(self) -> None:
        """The GPU's `_sleep` cycles per second, from events around one sleep (the SM clock it runs at now)."""
        import torch

        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        torch.cuda._sleep(CALIBRATE_CYCLES)
        b.record()
        b.synchronize()
        self.cycles_per_s = CALIBRATE_CYCLES / (a.elapsed_time(b) / 1e3)

    def size(self, host_s: dict[int, float]) -> None:
        """Each batch's sleep from the host's time to issue it in the untimed pass (`host_s`, by batch index)."""
        self.sleep_s = {k: sleep_seconds(v) for k, v in host_s.items()}

    def issue(self, index: int, run_batch: Callable[[], None]) -> None:
        """Issue batch `index` (`run_batch`), behind its sleep when host-ahead; the host's time and whether the
        GPU had left the sleep by then. `settle` (after the device is synchronised) completes the row."""
        events = None
        if self.sleeping:
            import torch

            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            torch.cuda._sleep(sleep_cycles(self.sleep_s[index], self.cycles_per_s))
            b.record()
            events = (a, b)
        t0 = time.perf_counter()
        run_batch()
        row: dict[str, Any] = {"index": index, "host_s": time.perf_counter() - t0, "sleep_s": None, "caught_up": None}
        if events is not None:
            row["caught_up"] = bool(events[1].query())
        self._open.append((row, events))

    def settle(self, gap_s: float) -> None:
        """The open rows' measured sleeps (the device synchronised) and `gap_s`, the batch's GPU time between
        consecutive op spans (`Span.gap_s` summed)."""
        for row, events in self._open:
            if events is not None:
                row["sleep_s"] = events[0].elapsed_time(events[1]) / 1e3
            row["gap_s"] = gap_s
            self.runs.append(row)
        self._open = []


def summary(mode: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Every rank's and pass's runs (`HostAhead.runs`) per batch index, as the results file records them
    (`bench_results.OpTiming`): the longest host time and gap, the shortest sleep, the runs the GPU caught up."""
    by: dict[int, list[dict[str, Any]]] = {}
    for r in runs:
        by.setdefault(r["index"], []).append(r)
    batches = []
    for index, rows in sorted(by.items()):
        sleeps = [r["sleep_s"] for r in rows if r["sleep_s"] is not None]
        batches.append(
            {
                "index": index,
                "runs": len(rows),
                "host_s": max(r["host_s"] for r in rows),
                "sleep_s": min(sleeps) if sleeps else None,
                "caught_up": sum(1 for r in rows if r["caught_up"]),
                "gap_s": max(r["gap_s"] for r in rows),
            }
        )
    return {"mode": mode, "sleep_margin": SLEEP_MARGIN if mode == "host-ahead" else None, "batches": batches}


def timing_line(t: OpTiming | None) -> str:
    """The markdown's sentence on how a run's events were timed, from its recorded `timing`."""
    if t is None:
        return (
            "not recorded (files before issue 34): as issued, so an op the GPU reached with an empty queue "
            "measures the host"
        )
    if t.mode == "cpu":
        return "CPU wall clock (every op synchronous)"
    gap = max((b.gap_s for b in t.batches), default=0.0)
    gaps = f"GPU time between consecutive op spans at most {1e3 * gap:.3f} ms per batch (summed over its ops)"
    if t.mode == "as-issued":
        host = max((b.host_s for b in t.batches), default=0.0)
        return f"as issued (no sleep; the host took up to {1e3 * host:.2f} ms to issue a batch); {gaps}"
    sleeps = [b.sleep_s for b in t.batches if b.sleep_s is not None]
    runs, caught = sum(b.runs for b in t.batches), sum(b.caught_up for b in t.batches)
    return (
        f"host ahead: a GPU sleep of {1e3 * min(sleeps, default=0.0):.2f}-{1e3 * max(sleeps, default=0.0):.2f} ms "
        f"before each timed batch ({t.sleep_margin:g}x the host's time to issue it in an untimed pass); the GPU "
        f"had left the sleep before the host finished issuing in {caught} of {runs} batch runs (those may hold "
        f"time the GPU waited for the host); {gaps}"
    )


__all__ = [
    "MIN_SLEEP_S",
    "MODES",
    "SLEEP_MARGIN",
    "HostAhead",
    "sleep_cycles",
    "sleep_seconds",
    "summary",
    "timing_line",
]
