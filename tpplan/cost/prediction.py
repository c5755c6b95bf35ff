"""What a prediction says: per-op and per-collective times, per layer kind, memory per rank and TTFT.

The plain results `tpplan.cost.predict` returns (`PlanPrediction` and its parts) and their JSON
(`tpplan audit --json`, docs/audit-json.md, `prediction`). No pricing here: `cost/kernel_pricer.py`
and `cost/collective_pricer.py` price the program's steps, `cost/predictor.py` sums them into layers,
stages and memory.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from tpplan.cost.provenance import Provenance
from tpplan.cost.workload import TTFTResult
from tpplan.engines.memory import KVCapacity
from tpplan.layout.plan import Plan

Category = str  # "gemm" | "attention" | "recurrence" | "moe" | "elementwise"


@dataclass(frozen=True)
class OpTime:
    """One op of one layer kind, per rank, for one batch."""

    layer_kind: str
    op: str
    role: str
    category: Category
    flops_per_rank: float
    bytes_per_rank: float
    seconds: float
    redundant: bool  # every rank does the whole op (e.g. the replicated qkv_a under baseline)
    shape: tuple[int, int, int] | None = None  # (M, K, N) per rank for GEMMs (per expert group for MoE)
    kernel: str | None = None  # kernel class a measured profile may price (None: GEMMs, from the GEMM table)
    modelled_s: float | None = None  # the model's own estimate, before a kernel profile replaced it
    extrapolated: bool = False  # priced outside the measured shapes (a kernel model's sweep, the GEMM table's floor)
    source: str | None = None  # what priced it: a kernel source's name, gemm-table, kernel-model, roofline, ...
    note: str | None = None  # where its weight format was priced from other rows (`KernelPricer._moe_note`)
    band: str | None = None  # its own error-table class where not its category's (`models.opkinds.band_class`)

    def to_json(self) -> dict[str, object]:
        """Plain data, as `PlanPrediction.to_json` lists an op."""
        return {
            "op": self.op,
            "role": self.role,
            "category": self.category,
            "flops_per_rank": self.flops_per_rank,
            "bytes_per_rank": self.bytes_per_rank,
            "seconds": self.seconds,
            "redundant": self.redundant,
            "extrapolated": self.extrapolated,
            "source": self.source,
            "shape": list(self.shape) if self.shape else None,
        }


LAYOUT_COPY_KERNEL = "layout_copy"  # kernel class of the runtime's pack/unpack copies around collectives


@dataclass(frozen=True)
class CollectiveTime:
    """One collective of one layer kind, for one batch."""

    layer_kind: str
    label: str
    kind: str  # all_reduce | reduce_scatter | all_gather | all_to_all | send_recv
    region: str
    nbytes: float  # nccl-tests size
    seconds: float
    algorithm: str

    def to_json(self) -> dict[str, object]:
        """Plain data, as `PlanPrediction.to_json` lists a collective."""
        return {
            "label": self.label,
            "kind": self.kind,
            "region": self.region,
            "nbytes": self.nbytes,
            "seconds": self.seconds,
            "algorithm": self.algorithm,
        }


@dataclass(frozen=True)
class KindTime:
    """Time of one layer of a kind (compute and communication are not overlapped)."""

    kind: str
    count: int
    ops: list[OpTime]
    collectives: list[CollectiveTime]

    @property
    def compute_s(self) -> float:
        return sum(o.seconds for o in self.ops)

    @property
    def comm_s(self) -> float:
        return sum(c.seconds for c in self.collectives)

    @property
    def total_s(self) -> float:
        return self.compute_s + self.comm_s

    @property
    def redundant_s(self) -> float:
        """Compute every rank repeats: what a token-sharded plan could save."""
        return sum(o.seconds for o in self.ops if o.redundant)

    def to_json(self) -> dict[str, object]:
        """Plain data, as `PlanPrediction.to_json` lists a layer kind (ops that take no time left out)."""
        return {
            "count": self.count,
            "compute_s": self.compute_s,
            "comm_s": self.comm_s,
            "total_s": self.total_s,
            "redundant_s": self.redundant_s,
            "ops": [o.to_json() for o in self.ops if o.seconds > 0],
            "collectives": [c.to_json() for c in self.collectives],
        }


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per rank on the fullest pipeline stage. `replicated_extra` is part of `weights`
    (what replication costs beyond sharding), shown separately because it is a plan's price."""

    weights: float
    replicated_extra: float
    activations: float
    kv_cache: float
    recurrent_state: float

    @property
    def total(self) -> float:
        return self.weights + self.activations + self.kv_cache + self.recurrent_state


@dataclass(frozen=True)
class PlanPrediction:
    """One plan's prediction at TP `tp` x PP `pp` on a topology: what `predict_plan` hands on (its
    one serializer is `to_json`)."""

    plan: Plan
    tp: int
    pp: int
    legal: bool
    tokens: int
    context: int
    kinds: list[KindTime]
    stage_comm_s: float  # stage-boundary send/recv (+ re-gather) for one chunk, all boundaries
    forward_s: float  # one batch of `tokens`, whole model; PP: sum of the stages for one chunk
    memory: MemoryBreakdown
    ttft: TTFTResult | None
    topology: str
    workload: str | None
    stage_s: list[float] = field(default_factory=list)  # per stage, one chunk, its send included
    final_comm_s: float = 0.0  # the reduction before the final norm
    gpu_memory_bytes: float = 0.0
    provenance: Provenance | None = None  # how the times were made and the error band that applies
    cp: int = 1  # context-parallel size: TP groups per stage, each on 1/cp of the tokens
    # the KV cache per rank as each engine version sizes it (`tpplan.cost.kv_capacity`)
    kv_capacity: tuple[KVCapacity, ...] = ()
    replicas: int = 1  # identical copies of the deployment, the workload's requests split between them
    # what the serving loop that priced `ttft` does not model for its engine (empty: the cost model's own
    # idealised schedule; `tpplan.simulate.serving.with_serving_loop` fills it); not in the JSON
    serving_conditions: tuple[str, ...] = ()

    @property
    def compute_s(self) -> float:
        """Whole-model compute for one chunk (every layer)."""
        return sum(k.count * k.compute_s for k in self.kinds)

    @property
    def comm_s(self) -> float:
        """Whole-model TP communication for one chunk (without stage sends)."""
        return sum(k.count * k.comm_s for k in self.kinds) + self.final_comm_s

    @property
    def redundant_s(self) -> float:
        return sum(k.count * k.redundant_s for k in self.kinds)

    @property
    def fits(self) -> bool:
        return self.memory.total <= self.gpu_memory_bytes

    @property
    def extrapolated_ops(self) -> list[str]:
        """`kind/op` of every op priced outside the shapes its measurements cover (kernel models, GEMM table)."""
        return [f"{k.kind}/{o.op}" for k in self.kinds for o in k.ops if o.extrapolated and o.seconds > 0]

    def to_json(self) -> dict[str, object]:
        """Plain data for `tpplan audit --json` (docs/audit-json.md, `prediction`)."""
        m = self.memory
        return {
            "topology": self.topology,
            "workload": self.workload,
            "tp": self.tp,
            "pp": self.pp,
            "cp": self.cp,
            "replicas": self.replicas,
            "tokens": self.tokens,
            "context": self.context,
            "forward_s": self.forward_s,
            "provenance": self.provenance.to_json() if self.provenance else None,
            "compute_s": self.compute_s,
            "comm_s": self.comm_s,
            "redundant_compute_s": self.redundant_s,
            "extrapolated_ops": self.extrapolated_ops,
            "stage_comm_s": self.stage_comm_s,
            "stage_s": list(self.stage_s),
            "layer_kinds": {k.kind: k.to_json() for k in self.kinds},
            "memory_bytes_per_rank": {
                "weights": m.weights,
                "replicated_extra": m.replicated_extra,
                "activations": m.activations,
                "kv_cache": m.kv_cache,
                "recurrent_state": m.recurrent_state,
                "total": m.total,
                "gpu": self.gpu_memory_bytes,
                "fits": self.fits,
            },
            "ttft": _ttft_json(self.ttft),
            "kv_capacity": [c.to_json() for c in self.kv_capacity],
        }


def _ttft_json(t: TTFTResult | None) -> dict[str, object] | None:
    """A TTFT result's summary, as `PlanPrediction.to_json` states it."""
    if t is None:
        return None
    out: dict[str, object] = {
        "mean_s": t.mean_s,
        "p50_s": t.p50_s,
        "max_s": t.max_s,
        "throughput_tok_s": t.throughput_tok_s,
        "makespan_s": t.makespan_s,
        "batches": len(t.batches),
        "requests": len(t.ttft_s),
    }
    if t.replicas:  # each replica's share (its own scheduler): requests, prefill tokens, TTFT
        out["per_replica"] = [asdict(share) for share in t.replicas]
    return out


__all__ = ["LAYOUT_COPY_KERNEL", "CollectiveTime", "KindTime", "MemoryBreakdown", "OpTime", "PlanPrediction"]
