"""The search under latency targets: each deployment a search found, served with decode, ranked by goodput per GPU.

`search_plans` picks each deployment's best plan (`SearchOutcome.deployment_best`); here each is served by
its engine's loop with decode (`tpplan.simulate`), admitted as the engine admits requests (its
`--max-running-requests` / `max_num_seqs` and KV pool, `simulate.serving.replica_kv`), and judged against
the targets (`search.targets`). Two ways to ask:

- a GPU budget (the topology's GPUs): each deployment is one replica of the budget's split, served
  closed-loop at 1, 2, 4, ... clients up to the decode batch its KV pool admits (the *admitted batch*);
  its answer is the load with the most goodput per GPU that meets the targets. Replicas serve alike, so
  one replica's figures per GPU are the budget's;
- a request rate: each deployment (all its replicas) serves Poisson arrivals at that rate.

Cheap bounds first: a deployment whose one request alone (one client, nothing queued) already misses
a target cannot meet it under load (taken: load adds queueing and larger decode batches, never a
shorter step), so it is served at no other load. Under the budget the loads are searched for the
largest that meets the targets (`serving_points.largest_met`: a bisection from the load a priced decode
step suggests), TTFT and TPOT taken to grow with the clients (as the engines' own sweeps show).

What binds a deployment at its answer: the KV pool (the admitted batch is the most clients its pool
holds, so no more load can be tried), the engine's running-request cap, or the target the next load
misses: TTFT (prefill) or TPOT (decode). docs/search-json.md, "serving_search".
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from tpplan.search.fronts import pareto_max
from tpplan.search.results import RankedPlan, SearchOutcome
from tpplan.search.serving_points import (
    WAVES,
    Ask,
    Binds,
    DeploymentAnswer,
    Load,
    ServingPoint,
    admitted_batch,
    kv_need_of,
    largest_met,
    launchers_of,
    load_ladder,
    loop_engine_runs,
    point_at,
    predictor_of,
    serve_aggregated,
    shapes_of,
)
from tpplan.search.targets import Targets, seconds_text

if TYPE_CHECKING:
    from tpplan.cost.predictor import Predictor
    from tpplan.cost.workload import Workload
    from tpplan.engines.speculative import Speculative
    from tpplan.models.graph import ModelGraph
    from tpplan.simulate.serving import Arrival


@dataclass(frozen=True)
class TargetsOutcome:
    """The answer: deployments meeting the targets by goodput per GPU (best first), then the rest by
    how near they come; the Pareto front of output tokens/s per GPU against tokens/s per user over
    every load served; the closest deployment where none meets them."""

    targets: Targets
    gpus: int  # the budget (the topology's GPUs)
    rate: float | None
    answers: tuple[DeploymentAnswer, ...]
    front: tuple[ServingPoint, ...]
    seconds: float
    skipped: tuple[tuple[str, str], ...] = field(default=())  # (deployment, why) not served
    speculative: Speculative | None = None  # the decode steps' speculative decoding, where asked for

    @property
    def meeting(self) -> tuple[DeploymentAnswer, ...]:
        return tuple(a for a in self.answers if a.best is not None)

    def closest(self) -> DeploymentAnswer | None:
        """Where nothing meets the targets, the deployment nearest to meeting them (None where one does)."""
        if self.meeting or not self.answers:
            return None
        return self.answers[0]

    def verdict(self) -> str:
        """The answer in one sentence, every figure from the outcome."""
        return verdict(self)

    def to_json(self) -> dict[str, object]:
        near = self.closest()
        return {
            "targets": self.targets.to_json(),
            "mode": "rate" if self.rate is not None else "gpu_budget",
            "gpus": self.gpus,
            "rate_per_s": self.rate,
            "waves": WAVES,
            "deployments": [a.to_json(self.targets) for a in self.answers],
            "meets": [a.label for a in self.meeting],
            "closest": None if near is None else near.to_json(self.targets),
            "pareto_front": [p.to_json() for p in self.front],
            "skipped": [{"deployment": d, "why": w} for d, w in self.skipped],
            "verdict": self.verdict(),
            "seconds": self.seconds,
            **({"speculative": self.speculative.to_json()} if self.speculative is not None else {}),
        }


def verdict(out: TargetsOutcome) -> str:
    """`2x TP8 (plan) meets p90 TTFT <= 2 s and p90 TPOT <= 50 ms with the most goodput: ...` or `Nothing meets
    ...; closest is TP8 (plan) at 1 client: p90 TPOT 63.9 ms, 13.9 ms (+28%) over its 50 ms; decode binds`."""
    goal = out.targets.describe()
    if not out.answers:
        return f"No deployment could be served under {goal}."
    first = out.answers[0]
    near = first.closest
    each = " per replica" if first.replicas > 1 and near.load.clients is not None else ""
    if first.best is not None:
        b = first.best
        got = _achieved_text(out.targets, b)
        said = (f"{b.deployment} ({b.plan}) meets {goal} with the most goodput: {b.goodput_per_gpu:.3g} requests/s "
                f"per GPU at {b.load.describe()}{each}, {got}; {first.why}")  # fmt: skip
        return said + (launchable_text(out) if first.needs_code else "")
    misses = out.targets.misses(near.achieved)
    over = [f"{tg.label} {seconds_text(near.achieved[tg.metric])}, {seconds_text(misses[tg.metric])} "
            f"(+{misses[tg.metric] / tg.seconds:,.0%}) over its {seconds_text(tg.seconds)}"
            for tg in out.targets.each if misses.get(tg.metric, 0) > 0]  # fmt: skip
    said = (f"Nothing meets {goal}; closest is {near.deployment} ({near.plan}) at {near.load.describe()}{each}: "
            + "; ".join(over) + f"; {first.binds} binds")  # fmt: skip
    launched = next((a for a in out.answers if a.launch is not None and not a.needs_code), None)
    if not first.needs_code:
        return said
    alt = (
        ""
        if launched is None
        else f"; the closest an engine launches is {launched.label} ({launched.ranked.plan.name})"
    )
    return said + "; no engine release launches it (needs code)" + alt


def best_launchable(out: TargetsOutcome) -> DeploymentAnswer | None:
    """The deployment with the most goodput per GPU meeting the targets that an engine release launches (None:
    none does)."""
    return next((a for a in out.meeting if a.launch is not None and not a.needs_code), None)


def launchable_text(out: TargetsOutcome) -> str:
    """What the verdict adds where the best deployment needs code: the best one an engine launches, its figures."""
    alt = best_launchable(out)
    none = "; no engine release launches it (needs code)"
    if alt is None or alt.best is None:
        return f"{none}, nor any other deployment meeting the targets"
    b, each = alt.best, " per replica" if alt.replicas > 1 and alt.best.load.clients is not None else ""
    assert alt.launch is not None
    return (
        f"{none}; the best an engine launches is {b.deployment} ({b.plan}, {' or '.join(alt.launch.by)}): "
        f"{b.goodput_per_gpu:.3g} requests/s per GPU at {b.load.describe()}{each}, {_achieved_text(out.targets, b)}"
    )


def _achieved_text(targets: Targets, p: ServingPoint) -> str:
    return " and ".join(f"{tg.label} {seconds_text(p.achieved[tg.metric])}" for tg in targets.each)


def serve_budget(ask: Ask, r: RankedPlan) -> DeploymentAnswer:
    """One replica of `r`'s deployment under the budget: one client alone first (the bound), then the
    loads 2, 4, ... clients up to the admitted batch, from the load the priced decode step suggests
    (`_first_guess`; `largest_met`): the largest load that meets them and the next one up, which misses
    (so what binds is seen)."""
    from tpplan.simulate.requests import closed_loop
    from tpplan.simulate.serving import replica_kv

    p = predictor_of(ask, r, False)
    cap, _ = replica_kv(p, speculative=ask.speculative)
    shapes = shapes_of(ask.workload)
    batch = admitted_batch(cap, shapes)
    most = batch if batch is not None else 2**10
    loads = load_ladder(most)
    gpus = p.deployment.gpus
    tried: dict[int, ServingPoint] = {}

    def at(i: int) -> ServingPoint:
        c = loads[i]
        if c not in tried:
            n = len(shapes) if c == 1 else ask.requests or WAVES * c
            res = serve_aggregated(ask, p, closed_loop(c, shapes, max(n, c)), cap)
            tried[c] = point_at(ask, r, res, Load(clients=c), gpus)
        return tried[c]

    i = 0
    if at(0).met and len(loads) > 1:
        i = largest_met(len(loads), lambda j: at(j).met, _first_guess(ask, p, loads, at(0)))
    points = [tried[c] for c in sorted(tried)]
    met = [pt for pt in points if pt.met]
    best = max(met, key=lambda pt: pt.goodput_per_gpu) if met else None
    last = tried.get(loads[i + 1]) if best is not None and i + 1 < len(loads) else None
    binds, why = what_binds(
        ask.targets, [*points[:1], *(x for x in (best, last) if x is not None)], best, batch, cap, kv_need_of(shapes)
    )
    pruned = not at(0).met and len(loads) > 1
    return DeploymentAnswer(r, r.replicas, tuple(points), best, batch, cap[1] if cap else None,
                            cap[0] if cap else None, binds, why, pruned)  # fmt: skip


def _first_guess(ask: Ask, p: Predictor, loads: list[int], alone: ServingPoint) -> int:
    """The load to try first: the most clients whose decode step, priced alone (each running request
    one token at the middle of its output, every stage in turn, the batch split over the engine's
    micro-batches in flight, the engine's CPU cost per step added) is within the TPOT target, and whose
    TTFT, the unloaded one times the clients ahead of the statistic's request in the first wave, is within
    the TTFT target. A guess only: the loads tried from it decide (it changes how many runs, not the
    answer, while the targets' figures grow with the load)."""
    from tpplan.simulate.engine import engine_loop
    from tpplan.simulate.prices import even_decode

    wl, tg = ask.workload, ask.targets
    cfg = engine_loop(p.pipeline, p.deployment, wl.chunk_size, ask.topo.gpus_per_node).config
    m = cfg.in_flight
    ctx = max(s.prompt_tokens for s in shapes_of(wl)) + wl.output_len // 2
    best = 0
    for i, c in enumerate(loads):
        b = max(1, c // m)
        stage_s, sends, _ = p.stage_times(even_decode(b, b * ctx))
        tpot = math.fsum(stage_s) + math.fsum(sends) + cfg.step_overhead_s
        share = 0.5 if tg.ttft is None or tg.ttft.stat == "mean" else float(tg.ttft.stat[1:]) / 100
        ttft = alone.ttft_s["mean"] * max(1.0, c * share)
        if (tg.tpot is None or tpot <= tg.tpot.seconds) and (tg.ttft is None or ttft <= tg.ttft.seconds):
            best = i
        else:
            break
    return best


def serve_rate(ask: Ask, r: RankedPlan) -> DeploymentAnswer:
    """`r`'s whole deployment (its replicas) under Poisson arrivals at the asked rate; one client alone
    first (the bound: if it misses, the rate cannot be met)."""
    from tpplan.simulate.requests import closed_loop
    from tpplan.simulate.serving import arrivals_for, replica_kv

    assert ask.arrival is not None and ask.arrival.rate is not None
    one = predictor_of(ask, r, False)
    cap, _ = replica_kv(one, speculative=ask.speculative)
    shapes = shapes_of(ask.workload)
    batch = admitted_batch(cap, shapes)
    alone = point_at(
        ask,
        r,
        serve_aggregated(ask, one, closed_loop(1, shapes, len(shapes)), cap),
        Load(clients=1),
        one.deployment.gpus,
    )
    if not alone.met:
        binds, why = what_binds(ask.targets, [alone], None, batch, cap, kv_need_of(shapes))
        return DeploymentAnswer(r, r.replicas, (alone,), None, batch, cap[1] if cap else None, cap[0] if cap else None,
                                binds, why, True)  # fmt: skip
    p = predictor_of(ask, r, True)
    arrivals = arrivals_for(ask.arrival, ask.workload, ask.graph.spec.numerics.max_position_embeddings)
    pt = point_at(ask, r, serve_aggregated(ask, p, arrivals, cap), Load(rate=ask.arrival.rate), p.deployment.gpus)
    best = pt if pt.met else None
    binds, why = what_binds(ask.targets, [alone, pt], best, batch, cap, kv_need_of(shapes))
    return DeploymentAnswer(
        r, r.replicas, (pt,), best, batch, cap[1] if cap else None, cap[0] if cap else None, binds, why
    )


def what_binds(
    targets: Targets, points: list[ServingPoint], best: ServingPoint | None, batch: int | None,
    cap: tuple[int, int] | None, need: int,
) -> tuple[Binds | None, str]:  # fmt: skip
    """What stops more load, and a sentence from the figures that say so (`need`: KV tokens the longest
    request holds, prompt and output)."""
    last = points[-1]
    if best is not None and last is best and batch is not None and last.load.clients == batch and cap is not None:
        if batch == cap[0]:
            return "running-request cap", f"{batch} clients is the engine's running-request cap ({cap[0]})"
        return "KV capacity", (f"{batch} clients is the most its KV pool admits: {batch} requests of {need:,} tokens "
                               f"(prompt and output) hold {batch * need:,} of its {cap[1]:,} tokens, one more "
                               "does not fit")  # fmt: skip
    if last.met:  # a rate that is met: nothing bound at this load
        return None, f"at {last.load.describe()} every target is met"
    over = {
        tg.metric: last.achieved[tg.metric] / tg.seconds for tg in targets.each if last.achieved[tg.metric] > tg.seconds
    }
    worst = max(over, key=lambda m: over[m])
    tg = targets.ttft if worst == "ttft" else targets.tpot
    assert tg is not None
    what: Binds = "prefill" if worst == "ttft" else "decode"
    return what, (f"at {last.load.describe()} its {tg.label} is {seconds_text(last.achieved[worst])}, over the "
                  f"{seconds_text(tg.seconds)} target")  # fmt: skip


def served_plans(ask: Ask, best: tuple[RankedPlan, ...]) -> tuple[RankedPlan, ...]:
    """The plan each deployment is served with: the search's best where the flags of the engine the loop
    simulates realise it at that mesh (`engines.recipes`), else Megatron TP (baseline) there, which the
    engines run by default; so every answer has a launch line (`DeploymentAnswer.searched` names the
    search's plan where it was not served; the served copy has no score or prediction of its own)."""
    from tpplan.audit import Audits
    from tpplan.mesh import Mesh
    from tpplan.plans.named import baseline

    audits = Audits(ask.graph)
    out = []
    for r in best:
        if loop_engine_runs(ask, r.plan, r.mesh):
            out.append(r)
            continue
        one = Mesh(r.tp, pp=r.pp, cp=r.cp, cp_layers=ask.cp_layers, cp_kv=ask.cp_kv)
        pa = audits.of(baseline(), one, ask.dtype)
        out.append(replace(r, plan=pa.plan, audit=pa, score=math.nan, prediction=None))
    return tuple(out)


def check_workload(targets: Targets, workload: Workload, context: int | None = None) -> None:
    """Refused before any work: a TPOT target without output tokens after the first, and requests whose
    prompt and output together pass the model's `context` (positions it was trained for)."""
    from tpplan.errors import TpplanError

    if workload.output_len < 2 and targets.tpot is not None:
        raise TpplanError(f"workload={workload.name}", "its requests have one output token: no TPOT to target",
                          "give a workload with output_len above 1, or drop the TPOT target")  # fmt: skip
    check_context(workload, context)


def check_context(workload: Workload, context: int | None) -> None:
    """Refused before any work (search and report under targets, audit with a workload): requests whose
    prompt and output together pass the model's `context` (`Numerics.stated_context`: only a context the
    config states; None: nothing to check)."""
    from tpplan.errors import TpplanError

    longest = max(workload.input_lens or [workload.prompt_len(0)]) + workload.output_len
    if context is not None and longest > context:
        raise TpplanError(f"workload={workload.name}", f"a request of {longest:,} tokens (prompt and output) is "
                          f"past the model's context of {context:,}", "give shorter prompts or outputs")  # fmt: skip


def serve_under_targets(
    outcome: SearchOutcome, graph: ModelGraph, workload: Workload, targets: Targets, *,
    arrival: Arrival | None = None, requests: int | None = None, disaggregated: bool = True,
    speculative: Speculative | None = None, engines: tuple[str, ...] | None = None,
) -> TargetsOutcome:  # fmt: skip
    """Each deployment's best plan (`outcome.deployment_best`, searched with `every_deployment`) served
    under `targets`: by the GPU budget (the topology's GPUs; `arrival` None or without a rate) or at
    `arrival`'s rate, `requests` per load where given; ranked by goodput per GPU where the targets are
    met, else by how near they come. `disaggregated`: also P/D deployments of the meshes found
    (`search.disagg_targets`); `speculative`: aggregated decode steps are speculative steps; each answer says
    which of `engines`' releases (`--engine`; None: the current ones) launch it (`serving_points.launchers_of`)."""
    from tpplan.errors import TpplanError

    t0 = time.perf_counter()
    check_workload(targets, workload, graph.spec.numerics.stated_context)
    topo = outcome.topology
    if topo is None:
        raise TpplanError("topology=None", "serving under targets needs a topology", "pass one (e.g. h200x8-ib400)")
    rate = arrival.rate if arrival is not None else None
    ask = Ask(graph, topo, workload, targets, outcome.dtype, outcome.expert_dtype, outcome.cp_layers, outcome.cp_kv,
               arrival if rate is not None else None, requests, speculative=speculative,
               router=outcome.router, engines=engines)  # fmt: skip
    outcome_best = served_plans(ask, outcome.deployment_best)
    ask = replace(ask, deployments=outcome_best)
    answers: list[DeploymentAnswer] = []
    skipped: list[tuple[str, str]] = []
    for r, s, got in zip(outcome.deployment_best, outcome_best, _serve_all(ask), strict=True):
        if isinstance(got, DeploymentAnswer):
            answers.append(got if s is r else replace(got, searched=r.plan.name))
        else:  # a request whose KV does not fit the pool alone
            skipped.append((r.deployment, got))
    if answers and disaggregated:  # P/D pools of the meshes the aggregated deployments use
        from tpplan.search.disagg_targets import serve_disagg

        answers += serve_disagg(ask, answers)
    answers = sorted((replace(a, launch=launchers_of(ask, a)) for a in answers), key=_order)
    front = pareto_max([p for a in answers for p in a.points],
                       lambda p: (p.output_tok_s_per_gpu, p.output_tok_s_per_user))  # fmt: skip
    return TargetsOutcome(targets, topo.world_size, rate, tuple(answers), tuple(front), time.perf_counter() - t0,
                          tuple(skipped), speculative)  # fmt: skip


def _serve_one(ask: Ask, r: RankedPlan) -> DeploymentAnswer | str:
    """One deployment served under the targets; a refusal's reason as text."""
    from tpplan.errors import TpplanError

    try:
        return serve_rate(ask, r) if ask.arrival is not None else serve_budget(ask, r)
    except TpplanError as err:
        return err.reason


def _serve_all(ask: Ask) -> list[DeploymentAnswer | str]:
    """Every deployment served, on as many cores as there are (forked workers, as the search's own grid:
    `search.pool`), else in turn. A worker's answer carries its plan back; the parent keeps its own."""
    from functools import partial

    from tpplan.search.pool import forked_map

    got = forked_map([partial(_serve_one, ask, r) for r in ask.deployments])
    return [
        replace(g, ranked=r) if isinstance(g, DeploymentAnswer) else g
        for g, r in zip(got, ask.deployments, strict=True)
    ]


def _order(a: DeploymentAnswer) -> tuple[int, float]:
    """Meeting deployments first, most goodput per GPU first; then the rest, nearest first."""
    if a.best is not None:
        return (0, -a.best.goodput_per_gpu)
    return (1, a.closest.worst_ratio)


__all__ = [
    "TargetsOutcome",
    "best_launchable",
    "check_workload",
    "serve_under_targets",
    "what_binds",
]
