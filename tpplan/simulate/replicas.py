"""Replicas behind the deployment's request router (`LoopConfig.router`, chosen once from the engine release's
records by `tpplan.engines.routing`, which the launch lines start too: by default SGLang's DP controller deals
round-robin, vLLM's DP client picks the least-loaded engine): every replica's loop and the router in one co-simulation
(`simulate.cosim`), so that the router picks at the moment a request reaches it, from the requests then in
flight at each replica, and a closed-loop client's next request may go to any replica. The dealt loop
(`simulate.loop.simulate`: client c pinned to replica c mod R, as `cost.workload.replica_workloads` deals the
search walk's screen) equals it on timed arrivals and on alike prompts with R dividing C under round-robin, not
on a closed loop of mixed prompts (tests/simulate/test_routing.py). The cost model's own scheduler runs the
same router (`cost.workload.simulate_routed`): without fixed costs the two agree request by request
(tests/cost/test_routed_replicas.py)."""

from __future__ import annotations

import heapq
import math

from tpplan.cost.routing import Router
from tpplan.cost.workload import PrefillBatch, ReplicaShare
from tpplan.mesh import Mesh
from tpplan.simulate.cosim import Actor, CoSim, RouterActor
from tpplan.simulate.loop import LoopConfig, StagePrices, _check_fits, _Replica
from tpplan.simulate.loop import simulate as dealt
from tpplan.simulate.requests import Arrivals, ClosedLoop
from tpplan.simulate.results import LoopResult, Timeline


class _Served(_Replica):
    """One replica: the engine's loop, its requests delivered by the router."""

    def __init__(self, sim: _Routed, arrivals: Arrivals, prices: StagePrices, cfg: LoopConfig) -> None:
        super().__init__(arrivals, prices, cfg, seeded=False)
        self.sim = sim

    def deliver(self, rid: int, t: float) -> None:
        heapq.heappush(self.heap, (t, rid))

    def act(self, now: float) -> float:
        """One turn of the loop at `now` (as `_Replica.run`'s): take arrivals, form and run a step."""
        while self.heap and self.heap[0][0] <= now:
            self.waiting.append(heapq.heappop(self.heap)[1])
        segs, dec = self.form_step(now)
        if segs or dec:
            self.run_step(segs, dec, now)
            return self.earliest(now)
        return self.next_wake(now)

    def finish(self, rid: int, t: float) -> None:
        super().finish(rid, t)
        self.sim.finished(self, rid, t)


class _Routed(CoSim):
    def __init__(self, arrivals: Arrivals, prices: StagePrices, cfg: LoopConfig, mesh: Mesh) -> None:
        self.reqs, self.cfg, replicas = arrivals.requests, cfg, mesh.replicas
        self.reps = [_Served(self, arrivals, prices, cfg) for _ in range(replicas)]
        self.router_actor = RouterActor(self)
        self.insts: list[Actor] = [self.router_actor, *self.reps]  # the router first at a tie
        self.router = Router(cfg.router, replicas, cfg.router_rule)
        self.of = [-1] * len(self.reqs)  # the replica each request went to
        self.peak = [0] * replicas  # the most of its requests in flight at once
        self.done = 0
        self.start()
        self.closed = isinstance(arrivals, ClosedLoop)
        first = min(arrivals.concurrency, len(self.reqs)) if isinstance(arrivals, ClosedLoop) else len(self.reqs)
        self.next_id = first
        for rid in range(first):
            self.send(rid, 0.0 if self.closed else self.reqs[rid].arrival_s)

    def send(self, rid: int, t: float) -> None:
        heapq.heappush(self.router_actor.events, (t, 0, rid))
        self.notify(0, t)

    def route(self, rid: int, t: float, kind: int) -> None:
        r = self.of[rid] = self.router.pick(self.reqs[rid], t)
        self.peak[r] = max(self.peak[r], self.router.load[r])
        self.reps[r].sent[rid] = t
        self.reps[r].deliver(rid, t + self.cfg.request_in_s)
        self.notify(1 + r, t + self.cfg.request_in_s)

    def finished(self, rep: _Served, rid: int, t: float) -> None:
        self.done += 1
        self.router.release(self.of[rid], t)
        if self.closed and self.next_id < len(self.reqs):  # the client sends its next request at once
            nxt, self.next_id = self.next_id, self.next_id + 1
            self.send(nxt, t + self.cfg.request_out_s)


def simulate(arrivals: Arrivals, prices: StagePrices, cfg: LoopConfig, mesh: Mesh | None = None) -> LoopResult:
    """The serving loop over the mesh's replicas as the engine's replica router spreads the requests
    (`simulate_routed`; one replica: `simulate.loop.simulate`)."""
    if mesh is None or mesh.replicas == 1:
        return dealt(arrivals, prices, cfg, mesh)
    return simulate_routed(arrivals, prices, cfg, mesh)


def simulate_routed(arrivals: Arrivals, prices: StagePrices, cfg: LoopConfig, mesh: Mesh) -> LoopResult:
    """`simulate.loop.simulate`'s result for the mesh's replicas behind `cfg.router`: timelines in request
    order (each with the replica it went to), steps by start time, every replica's share (its clients: the
    most of its requests in flight at once)."""
    _check_fits(arrivals, cfg)
    sim = _Routed(arrivals, prices, cfg, mesh)
    sim.run()
    per = [rep.timelines(r) for r, rep in enumerate(sim.reps)]
    lines = [per[r][rid] for rid, r in enumerate(sim.of)]
    steps = sorted((b for rep in sim.reps for b in rep.steps), key=lambda b: (b.start_s, b.end_s))
    itl = tuple(g for rep in sim.reps for g in rep.itl)
    shares = tuple(_share(r, sim, lines, rep.steps) for r, rep in enumerate(sim.reps))
    return LoopResult(tuple(lines), tuple(steps), itl, shares)


def _share(r: int, sim: _Routed, lines: list[Timeline], steps: list[PrefillBatch]) -> ReplicaShare:
    mine = [t for t in lines if t.replica == r]
    if not mine:
        return ReplicaShare(0, 0, 0, math.nan, 0.0)
    mean = math.fsum(t.ttft_s for t in mine) / len(mine)
    tokens = sum(t.request.prompt_tokens for t in mine)
    return ReplicaShare(len(mine), sim.peak[r], tokens, mean, max(b.end_s for b in steps))


__all__ = ["simulate", "simulate_routed"]
