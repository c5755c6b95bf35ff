"""The serving loop against a deliberately naive tick-by-tick simulation, on random small cases.

The reference below advances a clock one tick at a time (every price and overhead a whole number
of ticks, at least one per stage) and keeps explicit per-stage queues, so it shares no code and no
event logic with `tpplan.simulate.loop`; both must give every request the same TTFT."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tpplan.simulate.loop import LoopConfig, simulate
from tpplan.simulate.requests import Arrivals, ClosedLoop, Request, Timed


def _cost(coef: list[tuple[int, int]], segs: tuple[tuple[int, int], ...]) -> list[int]:
    new = sum(n for n, _ in segs)
    ctx = sum(c for _, c in segs)
    return [a + (new + ctx // 4) // b for a, b in coef]


def brute_force(arr: Arrivals, cfg: LoopConfig, coef: list[tuple[int, int]]) -> list[int]:
    """TTFT per request, tick by tick (integer config and prices)."""
    reqs, n, p = arr.requests, len(arr.requests), len(coef)
    closed = isinstance(arr, ClosedLoop)
    sent = {i: (0 if closed else int(r.arrival_s)) for i, r in enumerate(reqs) if not closed or i < arr.concurrency}
    pos = {i: r.cached_tokens for i, r in enumerate(reqs)}
    waiting: list[int] = []
    in_pipe: set[int] = set()  # requests with a chunk in the pipeline
    busy: list[tuple[int, dict[str, object]] | None] = [None] * p  # (finish tick, step) per stage
    queues: list[list[dict[str, object]]] = [[] for _ in range(p)]
    ttft: dict[int, int] = {}
    flying, t = 0, 0
    while len(ttft) < n:
        for k in range(p):  # finish what ends now; a finished step moves to the next stage's queue
            if busy[k] is not None and busy[k][0] == t:  # type: ignore[index]
                step = busy[k][1]  # type: ignore[index]
                busy[k] = None
                if k + 1 < p:
                    queues[k + 1].append(step)
                    continue
                flying -= 1
                for rid in step["rids"]:  # type: ignore[attr-defined]
                    in_pipe.discard(rid)
                for rid in step["done"]:  # type: ignore[attr-defined]
                    ttft[rid] = t + int(cfg.request_out_s) - sent[rid]
                    nxt = len(sent)
                    if closed and nxt < n:
                        sent[nxt] = t + int(cfg.request_out_s)
        for k in range(1, p):
            if busy[k] is None and queues[k]:
                step = queues[k].pop(0)
                busy[k] = (t + step["cost"][k], step)  # type: ignore[index]
        waiting += sorted(i for i, s in sent.items() if s + int(cfg.request_in_s) == t)
        if busy[0] is None and flying < cfg.in_flight:
            budget, segs, rids, done = cfg.chunk_tokens, [], [], []
            for rid in list(waiting):
                if budget == 0:
                    break
                if not cfg.chunks_overlap and rid in in_pipe:
                    continue
                take = min(budget, reqs[rid].prompt_tokens - pos[rid])
                segs.append((take, pos[rid]))
                rids.append(rid)
                pos[rid] += take
                budget -= take
                if pos[rid] == reqs[rid].prompt_tokens:
                    waiting.remove(rid)
                    done.append(rid)
            if segs:
                cost = _cost(coef, tuple(segs))
                step = {"rids": rids, "done": done, "cost": cost}
                in_pipe.update(rids)
                flying += 1
                busy[0] = (t + cost[0] + int(cfg.step_overhead_s), step)
        t += 1
        assert t < 100_000
    return [ttft[i] for i in range(n)]


requests = st.lists(
    st.tuples(st.integers(0, 30), st.integers(1, 40), st.integers(0, 3)), min_size=1, max_size=8
)  # (arrival, prompt, cached quarters)


@settings(max_examples=150, deadline=None)
@given(
    reqs=requests,
    closed=st.integers(0, 4),  # 0: timed arrivals, else the concurrency
    chunk=st.integers(1, 25),
    coef=st.lists(st.tuples(st.integers(1, 3), st.integers(1, 8)), min_size=1, max_size=3),
    extra=st.integers(0, 2),
    overlap=st.booleans(),
    overheads=st.tuples(st.integers(0, 2), st.integers(0, 2), st.integers(0, 2)),
)
def test_loop_equals_the_tick_by_tick_reference(reqs, closed, chunk, coef, extra, overlap, overheads) -> None:  # type: ignore[no-untyped-def]
    ordered = sorted(reqs)
    made = tuple(Request(i, float(a), n, 1, min(n - 1, n * q // 4)) for i, (a, n, q) in enumerate(ordered))
    arr: Arrivals = ClosedLoop(closed, made) if closed else Timed(made)
    step_s, in_s, out_s = overheads
    cfg = LoopConfig(chunk, max(1, len(coef) - 1 + extra), overlap, float(step_s), float(in_s), float(out_s))
    got = simulate(arr, lambda segs: _cost(coef, segs), cfg)
    assert got.ttfts == brute_force(arr, cfg, coef)
