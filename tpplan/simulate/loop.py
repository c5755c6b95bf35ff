"""The engine's serving loop for prefill: a deterministic discrete-event simulation of one replica.

What it does, step by step (docs/cost-model.md, "Serving loop"):
- a request is sent at its arrival time (closed loop: when a client's previous request got its first
  token) and reaches the scheduler's queue `request_in_s` later (tokenise, hand over);
- the scheduler forms a step when stage 0 is free and fewer than `in_flight` steps are in the pipeline:
  first come first served, each waiting request takes as many of its remaining prompt tokens as the
  step's token budget (`chunk_tokens`) still holds, a request that does not fit is split and its rest
  goes first in the next step (both engines' chunked prefill, `tpplan.engines.scheduling`); with
  `chunks_overlap` off a request's next chunk waits until its previous one has left the last stage;
- the step runs through the stages in order (a flow shop): it starts stage k when it has left stage
  k - 1 and stage k has finished the step before; the CPU's per-step cost (`step_overhead_s`: schedule,
  launch) is paid on stage 0 before its compute;
- a request's first token reaches its client `request_out_s` after its last chunk leaves the last stage
  (sample, detokenise, return).
Prices come from `StagePrices`: seconds per stage for a step's segments ((new tokens, context) per
request; a cached prefix is context, so attention still reads it but no token of it is computed).
Decode is not simulated here (it neither delays prefill steps nor holds batch slots).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tpplan.cost.segments import Segments
from tpplan.cost.workload import PrefillBatch, Segment
from tpplan.errors import TpplanError
from tpplan.simulate.requests import Arrivals, ClosedLoop, split_round_robin
from tpplan.simulate.results import LoopResult, Timeline

StagePrices = Callable[[Segments], Sequence[float]]
"""Seconds one step of these segments holds each pipeline stage (its send into the next included)."""


@dataclass(frozen=True)
class LoopConfig:
    """How one engine replica runs its loop: step budget, pipeline depth, overheads (seconds)."""

    chunk_tokens: int  # prefill tokens per step (SGLang --chunked-prefill-size, vLLM max_num_batched_tokens)
    in_flight: int = 1  # steps in the pipeline at once (PP: the engine's micro-batches in flight)
    chunks_overlap: bool = True  # chunk k+1 of a prompt may enter stage 0 while chunk k is in the pipeline
    step_overhead_s: float = 0.0  # CPU schedule + launch per step, on stage 0
    request_in_s: float = 0.0  # per request, before the scheduler sees it
    request_out_s: float = 0.0  # per request, after its last chunk: first-token sample, detokenise, return

    def __post_init__(self) -> None:
        if self.chunk_tokens < 1 or self.in_flight < 1:
            raise TpplanError(f"chunk_tokens={self.chunk_tokens} in_flight={self.in_flight}", "must be at least 1",
                              "pass a positive step budget and micro-batch count")  # fmt: skip
        costs = (self.step_overhead_s, self.request_in_s, self.request_out_s)
        if not all(math.isfinite(c) and c >= 0 for c in costs):
            raise TpplanError(f"overheads={costs}", "must be finite and >= 0", "pass non-negative seconds")


class _Replica:
    """The state of one replica's loop while it runs (`run_replica`)."""

    def __init__(self, arrivals: Arrivals, prices: StagePrices, cfg: LoopConfig) -> None:
        self.reqs = arrivals.requests
        self.prices, self.cfg = prices, cfg
        n = len(self.reqs)
        self.sent = [r.arrival_s for r in self.reqs]
        self.progress = [r.prompt_tokens - r.new_tokens for r in self.reqs]  # next position to compute
        self.out_at = [0.0] * n  # when the request's latest chunk leaves the pipeline
        self.first_step = [math.nan] * n
        self.prefill_end = [math.nan] * n
        self.closed = isinstance(arrivals, ClosedLoop)
        first = min(arrivals.concurrency, n) if isinstance(arrivals, ClosedLoop) else n
        if self.closed:
            self.sent[:first] = [0.0] * first
        self.next_id = first
        self.heap = [(self.sent[i] + cfg.request_in_s, i) for i in range(first)]
        heapq.heapify(self.heap)
        self.waiting: deque[int] = deque()
        self.stage_free: list[float] = []
        self.steps: list[PrefillBatch] = []
        self.done = 0

    def form_step(self, now: float) -> list[Segment]:
        """First come first served under the token budget; a split request goes back to the front."""
        budget, segs, back = self.cfg.chunk_tokens, [], []
        while self.waiting and budget > 0:
            rid = self.waiting.popleft()
            if not self.cfg.chunks_overlap and self.out_at[rid] > now:
                back.append(rid)  # its previous chunk is still in the pipeline
                continue
            pos = self.progress[rid]
            take = min(budget, self.reqs[rid].prompt_tokens - pos)
            segs.append(Segment(rid, pos, take))
            budget -= take
            if pos + take < self.reqs[rid].prompt_tokens:
                back.append(rid)
        self.waiting.extendleft(reversed(back))
        return segs

    def next_event(self, now: float) -> float:
        """When something can change while no step can form: an arrival, or a blocked chunk's exit."""
        times = [self.heap[0][0]] if self.heap else []
        times += [self.out_at[r] for r in self.waiting if self.out_at[r] > now]
        if not times:
            raise AssertionError("the loop stalled with requests unfinished")  # a bug, not an input
        return min(times)

    def run_step(self, segs: list[Segment], now: float) -> None:
        """Price the step, push it through the stages, and finish the requests whose last chunk it holds."""
        times = [float(t) for t in self.prices(tuple((s.n_tokens, s.start_pos) for s in segs))]
        if not times or min(times) < 0 or not all(map(math.isfinite, times)):
            raise TpplanError("stage prices", f"returned {times} s for step {len(self.steps)}", "return >= 0 per stage")
        times[0] += self.cfg.step_overhead_s
        if not self.stage_free:
            self.stage_free = [0.0] * len(times)
        t = now
        for k, dt in enumerate(times):
            t = max(t, self.stage_free[k]) + dt
            self.stage_free[k] = t
        self.steps.append(PrefillBatch(len(self.steps), tuple(segs), now, t))
        for s in segs:
            rid = s.request_id
            if math.isnan(self.first_step[rid]):
                self.first_step[rid] = now
            self.progress[rid] = s.start_pos + s.n_tokens
            self.out_at[rid] = t
            if self.progress[rid] == self.reqs[rid].prompt_tokens:
                self.finish(rid, t)

    def finish(self, rid: int, t: float) -> None:
        self.prefill_end[rid] = t
        self.done += 1
        if self.closed and self.next_id < len(self.reqs):  # the client sends its next request at once
            nxt, self.next_id = self.next_id, self.next_id + 1
            self.sent[nxt] = t + self.cfg.request_out_s
            heapq.heappush(self.heap, (self.sent[nxt] + self.cfg.request_in_s, nxt))

    def run(self) -> None:
        now, m = 0.0, self.cfg.in_flight
        while self.done < len(self.reqs):
            if self.stage_free:
                now = max(now, self.stage_free[0])
            if len(self.steps) >= m:
                now = max(now, self.steps[-m].end_s)
            while self.heap and self.heap[0][0] <= now:
                self.waiting.append(heapq.heappop(self.heap)[1])
            segs = self.form_step(now)
            if segs:
                self.run_step(segs, now)
            else:
                now = self.next_event(now)

    def timelines(self, replica: int) -> list[Timeline]:
        out = self.cfg.request_out_s
        return [Timeline(r, replica, self.sent[i], self.sent[i] + self.cfg.request_in_s, self.first_step[i],
                         self.prefill_end[i], self.prefill_end[i] + out) for i, r in enumerate(self.reqs)]  # fmt: skip


def run_replica(arrivals: Arrivals, prices: StagePrices, cfg: LoopConfig) -> tuple[list[Timeline], list[PrefillBatch]]:
    """One replica's loop over `arrivals`: each request's timeline (in request order) and the steps."""
    if not arrivals.requests:
        raise TpplanError("requests", "there are none", "give at least one request")
    rep = _Replica(arrivals, prices, cfg)
    rep.run()
    return rep.timelines(0), rep.steps


def simulate(arrivals: Arrivals, prices: StagePrices, cfg: LoopConfig, replicas: int = 1) -> LoopResult:
    """The serving loop over `replicas` identical replicas, requests dealt round-robin
    (`split_round_robin`); timelines in the arrivals' request order, steps by start time with the
    arrivals' request ids."""
    lines: dict[int, Timeline] = {}
    steps: list[PrefillBatch] = []
    for r, (ids, share) in enumerate(split_round_robin(arrivals, replicas)):
        tl, st = run_replica(share, prices, cfg)
        for j, line in enumerate(tl):
            lines[ids[j]] = Timeline(arrivals.requests[ids[j]], r, *_times(line))
        for b in st:
            segs = tuple(Segment(ids[s.request_id], s.start_pos, s.n_tokens) for s in b.segments)
            steps.append(PrefillBatch(b.index, segs, b.start_s, b.end_s))
    steps.sort(key=lambda b: (b.start_s, b.end_s))
    return LoopResult(tuple(lines[i] for i in range(len(arrivals.requests))), tuple(steps))


def _times(t: Timeline) -> tuple[float, float, float, float, float]:
    return t.arrival_s, t.queued_s, t.first_step_s, t.prefill_end_s, t.first_token_s


__all__ = ["LoopConfig", "StagePrices", "run_replica", "simulate"]
