"""The P/D serving loop: the prefill instances and decode instances of one disaggregated deployment run
together, each request's KV handed from one to the other as the engine hands it.

Each instance is the engine's own loop (`simulate.loop`): a prefill instance forms chunked-prefill steps
and never decodes; a decode instance admits a request into its KV pool and running-request cap
(prompt + output reserved, no preemption, as the aggregated loop), takes it into its running batch once
the KV has arrived, and decodes one token per request per step. A conservative co-simulation keeps them
in step: the instance that can act earliest acts next, and what it causes elsewhere (a request reaching
the prefill server, KV reaching the decode server, a client sending its next request) is delivered at a
time no earlier than its own, so no instance ever acts before an event it should have seen.

How a request crosses (`tpplan.engines.schema.HandoffRule`, each release module states its own):
- SGLang 0.5.23: the router sends the request to both servers; the decode server reserves its KV first
  (`DecodePreallocQueue.pop_preallocated`, FIFO while it fits), and only then does the prefill server
  compute it (`PrefillBootstrapQueue.pop_bootstrapped`: at the default `optimistic_prefill_attempts` 0 a
  request waits for that bootstrap); the prefill side pushes the KV after its last chunk; the decode server
  merges the arrived request into its running batch and streams the prefill's first token;
- vLLM 0.34.0 (NixlConnector, pull): the prefill server computes the prompt first; the decode server gets
  the request with the prefill's block ids, allocates the prompt's blocks when it schedules it and reads
  the KV asynchronously (`NixlPullConnectorScheduler.get_num_new_matched_tokens`); once read, it recomputes
  the prompt's last token (`Scheduler._update_waiting_for_remote_kv`), which gives the first output token.
The KV of one request crosses one link (the sending prefill instance's for a push, the reading decode
instance's for a pull) in `handoff_s(request)` seconds; a link carries one request's KV at a time, in the
order the transfers start. Which instances a request goes to is the release's P/D router
(`HandoffRule.router`, run by `tpplan.cost.routing`): SGLang's router picks both at once, cache-aware in
each pool, and counts the request at its prefill instance until it ends (`prefill_load_to_end`); vLLM's proxy
picks the prefill in turn and, when it answers, the decode in turn. A rule whose router was not read routes
round-robin at the request (`ROUTER_UNREAD`).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from tpplan.cost.routing import Router
from tpplan.cost.workload import PrefillBatch, Segment
from tpplan.engines import handoff_rule
from tpplan.engines.schema import HandoffRule, Source
from tpplan.errors import TpplanError
from tpplan.simulate.cosim import Actor, CoSim, RouterActor
from tpplan.simulate.loop import LoopConfig, StagePrices, _check_fits, _Replica
from tpplan.simulate.requests import Arrivals, ClosedLoop, Request
from tpplan.simulate.results import LoopResult, Timeline

# The current default releases' hand-offs (`tpplan.engines.handoff_rule`; each release states its own).
SGLANG_RULE = handoff_rule("sglang")[0]
VLLM_RULE = handoff_rule("vllm")[0]
ROUTER_UNREAD = Source.unread(
    "the release's P/D router",
    "router",
    "which instance a request goes to (round-robin assumed)",
    why="the fallback for a release module that states no P/D router (HandoffRule.router None); no release does "
    "today: sglang 0.5.23's (sglang-router 0.3.2) and vllm 0.34.0's (its toy proxy) were read, and 0.33.0 and the "
    "main revisions use 0.34.0's and 0.5.23's rules with a note",
)


def router_sources(rule: HandoffRule) -> tuple[Source, ...]:
    """Where the rule's P/D router was read (`ROUTER_UNREAD` where it was not)."""
    return tuple(f.source for f in rule.router.facts) if rule.router else (ROUTER_UNREAD,)


@dataclass(frozen=True)
class PoolLoop:
    """One pool as the loop runs it: step prices of one instance, its loop settings, how many instances."""

    prices: StagePrices
    config: LoopConfig
    instances: int


@dataclass(frozen=True)
class DisaggRun:
    """The loop's result (timelines with TTFT at the client, every step of both pools, decode ITLs) and
    what says which side binds: each pool's busy share per instance, each link's, the waits."""

    result: LoopResult
    prefill_busy: tuple[float, ...]  # share of the run each prefill instance has a step in flight
    decode_busy: tuple[float, ...]
    link_busy: tuple[float, ...]  # share of the run each link carries KV
    handoff_mean_s: float  # seconds one request's KV takes on the link (no queueing)
    link_wait_mean_s: float  # mean wait for a busy link (every chunk's, where the engine sends per chunk)
    handoff_tail_mean_s: float  # mean time from a prompt's last chunk to its KV at the decode server
    decode_admit_wait_mean_s: float  # mean wait at the decode server for KV room or a running slot


class _Link:
    """One instance's link for KV hand-offs: one transfer at a time, in the order they start."""

    def __init__(self) -> None:
        self.free = 0.0
        self.busy = 0.0
        self.wait = 0.0

    def send(self, start: float, seconds: float) -> float:
        begin = max(start, self.free)
        self.wait += begin - start
        self.free = begin + seconds
        self.busy += seconds
        return self.free


class _Prefill(_Replica):
    """A prefill instance: the engine's loop without decode; a finished prompt goes to the co-simulation."""

    def __init__(self, sim: _PD, arrivals: Arrivals, prices: StagePrices, cfg: LoopConfig) -> None:
        super().__init__(arrivals, prices, cfg, seeded=False)
        self.sim = sim
        self.completed: list[tuple[int, float]] = []  # prompts the step being run finished

    def deliver(self, rid: int, t: float) -> None:
        heapq.heappush(self.heap, (t, rid))

    def run_step(self, segs: list[Segment], dec: list[int], now: float) -> None:
        """The step, then each chunk's KV to the link (where the engine sends per chunk) and the finished
        prompts to the co-simulation."""
        super().run_step(segs, dec, now)
        t = self.steps[-1].end_s
        for seg in segs:
            self.sim.chunk_done(self, seg, t)
        for rid, end in self.completed:
            self.sim.prefilled(rid, end)
        self.completed.clear()

    def act(self, now: float) -> float:
        """One turn of the loop at `now`: take arrivals, form and run a step; when it can act again."""
        while self.heap and self.heap[0][0] <= now:
            self.waiting.append(heapq.heappop(self.heap)[1])
        segs, _ = self.form_step(now)
        if segs:
            self.run_step(segs, [], now)
            return self.earliest(now)
        return self.next_wake(now)

    def finish(self, rid: int, t: float) -> None:
        self.done_at[rid] = t
        self.done += 1
        self.completed.append((rid, t))


_KV, _REQ = 0, 1  # a decode instance's events: the request's KV arrived; the request reached the server
_SENT, _ANSWERED = 0, 1  # the router's events: a client sent the request; its prefill server answered (vLLM)


class _Decode(_Replica):
    """A decode instance: admits requests into its KV pool and cap, runs the arrived ones' decode steps."""

    def __init__(self, sim: _PD, arrivals: Arrivals, prices: StagePrices, cfg: LoopConfig) -> None:
        super().__init__(arrivals, prices, cfg, seeded=False)
        self.sim = sim
        self.first_on_decode = sim.rule.first_token_on_decode
        if self.first_on_decode:
            self.rounds = None  # a request's first decode step gives its first token, not a gap: per token
            self.cohorts = None
        self.prealloc: deque[int] = deque()  # reached the server, waiting for KV room (FIFO)
        self.arrived: deque[int] = deque()  # KV arrived, joining the running batch at the next step
        self.events: list[tuple[float, int, int]] = []  # (when, _KV or _REQ, request)
        self.seen_at = [math.nan] * len(self.reqs)
        self.admit_at = [math.nan] * len(self.reqs)

    def deliver(self, rid: int, t: float, kind: int) -> None:
        heapq.heappush(self.events, (t, kind, rid))

    def next_wake(self, now: float) -> float:
        return min(super().next_wake(now), self.events[0][0] if self.events else math.inf)

    def act(self, now: float) -> float:
        self.release(now)
        events = self.events
        while events and events[0][0] <= now:
            _, kind, rid = heapq.heappop(events)
            if kind == _KV:
                self.arrived.append(rid)
            else:
                self.seen_at[rid] = now
                self.prealloc.append(rid)
        while self.prealloc and self.admits(self.prealloc[0]):
            rid = self.prealloc.popleft()
            self.admitted.add(rid)
            self.kv_used += self.cfg.kv_need(self.reqs[rid])
            self.admit_at[rid] = now
            self.sim.admitted(rid, now)
        fresh = self.join(now)
        dec = self.decode_tokens(now, None)
        if not dec:
            return self.next_wake(now)
        before = len(self.itl)
        self.run_step([], dec, now)
        if fresh:  # their step gave the first token, not a gap between two
            keep = [g for g, r in zip(self.itl[before:], dec, strict=False) if r not in fresh]
            del self.itl[before:]
            self.itl.extend(keep)
            for rid in fresh:
                self.ready[rid] = self.out_at[rid] if math.isnan(self.done_at[rid]) else self.done_at[rid]
        return self.earliest(now)

    def join(self, now: float) -> set[int]:
        """The arrived requests into the running batch; those whose first token this server computes."""
        fresh: set[int] = set()
        while self.arrived:
            rid = self.arrived.popleft()
            self.out_at[rid] = now
            if self.first_on_decode:
                self.decoded[rid] = 0
                self.running[rid] = None
                fresh.add(rid)
                continue
            self.decoded[rid] = 1
            self.ready[rid] = now
            if self.outputs[rid] > 1:
                self.running[rid] = None
                if self.rounds is not None:
                    self.rounds.join(self, rid)
                elif self.cohorts is not None:
                    self.cohorts.join(self, rid)
            else:
                self.finish(rid, now)
        return fresh

    def finish(self, rid: int, t: float) -> None:
        self.done_at[rid] = t
        self.done += 1
        heapq.heappush(self.releases, (t, rid))
        self.sim.finished(rid, t)


class _PD(CoSim):
    """The co-simulation of one P/D deployment (see the module docstring)."""

    def __init__(
        self, arrivals: Arrivals, prefill: PoolLoop, decode: PoolLoop, handoff_s: Callable[[Request], float],
        rule: HandoffRule,
    ) -> None:  # fmt: skip
        self.reqs, self.rule = arrivals.requests, rule
        self.pcfg, self.dcfg = prefill.config, decode.config
        self.pre = [_Prefill(self, arrivals, prefill.prices, prefill.config) for _ in range(prefill.instances)]
        self.dec = [_Decode(self, arrivals, decode.prices, decode.config) for _ in range(decode.instances)]
        self.router = RouterActor(self)
        self.insts: list[Actor] = [self.router, *self.pre, *self.dec]  # the router first at a tie
        self.links = [_Link() for _ in range(prefill.instances if rule.push else decode.instances)]
        route = rule.router
        self.p_router = Router(route.prefill if route else "round_robin", prefill.instances, route)
        self.d_router = Router(route.decode if route else "round_robin", decode.instances, route)
        self.decode_late = route is not None and route.decode_at_prefill_end
        self.prefill_load_to_end = route is not None and route.prefill_load_to_end
        self.p_of = [-1] * len(self.reqs)  # the prefill instance each request went to
        self.d_of = [-1] * len(self.reqs)
        self.start()
        self.handoff_s = handoff_s
        self.handoff_cache: dict[int, float] = {}
        self.sent = [math.nan] * len(self.reqs)
        self.kv_sent = [math.nan] * len(self.reqs)  # when the last of a pushed prompt's chunks reaches the link's end
        self.kv_at = [math.nan] * len(self.reqs)  # when the request's KV is at the decode server
        self.done = 0
        self.closed = isinstance(arrivals, ClosedLoop)
        first = min(arrivals.concurrency, len(self.reqs)) if isinstance(arrivals, ClosedLoop) else len(self.reqs)
        self.next_id = first
        for rid in range(first):
            self.send(rid, 0.0 if self.closed else self.reqs[rid].arrival_s)

    def link(self, rid: int) -> _Link:
        """The link `rid`'s KV crosses: its prefill instance's (push) or its decode instance's (pull)."""
        return self.links[self.p_of[rid] if self.rule.push else self.d_of[rid]]

    def to_prefill(self, rid: int, t: float) -> None:
        p = self.p_of[rid]
        self.pre[p].deliver(rid, t)
        self.notify(1 + p, t)

    def to_decode(self, rid: int, t: float, kind: int) -> None:
        d = self.d_of[rid]
        self.dec[d].deliver(rid, t, kind)
        self.notify(1 + len(self.pre) + d, t)

    def kv_seconds(self, rid: int) -> float:
        r = self.reqs[rid]
        h = self.handoff_cache.get(r.prompt_tokens)
        if h is None:
            h = self.handoff_cache[r.prompt_tokens] = float(self.handoff_s(r))
            if not (math.isfinite(h) and h >= 0):
                raise TpplanError("handoff_s", f"returned {h} s for request {rid}", "return >= 0 seconds")
        return h

    def send(self, rid: int, t: float) -> None:
        """The client sends request `rid` at `t`: to the decode server first (SGLang) or the prefill (vLLM)."""
        self.sent[rid] = t
        self.to_router(rid, t, _SENT)

    def to_router(self, rid: int, t: float, kind: int) -> None:
        heapq.heappush(self.router.events, (t, kind, rid))
        self.notify(0, t)

    def route(self, rid: int, t: float, kind: int) -> None:
        """The router at `t`: picks the instances of a sent request and passes it on, or (vLLM) the decode
        instance of a request whose prefill answered, and passes it with its block ids."""
        req = self.reqs[rid]
        if kind == _ANSWERED:
            self.d_of[rid] = self.d_router.pick(req, t)
            self.to_decode(rid, t + self.dcfg.request_in_s, _REQ)
            return
        self.p_of[rid] = self.p_router.pick(req, t)
        if not self.decode_late:
            self.d_of[rid] = self.d_router.pick(req, t)
        if self.rule.decode_first:
            self.to_decode(rid, t + self.dcfg.request_in_s, _REQ)
        else:
            self.to_prefill(rid, t + self.pcfg.request_in_s)

    def admitted(self, rid: int, t: float) -> None:
        """The decode server reserved `rid`'s KV at `t`: the prefill may start (SGLang) or the read (vLLM)."""
        if self.rule.decode_first:
            self.to_prefill(rid, max(t, self.sent[rid] + self.pcfg.request_in_s))
        else:
            self.kv_at[rid] = self.link(rid).send(t, self.kv_seconds(rid))
            self.to_decode(rid, self.kv_at[rid], _KV)

    def chunk_done(self, inst: _Prefill, seg: Segment, t: float) -> None:
        """A chunk left prefill instance `inst` at `t`: where the engine sends each chunk (SGLang), its share
        of the prompt's KV (by new tokens; the cached prefix goes with the first) queues on the link."""
        if not self.rule.chunked_send:
            return
        rid = seg.request_id
        share = seg.n_tokens / self.reqs[rid].new_tokens
        self.kv_sent[rid] = self.link(rid).send(t, self.kv_seconds(rid) * share)

    def prefilled(self, rid: int, t: float) -> None:
        """The prompt's last chunk left the prefill instance at `t`: push its KV (SGLang; per chunk, it is
        already on the link), or pass the request with its block ids to the decode server (vLLM)."""
        if not self.prefill_load_to_end:
            self.p_router.release(self.p_of[rid], t)
        if self.rule.decode_first:
            chunked = self.rule.chunked_send  # the chunks' KV is already on the link
            arrive = self.kv_sent[rid] if chunked else self.link(rid).send(t, self.kv_seconds(rid))
            self.kv_at[rid] = arrive
            self.to_decode(rid, arrive, _KV)
        elif self.decode_late:
            self.to_router(rid, t + self.pcfg.request_out_s, _ANSWERED)
        else:
            self.to_decode(rid, t + self.pcfg.request_out_s + self.dcfg.request_in_s, _REQ)

    def finished(self, rid: int, t: float) -> None:
        self.done += 1
        self.d_router.release(self.d_of[rid], t)
        if self.prefill_load_to_end:  # the router counted it at its prefill instance until now
            self.p_router.release(self.p_of[rid], t)
        if self.closed and self.next_id < len(self.reqs):  # the client sends its next request
            nxt, self.next_id = self.next_id, self.next_id + 1
            self.send(nxt, t + self.dcfg.request_out_s)


def simulate_disaggregated(
    arrivals: Arrivals, prefill: PoolLoop, decode: PoolLoop, handoff_s: Callable[[Request], float],
    rule: HandoffRule = SGLANG_RULE,
) -> DisaggRun:  # fmt: skip
    """Every request of `arrivals` through the P/D deployment: its timeline (TTFT at the client, the
    hand-off included as the engine realises it), every step of both pools, the decode ITLs, and each
    side's busy share. The decode pool's `config.decode` must be on (a request holds prompt + output)."""
    if not arrivals.requests:
        raise TpplanError("requests", "there are none", "give at least one request")
    if prefill.instances < 1 or decode.instances < 1:
        raise TpplanError(f"instances={prefill.instances}:{decode.instances}", "each pool needs one instance or more",
                          "pass n_P >= 1 and n_D >= 1")  # fmt: skip
    if not decode.config.decode:
        raise TpplanError("decode pool", "its loop config has decode off", "build it with decode=True")
    _check_fits(arrivals, decode.config)
    sim = _PD(arrivals, prefill, decode, handoff_s, rule)
    sim.run()
    return _outcome(sim)


def _busy(steps: list[PrefillBatch], end: float) -> float:
    """Share of [0, end] in which the instance has a step in flight (the union of its steps' spans)."""
    total, reach = 0.0, 0.0
    for s in sorted(steps, key=lambda b: b.start_s):
        lo = max(s.start_s, reach)
        if s.end_s > lo:
            total += s.end_s - lo
            reach = s.end_s
    return total / end if end > 0 else 0.0


def _outcome(sim: _PD) -> DisaggRun:
    rin, d_out = sim.pcfg.request_in_s, sim.dcfg.request_out_s
    lines = []
    for rid, r in enumerate(sim.reqs):
        p, d = sim.pre[sim.p_of[rid]], sim.dec[sim.d_of[rid]]
        lines.append(Timeline(r, sim.d_of[rid], sim.sent[rid], sim.sent[rid] + rin, p.first_step[rid],
                              p.prefill_end[rid], d.ready[rid] + d_out, d.done_at[rid] + d_out))  # fmt: skip
    steps = sorted((b for inst in (*sim.pre, *sim.dec) for b in inst.steps), key=lambda b: (b.start_s, b.end_s))
    itl = tuple(g for d in sim.dec for g in d.itl)
    res = LoopResult(tuple(lines), tuple(steps), itl)
    end = max(t.done_s for t in lines)
    waits = [d.admit_at[rid] - d.seen_at[rid] for rid in range(len(sim.reqs)) for d in (sim.dec[sim.d_of[rid]],)]
    n = len(sim.reqs)
    handed = sum(sim.kv_seconds(rid) for rid in range(n))
    return DisaggRun(
        res,
        tuple(_busy(p.steps, end) for p in sim.pre),
        tuple(_busy(d.steps, end) for d in sim.dec),
        tuple(link.busy / end if end > 0 else 0.0 for link in sim.links),
        handed / n,
        math.fsum(link.wait for link in sim.links) / n,
        math.fsum(sim.kv_at[rid] - sim.pre[sim.p_of[rid]].prefill_end[rid] for rid in range(n)) / n,
        math.fsum(waits) / n,
    )


__all__ = [
    "ROUTER_UNREAD",
    "SGLANG_RULE",
    "VLLM_RULE",
    "DisaggRun",
    "HandoffRule",
    "PoolLoop",
    "handoff_rule",
    "router_sources",
    "simulate_disaggregated",
]
