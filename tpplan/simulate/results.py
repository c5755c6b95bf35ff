"""What the serving loop produces: one timeline per request and the aggregates serving SLAs use.

A request's TTFT runs from its arrival to its first token at the client: the per-request work
before the scheduler sees it (tokenise, hand to the scheduler), its wait in the queue, its prefill
steps, and the work after its last chunk (sample, detokenise, return). The queueing share is the
part of the mean TTFT spent waiting for a first step. Percentiles interpolate linearly between
order statistics (numpy's default), so p50 is the median.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

from tpplan.cost.workload import PrefillBatch, ReplicaShare, TTFTResult
from tpplan.simulate.requests import Request


@dataclass(frozen=True)
class Timeline:
    """One request through the loop (seconds from t = 0): sent, seen by the scheduler, its first chunk
    starts on stage 0, its last chunk leaves the last stage, its first token reaches the client."""

    request: Request
    replica: int
    arrival_s: float
    queued_s: float
    first_step_s: float
    prefill_end_s: float
    first_token_s: float
    done_s: float = math.nan  # its last token reaches the client (the first, without decode)

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.arrival_s

    @property
    def latency_s(self) -> float:
        """Arrival to the last token at the client."""
        return self.done_s - self.arrival_s

    @property
    def tpot_s(self) -> float:
        """Mean time per output token after the first (NaN for a request of one output token)."""
        n = self.request.output_tokens
        return (self.done_s - self.first_token_s) / (n - 1) if n > 1 else math.nan

    @property
    def wait_s(self) -> float:
        """Time in the scheduler's queue before its first chunk starts."""
        return self.first_step_s - self.queued_s

    def to_json(self) -> dict[str, object]:
        r = self.request
        tpot = self.tpot_s
        return {"id": r.id, "replica": self.replica, "arrival_s": self.arrival_s, "prompt_tokens": r.prompt_tokens,
                "cached_tokens": r.cached_tokens, "output_tokens": r.output_tokens, "wait_s": self.wait_s,
                "ttft_s": self.ttft_s, "tpot_s": None if math.isnan(tpot) else tpot,
                "latency_s": None if math.isnan(self.latency_s) else self.latency_s}  # fmt: skip


def percentile(values: list[float], q: float, is_sorted: bool = False) -> float:
    """The q-th percentile (0..100) of `values`, linear between order statistics."""
    s = values if is_sorted else sorted(values)
    pos = (len(s) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


@dataclass(frozen=True)
class LoopResult:
    """Every request's timeline (in request order) and every step the loop ran (by start time)."""

    timelines: tuple[Timeline, ...]
    steps: tuple[PrefillBatch, ...]
    itl: tuple[float, ...] = ()  # every gap between a request's successive tokens (decode)
    shares: tuple[ReplicaShare, ...] = ()  # each replica's part, when several served the requests
    ttfts: list[float] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "ttfts", [t.ttft_s for t in self.timelines])

    @cached_property
    def makespan_s(self) -> float:
        """End of the last step (from t = 0)."""
        return max(s.end_s for s in self.steps)

    @property
    def mean_s(self) -> float:
        return math.fsum(self.ttfts) / len(self.ttfts)

    def p(self, q: float) -> float:
        return percentile(self.ttfts, q)

    @property
    def queue_share(self) -> float:
        """Share of the mean TTFT that requests spend waiting for their first step."""
        mean = self.mean_s
        return math.fsum(t.wait_s for t in self.timelines) / len(self.timelines) / mean if mean > 0 else 0.0

    @property
    def prefill_tokens(self) -> int:
        """Prompt tokens the steps computed (cached prefixes and decode tokens excluded)."""
        return sum(s.n_tokens for s in self.steps)

    @property
    def prefill_tok_s(self) -> float:
        """Computed prefill tokens per second of the run (t = 0 to the last step's end)."""
        return self.prefill_tokens / self.makespan_s if self.makespan_s > 0 else math.inf

    def summary(self) -> dict[str, float | int]:
        """The aggregates audit/search JSON carry (docs/audit-json.md, `serving`)."""
        return {"requests": len(self.timelines), "steps": len(self.steps), "mean_s": self.mean_s,
                "p50_s": self.p(50), "p90_s": self.p(90), "p99_s": self.p(99), "max_s": max(self.ttfts),
                "queue_share": self.queue_share, "prefill_tok_s": self.prefill_tok_s,
                "makespan_s": self.makespan_s}  # fmt: skip

    def decode_summary(self, gpus: int) -> dict[str, object] | None:
        """TPOT, ITL and request latency (mean, p50/p90/p99), the steps that ran decode tokens (their count,
        mean and largest decode batch, their duration), output tokens/s per GPU (the run's output tokens
        over t = 0 to the last token, over `gpus`) and per user (1 / mean TPOT); None when no request
        decodes (docs/audit-json.md, `serving.decode`)."""
        tpots = [t.tpot_s for t in self.timelines if t.request.output_tokens > 1]
        if not tpots or not self.itl:
            return None
        end = max(t.done_s for t in self.timelines)
        out = sum(t.request.output_tokens for t in self.timelines)
        steps = [s for s in self.steps if s.decode_tokens]
        dec = [s.decode_tokens for s in steps]
        return {"output_tokens": out, "decode_steps": len(dec), "mean_decode_batch": math.fsum(dec) / len(dec),
                "max_decode_batch": max(dec), "decode_step_s": _stats([s.end_s - s.start_s for s in steps]),
                "tpot_s": _stats(tpots), "itl_s": _stats(list(self.itl)),
                "latency_s": _stats([t.latency_s for t in self.timelines]),
                "output_tok_s": out / end, "output_tok_s_per_gpu": out / end / gpus,
                "output_tok_s_per_user": len(tpots) / math.fsum(tpots)}  # fmt: skip

    def as_ttft(self) -> TTFTResult:
        """The same run as the cost model's `TTFTResult` (what today's readers of TTFT take)."""
        return TTFTResult(
            ttft_s=tuple(self.ttfts),
            arrival_s=tuple(t.arrival_s for t in self.timelines),
            batches=self.steps,
            makespan_s=self.makespan_s,
            prefill_tokens=sum(t.request.prompt_tokens for t in self.timelines),
            replicas=self.shares,
        )


def _stats(values: list[float]) -> dict[str, float]:
    """Mean and p50/p90/p99, sorting once (an ITL list holds every decode token)."""
    s = sorted(values)
    return {"mean": math.fsum(s) / len(s), "p50": percentile(s, 50, True), "p90": percentile(s, 90, True),
            "p99": percentile(s, 99, True)}  # fmt: skip


__all__ = ["LoopResult", "Timeline", "percentile"]
