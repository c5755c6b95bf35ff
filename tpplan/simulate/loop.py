"""The engine's serving loop: a deterministic discrete-event simulation of one replica, prefill and decode.

What it does, step by step (docs/cost-model.md, "Serving loop"):
- a request is sent at its arrival time (closed loop: when a client's previous request finished) and
  reaches the scheduler's queue `request_in_s` later (tokenise, hand over);
- the scheduler forms a step when stage 0 is free and fewer than `in_flight` steps are in the pipeline:
  first come first served, each waiting request takes as many of its remaining prompt tokens as the
  step's token budget (`chunk_tokens`) still holds, a request that does not fit is split and its rest
  goes first in the next step (both engines' chunked prefill, `tpplan.engines.scheduling`); with
  `chunks_overlap` off a request's next chunk waits until its previous one has left the last stage;
- with `decode` on, a request whose prompt is done decodes one token per step until it has its
  `output_tokens` (the prefill step gives the first): as vLLM schedules (`mixed`), every step takes the
  running requests' decode tokens first and fills the rest of the budget with prefill chunks; as SGLang
  does (`mixed` off), a step is a prefill step whenever one can form and a decode step of every running
  request otherwise. A request is in at most one step in the pipeline at a time (PP micro-batches hold
  different requests). A new request is admitted (its first chunk scheduled) only while fewer than
  `max_running` are admitted and the KV pool (`kv_tokens`) holds its prompt and output; it keeps them
  until it finishes (no preemption);
- the step runs through the stages in order (a flow shop): it starts stage k when it has left stage
  k - 1 and stage k has finished the step before; the CPU's per-step cost (`step_overhead_s`: schedule,
  launch) is paid on stage 0 before its compute;
- a token reaches its client `request_out_s` after its step leaves the last stage (sample, detokenise,
  return).
Prices come from `StagePrices`: seconds per stage for a step's segments ((new tokens, context) per
request; a cached prefix is context, so attention still reads it but no token of it is computed; a
decode token is (1, its position)).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tpplan.cost.segments import Segments
from tpplan.cost.workload import PrefillBatch, ReplicaShare, Segment
from tpplan.engines.schema import RouterPolicy, RouterRule
from tpplan.errors import TpplanError
from tpplan.mesh import Mesh
from tpplan.simulate.requests import Arrivals, ClosedLoop, Request, split_round_robin
from tpplan.simulate.results import LoopResult, Timeline

StagePrices = Callable[[Segments], Sequence[float]]
"""Seconds one step of these segments holds each pipeline stage (its send into the next included)."""


@dataclass(frozen=True)
class LoopConfig:
    """How one engine replica runs its loop: step budget, pipeline depth, overheads (seconds), decode."""

    chunk_tokens: int  # prefill tokens per step (SGLang --chunked-prefill-size, vLLM max_num_batched_tokens)
    in_flight: int = 1  # steps in the pipeline at once (PP: the engine's micro-batches in flight)
    chunks_overlap: bool = True  # chunk k+1 of a prompt may enter stage 0 while chunk k is in the pipeline
    step_overhead_s: float = 0.0  # CPU schedule + launch per step, on stage 0
    request_in_s: float = 0.0  # per request, before the scheduler sees it
    request_out_s: float = 0.0  # per token, after its step: sample, detokenise, return
    decode: bool = False  # requests decode their output tokens (off: a request ends at its first token)
    mixed: bool = True  # decode tokens and prefill chunks share a step's budget (vLLM); off: prefill first (SGLang)
    max_running: int | None = None  # admitted requests at once (SGLang --max-running-requests, vLLM max_num_seqs)
    kv_tokens: int | None = None  # KV pool of the replica in tokens; a request holds prompt + output from admission
    # P/D prefill pool: seconds to hand a finished prompt's KV to the decode side (its first token arrives
    # after it), and whether the prefill engine blocks its last stage on the hand-off (`simulate.pd`)
    handoff_s: Callable[[Request], float] | None = None
    handoff_blocks: bool = False
    # speculative decoding (`tpplan.engines.speculative`): a decode step verifies `verify_tokens` per request
    # out of the step's budget, and a request gains `accepted` tokens per step on average
    verify_tokens: int = 1
    accepted: float = 1.0
    router: RouterPolicy = "round_robin"  # how requests are spread over the mesh's replicas (`simulate.replicas`)
    router_rule: RouterRule | None = None  # the router's record (cache-aware thresholds, least-loaded ties)

    def __post_init__(self) -> None:
        if self.chunk_tokens < 1 or self.in_flight < 1:
            raise TpplanError(f"chunk_tokens={self.chunk_tokens} in_flight={self.in_flight}", "must be at least 1",
                              "pass a positive step budget and micro-batch count")  # fmt: skip
        costs = (self.step_overhead_s, self.request_in_s, self.request_out_s)
        if not all(math.isfinite(c) and c >= 0 for c in costs):
            raise TpplanError(f"overheads={costs}", "must be finite and >= 0", "pass non-negative seconds")
        for name in ("max_running", "kv_tokens"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise TpplanError(f"{name}={v}", "must be at least 1", f"pass a positive {name} or none")

    def kv_need(self, r: Request) -> int:
        """KV tokens a request holds while admitted: its prompt and, with decode, its output."""
        return r.prompt_tokens + (r.output_tokens if self.decode else 1)

    def steps_out(self, output_tokens: int) -> int:
        """The loop's count for a request's output: its prefill step and its decode steps (one token per
        step; with speculative decoding, its later tokens over `accepted`, rounded up)."""
        if self.accepted == 1.0 or output_tokens <= 1:
            return output_tokens
        return 1 + math.ceil((output_tokens - 1) / self.accepted - 1e-9)

    def position_shift(self, steps_done: int) -> float:
        """What a request's decode position gains over `steps_done` (its count in `_Replica.decoded`)
        beyond one token per step: 0 without speculative decoding."""
        return (self.accepted - 1.0) * max(steps_done - 1, 0) if self.accepted != 1.0 else 0


class _Rounds:
    """Decode kept per step instead of per token, while every decode step takes every running request (one
    step in flight, no budget cut): the loop's results are the same, its work per step no longer grows with
    the batch (tests/simulate/test_loop_fast_path.py checks both paths give identical results).

    Every running request that decoded in the last decode step last sent a token at `last_end`; those that
    joined since (`fresh`, the tail of the running requests in order) at their own `out_at`. A request that
    joins at decode round R with one token finishes at round R + output - 1 (`ends`, a heap in join order);
    `context_sum` is the sum of the running requests' next positions, which a decode step prices."""

    def __init__(self) -> None:
        self.round = 0
        self.last_end = 0.0
        self.fresh: list[int] = []
        self.ends: list[tuple[int, int]] = []  # (round it finishes at, request), pushed in join order
        self.finish_round: dict[int, int] = {}
        self.order: list[int] = []  # requests in join order (the second key of `ends`)
        self.context_sum: float = 0

    def join(self, rep: _Replica, rid: int) -> None:
        end = self.round + rep.outputs[rid] - 1
        heapq.heappush(self.ends, (end, len(self.finish_round)))
        self.finish_round[rid] = end
        self.order.append(rid)
        self.fresh.append(rid)
        self.context_sum += rep.last_pos[rid] + 1

    def decode(self, rep: _Replica, t: float) -> None:
        """One decode step of every running request, ending at `t`."""
        fresh, out_at = self.fresh, rep.out_at
        rep.itl.extend([t - self.last_end] * (len(rep.running) - len(fresh)))
        rep.itl.extend([t - out_at[r] for r in fresh])
        fresh.clear()
        self.context_sum += len(rep.running) * rep.cfg.accepted if rep.cfg.accepted != 1.0 else len(rep.running)
        self.round += 1
        self.last_end = t
        ends, order = self.ends, self.order
        while ends and ends[0][0] <= self.round:
            rid = order[heapq.heappop(ends)[1]]
            del rep.running[rid]
            rep.decoded[rid], out_at[rid] = rep.outputs[rid], t
            self.context_sum -= rep.last_pos[rid] + rep.outputs[rid] + rep.cfg.position_shift(rep.outputs[rid])
            rep.finish(rid, t)

    def materialize(self, rep: _Replica) -> None:
        """Each running request's own token count and last token time, for the per-token path."""
        fresh = set(self.fresh)
        for rid in rep.running:
            rep.decoded[rid] = rep.outputs[rid] - (self.finish_round[rid] - self.round)
            if rid not in fresh:
                rep.out_at[rid] = self.last_end


class _Cohort:
    """Running requests whose last step left the pipeline together, at `out_at`: they decode together.
    `ends` holds (the cohort round each finishes at, its join index); `members` the requests."""

    __slots__ = ("context_sum", "ends", "members", "out_at", "round")

    def __init__(self, out_at: float) -> None:
        self.out_at, self.round, self.context_sum = out_at, 0, 0.0
        self.ends: list[tuple[int, int]] = []
        self.members: dict[int, None] = {}


class _Cohorts:
    """PP decode kept per step (in flight > 1), as the engines run it: each step takes the running requests
    no step in the pipeline holds, a micro-batch of its own (SGLang 0.5.23 `scheduler_pp_mixin.event_loop_pp`
    keeps pp_size + async depth micro-batches in flight, each with its own running batch; vLLM schedules the
    requests not in flight). Requests that left the pipeline together form a cohort; a step takes every free
    cohort (merged, the smaller into the larger) and advances it one round, so the work per step does not
    grow with the batch; the loop's results are the per-token path's (tests/simulate/test_pp_decode.py)."""

    def __init__(self) -> None:
        self.cohorts: list[_Cohort] = []
        self.order: list[int] = []  # requests in join order (the second key of `ends`)
        self.taken: _Cohort | None = None
        self.gaps: list[tuple[float, int]] = []  # (previous out_at, requests) of the step being taken

    def join(self, rep: _Replica, rid: int) -> None:
        t = rep.out_at[rid]
        c = next((c for c in self.cohorts if c.out_at == t), None)
        if c is None:
            c = _Cohort(t)
            self.cohorts.append(c)
        heapq.heappush(c.ends, (c.round + rep.outputs[rid] - rep.decoded[rid], len(self.order)))
        self.order.append(rid)
        c.members[rid] = None
        c.context_sum += rep.position(rid)

    def free(self, now: float) -> list[_Cohort]:
        return [c for c in self.cohorts if c.out_at <= now]

    def take(self, now: float) -> list[int]:
        """The free cohorts merged into one, taken by the step starting now; its requests."""
        free = self.free(now)
        if not free:
            return []
        free.sort(key=lambda c: -len(c.members))
        base = free[0]
        self.gaps = [(c.out_at, len(c.members)) for c in free]
        for c in free[1:]:
            shift = base.round - c.round
            for end, j in c.ends:
                heapq.heappush(base.ends, (end + shift, j))
            base.members.update(c.members)
            base.context_sum += c.context_sum
            self.cohorts.remove(c)
        self.taken = base
        return list(base.members)

    def decode(self, rep: _Replica, t: float) -> None:
        """The taken cohort's decode step, ending at `t`: a round more, its finished requests in join order."""
        c, a = self.taken, rep.cfg.accepted
        assert c is not None
        for out_at, n in self.gaps:
            rep.itl.extend([t - out_at] * n)
        c.round += 1
        c.out_at = t
        c.context_sum += len(c.members) * a if a != 1.0 else len(c.members)
        done = []
        while c.ends and c.ends[0][0] <= c.round:
            done.append(heapq.heappop(c.ends)[1])
        for j in sorted(done):
            rid = self.order[j]
            del rep.running[rid], c.members[rid]
            rep.decoded[rid], rep.out_at[rid] = rep.outputs[rid], t
            c.context_sum -= rep.position(rid)
            rep.finish(rid, t)
        if not c.members:
            self.cohorts.remove(c)
        self.taken = None

    def materialize(self, rep: _Replica) -> None:
        """Each running request's own token count and last token time, for the per-token path."""
        for c in self.cohorts:
            for end, j in c.ends:
                rid = self.order[j]
                rep.decoded[rid], rep.out_at[rid] = rep.outputs[rid] - (end - c.round), c.out_at


class _Replica:
    """The state of one replica's loop while it runs (`run_replica`)."""

    FAST_DECODE = True  # decode steps of every running request kept per step, not per token (`_Rounds`)

    def __init__(self, arrivals: Arrivals, prices: StagePrices, cfg: LoopConfig, seeded: bool = True) -> None:
        """`seeded` False: no request arrives by itself (a P/D instance: `simulate.disagg_loop` delivers them)."""
        self.reqs = arrivals.requests
        self.prices, self.cfg = prices, cfg
        # `CachedPrices.price_step`: a step priced from (prefill segments, decode tokens, their contexts' sum),
        # the price `prices` gives the full segments (tests/simulate/test_loop_fast_path.py)
        self.price_step: Callable[[Segments, int, float, bool], Sequence[float]] | None = getattr(
            prices, "price_step", None
        )
        fast = self.FAST_DECODE and cfg.decode and cfg.in_flight == 1 and self.price_step is not None
        self.rounds: _Rounds | None = _Rounds() if fast else None
        pp = self.FAST_DECODE and cfg.decode and cfg.in_flight > 1 and self.price_step is not None
        self.cohorts: _Cohorts | None = _Cohorts() if pp else None
        n = len(self.reqs)
        self.sent = [r.arrival_s for r in self.reqs]
        self.progress = [r.prompt_tokens - r.new_tokens for r in self.reqs]  # next position to compute
        self.out_at = [0.0] * n  # when the request's latest step leaves the pipeline
        self.first_step = [math.nan] * n
        self.prefill_end = [math.nan] * n
        self.ready = [math.nan] * n  # when the first token can go out (after a P/D hand-off)
        self.done_at = [math.nan] * n  # when its last token's step leaves the pipeline
        self.decoded = [0] * n  # output tokens so far (the prefill step gives the first)
        self.last_pos = [r.prompt_tokens - 1 for r in self.reqs]  # a decode token's position: this + decoded
        self.outputs = [cfg.steps_out(r.output_tokens) for r in self.reqs]  # in steps (`steps_out`)
        self.itl: list[float] = []  # gaps between a request's successive tokens, every decode token
        self.closed = seeded and isinstance(arrivals, ClosedLoop)
        first = min(arrivals.concurrency, n) if isinstance(arrivals, ClosedLoop) else n
        first = first if seeded else 0
        if self.closed:
            self.sent[:first] = [0.0] * first
        self.next_id = first
        self.heap = [(self.sent[i] + cfg.request_in_s, i) for i in range(first)]
        heapq.heapify(self.heap)
        self.waiting: deque[int] = deque()
        self.running: dict[int, None] = {}  # decoding requests, in the order they started decoding
        self.limited = cfg.max_running is not None or cfg.kv_tokens is not None
        self.admitted: set[int] = set()  # tracked only under a cap or a pool (`limited`)
        self.kv_used = 0
        self.releases: list[tuple[float, int]] = []  # (when a finished request frees its slot and KV, id)
        self.stage_free: list[float] = []
        self.steps: list[PrefillBatch] = []
        self.done = 0

    def release(self, now: float) -> None:
        """Free the slots and KV of the requests whose last step has left the pipeline by `now`."""
        while self.releases and self.releases[0][0] <= now:
            rid = heapq.heappop(self.releases)[1]
            self.admitted.discard(rid)
            self.kv_used -= self.cfg.kv_need(self.reqs[rid])

    def admits(self, rid: int) -> bool:
        """Whether a request not yet admitted fits the running-request cap and the KV pool now."""
        cfg = self.cfg
        if cfg.max_running is not None and len(self.admitted) >= cfg.max_running:
            return False
        return cfg.kv_tokens is None or self.kv_used + cfg.kv_need(self.reqs[rid]) <= cfg.kv_tokens

    def prefill_chunks(self, now: float, budget: int) -> list[Segment]:
        """First come first served under the token budget; a split request goes back to the front;
        a request that is not admitted stops the queue (head of line)."""
        segs, back = [], []
        while self.waiting and budget > 0:
            rid = self.waiting[0]
            if self.limited and rid not in self.admitted:
                if not self.admits(rid):
                    break
                self.admitted.add(rid)
                self.kv_used += self.cfg.kv_need(self.reqs[rid])
            self.waiting.popleft()
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

    def position(self, rid: int) -> float:
        """The context a running request's next decode step reads."""
        d = self.decoded[rid]
        return self.last_pos[rid] + d + self.cfg.position_shift(d)

    def decode_tokens(self, now: float, budget: int | None) -> list[int]:
        """The running requests that decode in this step (not in the pipeline), at most `budget`."""
        if self.cohorts is not None:
            if budget is None or sum(len(c.members) for c in self.cohorts.free(now)) <= budget:
                return self.cohorts.take(now)
            self.cohorts.materialize(self)  # a step that leaves free requests out: per token from here on
            self.cohorts = None
        if self.cfg.in_flight == 1:  # a step starts after the last one left: no request is in the pipeline
            out = list(self.running)
        else:
            out_at = self.out_at
            out = [rid for rid in self.running if out_at[rid] <= now]
        return out if budget is None else out[:budget]

    def form_step(self, now: float) -> tuple[list[Segment], list[int]]:
        """(prefill chunks, decoding requests) of the next step, as the engine forms it."""
        self.release(now)
        if self.cfg.mixed:
            w = self.cfg.verify_tokens
            dec = self.decode_tokens(now, self.cfg.chunk_tokens // w)
            return self.prefill_chunks(now, self.cfg.chunk_tokens - len(dec) * w), dec
        segs = self.prefill_chunks(now, self.cfg.chunk_tokens)
        return (segs, []) if segs else ([], self.decode_tokens(now, None))

    def next_wake(self, now: float) -> float:
        """When something can change while no step can form: an arrival, a request's step leaving the
        pipeline, a finished request freeing its slot; infinity when nothing inside the replica will."""
        times = [self.heap[0][0]] if self.heap else []
        times += [self.out_at[r] for r in self.waiting if self.out_at[r] > now]
        if self.cohorts is not None:
            times += [c.out_at for c in self.cohorts.cohorts if c.out_at > now]
        else:
            times += [self.out_at[r] for r in self.running if self.out_at[r] > now]
        times += [self.releases[0][0]] if self.releases else []
        return min(times, default=math.inf)

    def next_event(self, now: float) -> float:
        """`next_wake`, where a replica that runs alone must find one."""
        t = self.next_wake(now)
        if t == math.inf:
            raise AssertionError("the loop stalled with requests unfinished")  # a bug, not an input
        return t

    def earliest(self, now: float) -> float:
        """The first time from `now` at which stage 0 and the pipeline's depth let a step start."""
        if self.stage_free:
            now = max(now, self.stage_free[0])
        m = self.cfg.in_flight
        if len(self.steps) >= m:
            now = max(now, self.steps[-m].end_s)
        return now

    def run_step(self, segs: list[Segment], dec: list[int], now: float) -> None:
        """Price the step, push it through the stages, and advance its requests."""
        reqs = self.reqs
        rounds = self.rounds
        if rounds is not None and dec and len(dec) != len(self.running):
            rounds.materialize(self)  # a step that leaves running requests out: per-request counts from here on
            rounds = self.rounds = None
        times = self.step_times(segs, dec, rounds)
        times[0] += self.cfg.step_overhead_s
        if not self.stage_free:
            self.stage_free = [0.0] * len(times)
        t = now
        for k, dt in enumerate(times):
            t = max(t, self.stage_free[k]) + dt
            self.stage_free[k] = t
        self.steps.append(PrefillBatch(len(self.steps), tuple(segs), now, t, len(dec)))
        if dec:
            if rounds is not None:
                rounds.decode(self, t)
            elif self.cohorts is not None:
                self.cohorts.decode(self, t)
            else:
                self.decode_each(dec, t)
        for s in segs:
            rid = s.request_id
            if math.isnan(self.first_step[rid]):
                self.first_step[rid] = now
            self.progress[rid] = s.start_pos + s.n_tokens
            self.out_at[rid] = t
            if self.progress[rid] == reqs[rid].prompt_tokens:
                self.prefill_end[rid], self.decoded[rid] = t, 1
                self.ready[rid] = self.hand_off(rid, t)
                if self.cfg.decode and reqs[rid].output_tokens > 1:
                    self.running[rid] = None
                    if rounds is not None:
                        rounds.join(self, rid)
                    elif self.cohorts is not None:
                        self.cohorts.join(self, rid)
                else:
                    self.finish(rid, self.ready[rid])

    def step_times(self, segs: list[Segment], dec: list[int], rounds: _Rounds | None) -> list[float]:
        """Seconds the step holds each stage (its CPU cost not yet added)."""
        last, decoded = self.last_pos, self.decoded
        pre = tuple([(s.n_tokens, s.start_pos) for s in segs])
        shift = self.cfg.position_shift
        if self.price_step is not None:  # the same price without a segment per decode token
            taken = self.cohorts.taken if self.cohorts is not None and dec else None
            if taken is not None or rounds is not None:
                ctx = taken.context_sum if taken is not None else rounds.context_sum  # type: ignore[union-attr]
            else:
                ctx = sum([last[r] + decoded[r] for r in dec])
            if taken is None and rounds is None and self.cfg.accepted != 1.0:
                ctx += sum([shift(decoded[r]) for r in dec])
            times = [float(t) for t in self.price_step(pre, len(dec), ctx, bool(dec) or self.drafts_used(segs))]
        else:
            w = self.cfg.verify_tokens
            tokens = tuple([(w, round(last[r] + decoded[r] + shift(decoded[r]))) for r in dec])
            times = [float(t) for t in self.prices(pre + tokens)]
        if not times or min(times) < 0 or not all(map(math.isfinite, times)):
            raise TpplanError("stage prices", f"returned {times} s for step {len(self.steps)}", "return >= 0 per stage")
        return times

    def drafts_used(self, segs: list[Segment]) -> bool:
        """Whether a prompt's final chunk in `segs` has tokens to decode (its engine decodes them, whether or
        not this loop does), so that a draft proposed after the step is verified (vLLM proposes none
        otherwise, `tpplan.engines.speculative.VLLM_AGG_PREFILL`)."""
        reqs = self.reqs
        return any(
            s.start_pos + s.n_tokens == reqs[s.request_id].prompt_tokens and reqs[s.request_id].output_tokens > 1
            for s in segs
        )

    def decode_each(self, dec: list[int], t: float) -> None:
        """Advance each decoding request by one token at `t` (its gap since its last token into the ITLs)."""
        out_at, decoded, outs = self.out_at, self.decoded, self.outputs
        self.itl.extend([t - out_at[r] for r in dec])
        for rid in dec:
            out_at[rid] = t
            decoded[rid] += 1
            if decoded[rid] >= outs[rid]:
                del self.running[rid]
                self.finish(rid, t)

    def hand_off(self, rid: int, t: float) -> float:
        """When request `rid`'s first token can go out: at once, or (P/D) once its KV reached the decode
        side; a blocking engine holds its last stage until then, one hand-off after another."""
        if self.cfg.handoff_s is None:
            return t
        h = float(self.cfg.handoff_s(self.reqs[rid]))
        if not (math.isfinite(h) and h >= 0):
            raise TpplanError("handoff_s", f"returned {h} s for request {rid}", "return >= 0 seconds")
        if not self.cfg.handoff_blocks:
            return t + h
        self.stage_free[-1] = max(self.stage_free[-1], t) + h
        return self.stage_free[-1]

    def finish(self, rid: int, t: float) -> None:
        self.done_at[rid] = t
        self.done += 1
        if self.limited:
            heapq.heappush(self.releases, (t, rid))
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
            segs, dec = self.form_step(now)
            if segs or dec:
                self.run_step(segs, dec, now)
            else:
                now = self.next_event(now)

    def timelines(self, replica: int) -> list[Timeline]:
        out, into = self.cfg.request_out_s, self.cfg.request_in_s
        return [
            Timeline(
                r,
                replica,
                self.sent[i],
                self.sent[i] + into,
                self.first_step[i],
                self.prefill_end[i],
                self.ready[i] + out,
                self.done_at[i] + out if self.cfg.decode or r.output_tokens == 1 else math.nan,
            )
            for i, r in enumerate(self.reqs)
        ]


def _check_fits(arrivals: Arrivals, cfg: LoopConfig) -> None:
    """A request whose KV does not fit the pool would never be admitted: refuse it up front."""
    if cfg.kv_tokens is None:
        return
    big = max(arrivals.requests, key=cfg.kv_need)
    if cfg.kv_need(big) > cfg.kv_tokens:
        why = (f"needs {cfg.kv_need(big):,} tokens of KV (prompt {big.prompt_tokens:,} + output "
               f"{big.output_tokens:,}), more than the pool's {cfg.kv_tokens:,} tokens")  # fmt: skip
        raise TpplanError(f"request {big.id}", why, "shorten the request or give each replica more KV (a larger TP)")


def run_replica(
    arrivals: Arrivals, prices: StagePrices, cfg: LoopConfig
) -> tuple[list[Timeline], list[PrefillBatch], list[float]]:
    """One replica's loop over `arrivals`: each request's timeline (in request order), the steps, and the
    gaps between successive tokens (every decode token)."""
    if not arrivals.requests:
        raise TpplanError("requests", "there are none", "give at least one request")
    _check_fits(arrivals, cfg)
    rep = _Replica(arrivals, prices, cfg)
    rep.run()
    return rep.timelines(0), rep.steps, rep.itl


def simulate(arrivals: Arrivals, prices: StagePrices, cfg: LoopConfig, mesh: Mesh | None = None) -> LoopResult:
    """The serving loop over the mesh's identical replicas (None: one), requests dealt round-robin
    (`split_round_robin`; a load-aware `cfg.router` is `simulate.replicas.simulate`'s); timelines in the
    arrivals' request order, steps by start time with the arrivals' request ids. `prices` are one
    replica's (the mesh's other axes are in them)."""
    mesh = mesh or Mesh(1)
    replicas = mesh.replicas
    if replicas > 1 and cfg.router != "round_robin":
        raise AssertionError("a load-aware router runs in simulate.replicas.simulate")  # a caller's bug
    lines: dict[int, Timeline] = {}
    steps: list[PrefillBatch] = []
    itl: list[float] = []
    shares: list[ReplicaShare] = []
    for r, (ids, share) in enumerate(split_round_robin(arrivals, mesh)):
        tl, st, gaps = run_replica(share, prices, cfg)
        itl += gaps
        shares.append(_share(share, tl, st))
        for j, line in enumerate(tl):
            lines[ids[j]] = Timeline(arrivals.requests[ids[j]], r, *_times(line))
        if replicas == 1:  # the share's ids are the arrivals' own
            steps += st
            continue
        for b in st:
            segs = tuple(Segment(ids[s.request_id], s.start_pos, s.n_tokens) for s in b.segments)
            steps.append(PrefillBatch(b.index, segs, b.start_s, b.end_s, b.decode_tokens))
    steps.sort(key=lambda b: (b.start_s, b.end_s))
    return LoopResult(tuple(lines[i] for i in range(len(arrivals.requests))), tuple(steps), tuple(itl),
                      tuple(shares) if replicas > 1 else ())  # fmt: skip


def _share(share: Arrivals, tl: list[Timeline], st: list[PrefillBatch]) -> ReplicaShare:
    """One replica's part: requests, clients (a timed share: one per request), prompt tokens, TTFT, makespan."""
    clients = share.concurrency if isinstance(share, ClosedLoop) else len(share.requests)
    mean = math.fsum(t.ttft_s for t in tl) / len(tl)
    return ReplicaShare(len(tl), clients, sum(t.request.prompt_tokens for t in tl), mean, max(b.end_s for b in st))


def _times(t: Timeline) -> tuple[float, float, float, float, float, float]:
    return t.arrival_s, t.queued_s, t.first_step_s, t.prefill_end_s, t.first_token_s, t.done_s


__all__ = ["LoopConfig", "StagePrices", "run_replica", "simulate"]
