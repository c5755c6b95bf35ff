"""A stand-in for `tpplan.cost.predict.predict_plan` with the announced API and field names.

It lets the report's time/memory/TTFT sections be tested before (and independently of) the real
predictor: the numbers are simple (comm from the audit's bytes over a fixed bandwidth, compute a
constant per layer) but the shape is the contract the report relies on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tpplan.audit import audit_plan
from tpplan.cost.workload import TTFTResult, simulate_ttft


@dataclass
class OpTime:
    layer_kind: str
    op: str
    role: str
    category: str
    flops_per_rank: float
    bytes_per_rank: float
    seconds: float
    redundant: bool


@dataclass
class CollectiveTime:
    layer_kind: str
    label: str
    kind: str
    region: str
    nbytes: float
    seconds: float
    algorithm: str


@dataclass
class KindTime:
    kind: str
    count: int
    ops: list[OpTime]
    collectives: list[CollectiveTime]
    compute_s: float
    comm_s: float
    total_s: float


@dataclass
class MemoryBreakdown:
    weights: float
    replicated_extra: float
    activations: float
    kv_cache: float
    recurrent_state: float
    total: float


@dataclass
class PlanPrediction:
    plan: str
    tp: int
    pp: int
    legal: bool
    tokens: int
    kinds: list[KindTime]
    stage_comm_s: float
    forward_s: float
    memory: MemoryBreakdown
    ttft: TTFTResult | None
    calls: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return {"plan": self.plan, "forward_s": self.forward_s}


def fake_predict_plan(graph, plan, topology, *, tp, pp=1, workload=None, tokens=8192, dtype="bf16"):
    pa = audit_plan(graph, plan, tp, dtype)
    counts = graph.counts()
    kinds = []
    for kind, ks in pa.kinds.items():
        comm = ks.result.elements_per_token() * pa.dtype_bytes * tokens / 100e9
        red = [d for d in ks.result.decisions if d.compute_share >= 1.0 and d.op.weight_numel]
        ops = [
            OpTime(kind, d.op.name, d.op.role, "gemm", 2.0 * tokens * d.op.weight_numel, 0.0, 1e-5, True) for d in red
        ]
        compute = 2e-3 + sum(o.seconds for o in ops)
        kinds.append(KindTime(kind, counts[kind], ops, [], compute, comm, compute + comm))
    stage = 1e-3 * (pp - 1)
    fwd = sum(k.total_s * k.count for k in kinds) / pp + stage
    ttft = simulate_ttft(workload, lambda b: fwd * b.n_tokens / tokens) if workload is not None else None
    mem = MemoryBreakdown(pa.weight_bytes_per_rank, pa.replicated_extra_bytes, 2**30, 2**31, 2**28, 0.0)
    mem.total = mem.weights + mem.activations + mem.kv_cache + mem.recurrent_state
    return PlanPrediction(plan.name, tp, pp, pa.legal, tokens, kinds, stage, fwd, mem, ttft)
