"""The memo's typed results, handed from the analysis to every section that prints it: a `Variant`
(one plan at one TP x PP with its audit, predictions and engine recipes), the figures read off one,
the hand-derived `BoundaryRow`, the `Verdict`, `NextStep` and `BottomLine` the decision rules
(`verdicts.py`) give, and the `Analysis` that holds them all.

Below `analysis.py` (which computes them), `verdicts.py` and `differences.py` (which read them), so
none of those imports another to reach a type.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tpplan.audit import PlanAudit
from tpplan.bench_results import BenchResults
from tpplan.cost.provenance import BANDS, Provenance
from tpplan.cost.topology import Topology
from tpplan.cost.workload import Workload
from tpplan.engines.recipes import EngineRecipe
from tpplan.layout.plan import Plan
from tpplan.mesh import Mesh
from tpplan.models.graph import ModelGraph
from tpplan.report.crossover import Crossover

if TYPE_CHECKING:
    from tpplan.cost.prediction import PlanPrediction
    from tpplan.report.rows import DeploymentRow, GroupRace, KernelSensitivity, LengthPoint
    from tpplan.report.serving_memo import ServingMemo
    from tpplan.simulate.serving import Arrival

# Verdict statuses and the word the memo's answer uses for each.
STATUS_WORDS = {
    "reference": "It is today's deployment",
    "YES": "Yes",
    "NO": "No",
    "CONDITIONAL": "Yes, with conditions",
    "TOO CLOSE": "Too close to call",
    "OPEN": "Open",
}


@dataclass(frozen=True)
class Verdict:
    key: str
    status: str  # one of STATUS_WORDS
    headline: str
    reasons: tuple[str, ...]
    formula: str


@dataclass(frozen=True)
class NextStep:
    key: str
    gain: float  # seconds (predicted TTFT) or fraction of bytes (volume basis)
    rel: float  # gain as a fraction of today's value
    basis: str
    price: str
    engine: str
    engine_ok: bool  # an engine flag realises it as is
    clear: bool  # the gain exceeds the error band (always False on a volume basis)
    conditions: tuple[str, ...] = ()  # what must hold for it to run as predicted (engine support, memory)

    @property
    def timed(self) -> bool:
        return "TTFT" in self.basis

    def gain_text(self) -> str:
        return f"{self.gain:.3f} s ({100 * self.rel:.1f}%)" if self.timed else f"{100 * self.gain:.1f}% bytes"


@dataclass(frozen=True)
class BottomLine:
    action: str  # "switch" | "keep"
    target: str  # the variant to run next (today's when keeping)
    text: str


@dataclass
class Variant:
    """One plan at one parallel shape (TP x PP) with its audit, predictions and engine flags."""

    plan: Plan
    tp: int
    pp: int
    audit: PlanAudit
    predictions: dict[str, PlanPrediction] = field(default_factory=dict)  # workload name -> its prediction
    prediction_error: str | None = None
    engines: list[EngineRecipe] = field(default_factory=list)
    main_tp: int = 0  # the report's main TP size; 0: this variant's own
    cp: int = 1  # context-parallel size of the deployment (tpplan.layout.context_parallel)
    replicas: int = 1  # identical copies of the deployment, the workload's requests split between them
    cp_layers: str = "all"  # which layers CP token-shards ("mla": only MLA attention, CP inside the TP group)

    @property
    def parallel(self) -> Mesh:
        """The deployment as the cost model and the engine recipes take it (the CP options only with CP)."""
        cp_layers = self.cp_layers if self.cp > 1 else "all"
        return Mesh(self.tp, self.pp, replicas=self.replicas, cp=self.cp, cp_layers=cp_layers)

    @property
    def flags(self) -> list[str]:
        """Each engine's launch line for the whole deployment, or why it has none (`EngineRecipe.line`)."""
        return [e.line() for e in self.engines]

    @property
    def deployment(self) -> str:
        """`TP8`, `TP8xPP4`, `TP8xCP4`, `2x TP16`: the search's name for the deployment (`Mesh.label`)."""
        return self.parallel.label()

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """(TP, PP, CP, replicas): what "the same shape" compares."""
        return self.tp, self.pp, self.cp, self.replicas

    @property
    def key(self) -> str:
        """Readable label: the plan name, plus the shape when it is not the report's main one."""
        if self.pp > 1 or self.cp > 1 or self.replicas > 1:
            return f"{self.plan.name} {self.deployment}"
        return self.plan.name if self.tp == (self.main_tp or self.tp) else f"{self.plan.name} TP{self.tp}"

    @property
    def legal(self) -> bool:
        return self.audit.legal


@dataclass(frozen=True)
class BoundaryRow:
    """One row of the hand-derived attention-input table (path, its formula and units), beside the
    plan that realises it and the units and formula tpplan derives from the graph."""

    path: str
    hand_formula: str
    hand_units: int
    plan: str
    units: float
    legal: bool
    formula: str


@dataclass
class Analysis:
    model: str
    graph: ModelGraph
    topology: Topology
    workloads: list[Workload]
    tp: int
    dtype: str
    variants: list[Variant]
    volume_vs_tp: dict[str, list[tuple[int, float]]]
    boundary_rows: list[BoundaryRow]
    verdicts: list[Verdict]
    next_steps: list[NextStep]
    differences: list[tuple[str, str]]  # (title, paragraph with numbers)
    predictor_note: str | None
    bench: BenchResults | None = None
    current_key: str = "baseline"
    provenance: Provenance = BANDS["datasheet"]
    bottom: BottomLine | None = None
    same_as: dict[str, str] = field(default_factory=dict)  # variant key -> earlier key with equal decisions
    crossovers: list[Crossover] = field(default_factory=list)
    memory_cap_bytes: float = float("inf")  # the limit verdicts and next steps apply (--memory-cap)
    engines: tuple[str, ...] = ()  # the engine versions the recipes were judged against (engine@version)
    pp_engine: str = ""  # the engine whose PP schedule priced PP TTFT (the first --engine; "": the default)
    grid: list[tuple[int, int, int, int]] = field(default_factory=list)  # the search's (TP, PP, CP, replicas)
    overlap: str | None = None  # the micro-batch overlap the search ranked too (--overlap), as `tpplan search`
    cp_kv: str = "engines"  # the KV a CP rank keeps in the predictions (`engines.context_parallel.CP_KV_MODES`)
    search_best: tuple[str, str] | None = None  # (memo variant's plan name, deployment) of the search's best
    deployments: dict[str, list[DeploymentRow]] = field(default_factory=dict)  # workload -> ranked deployments
    length_points: dict[str, list[LengthPoint]] = field(default_factory=dict)  # variant key -> per prompt length
    length_races: list[GroupRace] = field(default_factory=list)  # CP vs CP-1, TP x PP vs TP over prompt lengths
    kernel_sources: KernelSensitivity | None = (
        None  # the answer under each kernel-price source (report.rows, computed by report.kernel_sources)
    )
    arrival: Arrival | None = None  # the serving loop's arrivals (--arrival-rate, --trace); None: each workload's own
    serving: ServingMemo | None = (
        None  # under --ttft-target/--tpot-target: the deployments served (report.serving_section)
    )

    def variant(self, key: str) -> Variant | None:
        return next((v for v in self.variants if v.key == key), None)

    def verdict(self, key: str) -> Verdict | None:
        return next((x for x in self.verdicts if x.key == key), None)

    @property
    def baseline(self) -> Variant:
        return self.variants[0]

    @property
    def current(self) -> Variant:
        """Today's deployment (`--current`): the reference every verdict is judged against."""
        return self.variant(self.current_key) or self.variants[0]

    @property
    def asks_the_seed_question(self) -> bool:
        """The seed memo's model (Kimi-K3): only then does the memo speak of the seed."""
        return self.graph.spec.model_type == "kimi_k3"

    @property
    def first_workload(self) -> str | None:
        return self.workloads[0].name if self.workloads else None


def ttft_mean(v: Variant, workload: str) -> float | None:
    """Predicted mean TTFT of a variant under a workload, when predicted."""
    p = v.predictions.get(workload)
    ttft = getattr(p, "ttft", None) if p is not None else None
    return None if ttft is None else float(ttft.mean_s)


def memory_fit(v: Variant, limit: float = 0.0) -> tuple[float, float, bool] | None:
    """(predicted bytes per rank, the limit, fits) from the first prediction, when predicted; the
    limit is the memo's memory cap (`limit`) or else one GPU."""
    p = next(iter(v.predictions.values()), None)
    mem = getattr(p, "memory", None) if p is not None else None
    gpu = limit or float(getattr(p, "gpu_memory_bytes", 0.0) or 0.0)
    if mem is None or not gpu:
        return None
    return float(mem.total), gpu, float(mem.total) <= gpu


def held_weights(v: Variant) -> tuple[float, float]:
    """(weight bytes, replicated extra bytes) per rank: the one figure audit, search and memo share
    (`tpplan.audit.stage_weights`): the prediction's (fullest PP stage, `--expert-dtype`) when
    predicted, else the audit's (stored dtype, PP 1)."""
    p = next(iter(v.predictions.values()), None)
    mem = getattr(p, "memory", None) if p is not None else None
    if mem is not None:
        return float(mem.weights), float(mem.replicated_extra)
    return v.audit.weight_bytes_per_rank, v.audit.replicated_extra_bytes


def kind_times(v: Variant) -> dict[str, float] | None:
    """Predicted seconds per layer kind for one batch (kind time x layers of that kind), plus the
    final reduction and the stage sends: they sum to the prediction's `forward_s`, audit's forward."""
    p = next(iter(v.predictions.values()), None)
    if p is None:
        return None
    out = {k.kind: float(k.total_s) * int(k.count) for k in p.kinds}
    if getattr(p, "final_comm_s", 0.0):  # the reduction before the final norm: part of forward_s
        out["final reduce"] = float(p.final_comm_s)
    if getattr(p, "stage_comm_s", 0.0):
        out["pipeline send/recv"] = float(p.stage_comm_s)
    return out


def redundant_seconds(v: Variant) -> float | None:
    """Predicted seconds per batch spent on ops every rank repeats on every token."""
    p = next(iter(v.predictions.values()), None)
    if p is None:
        return None
    return sum(float(o.seconds) * int(k.count) for k in p.kinds for o in k.ops if o.redundant)
