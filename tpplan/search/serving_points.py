"""What the search under targets serves and records: the loads, one run's figures, one deployment's answer.

`Ask` is what every deployment is served with (the graph, cluster, workload, targets, the search's
deployments); `point_of` turns one serving-loop run into a `ServingPoint` under the targets; a
`DeploymentAnswer` holds every load a deployment was served at and its best. Aggregated deployments are
served in `under_targets`, P/D ones in `disagg_targets`; both build on these.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from tpplan.search.results import RankedPlan
from tpplan.search.targets import Metric, Targets, goodput
from tpplan.simulate.results import percentile

if TYPE_CHECKING:
    from tpplan.cost.predictor import Predictor
    from tpplan.cost.topology import Topology
    from tpplan.cost.workload import Workload
    from tpplan.engines.recipes import Launchers
    from tpplan.engines.speculative import Speculative
    from tpplan.layout.plan import Plan
    from tpplan.mesh import Mesh
    from tpplan.models.graph import ModelGraph
    from tpplan.simulate.requests import Arrivals, Shape
    from tpplan.simulate.results import LoopResult
    from tpplan.simulate.serving import Arrival

WAVES = 2  # closed-loop requests per client at each load: the first wave starts cold, the later ones steady
Binds = Literal["prefill", "decode", "KV capacity", "running-request cap", "KV transfer"]


@dataclass(frozen=True)
class Load:
    """How one run was loaded: closed-loop clients per replica, or Poisson at a rate over all replicas."""

    clients: int | None = None
    rate: float | None = None

    def describe(self) -> str:
        if self.clients is None:
            return f"{self.rate:g} req/s"
        return f"{self.clients} client" + ("s" if self.clients != 1 else "")


@dataclass(frozen=True)
class ServingPoint:
    """One deployment at one load, as its requests met the targets. Figures per GPU are over `gpus`,
    the GPUs that served the run: one replica's under a budget (the replicas serve alike, so its figures
    per GPU are the deployment's; `clients` are one replica's), every replica's under a rate."""

    deployment: str
    plan: str
    kind: str  # "aggregated" (one mesh serves prefill and decode) or "disaggregated"
    gpus: int
    load: Load
    requests: int
    achieved: dict[Metric, float]  # each target's statistic over the run
    good: int  # requests meeting both targets by their own TTFT and TPOT
    goodput_per_gpu: float  # good requests / s / GPU
    output_tok_s_per_gpu: float
    output_tok_s_per_user: float
    ttft_s: dict[str, float]  # mean, p50, p90, p99
    tpot_s: dict[str, float]
    met: bool
    worst_ratio: float  # the largest statistic / its ceiling (<= 1: met)

    def to_json(self) -> dict[str, object]:
        return {
            "deployment": self.deployment, "plan": self.plan, "kind": self.kind, "gpus": self.gpus,
            "clients": self.load.clients, "rate_per_s": self.load.rate, "requests": self.requests,
            "achieved_s": dict(self.achieved), "meets_targets": self.met, "good_requests": self.good,
            "goodput_per_gpu": self.goodput_per_gpu, "output_tok_s_per_gpu": self.output_tok_s_per_gpu,
            "output_tok_s_per_user": self.output_tok_s_per_user, "ttft_s": self.ttft_s, "tpot_s": self.tpot_s,
        }  # fmt: skip


@dataclass(frozen=True)
class DeploymentAnswer:
    """One deployment under the targets: every load tried, the best that meets them (None: none does),
    the admitted batch and the KV pool it came from, what binds and why (a sentence from the figures)."""

    ranked: RankedPlan
    replicas: int  # copies of the deployment (`ranked.replicas`); under a budget one is served
    points: tuple[ServingPoint, ...]
    best: ServingPoint | None
    admitted_batch: int | None  # decode batch one replica's KV pool and running cap admit; None: not read
    kv_tokens: int | None
    max_running: int | None
    binds: Binds | None
    why: str
    pruned: bool = False  # the unloaded run already missed: no other load was tried
    # P/D: `ranked` is the prefill pool's mesh and plan, this the decode pool's; the pools' instances n_P:n_D
    decode_ranked: RankedPlan | None = None
    ratio: str | None = None
    pools: dict[str, object] | None = None  # the P/D run's JSON at the best (or closest) load
    searched: str | None = None  # the search's best plan, where the engine's flags do not realise it (baseline served)
    launch: Launchers | None = None  # the engine releases that launch it, or why none does (`launchers_of`)

    @property
    def needs_code(self) -> bool:
        """No engine release launches it (its launch lines say "needs code")."""
        return self.launch is not None and self.launch.needs_code

    @property
    def kind(self) -> str:
        return "aggregated" if self.decode_ranked is None else "disaggregated"

    @property
    def label(self) -> str:
        return self.points[0].deployment if self.points else self.ranked.deployment

    @property
    def closest(self) -> ServingPoint:
        """The best load if one meets the targets, else the one nearest to meeting them."""
        return self.best or min(self.points, key=lambda p: p.worst_ratio)

    def to_json(self, targets: Targets) -> dict[str, object]:
        near = self.closest
        return {
            "deployment": self.label,
            "kind": self.kind,
            "plan": self.ranked.plan.name,
            "decode_plan": None if self.decode_ranked is None else self.decode_ranked.plan.name,
            "searched_plan": self.searched,
            "ratio": self.ratio,
            "replicas": self.replicas,
            "admitted_batch": self.admitted_batch,
            "kv_tokens_per_replica": self.kv_tokens,
            "max_running_requests": self.max_running,
            "meets_targets": self.best is not None,
            "best": None if self.best is None else self.best.to_json(),
            "closest": None if self.best is not None else {**near.to_json(), "misses_s": targets.misses(near.achieved)},
            "binds": self.binds,
            "why": self.why,
            "pruned_by_bound": self.pruned,
            "loads": [p.to_json() for p in self.points],
            "disaggregated": self.pools,
            "launched_by": None if self.launch is None else list(self.launch.by),
            "needs_code": "; ".join(self.launch.why_not) if self.launch is not None and self.needs_code else None,
        }


@dataclass
class Ask:
    """What every deployment is served with."""

    graph: ModelGraph
    topo: Topology
    workload: Workload
    targets: Targets
    dtype: str
    expert_dtype: str | None
    cp_layers: str
    cp_kv: str
    arrival: Arrival | None  # with a rate: Poisson at it; None: the budget's closed-loop sweep
    requests: int | None
    deployments: tuple[RankedPlan, ...] = ()
    speculative: Speculative | None = None  # decode steps as speculative steps (`tpplan.engines.speculative`)
    router: str | None = None  # the request router over the replicas (`tpplan.engines.routing`; None: the default)
    engines: tuple[str, ...] | None = None  # `--engine`'s versions (None: each engine's current release)


def point_of(
    targets: Targets, label: str, plan: str, kind: str, res: LoopResult, load: Load, gpus: int
) -> ServingPoint:
    """One run's figures under the targets (`gpus`: the GPUs that served it): TTFT and TPOT per request
    (`Timeline`), as `LoopResult.decode_summary` takes them (tokens/s per user = 1 / mean TPOT), without
    its inter-token gaps, which the targets do not read."""
    tl = res.timelines
    achieved = targets.achieved(tl)
    good, per_gpu = goodput(tl, targets, gpus)
    tpots = [t.tpot_s for t in tl if t.request.output_tokens > 1]
    end = max(t.done_s if not math.isnan(t.done_s) else t.first_token_s for t in tl)
    out_tok = sum(t.request.output_tokens for t in tl)
    user = len(tpots) / math.fsum(tpots) if tpots and math.fsum(tpots) > 0 else math.nan
    return ServingPoint(label, plan, kind, gpus, load, len(tl), achieved, good, per_gpu,
                        out_tok / end / gpus if end > 0 else 0.0, user, _stats([t.ttft_s for t in tl]), _stats(tpots),
                        targets.met(achieved), targets.worst_ratio(achieved))  # fmt: skip


def _stats(values: list[float]) -> dict[str, float]:
    """Mean, p50, p90, p99 (NaN without values), sorting once."""
    if not values:
        return dict.fromkeys(("mean", "p50", "p90", "p99"), math.nan)
    s = sorted(values)
    return {"mean": math.fsum(s) / len(s), **{f"p{q}": percentile(s, q, True) for q in (50, 90, 99)}}


def point_at(ask: Ask, r: RankedPlan, res: LoopResult, load: Load, gpus: int) -> ServingPoint:
    return point_of(ask.targets, r.deployment, r.plan.name, "aggregated", res, load, gpus)


def shapes_of(wl: Workload) -> list[Shape]:
    from tpplan.simulate.requests import Shape

    return [Shape(n, wl.output_len, wl.cached_share) for n in (wl.input_lens or [wl.prompt_len(0)])]


def predictor_of(ask: Ask, r: RankedPlan, every_replica: bool) -> Predictor:
    """`r`'s predictor: one replica of it, or `every_replica` (the requests split between them)."""
    from tpplan.cost.predictor import cached_predictor
    from tpplan.mesh import Mesh

    mesh = Mesh(r.tp, pp=r.pp, replicas=r.replicas if every_replica else 1, cp=r.cp, cp_layers=ask.cp_layers,
                cp_kv=ask.cp_kv, router=ask.router)  # fmt: skip
    return cached_predictor(ask.graph, r.plan, ask.topo, mesh, ask.dtype, ask.expert_dtype, r.audit)


def loop_engine_runs(ask: Ask, plan: Plan, mesh: Mesh) -> bool:
    """Whether the flags of the engine the loop simulates (`cost.pipeline.loop_engine`: `--engine`'s where
    tpplan read its serving rules, else SGLang's) realise `plan` on one replica of `mesh` (`engines.recipes`):
    a plan the search serves must have a launch line."""
    from tpplan.cost.pipeline import loop_engine
    from tpplan.engines import Launch, select_pair
    from tpplan.engines.recipes import recipes
    from tpplan.mesh import Mesh

    one = Mesh(mesh.tp, pp=mesh.pp, cp=mesh.cp, cp_layers=ask.cp_layers, cp_kv=ask.cp_kv)
    nodes = max(1, -(-one.gpus // ask.topo.gpus_per_node))
    launch = Launch(ask.graph.spec, one, chunk=ask.workload.chunk_size, gpu=ask.topo.gpu.name, nodes=nodes)
    loop = loop_engine(ask.topo.gpu.kernel_engine)
    return next(r for r in recipes(plan, launch, engines=select_pair([loop])) if r.version == loop).runs


def launchers_of(ask: Ask, a: DeploymentAnswer) -> Launchers:
    """The engine releases (`ask.engines`') that launch the deployment `a` serves (`engines.recipes.launchers`):
    aggregated, its plan on all its replicas behind the request router; P/D, one instance of each pool's plan,
    a release launching both."""
    from tpplan.engines import Launch, select_pair
    from tpplan.engines.recipes import launchers
    from tpplan.mesh import Mesh

    pair = select_pair(ask.engines)

    def of(r: RankedPlan, deployment: Mesh) -> Launchers:
        one = Mesh(r.tp, pp=r.pp, cp=r.cp, cp_layers=ask.cp_layers)
        nodes = max(1, -(-one.gpus // ask.topo.gpus_per_node))  # the nodes one server spans
        launch = Launch(ask.graph.spec, deployment, chunk=ask.workload.chunk_size, gpu=ask.topo.gpu.name, nodes=nodes)
        return launchers(r.plan, launch, engines=pair)

    def pool(r: RankedPlan) -> Mesh:  # one instance of a P/D pool
        return Mesh(r.tp, pp=r.pp, cp=r.cp, cp_layers=ask.cp_layers, cp_kv=ask.cp_kv)

    if a.decode_ranked is None:
        r = a.ranked
        return of(r, Mesh(r.tp, pp=r.pp, cp=r.cp, replicas=a.replicas, cp_layers=ask.cp_layers, cp_kv=ask.cp_kv,
                          router=ask.router))  # fmt: skip
    return of(a.ranked, pool(a.ranked)).merged(of(a.decode_ranked, pool(a.decode_ranked)))


def serve_aggregated(ask: Ask, p: Predictor, arrivals: Arrivals, cap: tuple[int, int] | None) -> LoopResult:
    from tpplan.simulate.engine import engine_loop, serve

    running, pool = cap if cap is not None else (None, None)
    loop = engine_loop(p.pipeline, p.deployment, ask.workload.chunk_size, ask.topo.gpus_per_node, decode=True,
                       max_running=running, kv_tokens=pool, speculative=ask.speculative)  # fmt: skip
    return serve(p, arrivals, loop, ask.speculative)


def kv_need_of(shapes: list[Shape]) -> int:
    return max(s.prompt_tokens + s.output_tokens for s in shapes)


def admitted_batch(cap: tuple[int, int] | None, shapes: list[Shape]) -> int | None:
    """The decode batch one replica admits: its running-request cap, or as many of the longest request
    (prompt + output) as its KV pool holds, whichever is fewer (None: the engine's sizing not read)."""
    if cap is None:
        return None
    return min(cap[0], cap[1] // kv_need_of(shapes))


def load_ladder(most: int) -> list[int]:
    """The loads a budget tries: 1, 2, 4, ... clients below `most`, and `most` (the admitted batch)."""
    return [c for c in (2**k for k in range(0, 31)) if c < most] + [max(1, most)]


def largest_met(n: int, met: Callable[[int], bool], first: int) -> int:
    """The index of the largest of `n` loads (fewest clients first) meeting the targets, where load 0 meets
    them and the targets' figures are taken to grow with the load: probe `first`, then gallop up while
    nothing is known to miss, then bisect. The load above the answer, where there is one, has been probed
    (and missed), so what binds is seen there."""
    lo, hi = 0, n  # met(lo); hi: the first load known to miss (n: none known yet)
    i = min(max(first, 1), n - 1)
    while hi - lo > 1:
        if met(i):
            lo = i
        else:
            hi = i
        i = min(n - 1, max(2 * i, lo + 1)) if hi == n else (lo + hi) // 2
    return lo


__all__ = [
    "WAVES",
    "Ask",
    "Binds",
    "DeploymentAnswer",
    "Load",
    "ServingPoint",
    "admitted_batch",
    "kv_need_of",
    "largest_met",
    "launchers_of",
    "load_ladder",
    "loop_engine_runs",
    "point_at",
    "point_of",
    "predictor_of",
    "serve_aggregated",
    "shapes_of",
]
