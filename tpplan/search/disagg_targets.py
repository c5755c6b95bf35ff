"""P/D deployments under latency targets: a prefill pool and a decode pool, each one of the meshes the
search found, in the n_P:n_D ratio the budget or the rate calls for (`tpplan.simulate.disagg`).

Candidates: pairs (prefill mesh, decode mesh) of the meshes of the search's deployments (one replica
each, with the plan served there): the `POOLS` with the shortest TTFT of one client alone for prefill,
the `POOLS` with the most output tokens/s per GPU served aggregated for decode, each decode mesh with the
search's plan and the `DECODE_PLANS` legal there (a decode pool is priced on decode steps, so its best plan
may differ from the prefill search's: `decode_variants`). Each pair is first
judged by `simulate.disagg.capacity`, the analytic bound (requests/s one prefill instance, one decode
instance at the largest batch whose decode step keeps the TPOT target, and one link carry): under a
GPU budget, the ratio whose bound per GPU is highest (then the most requests/s); under a rate, the
fewest GPUs whose bound carries it. Only the `PAIRS` pairs with the highest bound per GPU are
simulated (`serve_disaggregated`): one client alone first (the bound on TTFT and TPOT: a miss there is
a miss under load), then, under a budget, closed-loop loads from the decode instances' batches within
the TPOT target (the bound's), searched from that top load (`largest_met`); under a rate, Poisson at it. What
binds is the bound's side at the chosen ratio (prefill, decode or KV transfer), in its own words
(`DisaggResult.binding_text`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from tpplan.search.results import RankedPlan
from tpplan.search.serving_points import (
    WAVES,
    Binds,
    DeploymentAnswer,
    Load,
    ServingPoint,
    admitted_batch,
    largest_met,
    load_ladder,
    loop_engine_runs,
    point_of,
)

if TYPE_CHECKING:
    from tpplan.audit import Audits
    from tpplan.cost.predictor import Predictor
    from tpplan.search.serving_points import Ask
    from tpplan.simulate.disagg import Capacity, DisaggDeployment, DisaggResult

PAIRS = 2  # pairs of meshes simulated, those with the highest bound per GPU
POOLS = 3  # meshes tried for each pool
DECODE_PLANS = ("baseline", "dp-attention")  # named plans a decode pool may run instead of the searched one
_SIDE: dict[str, Binds] = {"prefill": "prefill", "decode": "decode", "transfer": "KV transfer"}


@dataclass(frozen=True)
class _Pair:
    """One candidate: prefill and decode meshes, the ratio the bound chose and its bound."""

    prefill: RankedPlan
    decode: RankedPlan
    dep: DisaggDeployment
    bound: Capacity

    @property
    def per_gpu(self) -> float:
        return self.bound.of(self.dep.prefill.instances, self.dep.decode.instances) / self.dep.gpus

    @property
    def label(self) -> str:
        p, d = self.dep.prefill, self.dep.decode
        plan = f" {self.decode.plan.name}" if self.decode.plan.name != self.prefill.plan.name else ""
        return f"P/D {p.instances}x {_mesh(self.prefill)} + {d.instances}x {_mesh(self.decode)}{plan}"


def _mesh(r: RankedPlan) -> str:
    return replace(r.mesh, replicas=1).label()


def _key(r: RankedPlan) -> tuple[str, str]:
    """A pool candidate: its one-replica mesh and its plan."""
    return _mesh(r), r.plan.name


def decode_variants(ask: Ask, r: RankedPlan, audits: Audits) -> list[RankedPlan]:
    """`r` (the prefill search's best plan at its mesh) and the `DECODE_PLANS` legal there that the loop's
    engine realises there: the plans a decode pool of that mesh may run. The prefill search ranked plans by
    TTFT; a decode pool is priced on decode steps, where another plan (DP attention: each rank keeps its own
    requests' KV) may carry more, so each is a decode candidate judged by its pair's bound (`_pairs`). A
    variant's `score` is NaN and its `prediction` None: nothing ranks it by prefill."""
    from tpplan.errors import TpplanError
    from tpplan.plans.named import make_plan

    out = [r]
    for name in DECODE_PLANS:
        if name == r.plan.name or r.same_as_named == name:
            continue
        try:
            pa = audits.of(make_plan(name, ask.graph, r.tp), replace(r.mesh, replicas=1), ask.dtype)
        except TpplanError:  # not a plan of this model at this TP
            continue
        if pa.legal and loop_engine_runs(ask, pa.plan, r.mesh):
            out.append(replace(r, plan=pa.plan, audit=pa, score=math.nan, prediction=None, same_as_named=name))
    return out


def meshes(deployments: tuple[RankedPlan, ...]) -> list[RankedPlan]:
    """One per distinct one-replica mesh among the search's deployments (the first, the best, of each)."""
    seen: dict[str, RankedPlan] = {}
    for r in deployments:
        seen.setdefault(_mesh(r), r)
    return list(seen.values())


def _pairs(
    ask: Ask, prefill: list[RankedPlan], decode: list[RankedPlan], predictor: dict[tuple[str, str], Predictor]
) -> list[_Pair]:
    """Every (prefill, decode) pair that fits the budget, at its ratio, by bound per GPU, best first."""
    from tpplan.errors import TpplanError
    from tpplan.search.serving_points import shapes_of
    from tpplan.simulate.disagg import DisaggDeployment, PoolSpec, capacity, ratios
    from tpplan.simulate.requests import closed_loop

    shapes = shapes_of(ask.workload)
    probe = closed_loop(1, shapes, len(shapes))
    tpot = ask.targets.tpot.seconds if ask.targets.tpot is not None else None
    chunk = ask.workload.chunk_size
    out = []
    for p in prefill:
        for d in decode:
            try:
                base = DisaggDeployment(
                    PoolSpec(predictor[_key(p)], 1, chunk), PoolSpec(predictor[_key(d)], 1, chunk, ask.speculative)
                )
            except TpplanError:  # the two meshes need more GPUs than there are
                continue
            bound = capacity(base, probe, tpot)
            rows = [(n_p, n_d) for n_p, n_d in ratios(base, ask.topo.world_size)]
            if ask.arrival is not None and ask.arrival.rate is not None:
                from tpplan.simulate.disagg import choose_ratio

                got = choose_ratio(base.prefill, base.decode, probe, rate=ask.arrival.rate).chosen
                if got.gpus <= ask.topo.world_size:
                    out.append(_Pair(p, d, got, bound))
                continue
            if not rows:
                continue
            n_p, n_d = max(rows, key=lambda x: (bound.of(*x) / base.with_ratio(*x).gpus, bound.of(*x)))
            out.append(_Pair(p, d, base.with_ratio(n_p, n_d), bound))
    out.sort(key=lambda x: -x.per_gpu)
    return out


def serve_pair(ask: Ask, pair: _Pair) -> DeploymentAnswer:
    """One pair served: alone first, then the budget's loads or the rate."""
    from tpplan.search.serving_points import shapes_of
    from tpplan.simulate.disagg import serve_disaggregated
    from tpplan.simulate.requests import closed_loop
    from tpplan.simulate.serving import arrivals_for

    shapes = shapes_of(ask.workload)
    dep = pair.dep
    plan = f"{pair.prefill.plan.name} / {pair.decode.plan.name}"
    runs: dict[int | None, DisaggResult] = {}

    def run(clients: int | None) -> ServingPoint:
        if clients not in runs:
            if clients is None:
                assert ask.arrival is not None
                arrivals = arrivals_for(ask.arrival, ask.workload, ask.graph.spec.numerics.max_position_embeddings)
            else:
                n = len(shapes) if clients == 1 else ask.requests or WAVES * clients
                arrivals = closed_loop(clients, shapes, max(n, clients))
            runs[clients] = serve_disaggregated(dep, arrivals)
        load = Load(clients=clients) if clients is not None else Load(rate=ask.arrival.rate if ask.arrival else None)
        return point_of(ask.targets, pair.label, plan, "disaggregated", runs[clients].result, load, dep.gpus)

    alone = run(1)
    points = [alone]
    if alone.met:
        points = _loads(pair, run) if ask.arrival is None else [alone, run(None)]
    met = [pt for pt in points if pt.met]
    best = max(met, key=lambda pt: pt.goodput_per_gpu) if met else None
    shown = best or min(points, key=lambda pt: pt.worst_ratio)
    key = shown.load.clients if ask.arrival is None or shown is alone else None
    res = runs[key]
    binds = _SIDE[res.binding]
    why = res.binding_text() + f" at {dep.ratio} ({dep.gpus} GPUs)"
    pools = res.to_json()
    dec: dict = pools["decode"]  # type: ignore[assignment]
    cap = (dec["max_running"], dec["kv_tokens"]) if dec["max_running"] and dec["kv_tokens"] else None
    return DeploymentAnswer(pair.prefill, 1, tuple(sorted(points, key=_order)), best, admitted_batch(cap, shapes),
                            dec["kv_tokens"], dec["max_running"], binds, why, not alone.met, pair.decode, dep.ratio,
                            pools)  # fmt: skip


def _order(p: ServingPoint) -> float:
    return p.load.clients if p.load.clients is not None else math.inf


def _loads(pair: _Pair, at: Callable[[int], ServingPoint]) -> list[ServingPoint]:
    """Closed-loop loads 1, 2, 4, ... up to the decode instances' batches within the TPOT target (the
    bound's), from that top one down (`largest_met`): the largest that meets the targets and the next."""
    loads = load_ladder(max(1, pair.dep.decode.instances * pair.bound.decode_batch))
    tried: dict[int, ServingPoint] = {}

    def point(i: int) -> ServingPoint:
        tried.setdefault(loads[i], at(loads[i]))
        return tried[loads[i]]

    point(0)
    largest_met(len(loads), lambda i: point(i).met, len(loads) - 1)
    return [tried[c] for c in sorted(tried)]


def serve_disagg(ask: Ask, aggregated: list[DeploymentAnswer]) -> list[DeploymentAnswer]:
    """The `PAIRS` best pairs as P/D deployments, served under the targets. Pools are drawn from the
    `POOLS` meshes with the shortest prefill TTFT (the search's score) for prefill and the `POOLS` with
    the most output tokens/s per GPU as aggregated deployments (at their best or closest load) for decode,
    each decode mesh with its own plan choice (`decode_variants`: priced on decode steps in the bound)."""
    from functools import partial

    from tpplan.audit import Audits
    from tpplan.search.pool import forked_map
    from tpplan.search.serving_points import predictor_of

    every = meshes(ask.deployments)
    alone = {_mesh(a.ranked): a.points[0].ttft_s["mean"] for a in aggregated if a.points}  # one client's TTFT
    prefill = sorted(every, key=lambda r: alone.get(_mesh(r), math.inf))[:POOLS]
    tok_s = {_mesh(a.ranked): a.closest.output_tok_s_per_gpu for a in aggregated}
    audits = Audits(ask.graph)
    decode = [v for r in sorted(every, key=lambda r: -tok_s.get(_mesh(r), 0.0))[:POOLS]
              for v in decode_variants(ask, r, audits)]  # fmt: skip
    predictor = {_key(r): predictor_of(ask, r, False) for r in (*prefill, *decode)}
    pairs = _pairs(ask, prefill, decode, predictor)[:PAIRS]
    got = forked_map([partial(serve_pair, ask, pair) for pair in pairs])  # a core each (`search.pool`)
    # a worker's answer carries copies of the pair's plans back: the parent keeps its own
    return [replace(a, ranked=p.prefill, decode_ranked=p.decode) for a, p in zip(got, pairs, strict=True)]


__all__ = ["DECODE_PLANS", "PAIRS", "POOLS", "decode_variants", "meshes", "serve_disagg", "serve_pair"]
