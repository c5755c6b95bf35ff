"""Predict a plan's time, memory and TTFT on a topology: the audit's decisions priced op by op.

The audit (`tpplan.audit`) says, per layer kind, how each op runs under a plan (its strategy, the
share of the op's work one rank does, its weight per rank) and which collectives the plan issues.
The cost model turns that into seconds and bytes on a `Topology` (a GPU model, `cost/gpu.py`, in a
cluster, `cost/cluster.py`, for a `Mesh`, `tpplan/mesh.py`), in these modules:

- the two pricers of the lowered program's steps (`tpplan.lower`): `cost/kernel_pricer.py`
  (`KernelPricer`: a kernel step by its op kind's cost class: GEMMs at the per-rank shape, grouped
  experts, attention, recurrences, memory-bound ops, through `cost/compute.py`'s kernel sources, GEMM
  table, kernel models and rooflines; measured profiles on top) and `cost/collective_pricer.py`
  (`CollectivePricer`: a collective, layout copy or stage send, through its `price_collective`:
  the cluster's curves, fitted constants and declared algorithms, engine tables, the link model);
- `cost/predictor.py`: a plan's program priced by those two, summed into a layer, the pipeline stages
  (boundary sends, the chunked-prefill bubble) and the memory per rank (weights, activations, KV
  cache, state);
- `cost/prediction.py`: the results (`PlanPrediction`) and their JSON; `cost/pricing.py`: the same
  prices one at a time for a search; `cost/bands.py`, `cost/provenance.py`: how sure a time is;
- `cost/segments.py`, `lower/stages.py`: batch shapes and the pipeline's stages;
- this module: the public API, `predict_plan`, `predict_audit`, `predict_many`, `batch_time`,
  `pipeline_ttft` (PP TTFT as the engine schedules it: `cost/pipeline.py`) and `plan_gemm_shapes`.

Formulas and assumptions: docs/cost-model.md ("Prediction"). Torch-free; cheap after the first call
(times are cached per distinct layer result and batch shape), because a search prices hundreds of
plans and the TTFT scheduler asks for every prefill batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from tpplan.audit import Audit, PlanAudit
from tpplan.cost.collective_pricer import CollectivePricer
from tpplan.cost.kernel_pricer import (
    ATTN_EFFICIENCY,
    EXPERT_M_TILE,
    KERNEL_FLOOR_S,
    RECURRENCE_EFFICIENCY,
    KernelPricer,
)
from tpplan.cost.kv_capacity import DEFAULT_KV_ENGINES, kv_capacity
from tpplan.cost.pipeline import DEFAULT_PP_ENGINE, PipelineModel, pipeline_model
from tpplan.cost.plan_steps import STATE_BYTES
from tpplan.cost.prediction import (
    LAYOUT_COPY_KERNEL,
    CollectiveTime,
    KindTime,
    MemoryBreakdown,
    OpTime,
    PlanPrediction,
)
from tpplan.cost.predictor import Predictor, cached_predictor
from tpplan.cost.provenance import composed_provenance, provenance
from tpplan.cost.segments import Segments, batch_pairs, cached_tokens, masked_pairs, segments_of
from tpplan.cost.topology import Topology
from tpplan.cost.workload import (
    PrefillBatch,
    TTFTResult,
    Workload,
    simulate_routed,
)
from tpplan.dtypes import WEIGHT_BITS
from tpplan.errors import TpplanError
from tpplan.layout.plan import Plan
from tpplan.lower.stages import bank_snapshots, stage_boundary_width, stage_layers
from tpplan.mesh import Mesh
from tpplan.models.graph import ModelGraph
from tpplan.models.opkinds import kernel_key


def plan_gemm_shapes(graph: ModelGraph, mesh: Mesh, topo: Topology, dtype: str = "bf16") -> list[tuple[int, int]]:
    """Per-rank (K, N) of every GEMM (and grouped expert GEMM) the model's legal named plans run at
    TP `mesh.tp` (one stage: the shapes do not depend on the other axes): the shapes a GEMM table for this
    model should have measured (`tpplan calibrate --gemm-model`)."""
    from tpplan.plans.named import ALL_PLANS, make_plan

    tp = mesh.tp
    shapes: set[tuple[int, int]] = set()
    for name in ALL_PLANS:
        try:
            plan = make_plan(name, graph, tp)
        except TpplanError:
            continue
        p = Predictor(graph, plan, topo.with_nodes(max(1, math.ceil(tp / topo.gpus_per_node))), Mesh(tp), dtype, None)
        if not p.audit.legal:
            continue
        for res in p.audit.layer_results:
            for o in p.kind_time(res, ((4096, 0),)).ops:
                if o.shape is None:
                    continue
                _, k, n = o.shape
                shapes.add((k, n))
                if o.category == "moe":  # the down projection after gate+up
                    shapes.add((n // 2, k))
    return sorted(shapes)


def batch_time(
    graph: ModelGraph,
    plan: Plan,
    topology: Topology,
    *,
    mesh: Mesh,
    n_tokens: int,
    context: int = 0,
    dtype: str = "bf16",
    expert_dtype: str | None = None,
    engine: str | None = None,
    pipeline: PipelineModel | None = None,
) -> float:
    """Seconds for one prefill batch of `n_tokens` new tokens after `context` cached ones, through
    the whole model; with PP, the sum of the stages and their sends (one chunk, no pipelining).
    `engine` ("sglang@0.5.14"): price kernels from that engine's measured database where it has them."""
    if n_tokens < 1:
        raise TpplanError("n_tokens", f"must be >= 1, got {n_tokens}", "pass a positive batch size")
    p = cached_predictor(graph, plan, topology, mesh, dtype, expert_dtype, engine=engine, pipeline=pipeline)
    return p.latency(((n_tokens, context),))


def pipeline_ttft(p: Predictor, workload: Workload) -> TTFTResult:
    """TTFT of `workload` on the predictor's stages as its engine (`p.pipeline`, `cost/pipeline.py`)
    schedules them (pp = 1: batches one after another). Each stage holds a batch for its compute, its
    TP collectives and its send into the next stage (the last one also for the reduction before the
    final norm). With replicas (`p.deployment.replicas`), the requests go to them as the deployment's request
    router sends them (`tpplan.engines.routing`: the router the launch lines start and the serving loop runs),
    and the result is over all of them."""
    from tpplan.engines.routing import replica_router

    router = replica_router(p.pipeline.engine, p.deployment.router) if p.deployment.replicas > 1 else None
    rule = router.rule if router is not None else None
    if p.pp == 1:
        return simulate_routed(workload, lambda b: (p.latency(segments_of(b)),), p.deployment, rule)
    m = p.pipeline

    def stages(batch: PrefillBatch) -> list[float]:
        stage_s, sends, _ = p.stage_times(segments_of(batch))
        return [s + x for s, x in zip(stage_s, sends, strict=True)]

    return simulate_routed(workload, stages, p.deployment, rule, in_flight=m.in_flight(p.deployment),
                           chunks_overlap=m.chunks_overlap)  # fmt: skip


def longest_request(workload: Workload | None) -> int | None:
    """Prompt + output tokens of the workload's longest request: the length a decode batch must hold KV for."""
    if workload is None:
        return None
    return max(workload.prompt_len(i) + workload.output_len for i in range(workload.concurrency))


def predict_plan(
    graph: ModelGraph,
    plan: Plan,
    topology: Topology,
    *,
    mesh: Mesh,
    workload: Workload | None = None,
    tokens: int = 8192,
    dtype: str = "bf16",
    expert_dtype: str | None = None,
    audit: PlanAudit | None = None,
    engine: str | None = None,
    pipeline: PipelineModel | None = None,
    kv_engines: tuple[str, ...] = DEFAULT_KV_ENGINES,
) -> PlanPrediction:
    """Time per layer kind, forward time for one batch of `tokens`, memory per rank and (with a
    workload) TTFT, for one plan on `mesh` (TP x CP x PP, its CP options: `tpplan.mesh.Mesh`) on `topology`
    (kernels from `engine`'s measured database where it has them, e.g. "sglang@0.5.14"); PP scheduled and
    its boundaries sent as `pipeline`'s engine does (default the current SGLang release: `cost/pipeline.py`).
    With `mesh.replicas` identical copies of the deployment, the workload's requests go to them as the
    deployment's request router sends them (`pipeline_ttft`); times and memory per rank are one replica's (its
    KV pool holding the most any replica holds at once, `Predictor.memory`), the TTFT over every request.
    `kv_engines`: the engine versions whose KV capacity per rank it states (`tpplan.cost.kv_capacity`), with
    the decode batch each admits at the workload's longest request."""
    if tokens < 1:
        raise TpplanError("tokens", f"must be >= 1, got {tokens}", "pass a positive batch size")
    p = cached_predictor(graph, plan, topology, mesh, dtype, expert_dtype, audit, engine=engine, pipeline=pipeline)
    segs: Segments = ((tokens, 0),)
    stage_s, sends, final = p.stage_times(segs)
    ttft = pipeline_ttft(p, workload) if workload is not None else None
    counts = graph.counts()
    kinds = []
    for kind, ks in p.audit.kinds.items():
        kt = p.kind_time(ks.result, segs)
        kinds.append(KindTime(kind, counts[kind], kt.ops, kt.collectives))
    pred = PlanPrediction(
        plan=p.audit.plan,
        tp=mesh.tp,
        pp=mesh.pp,
        legal=p.audit.legal and p.cp_audit.legal,
        tokens=tokens,
        context=0,
        kinds=kinds,
        stage_comm_s=sum(sends),
        forward_s=sum(stage_s) + sum(sends),
        memory=p.memory(workload, tokens, ttft.replicas if ttft is not None else ()),
        ttft=ttft,
        topology=topology.name,
        workload=workload.name if workload is not None else None,
        stage_s=[s + x for s, x in zip(stage_s, sends, strict=True)],
        final_comm_s=final,
        gpu_memory_bytes=topology.gpu.memory_GiB * 2**30,
        provenance=provenance(topology, p.deployment.gpus),
        cp=mesh.cp,
        replicas=mesh.replicas,
        kv_capacity=tuple(kv_capacity(p, e, longest_request(workload)) for e in kv_engines),
    )
    # The band of what this prediction sums (each op class and collective's out-of-sample error by its
    # share of the time), the same figure the memo uses: audit, search and report state one band.
    return replace(pred, provenance=composed_provenance(pred.provenance, pred))  # type: ignore[arg-type]


def predict_audit(
    a: Audit,
    topology: Topology,
    *,
    mesh: Mesh | None = None,
    workload: Workload | None = None,
    tokens: int | None = None,
    expert_dtype: str | None = None,
    engine: str | None = None,
    pipeline: PipelineModel | None = None,
    kv_engines: tuple[str, ...] = DEFAULT_KV_ENGINES,
) -> list[PlanPrediction]:
    """Predict every plan of an audit on `mesh` (default: TP alone), reusing its propagation; `tokens`
    defaults to the workload's chunk size (8192 without a workload). The mesh's TP is the audit's."""
    mesh = mesh or Mesh(a.n)
    if mesh.tp != a.n:
        raise TpplanError(f"tp={mesh.tp}", f"the audit was run at TP {a.n}", f"audit at tp={mesh.tp}, or pass tp={a.n}")
    t = tokens or (workload.chunk_size if workload is not None else 8192)
    return [
        predict_plan(
            a.graph,
            pa.plan,
            topology,
            mesh=mesh,
            workload=workload,
            tokens=t,
            dtype=a.dtype,
            expert_dtype=expert_dtype,
            audit=pa,
            engine=engine,
            pipeline=pipeline,
            kv_engines=kv_engines,
        )
        for pa in a.plans
    ]


def predict_many(graph: ModelGraph, plans: Sequence[Plan], topology: Topology, **options: Any) -> list[PlanPrediction]:
    """`predict_plan(graph, plan, topology, **options)` for each of `plans` (they share nothing but
    the GEMM table cache)."""
    return [predict_plan(graph, pl, topology, **options) for pl in plans]


__all__ = [
    "ATTN_EFFICIENCY",
    "DEFAULT_PP_ENGINE",
    "EXPERT_M_TILE",
    "KERNEL_FLOOR_S",
    "LAYOUT_COPY_KERNEL",
    "RECURRENCE_EFFICIENCY",
    "STATE_BYTES",
    "WEIGHT_BITS",
    "CollectivePricer",
    "CollectiveTime",
    "KernelPricer",
    "KindTime",
    "MemoryBreakdown",
    "OpTime",
    "PipelineModel",
    "PlanPrediction",
    "Predictor",
    "Segments",
    "bank_snapshots",
    "batch_pairs",
    "batch_time",
    "cached_predictor",
    "cached_tokens",
    "kernel_key",
    "longest_request",
    "masked_pairs",
    "pipeline_model",
    "pipeline_ttft",
    "plan_gemm_shapes",
    "predict_audit",
    "predict_many",
    "predict_plan",
    "segments_of",
    "stage_boundary_width",
    "stage_layers",
]
