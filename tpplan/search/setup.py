"""One search's checked inputs (`Setup`) and how it scores one plan at one deployment (`evaluate`).

`ranking.py` walks the deployments and `variants.py` adds the plans the search's space leaves out;
both score a plan here, against the objective `objective_of` builds, and take the reference plans
(Megatron TP baseline, the named plans' behaviours) from here, computed once per search.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tpplan.audit import Audits, PlanAudit
from tpplan.layout.plan import OverlapName
from tpplan.mesh import Mesh
from tpplan.models.graph import ModelGraph
from tpplan.search.naming import Behaviour, behaviour, named_behaviours
from tpplan.search.objectives import Cost, Objective, PredictObjective, VolumeObjective, plan_cost
from tpplan.search.results import Excluded, RankedPlan
from tpplan.search.space import SpaceOptions

if TYPE_CHECKING:
    from collections.abc import Callable

    from tpplan.cost.prediction import MemoryBreakdown
    from tpplan.cost.topology import Topology
    from tpplan.cost.workload import Workload
    from tpplan.search.memo import Memo


@dataclass
class Setup:
    """One search's checked inputs, and what it keeps while it runs (audits, named behaviours)."""

    graph: ModelGraph
    topo: Topology | None
    wl: Workload | None
    cap: float | None
    memory_cap: float | str | None  # as asked
    objective: str
    tokens: int
    dtype: str
    expert_dtype: str | None
    top: int
    all_plans: bool
    dp_attention: bool
    audits: Audits
    overlap: OverlapName | None = None  # also rank each all-to-all plan under this engine overlap
    cp_layers: str = "all"  # "mla": every CP of the grid sits inside its TP group (layout.context_parallel)
    cp_kv: str = "engines"  # KV per CP rank: the engines' whole sequence, or "sharded" (1/cp)
    every_deployment: bool = False  # each deployment's best plan and only it (no cutoff by earlier deployments)
    redundant_experts: int = 0  # copies beside the routed experts in every EP/all-to-all plan (SpaceOptions)
    named: dict[int, dict[Behaviour, str]] = field(default_factory=dict)  # TP -> named plans' behaviours
    baselines: dict[Mesh, RankedPlan] = field(default_factory=dict)  # each deployment's baseline

    @property
    def has_moe(self) -> bool:
        """Whether the model has MoE layers (a found plan's words speak of experts only then)."""
        return any(layer.mlp.kind == "moe" for layer in self.graph.spec.layers)

    @property
    def space(self) -> SpaceOptions:
        """The search space's knobs: every one, with the redundant experts asked for."""
        return SpaceOptions(redundant_experts=self.redundant_experts)

    def baseline_audit(self, mesh: Mesh) -> PlanAudit:
        """Megatron TP's audit at the mesh's TP (raises where the model does not split over it)."""
        from tpplan.plans.named import baseline as baseline_plan

        return self.audits.of(baseline_plan(), mesh, self.dtype)


def evaluate(s: Setup, pa: PlanAudit, cost: Cost, mesh: Mesh) -> RankedPlan:
    """One plan's result on `mesh`: the audit's volumes and, with a topology, `predict_plan`'s time and
    memory (the audit handed in: the prediction does not audit again)."""
    if s.topo is None:
        return RankedPlan(pa.plan, mesh, pa, cost, cost.score, None, behaviour(pa))
    from tpplan.cost.predict import predict_plan
    from tpplan.simulate.serving import on_serving_loop

    ideal = predict_plan(s.graph, pa.plan, s.topo, mesh=mesh, workload=s.wl, tokens=s.tokens, dtype=s.dtype,
                         expert_dtype=s.expert_dtype, audit=pa)  # fmt: skip
    # ranked by the engine's serving loop (fixed costs, CPU overlap, PP schedule, the replicas' router), as the
    # memo ranks
    pr = on_serving_loop(ideal, s.graph, pa.plan, s.topo, mesh=mesh, workload=s.wl, dtype=s.dtype,
                         expert_dtype=s.expert_dtype, audit=pa)  # fmt: skip
    score = cost.score
    if s.objective == "time":  # what plans are ranked by: predict's own figure
        score = pr.ttft.mean_s if pr.ttft is not None else pr.forward_s
    idealised = ideal.ttft.mean_s if ideal.ttft is not None else None
    return RankedPlan(pa.plan, mesh, pa, cost, score, pr, behaviour(pa), idealised_s=idealised)


@dataclass
class Deployed:
    """What one deployment's search left: ranked plans, exclusions, stats."""

    entries: list[RankedPlan]
    excluded: dict[str, Excluded]
    reserve: float
    families: int
    walks: int
    objective: str
    label: str


def objective_of(s: Setup, mesh: Mesh) -> Objective:
    if s.objective == "time":
        assert s.topo is not None
        from tpplan.cost.pricing import Pricer

        pricer = Pricer(s.graph, s.topo, mesh, dtype=s.dtype, expert_dtype=s.expert_dtype, audit=s.baseline_audit(mesh))
        return PredictObjective(pricer, workload=s.wl, tokens=s.tokens)
    return VolumeObjective(s.dtype)


def lower_bound(s: Setup, score: float, mesh: Mesh) -> float:
    """What `predict_plan` can say of a plan the search scored `score` on `mesh`, at least: the score itself
    (forward time, volume, or TTFT without PP), or with PP the unpipelined TTFT over PP (a batch
    occupies a stage at least 1/pp of its trip through all of them). With a workload the ranked TTFT is
    the serving loop's, whose fixed costs only add to the idealised schedule's (taken, not proven, never
    to shorten a request's TTFT); over replicas where the walk's dealt split is not the router's, `Screen`
    scales it by what the evaluated plans showed."""
    return score / mesh.pp if s.wl is not None and mesh.pp > 1 else score


@dataclass
class Screen:
    """What a deployment's walk score says of the TTFT a plan is printed and ranked with (`evaluate`).

    The walk screens with the dealt split (`cost.workload.replica_workloads`): linear in batch times, so the
    walk is exact for it. The plans it hands on are ranked by the routed serving loop. Where the dealt split's
    mean is the router's for any batch times (`cost.workload.dealt_is_routed`: one replica; alike prompts with
    R dividing the clients), the screen is the idealised TTFT itself, and a plan's printed TTFT is taken to be
    at least its `lower_bound` (the fixed costs only add), as before. Elsewhere a router may serve a plan
    better or worse than the screen says, and not alike for every plan, so the walk's order is not the
    printed one: every plan whose printed TTFT could still rank is evaluated. Its printed TTFT is taken to be at
    least `lower_bound` x `ratio` + `fixed`: `ratio` the least of (idealised routed TTFT / that bound) seen on
    this deployment's evaluated plans, at most 1 (a router never makes a plan's TTFT less than that share of
    its screen), `fixed` the least (printed - idealised) seen (the fixed costs). The first plan is always
    evaluated there, to see them (tests/test_search_routed.py: the search's best is the best of every walk
    candidate's printed TTFT)."""

    exact: bool
    ratio: float = 1.0
    fixed: float = math.inf
    seen: int = 0

    @staticmethod
    def of(s: Setup, mesh: Mesh) -> Screen:
        from tpplan.cost.workload import dealt_is_routed

        return Screen(s.wl is None or s.objective != "time" or s.topo is None or dealt_is_routed(s.wl, mesh))

    def learn(self, bound: float, got: RankedPlan) -> None:
        """What an evaluated plan (its walk score's `lower_bound` `bound`) shows of the screen."""
        self.seen += 1
        if self.exact or got.idealised_s is None or bound <= 0:
            return
        self.ratio = min(self.ratio, got.idealised_s / bound)
        self.fixed = min(self.fixed, max(0.0, got.score - got.idealised_s))

    def least(self, bound: float) -> float:
        """The least printed TTFT a plan whose walk score's `lower_bound` is `bound` can have."""
        return bound if self.exact else bound * self.ratio + (self.fixed if self.seen else 0.0)

    def stops(self, bound: float, cutoff: float, kth: float | None) -> bool:
        """Whether the walk's next plan (and every later one) cannot rank: its least printed TTFT is no better
        than `cutoff` (earlier deployments') or, once `top` plans fit, than the `top`-th of them (`kth`; exact
        screen: then always, as the walk's order is taken for the printed one)."""
        if not self.exact and not self.seen:
            return False
        least = self.least(bound)
        if least >= cutoff:
            return True
        return kth is not None and (self.exact or least >= kth)


def over_cap(mem: MemoryBreakdown, walked: float) -> tuple[float, str]:
    """What a predicted plan over the cap needs beyond the walk's additive memory (`walked`), to reserve in the
    next walk, and why: its activations, and over replicas the KV of the requests the router sent one replica
    at once beyond its dealt share of the clients (`Predictor.memory`)."""
    act = float(mem.activations)
    routed = mem.total - act - walked
    if routed > 1e-9 * mem.total:
        return act + routed, "activations and routed KV"
    return act, "activations"


def over_floor(s: Setup, mesh: Mesh, memo: Memo, floor: Callable[[], float]) -> Excluded | None:
    """CP keeps every CP group's TP x PP weights, a replica all of them: baseline's memory (no replication,
    the least any plan holds) with KV, state and embedding is a floor on every plan's; over the cap, none
    fits, and every plan is excluded (None: the floor fits, or no CP, no replicas, no cap)."""
    if not (mesh.cp > 1 or mesh.replicas > 1) or s.cap is None:
        return None
    least = memo.get("floor", None, floor)
    if least <= s.cap:
        return None
    return Excluded("every plan", mesh.label(), None, search_memory_bytes=least, why="floor")


def baseline_of(s: Setup, mesh: Mesh) -> RankedPlan:
    """Megatron TP on this mesh, for reference (priced once per search)."""
    hit = s.baselines.get(mesh)
    if hit is None:
        pa = s.baseline_audit(mesh)
        cost = plan_cost(objective_of(s, mesh), s.graph, pa)
        hit = s.baselines[mesh] = evaluate(s, pa, cost, mesh)
    return hit


def named_of(s: Setup, mesh: Mesh) -> dict[Behaviour, str]:
    """The named plans' behaviours at the mesh's TP (computed once per search and TP)."""
    if mesh.tp not in s.named:
        s.named[mesh.tp] = named_behaviours(s.graph, mesh.tp, s.dtype, audits=s.audits)
    return s.named[mesh.tp]


__all__ = [
    "Deployed",
    "Screen",
    "Setup",
    "baseline_of",
    "evaluate",
    "lower_bound",
    "named_of",
    "objective_of",
    "over_cap",
    "over_floor",
]
