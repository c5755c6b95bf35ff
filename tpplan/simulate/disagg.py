"""P/D disaggregation as a library: a prefill pool and a decode pool, each of its own mesh, priced,
simulated, and sized.

API (what the search under targets and `audit --pd` call):
- `PoolSpec(predictor, instances, chunk_tokens=None)`: one pool. The predictor prices one instance (its
  graph, plan, mesh `predictor.deployment` with one replica, engine `predictor.pipeline.engine`, cluster
  `predictor.topo`); `instances` of it serve the pool.
- `DisaggDeployment(prefill, decode)`: the whole deployment; `gpus`, `ratio` ("n_P:n_D"), `with_ratio`.
- `capacity(dep, arrivals) -> Capacity`: the analytic bound, in requests/s per instance for prefill (full
  steps of the requests' prompts), decode (the batch the decode instance's KV pool and running cap admit,
  priced at the requests' mean context) and per link for the KV transfer; `Capacity.of(n_P, n_D)` is the
  deployment's bound and `Capacity.binding(n_P, n_D)` names the side that sets it. A few step prices per
  pool, cached: the pre-filter a search runs over many meshes before it simulates any.
- `serve_disaggregated(dep, arrivals) -> DisaggResult`: the co-simulated loop (`simulate.disagg_loop`):
  TTFT (mean, p50/p90/p99, the hand-off included as the engine realises it), TPOT/ITL, output tokens/s per
  GPU and per user, each side's busy share and waits, the bound and what binds; `to_json()` is what
  audit JSON carries under `serving.disaggregated` (docs/audit-json.md).
- `choose_ratio(prefill, decode, arrivals, gpus=G | rate=R) -> RatioChoice`: n_P:n_D for a GPU budget
  (the most throughput, then the fewest GPUs: the bound ranks every ratio, the simulation decides among
  those within `SLACK` of the best) or for a request rate (the fewest GPUs whose bound carries the rate).
Engine facts (KV pools, caps, hand-off order) are the engines' own, cited (`engines.memory`,
`disagg_loop.HandoffRule`); what is not modelled is in `PD_NOT_MODELLED`.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, replace
from functools import cached_property

from tpplan.cost.collective_pricer import price_collective
from tpplan.cost.draft import DraftMemory, draft_memory
from tpplan.cost.predictor import Predictor
from tpplan.engines.speculative import PD_NOT_MODELLED as SPEC_PD_NOT_MODELLED
from tpplan.engines.speculative import PD_PREFILL_SOURCES, Speculative, check_pd_draft, prefill_draft_samples
from tpplan.errors import TpplanError
from tpplan.models.opkinds import mixer
from tpplan.simulate.disagg_loop import (
    DisaggRun,
    HandoffRule,
    PoolLoop,
    handoff_rule,
    router_sources,
    simulate_disaggregated,
)
from tpplan.simulate.engine import EngineLoop, decode_conditions, engine_loop
from tpplan.simulate.pd import handoff_bytes_per_rank
from tpplan.simulate.prices import CachedPrices, context_grid, predictor_prices, prefill_server_prices
from tpplan.simulate.requests import Arrivals, Request
from tpplan.simulate.results import LoopResult
from tpplan.simulate.serving import replica_kv

SIDES = ("prefill", "decode", "transfer")
SLACK = 0.10  # choose_ratio simulates the ratios whose bound is within 10% of the best one's
MAX_SIMULATED = 4  # and at most this many of them
PD_NOT_MODELLED = (
    "SGLang's per-chunk KV sends: a chunk's part of the hand-off is its share of the prompt's new tokens (the "
    "link's latency charged once per prompt, not per chunk)",
    "the decode server reserves prompt + output KV at admission (SGLang 0.5.23 reserves prompt + "
    "num_reserved_decode_tokens, 512, in DecodePreallocQueue._prealloc_required_tokens and retracts when full; "
    "vLLM 0.34.0 allocates each step's slots in Scheduler.schedule, allocate_slots)",
    "the prefill server's own KV pool is not modelled (it holds a prompt's KV until sent)",
    "the router's loads are its own requests in flight; SGLang's cache-aware router matches a prefix id's cached "
    "tokens at the instance it last went to, never evicts, and breaks ties by lowest instance "
    "(tpplan.cost.routing)",
)


@dataclass(frozen=True)
class PoolSpec:
    """One pool of a P/D deployment: `instances` copies of the mesh `predictor` prices."""

    predictor: Predictor
    instances: int = 1
    chunk_tokens: int | None = None  # step budget (None: the engine's default on this GPU)
    speculative: Speculative | None = None  # a decode pool's speculative decoding (`tpplan.engines.speculative`)

    def __post_init__(self) -> None:
        if self.instances < 1:
            raise TpplanError(f"instances={self.instances}", "a pool needs one instance or more", "pass 1 or more")
        if self.predictor.deployment.replicas != 1:
            raise TpplanError(f"replicas={self.predictor.deployment.replicas}", "a pool's mesh is one instance",
                              "give the mesh one replica and the pool's instances as `instances`")  # fmt: skip

    @property
    def gpus(self) -> int:
        return self.predictor.deployment.gpus * self.instances

    @property
    def engine(self) -> str:
        return self.predictor.pipeline.engine

    def chunk(self) -> int:
        from tpplan.engines import scheduler_rules

        if self.chunk_tokens is not None:
            return self.chunk_tokens
        gpu = self.predictor.topo.gpu
        return scheduler_rules(self.engine).budget.default_tokens(gpu.memory_GiB, gpu.name)


@dataclass(frozen=True)
class DisaggDeployment:
    """A prefill pool and a decode pool on one cluster, one engine version."""

    prefill: PoolSpec
    decode: PoolSpec

    def __post_init__(self) -> None:
        if self.prefill.engine.split("@")[0] != self.decode.engine.split("@")[0]:
            raise TpplanError(f"engines={self.prefill.engine},{self.decode.engine}",
                              "a P/D deployment runs one engine's connector",
                              "give both pools the same engine")  # fmt: skip
        if self.speculative is not None:
            self._check_draft(self.speculative)
        topo = self.prefill.predictor.topo
        if self.gpus > topo.world_size:
            raise TpplanError(f"instances={self.ratio}", f"needs {self.gpus} GPUs, {topo.name} has {topo.world_size}",
                              "use fewer instances or a cluster with more nodes")  # fmt: skip

    @property
    def speculative(self) -> Speculative | None:
        """The decode pool's speculative decoding, which the prefill servers are launched with too: both engines'
        decode servers take the draft's state from the prefill side (`engines.speculative.PD_PREFILL_SOURCES`)."""
        return self.decode.speculative

    def _check_draft(self, spec: Speculative) -> None:
        """What the engine's connector refuses for a drafting pair (`tpplan.engines.speculative.check_pd_draft`)."""
        pp = self.prefill.predictor
        draft = draft_memory(pp, spec)
        latent = [mixer(layer.attn.kind).latent_kv for layer in pp.graph.spec.layers]
        draft_latent = latent[-1] if draft is None or draft.attn is None else mixer(draft.attn.kind).latent_kv
        check_pd_draft(self.prefill.engine, pp.deployment, self.decode.predictor.deployment, any(latent), draft_latent)

    @property
    def gpus(self) -> int:
        return self.prefill.gpus + self.decode.gpus

    @property
    def ratio(self) -> str:
        return f"{self.prefill.instances}:{self.decode.instances}"

    def with_ratio(self, n_prefill: int, n_decode: int) -> DisaggDeployment:
        return DisaggDeployment(replace(self.prefill, instances=n_prefill), replace(self.decode, instances=n_decode))

    @property
    def rule(self) -> tuple[HandoffRule, str | None]:
        return handoff_rule(self.prefill.engine)

    def one_node(self) -> bool:
        """Whether every instance sits on one node (the hand-off stays on the node's links)."""
        return self.gpus <= self.prefill.predictor.topo.gpus_per_node


@dataclass(frozen=True)
class _Pools:
    """What the loop and the bound need of a deployment: each pool's loop and prices, the hand-off."""

    prefill: EngineLoop
    decode: EngineLoop
    prefill_prices: CachedPrices
    decode_prices: CachedPrices
    kv_label: str | None
    built_from: tuple[Predictor, Predictor]
    drafts: tuple[DraftMemory | None, DraftMemory | None] = (
        None,
        None,
    )  # each side's draft (its KV is sent)  # whose graphs and topologies a hit must equal (`Predictor.built_on`)


# Per both pools' `Predictor.key`, chunks, fixed costs and speculation, all by value.
_POOLS: dict[tuple[object, ...], _Pools] = {}


def _pools(dep: DisaggDeployment, fixed_costs: bool = True) -> _Pools:
    """Each pool's engine loop (the decode one with its KV pool and cap) and step prices, cached per the pools'
    predictors by value (`Predictor.key`), their chunks, fixed costs and speculation."""
    pp, dp = dep.prefill.predictor, dep.decode.predictor
    spec = dep.decode.speculative
    key = (pp.key, dp.key, dep.prefill.chunk(), dep.decode.chunk(), fixed_costs, spec)
    hit = _POOLS.get(key)
    if hit is not None and all(h.built_on(p.graph, p.topo) for h, p in zip(hit.built_from, (pp, dp), strict=True)):
        return hit
    gpn = pp.topo.gpus_per_node
    pre = engine_loop(pp.pipeline, pp.deployment, dep.prefill.chunk(), gpn, fixed_costs=fixed_costs)
    cap, label = replica_kv(dp, pd=True, speculative=spec)
    running, pool = cap if cap is not None else (None, None)
    dec = engine_loop(dp.pipeline, dp.deployment, dep.decode.chunk(), gpn, fixed_costs=fixed_costs, decode=True,
                      max_running=running, kv_tokens=pool, speculative=spec)  # fmt: skip
    if len(_POOLS) > 64:
        _POOLS.clear()
    drafts = (draft_memory(pp, spec), draft_memory(dp, spec))
    out = _POOLS[key] = _Pools(pre, dec, prefill_server_prices(pp, spec), predictor_prices(dp, spec), label, (pp, dp),
                               drafts)  # fmt: skip
    return out


def handoff_seconds(dep: DisaggDeployment, prompt_tokens: int) -> float:
    """Seconds one prompt's KV takes between the two meshes: each rank sends its share to its peer, all ranks
    at once, so the larger share per rank (the prefill rank's, or the decode rank's where the decode mesh is
    narrower) crosses one point-to-point link (`price_collective`, "send_recv"; between nodes unless the whole
    deployment sits on one node). Under speculative decoding the draft's KV goes with the target's, and with
    SGLang the request's draft hidden state (`tpplan.simulate.pd.draft_state_bytes`)."""
    pp, dp = dep.prefill.predictor, dep.decode.predictor
    drafts = _pools(dep).drafts if dep.speculative is not None else (None, None)
    nbytes = max(handoff_bytes_per_rank(pp, prompt_tokens, drafts[0]),
                 handoff_bytes_per_rank(dp, prompt_tokens, drafts[1]))  # fmt: skip
    return price_collective("send_recv", nbytes, 2, pp.topo, ranks_per_node=2 if dep.one_node() else 1).time_s


@dataclass(frozen=True)
class Capacity:
    """The analytic bound: requests/s one prefill instance, one decode instance and one link carry."""

    prefill_rps: float
    decode_rps: float
    transfer_rps: float
    decode_batch: int  # requests one decode instance runs at once (KV pool and running cap)
    decode_step_s: float  # one decode step at that batch and the requests' mean context
    push: bool  # the links are the prefill instances' (push) or the decode instances' (pull)

    def sides(self, n_prefill: int, n_decode: int) -> dict[str, float]:
        links = n_prefill if self.push else n_decode
        return {"prefill": n_prefill * self.prefill_rps, "decode": n_decode * self.decode_rps,
                "transfer": links * self.transfer_rps}  # fmt: skip

    def of(self, n_prefill: int, n_decode: int) -> float:
        return min(self.sides(n_prefill, n_decode).values())

    def binding(self, n_prefill: int, n_decode: int) -> str:
        sides = self.sides(n_prefill, n_decode)
        return min(SIDES, key=lambda s: sides[s])


MAX_SHAPES = 64  # distinct (prompt, output, new) shapes the bound prices; a trace with more is put on a grid


def _shapes(arrivals: Arrivals) -> Counter[tuple[int, int, int]]:
    """The requests' (prompt, output, new tokens), counted; past `MAX_SHAPES` distinct ones, each length
    rounded down to `context_grid`'s points (16 per doubling, 4.4% apart), so a trace of many lengths costs
    the bound a few dozen prices, not one per length."""
    exact = Counter((r.prompt_tokens, r.output_tokens, r.new_tokens) for r in arrivals.requests)
    if len(exact) <= MAX_SHAPES:
        return exact
    out: Counter[tuple[int, int, int]] = Counter()
    for (p, o, n), c in exact.items():
        new = max(1, context_grid(n)[0])
        out[(max(new, context_grid(p)[0]), max(1, context_grid(o)[0]), new)] += c
    return out


def _period(times: list[float], loop: EngineLoop) -> float:
    """Seconds between steps when the pipeline is kept full: the busiest stage, or the whole step over the
    steps in flight, whichever is longer; the scheduler's per-step CPU on stage 0."""
    times = [times[0] + loop.config.step_overhead_s, *times[1:]]
    return max(max(times), sum(times) / loop.config.in_flight)


def _prefill_seconds(pools: _Pools, prompt: int, new: int) -> float:
    """Seconds of one prefill instance per request of this shape, its steps full: short prompts packed
    several to a step, a long one in chunks."""
    chunk, prices = pools.prefill.config.chunk_tokens, pools.prefill_prices
    start = prompt - new
    if new <= chunk:
        k = max(1, chunk // new)
        return _period(list(prices(((new, start),) * k)), pools.prefill) / k
    total, pos = 0.0, start
    while pos < prompt:
        take = min(chunk, prompt - pos)
        total += _period(list(prices(((take, pos),))), pools.prefill)
        pos += take
    return total


def capacity(dep: DisaggDeployment, arrivals: Arrivals, tpot_s: float | None = None) -> Capacity:
    """The analytic bound of `dep`'s pools on the requests of `arrivals` (their shapes, weighted by count).
    The decode batch is the most the decode instance admits (its KV pool at the requests' mean prompt +
    output, its running cap); with `tpot_s`, the largest batch whose decode step stays within it (at
    least 1: a target no batch meets leaves the bound at batch 1)."""
    pools, (rule, _) = _pools(dep), dep.rule
    shapes = _shapes(arrivals)
    n = sum(shapes.values())
    pre_s = sum(c * _prefill_seconds(pools, p, new) for (p, _, new), c in shapes.items()) / n
    mean_prompt = sum(c * p for (p, _, _), c in shapes.items()) / n
    mean_out = sum(c * o for (_, o, _), c in shapes.items()) / n
    cfg = pools.decode.config
    batch = cfg.max_running or MAX_BATCH
    if cfg.kv_tokens is not None:
        batch = min(batch, max(1, int(cfg.kv_tokens // (mean_prompt + mean_out))))
    ctx = int(mean_prompt + mean_out / 2)
    if tpot_s is not None:
        batch = _batch_within(pools, batch, ctx, tpot_s)
    per_step = math.ceil(batch / cfg.in_flight)
    step = _decode_period(pools, per_step, ctx)
    tokens = mean_out - (0 if rule.first_token_on_decode else 1)
    tokens /= cfg.accepted  # decode steps per request (speculative decoding: tokens over those a step gains)
    decode_rps = per_step / step / tokens if tokens > 0 else math.inf
    hand = sum(c * handoff_seconds(dep, p) for (p, _, _), c in shapes.items()) / n
    return Capacity(1 / pre_s, decode_rps, 1 / hand if hand > 0 else math.inf, batch, step, rule.push)


MAX_BATCH = 4096  # the decode batch where the engine sets no running cap


def _decode_period(pools: _Pools, per_step: int, ctx: int) -> float:
    return _period(list(pools.decode_prices(((1, ctx),) * per_step)), pools.decode)


def _batch_within(pools: _Pools, most: int, ctx: int, tpot_s: float) -> int:
    """The largest decode batch up to `most` whose token gap (the step, times the steps in flight under PP)
    is within `tpot_s`; the gap grows with the batch, so a bisection finds it."""
    m = pools.decode.config.in_flight

    def gap(b: int) -> float:  # per output token: a speculative step gains `accepted` of them
        return _decode_period(pools, math.ceil(b / m), ctx) * m / pools.decode.config.accepted

    lo, hi = 1, most
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if gap(mid) <= tpot_s else (lo, mid - 1)
    return lo


@dataclass(frozen=True)
class DisaggResult:
    """One P/D deployment served: the loop's outcome, the bound, and which side binds."""

    deployment: DisaggDeployment
    run: DisaggRun
    bound: Capacity
    notes: tuple[str, ...]

    @property
    def result(self) -> LoopResult:
        return self.run.result

    @property
    def binding(self) -> str:
        """The side whose bound is the lowest (requests/s), from `bound.sides`."""
        return self.bound.binding(self.deployment.prefill.instances, self.deployment.decode.instances)

    def binding_text(self) -> str:
        """What binds, in words from the figures beside it: each side's bound, and how busy each was here."""
        sides = self.bound.sides(self.deployment.prefill.instances, self.deployment.decode.instances)
        others = ", ".join(f"{s} {sides[s]:.3g}" for s in SIDES if s != self.binding)
        run = self.run
        busy = [sum(b) / len(b) for b in (run.prefill_busy, run.decode_busy, run.link_busy)]
        return (f"{self.binding} binds: at most {sides[self.binding]:.3g} requests/s against {others}; in this run "
                f"the prefill instances were busy {busy[0]:.0%}, the decode instances {busy[1]:.0%}, the links "
                f"{busy[2]:.0%} of the time")  # fmt: skip

    @cached_property
    def decode(self) -> dict[str, object] | None:
        return self.result.decode_summary(self.deployment.gpus)

    def to_json(self) -> dict[str, object]:
        """`serving.disaggregated` in audit JSON (docs/audit-json.md)."""
        dep, run, res = self.deployment, self.run, self.result
        sides = self.bound.sides(dep.prefill.instances, dep.decode.instances)
        rule, _ = dep.rule
        pools = _pools(dep)
        return {
            "engine": dep.prefill.engine,
            "ratio": dep.ratio,
            "gpus": dep.gpus,
            "prefill": _pool_json(dep.prefill, pools.prefill, run.prefill_busy),
            "decode": {
                **_pool_json(dep.decode, pools.decode, run.decode_busy),
                "kv_capacity": pools.kv_label,
                "max_running": pools.decode.config.max_running,
                "kv_tokens": pools.decode.config.kv_tokens,
                "admit_wait_mean_s": run.decode_admit_wait_mean_s,
            },
            "transfer": {
                "handoff_mean_s": run.handoff_mean_s,
                "link_wait_mean_s": run.link_wait_mean_s,
                "handoff_tail_mean_s": run.handoff_tail_mean_s,
                "busy": list(run.link_busy),
                "links": "prefill" if rule.push else "decode",
            },
            "ttft": res.summary(),
            "decode_summary": self.decode,
            "bound_rps": sides,
            "binding": self.binding,
            "binding_text": self.binding_text(),
            "sources": [s.cite() for s in (*rule.sources, *router_sources(rule))],
            "conditions": [
                *self.notes,
                *PD_NOT_MODELLED,
                *decode_conditions(dep.decode.speculative, dep.decode.predictor),
                *((SPEC_PD_NOT_MODELLED,) if dep.speculative is not None else ()),
            ],
            **(
                {"speculative": {**spec_json(dep.decode), "prefill_server": prefill_server_json(dep)}}
                if dep.speculative is not None
                else {}
            ),
        }


def spec_json(pool: PoolSpec) -> dict[str, object]:
    """A decode pool's speculative decoding: its inputs and its draft's memory (`tpplan.cost.draft`)."""
    assert pool.speculative is not None
    draft = draft_memory(pool.predictor, pool.speculative)
    return {**pool.speculative.to_json(), "draft": None if draft is None else draft.to_json()}


def prefill_server_json(dep: DisaggDeployment) -> dict[str, object]:
    """The prefill servers under the decode pool's speculative decoding, launched with its flags: the draft
    they load (its memory on a prefill rank), their KV pool with it, whether a step's draft pass samples
    (`tpplan.engines.speculative.prefill_draft_samples`) and where that was read."""
    spec = dep.speculative
    assert spec is not None
    draft = _pools(dep).drafts[0]
    _, label = replica_kv(dep.prefill.predictor, pd=True, speculative=spec)
    engine = dep.prefill.engine
    return {"draft": None if draft is None else draft.to_json(), "kv_capacity": label,
            "draft_samples": prefill_draft_samples(engine),
            "sources": [PD_PREFILL_SOURCES[engine.split("@")[0]].cite()]}  # fmt: skip


def _pool_json(pool: PoolSpec, loop: EngineLoop, busy: tuple[float, ...]) -> dict[str, object]:
    d = pool.predictor.deployment
    mesh = {"tp": d.tp, "pp": d.pp, "cp": d.cp, "ep": d.ep, "dp_attention": pool.predictor.plan.dp_attention}
    return {"instances": pool.instances, "gpus_per_instance": d.gpus, "mesh": mesh, "plan": pool.predictor.plan.name,
            "chunk_tokens": loop.config.chunk_tokens, "busy_mean": sum(busy) / len(busy)}  # fmt: skip


def serve_disaggregated(dep: DisaggDeployment, arrivals: Arrivals, *, fixed_costs: bool = True) -> DisaggResult:
    """Every request of `arrivals` through `dep`'s pools (`simulate.disagg_loop`); `fixed_costs` False
    leaves the per-request and per-step CPU costs out (the idealised loop)."""
    pools = _pools(dep, fixed_costs)
    rule, note = dep.rule
    run = simulate_disaggregated(
        arrivals,
        PoolLoop(pools.prefill_prices, pools.prefill.config, dep.prefill.instances),
        PoolLoop(pools.decode_prices, pools.decode.config, dep.decode.instances),
        lambda r: _handoff(dep, r),
        rule,
    )
    notes: tuple[str, ...] = (note,) if note else ()
    if pools.kv_label is None:
        notes += ("no KV-pool or running-request cap on the decode side: the engine's KV sizing was not read",)
    return DisaggResult(dep, run, capacity(dep, arrivals), notes)


def _handoff(dep: DisaggDeployment, r: Request) -> float:
    return handoff_seconds(dep, r.prompt_tokens)


@dataclass(frozen=True)
class RatioChoice:
    """The chosen ratio, every ratio's bound (n_P, n_D, GPUs, requests/s, binding side), and the simulations."""

    chosen: DisaggDeployment
    bound: Capacity
    table: tuple[tuple[int, int, int, float, str], ...]
    simulated: tuple[DisaggResult, ...]

    @property
    def binding(self) -> str:
        return self.bound.binding(self.chosen.prefill.instances, self.chosen.decode.instances)


def ratios(dep: DisaggDeployment, gpus: int) -> list[tuple[int, int]]:
    """Every (n_P, n_D), both at least 1, whose GPUs fit `gpus`."""
    gp, gd = dep.prefill.predictor.deployment.gpus, dep.decode.predictor.deployment.gpus
    return [(p, d) for p in range(1, (gpus - gd) // gp + 1) for d in range(1, (gpus - p * gp) // gd + 1)]


def choose_ratio(
    prefill: PoolSpec, decode: PoolSpec, arrivals: Arrivals, *, gpus: int | None = None, rate: float | None = None,
    simulate: bool = True,
) -> RatioChoice:  # fmt: skip
    """n_P:n_D for a GPU budget (`gpus`: the most throughput, then the fewest GPUs) or a request rate
    (`rate`: the fewest GPUs whose bound carries it, then the highest bound). Under a budget, the ratios
    whose bound is within `SLACK` of the best (at most `MAX_SIMULATED`, best first) are simulated over
    `arrivals` and the one with the most output tokens/s wins (`simulate` False: the bound alone)."""
    if (gpus is None) == (rate is None):
        raise TpplanError("gpus and rate", "choose_ratio sizes for one of them", "give a GPU budget or a rate")
    base = DisaggDeployment(replace(prefill, instances=1), replace(decode, instances=1))
    bound = capacity(base, arrivals)
    if rate is not None:
        return _for_rate(base, bound, rate)
    assert gpus is not None
    table = sorted(((p, d, _gpus(base, p, d), bound.of(p, d), bound.binding(p, d)) for p, d in ratios(base, gpus)),
                   key=lambda row: (-row[3], row[2], abs(row[0] - row[1])))  # fmt: skip
    if not table:
        raise TpplanError(f"gpus={gpus}", f"one prefill and one decode instance need {base.gpus} GPUs",
                          "give a larger budget or smaller meshes")  # fmt: skip
    best = table[0][3]
    near = [row for row in table if row[3] >= (1 - SLACK) * best][:MAX_SIMULATED]
    if not simulate or len(near) == 1:
        return RatioChoice(base.with_ratio(*table[0][:2]), bound, tuple(table), ())
    runs = [serve_disaggregated(base.with_ratio(p, d), arrivals) for p, d, *_ in near]
    pick = max(runs, key=lambda r: (_output_rate(r), -r.deployment.gpus))
    return RatioChoice(pick.deployment, bound, tuple(table), tuple(runs))


def _gpus(base: DisaggDeployment, p: int, d: int) -> int:
    return p * base.prefill.predictor.deployment.gpus + d * base.decode.predictor.deployment.gpus


def _output_rate(r: DisaggResult) -> float:
    """Output tokens per second of the run (its requests' output over arrival of the first to the last token)."""
    lines = r.result.timelines
    end = max(t.done_s for t in lines) - min(t.arrival_s for t in lines)
    return sum(t.request.output_tokens for t in lines) / end if end > 0 else math.inf


def _for_rate(base: DisaggDeployment, bound: Capacity, rate: float) -> RatioChoice:
    if not (math.isfinite(rate) and rate > 0):
        raise TpplanError(f"rate={rate}", "must be a positive number of requests/s", "pass a rate above 0")
    n_p = math.ceil(rate / min(bound.prefill_rps, bound.transfer_rps if bound.push else math.inf))
    n_d = math.ceil(rate / min(bound.decode_rps, math.inf if bound.push else bound.transfer_rps))
    row = (n_p, n_d, _gpus(base, n_p, n_d), bound.of(n_p, n_d), bound.binding(n_p, n_d))
    return RatioChoice(base.with_ratio(n_p, n_d), bound, (row,), ())


__all__ = [
    "PD_NOT_MODELLED",
    "SIDES",
    "Capacity",
    "DisaggDeployment",
    "DisaggResult",
    "PoolSpec",
    "RatioChoice",
    "capacity",
    "choose_ratio",
    "handoff_seconds",
    "ratios",
    "serve_disaggregated",
]
