"""Which instance of a pool a request goes to, as the engines' routers pick it (`RouterRule`, each release
module states its own with the sources read).

- `round_robin`: request after request to instance 0, 1, ..., n-1, 0, ... (vLLM's P/D proxy for
  NixlConnector, `toy_proxy_server.get_next_client`, one cycle per pool).
- `least_loaded`: the instance with the fewest of the router's requests in flight, ties to the first from a
  start that moves on one instance per request (vLLM's DP client, `DPLBAsyncMPClient.get_core_engine_for_request`
  with one API server: its in-flight count; the coordinator's waiting + running snapshot, 100 ms stale, and the
  KV-pressure penalty on waiting requests are left out). A rule with `ties_rotate` off sends ties to the lowest
  index (SGLang's DP controller, `--load-balance-method total_requests`: `DPBudget.dispatch`).
- `cache_aware`: SGLang's router default (sglang-router 0.3.2, `CacheAwarePolicy::select_worker`): when the
  loads are imbalanced (max - min > `balance_abs` and max > min x `balance_rel`) the least-loaded instance; else
  the instance holding the request's prefix where it covers more than `cache_threshold` of the prompt, else the
  least-loaded instance (the first of the least). Assumed here: a request of prefix id p shares its
  `cached_tokens` with the earlier requests of p and p's holder is the instance p was last sent to (the router
  matches characters of the request text in its approximate trees), distinct prompts share nothing, nothing is
  evicted, and a request is in flight at an instance until its part there ends, or until the whole request
  ends where the rule says its prefill instance's load lasts that long (`prefill_load_to_end`).
"""

from __future__ import annotations

import heapq
from typing import Protocol

from tpplan.engines.schema import RouterPolicy, RouterRule


class Routed(Protocol):
    """What a router reads of a request (`tpplan.simulate.requests.Request`, the cost model's scheduler's)."""

    @property
    def prompt_tokens(self) -> int: ...

    @property
    def cached_tokens(self) -> int: ...

    @property
    def prefix_id(self) -> str | None: ...


class Router:
    """One pool's router: `pick` an instance for a request at a time, `release` it when its part there ends
    (a release is seen by the picks at or after its time, whenever the co-simulation learns of it)."""

    def __init__(self, policy: RouterPolicy, instances: int, rule: RouterRule | None = None) -> None:
        self.policy, self.n, self.rule = policy, instances, rule
        self.load = [0] * instances  # the router's requests in flight per instance
        self.turn = 0  # round_robin's next instance; least_loaded's scan start
        self.holder: dict[str, int] = {}  # cache_aware: the instance a prefix id was last sent to
        self.pending: list[tuple[float, int]] = []  # releases not yet due: (when, instance)

    def pick(self, req: Routed, now: float = 0.0) -> int:
        while self.pending and self.pending[0][0] <= now:
            self.load[heapq.heappop(self.pending)[1]] -= 1
        if self.policy == "round_robin":
            i = self.turn
            self.turn = (self.turn + 1) % self.n
        elif self.policy == "least_loaded":
            start = self.turn if self.rule is None or self.rule.ties_rotate else 0
            i = min(range(self.n), key=lambda k: (self.load[(start + k) % self.n], k))
            i = (start + i) % self.n
            self.turn = (self.turn + 1) % self.n
        else:
            i = self._cache_aware(req)
        self.load[i] += 1
        return i

    def release(self, i: int, t: float = 0.0) -> None:
        heapq.heappush(self.pending, (t, i))

    def _cache_aware(self, req: Routed) -> int:
        rule = self.rule or RouterRule("cache_aware", "cache_aware", False, ())
        hi, lo = max(self.load), min(self.load)
        owner = self.holder.get(req.prefix_id) if req.prefix_id is not None else None
        shared = req.cached_tokens if owner is not None else 0
        balanced = not (hi - lo > rule.balance_abs and hi > lo * rule.balance_rel)
        i = owner if balanced and owner is not None and shared / req.prompt_tokens > rule.cache_threshold else None
        i = self.load.index(lo) if i is None else i
        if req.prefix_id is not None:
            self.holder[req.prefix_id] = i
        return i


__all__ = ["Routed", "Router"]
