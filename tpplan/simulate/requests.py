"""Requests and the ways they arrive: closed loop at a concurrency, Poisson at a rate, or a trace.

A `Request` is what the serving loop needs of one request: when it arrives, how long its prompt is,
how many of those tokens the prefix cache already holds (they cost no prefill compute, but the
attention of the new tokens still reads them), and how many tokens it will generate. `Arrivals` is
one of two forms: `Timed` (every arrival time known up front: Poisson, a trace) or `ClosedLoop`
(C clients, each sending its next request when the previous one gets its first token, as tpplan's
workloads always did).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from tpplan.errors import TpplanError
from tpplan.mesh import Mesh

MAX_RATE = 1e6  # requests/s; above this a rate is a typo, not a workload


@dataclass(frozen=True)
class Request:
    """One request: arrival (s; a closed loop sets it when the client sends), prompt, cached prefix, output."""

    id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int = 1
    cached_tokens: int = 0  # prompt tokens already in the prefix cache: no prefill compute
    prefix_id: str | None = None  # requests of one prefix id share their cached prefix (from a trace)

    @property
    def new_tokens(self) -> int:
        """Tokens the engine must prefill (at least one: engines always compute the last token)."""
        return max(1, self.prompt_tokens - self.cached_tokens)


@dataclass(frozen=True)
class Timed:
    """Requests with known arrival times, sorted (Poisson, a trace)."""

    requests: tuple[Request, ...]


@dataclass(frozen=True)
class ClosedLoop:
    """`concurrency` clients, the first C requests sent at t = 0 and each next one (in order) the moment
    a client's request gets its first token. `requests[i].arrival_s` is ignored."""

    concurrency: int
    requests: tuple[Request, ...]


Arrivals = Timed | ClosedLoop


@dataclass(frozen=True)
class Shape:
    """A request's lengths, without its arrival: prompt, output, cached share of the prompt."""

    prompt_tokens: int
    output_tokens: int = 1
    cached_share: float = 0.0  # of the prompt, in [0, 1): rounded down to whole tokens

    def request(self, rid: int, arrival_s: float = 0.0) -> Request:
        cached = min(self.prompt_tokens - 1, int(self.prompt_tokens * self.cached_share))
        return Request(rid, arrival_s, self.prompt_tokens, self.output_tokens, cached)


def closed_loop(concurrency: int, shapes: Sequence[Shape], n: int) -> ClosedLoop:
    """`n` requests from `concurrency` clients, their shapes cycled."""
    if concurrency < 1:
        raise TpplanError(f"concurrency={concurrency}", "must be at least 1", "pass 1 or more clients")
    return ClosedLoop(concurrency, tuple(shapes[i % len(shapes)].request(i) for i in range(n)))


def poisson(rate: float, shapes: Sequence[Shape], n: int, seed: int = 0) -> Timed:
    """`n` requests arriving as a Poisson process of `rate` per second (exponential gaps drawn from
    `random.Random(seed)`, so one seed gives one trace), their shapes cycled; the first at t = 0."""
    if not (math.isfinite(rate) and 0 < rate <= MAX_RATE):
        raise TpplanError(f"arrival_rate={rate}", f"must be a rate in (0, {MAX_RATE:g}] requests/s",
                          "pass a positive request rate")  # fmt: skip
    rng = random.Random(seed)
    t, out = 0.0, []
    for i in range(n):
        out.append(shapes[i % len(shapes)].request(i, t))
        t += rng.expovariate(rate)
    return Timed(tuple(out))


def split_round_robin(arrivals: Arrivals, mesh: Mesh) -> list[tuple[list[int], Arrivals]]:
    """Each of the mesh's R replicas' share dealt beforehand (the search's screen; the engines' routers run in
    `simulate.replicas` and `cost.workload.simulate_routed`): request i to replica i mod R
    (closed loop: requests as above, and clients c, c + R, ... of replica r; as
    `tpplan.cost.workload.replica_workloads` deals them). Returns (the original ids,
    the share with ids 0..n-1) per replica; R above the requests (or the clients) is refused."""
    reqs, replicas = arrivals.requests, mesh.replicas
    clients = arrivals.concurrency if isinstance(arrivals, ClosedLoop) else len(reqs)
    if replicas < 1 or replicas > min(clients, len(reqs)):
        raise TpplanError(f"replicas={replicas}", f"{len(reqs)} requests from {clients} clients leave a replica idle",
                          f"use 1 to {min(clients, len(reqs))} replicas")  # fmt: skip
    out: list[tuple[list[int], Arrivals]] = []
    for r in range(replicas):
        ids = list(range(r, len(reqs), replicas))
        mine = tuple(Request(j, reqs[i].arrival_s, reqs[i].prompt_tokens, reqs[i].output_tokens,
                             reqs[i].cached_tokens, reqs[i].prefix_id) for j, i in enumerate(ids))  # fmt: skip
        if isinstance(arrivals, ClosedLoop):
            out.append((ids, ClosedLoop(len(range(r, clients, replicas)), mine)))
        else:
            out.append((ids, Timed(mine)))
    return out


__all__ = ["Arrivals", "ClosedLoop", "Request", "Shape", "Timed", "closed_loop", "poisson", "split_round_robin"]
