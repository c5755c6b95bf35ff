"""Latency targets (TTFT and TPOT at a statistic), and what a serving run's requests make of them.

A target is a ceiling on one statistic (mean, p50, p90 or p99) of one per-request figure: TTFT (arrival
to first token) or TPOT (mean time per output token after the first, `Timeline.tpot_s`). A run *meets*
the targets when each target's statistic over the run's requests is at most its ceiling. Its *goodput*
counts requests one by one: a request is good when its own TTFT and its own TPOT are each at most the
ceilings (a request of one output token has no TPOT and is good on TTFT alone); goodput per GPU is the
good requests over the run's span (t = 0 to its last token) over the GPUs that served them. The two
are separate questions on purpose: a p90 target is met while up to 10% of requests miss, and those
do not count as goodput (docs/search-json.md, "serving_search").

`parse_target` reads a target as written on the command line ("2s", "50ms", "p90:2s"); its errors name
the field (`ttft_target=2x`), which the CLI writes as its option.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from tpplan.errors import TpplanError
from tpplan.simulate.results import Timeline, percentile

Stat = Literal["mean", "p50", "p90", "p99"]
STATS: tuple[Stat, ...] = ("mean", "p50", "p90", "p99")
Metric = Literal["ttft", "tpot"]
_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*(s|ms|us)\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class Target:
    """At most `seconds` for the `stat` of every request's `metric`."""

    metric: Metric
    seconds: float
    stat: Stat

    @property
    def label(self) -> str:
        """`p90 TTFT` / `mean TPOT`: the figure the target bounds, in words."""
        return f"{self.stat} {self.metric.upper()}"

    def value(self, values: Sequence[float]) -> float:
        """This target's statistic of `values` (NaN where there are none)."""
        vals = [v for v in values if not math.isnan(v)]
        if not vals:
            return math.nan
        if self.stat == "mean":
            return math.fsum(vals) / len(vals)
        return percentile(vals, float(self.stat[1:]))

    def to_json(self) -> dict[str, object]:
        return {"metric": self.metric, "stat": self.stat, "seconds": self.seconds}


@dataclass(frozen=True)
class Targets:
    """A TTFT target, a TPOT target, or both (at least one)."""

    ttft: Target | None = None
    tpot: Target | None = None

    def __post_init__(self) -> None:
        if self.ttft is None and self.tpot is None:
            raise TpplanError("ttft_target and tpot_target", "a search under targets needs one of them",
                              "give a TTFT target, a TPOT target or both")  # fmt: skip

    @property
    def each(self) -> tuple[Target, ...]:
        return tuple(t for t in (self.ttft, self.tpot) if t is not None)

    def good(self, t: Timeline) -> bool:
        """Whether one request meets both targets by its own TTFT and TPOT."""
        if self.ttft is not None and t.ttft_s > self.ttft.seconds:
            return False
        tpot = t.tpot_s
        return self.tpot is None or math.isnan(tpot) or tpot <= self.tpot.seconds

    def achieved(self, timelines: Sequence[Timeline]) -> dict[Metric, float]:
        """Each target's statistic over the run's requests."""
        out: dict[Metric, float] = {}
        for tg in self.each:
            out[tg.metric] = tg.value([t.ttft_s if tg.metric == "ttft" else t.tpot_s for t in timelines])
        return out

    def misses(self, achieved: dict[Metric, float]) -> dict[Metric, float]:
        """By how many seconds each statistic is over its ceiling (0 where met; NaN counts as met)."""
        return {tg.metric: max(0.0, achieved[tg.metric] - tg.seconds) for tg in self.each if tg.metric in achieved}

    def met(self, achieved: dict[Metric, float]) -> bool:
        return not any(v > 0 for v in self.misses(achieved).values())

    def worst_ratio(self, achieved: dict[Metric, float]) -> float:
        """The largest statistic / ceiling (<= 1: met): how far the run is from meeting the targets."""
        ratios = [achieved[tg.metric] / tg.seconds for tg in self.each if not math.isnan(achieved[tg.metric])]
        return max(ratios, default=0.0)

    def describe(self) -> str:
        """`p90 TTFT <= 2 s and p90 TPOT <= 50 ms`, from the values."""
        return " and ".join(f"{tg.label} <= {seconds_text(tg.seconds)}" for tg in self.each)

    def to_json(self) -> dict[str, object]:
        return {tg.metric: tg.to_json() for tg in self.each}


def goodput(timelines: Sequence[Timeline], targets: Targets, gpus: int) -> tuple[int, float]:
    """(good requests, good requests per second per GPU) of one run: t = 0 to its last token."""
    good = sum(1 for t in timelines if targets.good(t))
    end = max(t.done_s if not math.isnan(t.done_s) else t.first_token_s for t in timelines)
    return good, (good / end / gpus if end > 0 else 0.0)


def seconds_text(s: float) -> str:
    """A duration as a person writes it: `2 s`, `50 ms`, `1.25 s`, `800 us`."""
    if s >= 1:
        return f"{s:.4g} s"
    if s >= 1e-3:
        return f"{s * 1e3:.4g} ms"
    return f"{s * 1e6:.4g} us"


def parse_duration(text: str, field: str) -> float:
    """`2s`, `50ms`, `1.5 s`, `800us` -> seconds; anything else is refused naming `field`."""
    m = _DURATION.match(text)
    if m is None:
        raise TpplanError(f"{field}={text}", "not a duration with a unit", "write it as 2s, 1.5s, 50ms or 800us")
    seconds = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if not math.isfinite(seconds) or seconds <= 0:
        raise TpplanError(f"{field}={text}", "must be a positive duration", "write it as 2s, 50ms or 800us")
    return seconds


def parse_stat(text: str, field: str) -> Stat:
    stat = text.strip().lower()
    for s in STATS:
        if stat == s:
            return s
    raise TpplanError(f"{field}={text}", "unknown statistic", f"choose one of {', '.join(STATS)}")


def parse_target(text: str, metric: Metric, default_stat: Stat) -> Target:
    """A target as written: `2s` (at `default_stat`) or `p90:2s` / `mean:50ms` (its own statistic)."""
    field = f"{metric}_target"
    stat = default_stat
    value = text
    if ":" in text:
        head, value = text.split(":", 1)
        stat = parse_stat(head, field)
    return Target(metric, parse_duration(value, field), stat)


__all__ = [
    "STATS",
    "Metric",
    "Stat",
    "Target",
    "Targets",
    "goodput",
    "parse_duration",
    "parse_stat",
    "parse_target",
    "seconds_text",
]
