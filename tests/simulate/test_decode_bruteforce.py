"""The serving loop with decode against a naive tick-by-tick reference, on random small cases.

The reference advances a clock one tick at a time (every price and overhead a whole number of ticks, at
least one per stage), keeps explicit per-stage queues, a list of decoding requests, the admitted set and
the KV in use, and frees a finished request's slot when its last step leaves the last stage. It shares no
code and no event logic with `tpplan.simulate.loop`; both must give every request the same first-token
and last-token times, for vLLM-style mixed steps and SGLang-style prefill-first steps."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tpplan.simulate.loop import LoopConfig, simulate
from tpplan.simulate.requests import Arrivals, ClosedLoop, Request, Timed


def _cost(coef: list[tuple[int, int]], segs: tuple[tuple[int, int], ...]) -> list[int]:
    new = sum(n for n, _ in segs)
    ctx = sum(c for _, c in segs)
    return [a + (new + ctx // 4) // b for a, b in coef]


class _Ref:
    """The reference's state: what each request has done, and what the scheduler holds."""

    def __init__(self, arr: Arrivals, cfg: LoopConfig) -> None:
        self.reqs, self.cfg = arr.requests, cfg
        self.closed = isinstance(arr, ClosedLoop)
        first = arr.concurrency if isinstance(arr, ClosedLoop) else len(self.reqs)
        self.sent = {i: (0 if self.closed else int(r.arrival_s)) for i, r in enumerate(self.reqs) if i < first}
        self.pos = {i: r.prompt_tokens - r.new_tokens for i, r in enumerate(self.reqs)}
        self.made = dict.fromkeys(range(len(self.reqs)), 0)  # output tokens so far
        self.waiting: list[int] = []
        self.decoding: list[int] = []
        self.in_pipe: set[int] = set()
        self.admitted: set[int] = set()
        self.kv = 0
        self.first: dict[int, int] = {}
        self.last: dict[int, int] = {}

    def need(self, rid: int) -> int:
        r = self.reqs[rid]
        return r.prompt_tokens + (r.output_tokens if self.cfg.decode else 1)

    def finish(self, rid: int, t: int) -> None:
        self.last[rid] = t + int(self.cfg.request_out_s)
        if self.cfg.max_running is not None or self.cfg.kv_tokens is not None:
            self.admitted.discard(rid)
            self.kv -= self.need(rid)
        if self.closed and len(self.sent) < len(self.reqs):
            self.sent[len(self.sent)] = t + int(self.cfg.request_out_s)

    def leave(self, step: dict[str, Any], t: int) -> None:
        """A step leaves the last stage at tick t: its requests' tokens are out."""
        for rid in step["dec"]:
            self.in_pipe.discard(rid)
            self.made[rid] += 1
            if self.made[rid] == self.reqs[rid].output_tokens:
                self.decoding.remove(rid)
                self.finish(rid, t)
        for rid, done in step["pre"]:
            self.in_pipe.discard(rid)
            if done:
                self.first[rid] = t + int(self.cfg.request_out_s)
                self.made[rid] = 1
                if self.cfg.decode and self.reqs[rid].output_tokens > 1:
                    self.decoding.append(rid)
                else:
                    self.finish(rid, t)

    def prefill(self, budget: int) -> list[tuple[int, int, int, bool]]:
        cfg, out = self.cfg, []
        for rid in list(self.waiting):
            if budget == 0:
                break
            if (cfg.max_running is not None or cfg.kv_tokens is not None) and rid not in self.admitted:
                if cfg.max_running is not None and len(self.admitted) >= cfg.max_running:
                    break
                if cfg.kv_tokens is not None and self.kv + self.need(rid) > cfg.kv_tokens:
                    break
                self.admitted.add(rid)
                self.kv += self.need(rid)
            if not cfg.chunks_overlap and rid in self.in_pipe:
                continue
            take = min(budget, self.reqs[rid].prompt_tokens - self.pos[rid])
            out.append((rid, take, self.pos[rid], self.pos[rid] + take == self.reqs[rid].prompt_tokens))
            self.pos[rid] += take
            budget -= take
            if out[-1][3]:
                self.waiting.remove(rid)
        return out

    def form(self) -> tuple[list[tuple[int, int, int, bool]], list[int]]:
        free = [r for r in self.decoding if r not in self.in_pipe]
        if self.cfg.mixed:
            dec = free[: self.cfg.chunk_tokens]
            return self.prefill(self.cfg.chunk_tokens - len(dec)), dec
        pre = self.prefill(self.cfg.chunk_tokens)
        return (pre, []) if pre else ([], free)


def brute_force(arr: Arrivals, cfg: LoopConfig, coef: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """(first-token tick, last-token tick) per request, tick by tick."""
    ref, n, p = _Ref(arr, cfg), len(arr.requests), len(coef)
    busy: list[tuple[int, dict[str, Any]] | None] = [None] * p
    queues: list[list[dict[str, Any]]] = [[] for _ in range(p)]
    flying = t = 0
    while len(ref.last) < n:
        for k in range(p):
            job = busy[k]
            if job is not None and job[0] == t:
                busy[k] = None
                if k + 1 < p:
                    queues[k + 1].append(job[1])
                else:
                    flying -= 1
                    ref.leave(job[1], t)
        for k in range(1, p):
            if busy[k] is None and queues[k]:
                step = queues[k].pop(0)
                busy[k] = (t + step["cost"][k], step)
        ref.waiting += sorted(i for i, s in ref.sent.items() if s + int(cfg.request_in_s) == t)
        if busy[0] is None and flying < cfg.in_flight:
            pre, dec = ref.form()
            if pre or dec:
                shape = tuple((take, pos) for _, take, pos, _ in pre)
                shape += tuple((1, arr.requests[r].prompt_tokens + ref.made[r] - 1) for r in dec)
                step = {"pre": [(r, done) for r, _, _, done in pre], "dec": dec, "cost": _cost(coef, shape)}
                ref.in_pipe.update([r for r, *_ in pre] + dec)
                flying += 1
                busy[0] = (t + step["cost"][0] + int(cfg.step_overhead_s), step)
        t += 1
        assert t < 200_000
    return [ref.first[i] for i in range(n)], [ref.last[i] for i in range(n)]


requests = st.lists(
    st.tuples(st.integers(0, 30), st.integers(1, 30), st.integers(0, 3), st.integers(1, 6)), min_size=1, max_size=7
)  # (arrival, prompt, cached quarters, output tokens)


@settings(max_examples=150, deadline=None)
@given(
    reqs=requests,
    closed=st.integers(0, 4),  # 0: timed arrivals, else the concurrency
    chunk=st.integers(1, 25),
    coef=st.lists(st.tuples(st.integers(1, 3), st.integers(1, 8)), min_size=1, max_size=3),
    extra=st.integers(0, 2),
    overlap=st.booleans(),
    mixed=st.booleans(),
    caps=st.tuples(st.none() | st.integers(1, 3), st.none() | st.integers(0, 40)),
    overheads=st.tuples(st.integers(0, 2), st.integers(0, 2), st.integers(0, 2)),
)
def test_decode_loop_equals_the_tick_by_tick_reference(  # type: ignore[no-untyped-def]
    reqs, closed, chunk, coef, extra, overlap, mixed, caps, overheads
) -> None:
    ordered = sorted(reqs)
    made = tuple(Request(i, float(a), n, o, min(n - 1, n * q // 4)) for i, (a, n, q, o) in enumerate(ordered))
    arr: Arrivals = ClosedLoop(closed, made) if closed else Timed(made)
    biggest = max(r.prompt_tokens + r.output_tokens for r in made)
    kv = None if caps[1] is None else biggest + caps[1]  # every request fits the pool alone
    step_s, in_s, out_s = overheads
    cfg = LoopConfig(chunk, max(1, len(coef) - 1 + extra), overlap, float(step_s), float(in_s), float(out_s),
                     decode=True, mixed=mixed, max_running=caps[0], kv_tokens=kv)  # fmt: skip
    got = simulate(arr, lambda segs: _cost(coef, segs), cfg)
    first, last = brute_force(arr, cfg, coef)
    assert [t.first_token_s for t in got.timelines] == [float(x) for x in first]
    assert [t.done_s for t in got.timelines] == [float(x) for x in last]
