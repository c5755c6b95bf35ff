"""One search's checked inputs (`Setup`) and how it scores one plan at one deployment (`evaluate`).

`ranking.py` walks the deployments and `variants.py` adds the plans the search's space leaves out;
both score a plan here, against the objective `objective_of` builds, and take the reference plans
(Megatron TP baseline, the named plans' behaviours) from here, computed once per search.
"""

from __future__ import annotations

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
    from tpplan.cost.topology import Topology
    from tpplan.cost.workload import Workload


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
    from tpplan.simulate.serving import with_serving_loop

    # ranked by the engine's serving loop (fixed costs, CPU overlap, PP schedule), as the memo ranks
    predict = with_serving_loop(predict_plan)
    pr = predict(s.graph, pa.plan, s.topo, mesh=mesh, workload=s.wl, tokens=s.tokens, dtype=s.dtype,
                 expert_dtype=s.expert_dtype, audit=pa)  # fmt: skip
    score = cost.score
    if s.objective == "time":  # what plans are ranked by: predict's own figure
        score = pr.ttft.mean_s if pr.ttft is not None else pr.forward_s
    return RankedPlan(pa.plan, mesh, pa, cost, score, pr, behaviour(pa))


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
    to shorten a request's TTFT)."""
    return score / mesh.pp if s.wl is not None and mesh.pp > 1 else score


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


__all__ = ["Deployed", "Setup", "baseline_of", "evaluate", "lower_bound", "named_of", "objective_of"]
