"""What `tpplan search` hands on: typed results, and their one serializer (docs/search-json.md).

`search_plans` (`tpplan.search.ranking`) returns a `SearchOutcome`: the ranked plans, each a
`RankedPlan` holding its plan, audit, the search's own cost and (with a topology) its prediction;
the baselines the deltas compare against; the plans the memory cap excluded; and the inputs it was
asked with. The stages after it (the CLI's table, plan files, the memo) read these objects; JSON
is made only at the edge, by `SearchOutcome.to_json` (`RankedPlan.to_json` for one entry).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from tpplan.audit import PlanAudit
from tpplan.layout.plan import Plan
from tpplan.mesh import Mesh
from tpplan.search.naming import Behaviour
from tpplan.search.objectives import Cost
from tpplan.units import GIB
from tpplan.units import pct_change_json as pct

if TYPE_CHECKING:
    from tpplan.cost.prediction import PlanPrediction
    from tpplan.cost.topology import Topology
    from tpplan.cost.workload import TTFTResult, Workload
    from tpplan.plans.files import PlanFile

JSON_SCHEMA_VERSION = 3  # 3: deltas vs the same-shape baseline; weights in the stored dtype
SERVING_SHARE = 0.9  # the default memory cap: this share of one GPU (tpplan.search.ranking's docstring)


@dataclass(frozen=True)
class RankedPlan:
    """One plan a search evaluated on `mesh` (TP x PP x CP, replicas): its audit, the search's own cost of it
    (`search_cost`), what plans are ranked by (`score`: the prediction's mean TTFT or forward time,
    else the search's score) and, with a topology, the prediction itself.

    A ranked plan also has its `rank` and the baselines its deltas compare with: `baseline`, at
    the same TP x PP, and `reference`, at the search's first deployment. A baseline shown for
    reference has neither."""

    plan: Plan
    mesh: Mesh
    audit: PlanAudit
    search_cost: Cost
    score: float
    prediction: PlanPrediction | None
    behaviour: Behaviour = ()
    same_as_named: str | None = None
    rank: int | None = None
    baseline: RankedPlan | None = None
    reference: RankedPlan | None = None
    # predict_plan's own TTFT mean (no fixed costs; over replicas the router's), which the walk's screen bounds
    # (`search.setup.Screen`); None without a workload
    idealised_s: float | None = None

    @property
    def tp(self) -> int:
        return self.mesh.tp

    @property
    def pp(self) -> int:
        return self.mesh.pp

    @property
    def cp(self) -> int:
        """Context-parallel size of the deployment (layout.context_parallel)."""
        return self.mesh.cp

    @property
    def replicas(self) -> int:
        """Identical copies of the TP x CP x PP deployment, the requests split between them."""
        return self.mesh.replicas

    @property
    def deployment(self) -> str:
        return self.mesh.label()

    @property
    def memory_total(self) -> float | None:
        """Predicted bytes per rank (None without a prediction)."""
        return self.prediction.memory.total if self.prediction is not None else None

    @property
    def weight_bytes(self) -> tuple[float, float]:
        """(weight bytes, replicated extra) per rank: the prediction's (fullest stage, expert dtype)
        when predicted, else the audit's (one figure: `tpplan.audit.stage_weights`)."""
        if self.prediction is not None:
            return self.prediction.memory.weights, self.prediction.memory.replicated_extra
        return self.audit.weight_bytes_per_rank, self.audit.replicated_extra_bytes

    def _volume(self, ttft: TTFTResult) -> dict[str, object]:
        """What each replica moves over the workload and the total: its prefill tokens times the
        audit's TP bytes per token per rank (one rank of a TP group, every layer; CP exchanges and PP
        sends not counted), so the replicas' sum is what one copy would move for every token."""
        per_token = self.audit.comm_bytes_per_token
        tokens = [share.prefill_tokens for share in ttft.replicas] or [ttft.prefill_tokens]
        return {
            "prefill_tokens_per_replica": tokens,
            "comm_bytes_per_rank_per_replica": [n * per_token for n in tokens],
            "comm_bytes_per_rank_total": sum(tokens) * per_token,
        }

    def to_json(self) -> dict[str, object]:
        """One entry of the search JSON (docs/search-json.md, `plans[]` and `baseline`)."""
        plan, pa = self.plan, self.audit
        weights, extra = self.weight_bytes
        out: dict[str, object] = {
            "rank": self.rank,
            "name": plan.name,
            "tp": self.tp,
            "pp": self.pp,
            "cp": self.cp,
            "replicas": self.replicas,
            "deployment": self.deployment,
            "title": plan.title,
            "summary": plan.summary,
            "found_by": plan.found_by,
            "same_as_named": self.same_as_named,
            "legal": pa.legal,
            "decisions": plan.describe(),
            "score": self.score,
            "search_score": self.search_cost.score,
            "comm_bytes_per_token_per_rank": pa.comm_bytes_per_token,
            "weight_bytes_per_rank": weights,
            "replicated_extra_bytes_per_rank": extra,
            "search_memory_bytes_per_rank": self.search_cost.memory,
        }
        pr = self.prediction
        if pr is not None:
            t = pr.ttft
            out["forward_s"] = pr.forward_s
            out["ttft"] = {"mean_s": t.mean_s, "p50_s": t.p50_s, "max_s": t.max_s} if t is not None else None
            if t is not None:
                out["volume"] = self._volume(t)
            out["memory_bytes_per_rank"] = {**asdict(pr.memory), "total": pr.memory.total}
            out["kv_capacity"] = [c.to_json() for c in pr.kv_capacity]
            out["provenance"] = pr.provenance.to_json() if pr.provenance is not None else None
        same, ref = self.baseline, self.reference
        if self.rank is not None and same is not None and ref is not None:
            out["baseline_score"] = same.score
            out["delta_vs_baseline_pct"] = pct(self.score, same.score)
            out["deployment_delta_pct"] = pct(same.score, ref.score)
            out["comm_delta_vs_baseline_pct"] = pct(pa.comm_bytes_per_token, same.audit.comm_bytes_per_token)
        return out


@dataclass(frozen=True)
class Excluded:
    """A plan that would have ranked but is over the memory cap: by the search's own sum
    (`why` None), by its activations once predicted ("activations"), a named DP plan ("memory"), or
    every plan of a CP deployment whose baseline memory is over the cap ("floor", no score: not searched)."""

    name: str
    deployment: str
    score: float | None
    search_memory_bytes: float | None = None
    memory_bytes: float | None = None  # predicted
    why: str | None = None

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"name": self.name, "deployment": self.deployment}
        if self.memory_bytes is not None:
            out["memory_bytes_per_rank"] = self.memory_bytes
        else:
            out["search_memory_bytes_per_rank"] = self.search_memory_bytes
        out["score"] = self.score
        if self.why is not None:
            out["why"] = self.why
        return out


@dataclass(frozen=True)
class SearchStats:
    """What the search did: the deployments searched and skipped (label, why), families, steps."""

    deployments: tuple[str, ...]
    skipped: tuple[tuple[str, str], ...]
    families: int
    walk_steps: int
    seconds: float


@dataclass(frozen=True)
class SearchOutcome:
    """A search's answer: the ranked plans (best first), the baselines their deltas compare with
    (`baseline` at the first deployment, `baselines` one per TP x PP shown), the plans the cap
    excluded and the inputs the search was asked with. `to_json` is the search JSON."""

    model: str
    graph_layer_kinds: tuple[str, ...]
    grid: tuple[Mesh, ...]  # each deployment searched, in order (the first: the reference)
    topology: Topology | None
    workload: Workload | None
    dtype: str
    expert_dtype: str | None
    objective: str  # the objective's name ("mean TTFT", ...)
    ranks_by_time: bool
    all_plans: bool
    memory_cap: float | str | None  # as asked: GiB, "serving", "gpu" or None
    memory_cap_bytes: float | None
    reserve_bytes: float  # activations reserved under the cap in the search
    baseline: RankedPlan
    baselines: tuple[RankedPlan, ...]
    ranked: tuple[RankedPlan, ...]
    excluded: tuple[Excluded, ...]
    stats: SearchStats
    plan_files: list[PlanFile] = field(default_factory=list)  # one per ranked plan (`tpplan search --save`)
    # the best plan of each deployment searched (grid order; the memo's "Deployments ranked" rows are these)
    deployment_best: tuple[RankedPlan, ...] = ()
    cp_layers: str = "all"  # the CP options every deployment was priced with (each its own CP size)
    cp_kv: str = "engines"
    router: str | None = None  # the request router over the replicas asked for (None: the engine release's default)

    @property
    def plans(self) -> list[Plan]:
        """The ranked plans themselves, best first."""
        return [r.plan for r in self.ranked]

    @property
    def data(self) -> dict[str, object]:
        """The search JSON (`to_json`)."""
        return self.to_json()

    def _provenance(self) -> dict[str, object] | None:
        """How the ranked times were made (None for byte volumes, which are exact counts): the band of
        the question, the reference deployment's baseline prediction composed per op class and source
        (`cost.provenance.question_provenance`: the same figure audit and the memo state), else the
        topology's for the reference deployment."""
        if not self.ranks_by_time or self.topology is None:
            return None
        from tpplan.cost.provenance import question_provenance

        m = self.grid[0]
        return question_provenance(self.baseline.prediction, self.topology, m.tp * m.pp * m.cp).to_json()

    def _cap_reason(self) -> str | None:
        if self.memory_cap_bytes is None:
            return None
        return (
            f"memory per rank above the cap of {self.memory_cap_bytes / GIB:g} GiB"
            + (", one GPU's memory" if self.memory_cap == "gpu" else "")
            + (f", {SERVING_SHARE:.0%} of one GPU's memory" if self.memory_cap == "serving" else "")
            + " (weights incl. replication, KV cache, recurrent state, embedding/head, and the activations"
            " of one chunk: the walk caps the rest, then each ranked plan is checked with its activations added; "
            + (
                f"{self.reserve_bytes / GIB:.2f} GiB reserved for them in a second walk)"
                if self.reserve_bytes > 0
                else "none went over with them, so no second walk reserved any)"
            )
        )

    def to_json(self) -> dict[str, object]:
        """The search JSON (docs/search-json.md)."""
        topo, base = self.topology, self.baseline
        return {
            "schema_version": JSON_SCHEMA_VERSION,
            "model": self.model,
            "tp": self.grid[0].tp,
            "pp": self.grid[0].pp,
            "cp": self.grid[0].cp,
            "replicas": self.grid[0].replicas,
            "dtype": self.dtype,
            "expert_dtype": self.expert_dtype,
            "topology": topo.name if topo is not None else None,
            "nodes": topo.nodes if topo is not None else None,
            "gpus_per_node": topo.gpus_per_node if topo is not None else None,
            "workload": self.workload.name if self.workload is not None else None,
            "objective": self.objective,
            "score_unit": "s" if self.ranks_by_time else "bytes per token per rank",
            "mode": "all" if self.all_plans else "per-family",
            "memory_cap_bytes": self.memory_cap_bytes,
            "gpu_memory_bytes": topo.gpu.memory_GiB * GIB if topo is not None else None,
            "provenance": self._provenance(),
            "baseline": base.to_json(),
            "baselines": [
                {"deployment": b.deployment, "score": b.score, "delta_pct": pct(b.score, base.score)}
                for b in self.baselines
            ],
            "plans": [r.to_json() for r in self.ranked],
            "excluded_over_cap": {
                "count": len(self.excluded),
                "reason": self._cap_reason(),
                "plans": [e.to_json() for e in self.excluded],
            },
            "search": {
                "deployments": list(self.stats.deployments),
                "skipped": [{"deployment": d, "why": why} for d, why in self.stats.skipped],
                "families": self.stats.families,
                "walk_steps": self.stats.walk_steps,
                "seconds": round(self.stats.seconds, 3),
            },
        }


__all__ = [
    "GIB",
    "JSON_SCHEMA_VERSION",
    "SERVING_SHARE",
    "Excluded",
    "RankedPlan",
    "SearchOutcome",
    "SearchStats",
]
