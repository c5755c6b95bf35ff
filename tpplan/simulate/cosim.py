"""A conservative co-simulation of several engine instances and the router in front of them (the P/D loop,
`simulate.disagg_loop`, and replicas behind a load-aware router, `simulate.replicas`): the actor that can act
earliest acts next, and what it causes elsewhere is delivered at a time no earlier than its own, so no actor
ever acts before an event it should have seen."""

from __future__ import annotations

import heapq
import math
from typing import Protocol

from tpplan.simulate.requests import Request


class Actor(Protocol):
    def earliest(self, now: float) -> float: ...  # the first time from `now` it could act

    def act(self, now: float) -> float: ...  # act at `now`; when it can act again (inf: on a delivery only)


class CoSim:
    """The driver: `insts` the actors, `reqs` the requests, `done` how many finished (subclasses set them)."""

    insts: list[Actor]
    reqs: tuple[Request, ...]
    done: int

    def start(self) -> None:
        self.wake = [math.inf] * len(self.insts)
        self.queue: list[tuple[float, int]] = []

    def notify(self, idx: int, t: float) -> None:
        if t < self.wake[idx]:
            self.wake[idx] = t
            heapq.heappush(self.queue, (t, idx))

    def run(self) -> None:
        n, queue, wake = len(self.reqs), self.queue, self.wake
        while self.done < n:
            if not queue:
                raise AssertionError("the co-simulation stalled with requests unfinished")  # a bug, not an input
            t, i = heapq.heappop(queue)
            if t != wake[i]:
                continue  # superseded by an earlier wake
            self.turns(i, t)

    def turns(self, i: int, t: float) -> None:
        """Actor `i` acts at `t`, and again at once while its next turn comes strictly before every other
        actor's (nothing can reach it meanwhile): the order the queue would give, without its pushes."""
        inst, queue, wake = self.insts[i], self.queue, self.wake
        while True:
            horizon = queue[0][0] if queue else math.inf
            e = inst.earliest(t)
            if e > t:
                if e >= horizon:
                    wake[i] = e
                    heapq.heappush(queue, (e, i))
                    return
                t = e
            wake[i] = math.inf
            nxt = min(inst.act(t), wake[i])  # a delivery to itself may have set an earlier wake
            horizon = queue[0][0] if queue else math.inf
            if nxt < horizon and self.done < len(self.reqs):
                t = nxt
                continue
            wake[i] = nxt
            if nxt < math.inf:
                heapq.heappush(queue, (nxt, i))
            return


class Routed(Protocol):
    def route(self, rid: int, t: float, kind: int) -> None: ...


class RouterActor:
    """The router as one more actor, so that it picks instances at the time a request reaches it, having seen
    every release before that time; `kind` tells the co-simulation what reached it. Put it first in `insts`:
    at a tie it then acts before the instances, so a request sent at t is in an instance's queue at t."""

    def __init__(self, sim: Routed) -> None:
        self.sim = sim
        self.events: list[tuple[float, int, int]] = []  # (when, kind, request)

    def earliest(self, now: float) -> float:
        return max(now, self.events[0][0]) if self.events else math.inf

    def act(self, now: float) -> float:
        while self.events and self.events[0][0] <= now:
            t, kind, rid = heapq.heappop(self.events)
            self.sim.route(rid, t, kind)
        return self.events[0][0] if self.events else math.inf


__all__ = ["Actor", "CoSim", "RouterActor"]
