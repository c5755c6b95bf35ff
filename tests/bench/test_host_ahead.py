"""The bench's batch timing with the host ahead of the GPU (`bench.host_ahead`, issue 34): what runs on the CPU.

The sleep itself and its event check run only on CUDA; here: the sizing, the per-batch summary the results
record, the probe's gaps between op spans, that a CPU (gloo) run queues nothing and records mode "cpu", and
the markdown's sentence."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tpplan.bench.host_ahead import MIN_SLEEP_S, SLEEP_MARGIN, HostAhead, sleep_cycles, sleep_seconds, summary
from tpplan.bench_results import OpTiming


def test_the_sleep_is_the_margin_times_the_host_time_with_a_floor() -> None:
    assert sleep_seconds(0.004) == pytest.approx(SLEEP_MARGIN * 0.004)
    assert sleep_seconds(1e-6) == MIN_SLEEP_S  # a batch issued in microseconds still gets the floor
    assert sleep_seconds(0.004, margin=3.0) == pytest.approx(0.012)
    assert sleep_cycles(0.010, 2.0e9) == 20_000_000
    assert sleep_cycles(1e-12, 2.0e9) == 1
    with pytest.raises(ValueError, match="calibrate first"):
        sleep_cycles(0.01, 0.0)


def test_the_summary_keeps_the_worst_run_of_each_batch() -> None:
    """Two ranks x two passes of batch 0 and one run of batch 1: the longest host time and gap, the shortest
    sleep, how many runs the GPU caught up with the host."""
    runs = [
        {"index": 0, "host_s": 0.004, "sleep_s": 0.0061, "caught_up": False, "gap_s": 1e-5},
        {"index": 0, "host_s": 0.005, "sleep_s": 0.0060, "caught_up": True, "gap_s": 3e-4},
        {"index": 0, "host_s": 0.003, "sleep_s": 0.0062, "caught_up": False, "gap_s": 2e-5},
        {"index": 0, "host_s": 0.004, "sleep_s": 0.0063, "caught_up": False, "gap_s": 1e-5},
        {"index": 1, "host_s": 0.001, "sleep_s": 0.002, "caught_up": False, "gap_s": 0.0},
    ]
    t = OpTiming.model_validate(summary("host-ahead", runs))
    b0, b1 = t.batches
    assert (b0.index, b0.runs, b0.host_s, b0.sleep_s, b0.caught_up, b0.gap_s) == (0, 4, 0.005, 0.0060, 1, 3e-4)
    assert (b1.index, b1.runs, b1.caught_up) == (1, 1, 0)
    assert t.sleep_margin == SLEEP_MARGIN
    issued = OpTiming.model_validate(summary("as-issued", [{**r, "sleep_s": None, "caught_up": None} for r in runs]))
    assert issued.sleep_margin is None and issued.batches[0].sleep_s is None and issued.batches[0].caught_up == 0


def test_on_the_cpu_nothing_is_queued_and_the_mode_says_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    def no_sleep(_cycles: int) -> None:
        raise AssertionError("a CPU run queued a GPU sleep")

    monkeypatch.setattr(torch.cuda, "_sleep", no_sleep)
    ahead = HostAhead.for_device("host-ahead", cuda=False)
    assert ahead.mode == "cpu" and not ahead.sleeping
    issued: list[int] = []
    ahead.issue(3, lambda: issued.append(3))
    ahead.settle(0.25)
    assert issued == [3]
    (row,) = ahead.runs
    assert row["index"] == 3 and row["sleep_s"] is None and row["caught_up"] is None and row["gap_s"] == 0.25
    assert row["host_s"] >= 0
    assert HostAhead.for_device("as-issued", cuda=True).sleeping is False
    assert HostAhead.for_device("host-ahead", cuda=True).sleeping is True


def test_the_probe_measures_the_time_between_consecutive_op_spans() -> None:
    """The first op of a batch has no predecessor; a wait between two ops is the second's gap; an op nested in
    another has none (its predecessor's end is not the GPU's idle time)."""
    import torch

    from tpplan.bench.probe import Clock, Probe

    probe = Probe(Clock(torch.device("cpu")), layers=1)
    probe.enabled = True
    batch = probe.open("batch", -1, "0")
    a = probe.open("op", 0, "a")
    probe.close(a)
    time.sleep(0.005)
    b = probe.open("op", 0, "b")
    inner = probe.open("op", 0, "inner")
    probe.close(inner)
    probe.close(b)
    probe.close(batch)
    spans = {s.name: s for s in probe.resolve()}
    assert spans["a"].gap_s == 0.0
    assert spans["b"].gap_s >= 0.005
    assert spans["inner"].gap_s == 0.0
    assert all(s.after is None for s in spans.values())  # marks released after resolve


def test_a_cpu_gloo_run_records_cpu_timing_per_batch(tmp_path: Path, monkeypatch, one_rank_group) -> None:
    """A real one-rank gloo bench: its results say mode "cpu", one row per batch with the host's time, and the
    markdown says so; an unknown mode is refused before any rank starts."""
    from tests.bench.test_repredict import _plan_bench, _tiny_run
    from tpplan.bench.config import BenchConfig, check_inputs
    from tpplan.bench.markdown import markdown
    from tpplan.bench_results import load_bench_results
    from tpplan.errors import TpplanError

    r = load_bench_results(_tiny_run(tmp_path, monkeypatch))
    assert r.timing is not None and r.timing.mode == "cpu" and r.timing.sleep_margin is None
    assert [b.index for b in r.timing.batches] == [b.index for b in r.batches]
    assert all(b.runs == 1 and b.host_s > 0 and b.sleep_s is None and b.caught_up == 0 for b in r.timing.batches)
    md = markdown([_plan_bench(r)], {"run": tmp_path / "r.json"})  # type: ignore[list-item]
    assert "Timing: CPU wall clock (every op synchronous)." in md
    bad = BenchConfig(model="tiny-llama", plans=("baseline",), workload="prompt16k-c8", timing="ahead")
    with pytest.raises(TpplanError, match="timing=ahead"):
        check_inputs(bad, 1)


def test_the_markdown_sentence_is_computed_from_the_recorded_rows() -> None:
    from tpplan.bench.host_ahead import timing_line

    runs = [
        {"index": 0, "host_s": 0.004, "sleep_s": 0.006, "caught_up": False, "gap_s": 1e-5},
        {"index": 1, "host_s": 0.009, "sleep_s": 0.0135, "caught_up": True, "gap_s": 2e-3},
    ]
    line = timing_line(OpTiming.model_validate(summary("host-ahead", runs)))
    assert line.startswith(
        f"host ahead: a GPU sleep of 6.00-13.50 ms before each timed batch ({SLEEP_MARGIN:g}x the host's"
    )
    assert "in 1 of 2 batch runs" in line and "at most 2.000 ms per batch" in line
    issued = timing_line(OpTiming.model_validate(summary("as-issued", runs)))
    assert issued.startswith("as issued (no sleep; the host took up to 9.00 ms to issue a batch)")
    assert timing_line(None).startswith("not recorded")


class _FakeGpu:
    """torch.cuda's Event and _sleep on a fake GPU clock: a sleep of N cycles takes N / `hz` seconds; an
    event's `query` says whether the GPU had passed it (`passed`)."""

    def __init__(self, hz: float) -> None:
        self.hz, self.now, self.passed, self.slept = hz, 0.0, False, []

    def sleep(self, cycles: int) -> None:
        self.slept.append(cycles)
        self.now += cycles / self.hz

    def event(self, enable_timing: bool = False) -> object:
        gpu = self

        class Event:
            def record(self) -> None:
                self.t = gpu.now

            def elapsed_time(self, other: Event) -> float:
                return (other.t - self.t) * 1e3

            def query(self) -> bool:
                return gpu.passed

            def synchronize(self) -> None:
                pass

        return Event()


def test_host_ahead_sizes_each_sleep_in_cycles_and_records_whether_the_gpu_caught_up(monkeypatch) -> None:
    """The CUDA path on a fake GPU: calibration gives the clock, each batch's sleep is its sized seconds in
    cycles, the measured sleep is recorded, and `caught_up` is the sleep end event's `query` when the host
    finished issuing."""
    import torch

    gpu = _FakeGpu(hz=1.5e9)
    monkeypatch.setattr(torch.cuda, "_sleep", gpu.sleep)
    monkeypatch.setattr(torch.cuda, "Event", gpu.event)
    ahead = HostAhead.for_device("host-ahead", cuda=True)
    ahead.calibrate()
    assert ahead.cycles_per_s == pytest.approx(1.5e9)
    ahead.size({0: 0.004, 1: 0.0})
    ahead.issue(0, lambda: None)
    gpu.passed = True  # the GPU had left batch 1's sleep before the host finished issuing it
    ahead.issue(1, lambda: None)
    ahead.settle(1e-5)
    assert gpu.slept[1:] == [sleep_cycles(SLEEP_MARGIN * 0.004, 1.5e9), sleep_cycles(MIN_SLEEP_S, 1.5e9)]
    r0, r1 = ahead.runs
    assert r0["sleep_s"] == pytest.approx(SLEEP_MARGIN * 0.004, rel=1e-6) and r0["caught_up"] is False
    assert r1["sleep_s"] == pytest.approx(MIN_SLEEP_S, rel=1e-6) and r1["caught_up"] is True


def test_the_default_timing_is_the_one_every_recorded_run_used():
    """host-ahead has not run on a GPU yet (docs/benchmarks.md): the library's and the CLI's default stay
    as-issued until a GPU call has compared the two modes."""
    import inspect

    from tpplan.bench.config import BenchConfig
    from tpplan.commands.bench import bench

    assert BenchConfig(model="tiny-llama", plans=("baseline",), workload="seed-c8").timing == "as-issued"
    assert inspect.signature(bench).parameters["timing"].default == "as-issued"
