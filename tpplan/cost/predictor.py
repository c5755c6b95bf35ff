"""The predictor: one plan's lowered program (`tpplan.lower`) priced into layers, pipeline stages and memory.

One `Predictor` per (graph, plan, topology, mesh, dtype), caching per batch shape (times are
cached per distinct layer result and batch shape, because a search prices hundreds of plans and
the TTFT scheduler asks for every prefill batch):

- `kind_time`: one layer's lowered steps priced (compute and communication are not overlapped);
- pipeline parallelism: the program's stages and their send/recv steps (what really crosses: the
  hidden stream and, for K3, the attention-residual bank), priced as the engine sends them
  (`cost/pipeline.py`); `latency` of a batch and its `stage_times`;
- `memory` per rank: weights under the plan, activations of one chunk, KV cache, recurrent state.

Formulas and assumptions: docs/cost-model.md ("Prediction").
"""

from __future__ import annotations

import math
from dataclasses import replace

from tpplan.audit import PlanAudit, stage_weights
from tpplan.cost.comm import price_collective
from tpplan.cost.context_parallel import cp_weight_elements
from tpplan.cost.op_prices import OpPrices
from tpplan.cost.pipeline import PipelineModel, pipeline_model
from tpplan.cost.prediction import KindTime, MemoryBreakdown, OpTime
from tpplan.cost.segments import Segments, batch_pairs, cached_tokens
from tpplan.cost.topology import Topology
from tpplan.cost.workload import Workload, replica_workloads
from tpplan.engines.context_parallel import kv_cp_share
from tpplan.layout.plan import Plan
from tpplan.layout.propagate import LayerResult
from tpplan.lower import (
    Batch,
    KernelCall,
    LayerProgram,
    Lowering,
    Program,
    SendRecv,
    lower_layer,
    lower_outline,
    lowering,
)
from tpplan.lower.registry import generation
from tpplan.lower.shapes import experts_shape
from tpplan.lower.stages import bank_snapshots
from tpplan.mesh import Mesh
from tpplan.models.graph import LayerGraph, ModelGraph, OpKind
from tpplan.models.opkinds import mixer
from tpplan.models.spec import AttnSpec
from tpplan.placement import S_COL, S_TOK, Placement, R

STATE_BYTES = 4  # KDA/GDN recurrent state is kept in fp32 (conv state in the activation dtype)


class Predictor(OpPrices):
    """A plan's time per layer, per stage and per batch, and its memory per rank (`OpPrices` for
    the arguments)."""

    def __init__(self, *args: object, pipeline: PipelineModel | None = None, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.pipeline = pipeline or pipeline_model()  # the engine whose PP schedule and boundary send apply
        self.serving_engine = self.engine or self.pipeline.engine  # and whose kernels the serving set prices
        self._kind_cache: dict[tuple[int, Segments], KindTime] = {}
        self._stage_cache: dict[Segments, tuple[list[float], list[float], float]] = {}
        self._lowerings: dict[Segments, Lowering] = {}
        self._outlines: dict[Segments, Program] = {}
        self._layer_of: dict[int, int] = {}  # id(layer result) -> its first layer

    def lowering(self, segs: Segments) -> Lowering:
        """The lowering context of one batch (`tpplan.lower`): this plan, mesh and audit, the batch in the
        prediction's dtype on the topology's nodes."""
        hit = self._lowerings.get(segs)
        if hit is None:
            hit = lowering(self.graph, self.plan, self.deployment, Batch(segs, self.dtype),
                           results=self.audit.layer_results, gpus_per_node=self.topo.gpus_per_node,
                           cp_audit=self.cp_audit)  # fmt: skip
            self._lowerings[segs] = hit
        return hit

    def lowered(self, res: LayerResult, segs: Segments) -> tuple[LayerProgram, Lowering]:
        """The lowered steps of a layer whose propagation is `res`, for one batch, and their context."""
        ctx = self.lowering(segs)
        if not self._layer_of:
            for i, r in enumerate(self.audit.layer_results):
                self._layer_of.setdefault(id(r), i)
        index = self._layer_of.get(id(res))
        if index is None:  # a result outside the audit's layers: lowered on its own
            ctx, index = replace(ctx, results=(res,)), 0
        return lower_layer(ctx, index), ctx

    def kind_time(self, res: LayerResult, segs: Segments) -> KindTime:
        """One layer's lowered steps priced for one batch: its kernels (at the CP rank's share of the
        batch), the layout copies, extra passes of kernels (CP), and its collectives. Compute and
        communication are not overlapped here (`layers_seconds` applies the plan's overlap)."""
        key = (id(res), segs)
        hit = self._kind_cache.get(key)
        if hit is not None:
            return hit
        layer, ctx = self.lowered(res, segs)
        local = ctx.local_segments  # CP: the slowest rank's share
        t, pairs, cached = batch_pairs(local)
        lg = self.graph.kinds[res.kind]
        kernels = layer.kernels()
        ops = [self.op_time(lg, k, t, pairs, cached, local) for k in kernels if k.repeat_of is None]
        ops += [self.copy_step(res.kind, c) for c in layer.copies()]
        ops += [repeated(k, ops) for k in kernels if k.repeat_of is not None]
        colls = [self.collective_step(res.kind, c) for c in layer.collectives() if c.priced]
        kt = KindTime(res.kind, self.counts[res.kind], ops, colls)
        self._kind_cache[key] = kt
        return kt

    def layers_seconds(self, results: list[LayerResult], segs: Segments) -> float:
        """Consecutive layers of one batch: their sum, or as the plan's overlap (micro-batch, async TP) runs them."""
        if self.plan.overlap is None:
            return sum(self.kind_time(r, segs).total_s for r in results)
        if self.plan.overlap == "asynctp":  # GEMM + collective fusion (cost/async_tp.py)
            from tpplan.cost.async_tp import fused_layers_seconds

            return fused_layers_seconds(self, self.kind_time, results, segs)
        from tpplan.cost.overlap import OverlapCosts, overlapped_seconds
        from tpplan.engines.overlap import overlap_named

        engine = overlap_named(self.plan.overlap)
        costs = OverlapCosts(self.topo.gpu.sm_count, engine.comm_sms)
        micro = self.outline(segs).stages[0].micro_batches
        halves = (micro[0].segments, micro[1].segments) if len(micro) == 2 else None
        return overlapped_seconds(self.kind_time, results, segs, halves, engine, costs)

    def outline(self, segs: Segments) -> Program:
        """The lowered program's stages, sends and final reduction for one batch (`lower_outline`)."""
        hit = self._outlines.get(segs)
        if hit is None:
            hit = self._outlines[segs] = lower_outline(self.lowering(segs))
        return hit

    def send_seconds(self, send: SendRecv) -> float:
        """A stage boundary: each TP rank sends its 1/N slice to its peer and the receivers all-gather it
        over TP, as both engines do (SGLang's send_tensor_dict and vLLM's isend_tensor_dict with
        all_gather_group; `self.pipeline.boundary_gathers`). A schedule that does not gather skips the
        all-gather when the plan keeps the stream token-sharded (`SendRecv.gather_optional`)."""
        rpn = 1 if send.cross_node else 2
        secs = price_collective("send_recv", send.bytes, 2, self.topo, ranks_per_node=rpn).time_s
        if send.gather is not None and (self.pipeline.boundary_gathers or not send.gather_optional):
            secs += self.collective_step("boundary", send.gather).seconds
        return secs

    def final_seconds(self, segs: Segments) -> float:
        """The reduction of the last layer's partial sum before the final norm, for one batch (0 without one)."""
        return sum((self.collective_step("final", c).seconds for c in self.outline(segs).stages[-1].final), 0.0)

    def stage_times(self, segs: Segments) -> tuple[list[float], list[float], float]:
        """Per stage of the lowered program: compute+TP-comm seconds for one batch, the send into the next
        stage, and the final reduction (in the last stage's seconds, and on its own)."""
        hit = self._stage_cache.get(segs)
        if hit is not None:
            return hit
        results = self.audit.layer_results
        stages = self.outline(segs).stages
        stage_s = [self.layers_seconds([results[layer.index] for layer in s.layers], segs) for s in stages]
        sends = [self.send_seconds(s.send) if s.send is not None else 0.0 for s in stages]
        final = self.final_seconds(segs)
        stage_s[-1] += final
        out = (stage_s, sends, final)
        self._stage_cache[segs] = out
        return out

    def latency(self, segs: Segments) -> float:
        """One batch through every stage (no pipelining): what batch_time returns."""
        stage_s, sends, _ = self.stage_times(segs)
        return sum(stage_s) + sum(sends)

    # -- memory ----------------------------------------------------------------------------------
    def memory(self, workload: Workload | None, tokens: int) -> MemoryBreakdown:
        """Per rank, for the stage that needs the most; with replicas, of the replica whose share of
        the workload needs the most (every replica holds the same weights)."""
        r = self.deployment.replicas
        if workload is None or r == 1:
            return self._memory(workload, tokens)
        return max(
            (self._memory(w, tokens) for w in replica_workloads(workload, self.deployment)), key=lambda m: m.total
        )

    def _memory(self, workload: Workload | None, tokens: int) -> MemoryBreakdown:
        spec = self.graph.spec
        if workload is not None:
            seqs = [workload.prompt_len(i) + workload.output_len for i in range(workload.concurrency)]
            chunk = min(workload.chunk_size, max(seqs))
        else:
            seqs, chunk = [tokens], tokens
        best: MemoryBreakdown | None = None
        held = stage_weights(self.audit, self.graph, self.stages, self.stored)  # the one weight figure
        for s, rng in enumerate(self.stages):
            kv = state = 0.0
            for j in rng:
                kv += self.kv_per_token(spec.layers[j].attn) * cached_tokens(spec.layers[j].attn, seqs)
                state += self.state_per_seq(spec.layers[j].attn) * len(seqs)
            weights, extra = held[s].weights, held[s].replicated_extra
            wide = self._attention_tp_weights(rng)  # `--cp-layers mla`: MLA attention weights at TP tp/cp
            weights, extra = weights + wide, extra + wide
            acts = self._activations(rng, math.ceil(chunk / self.cp))
            m = MemoryBreakdown(weights, extra, acts, kv, state)
            if best is None or m.total > best.total:
                best = m
        assert best is not None
        return best

    def _attention_tp_weights(self, rng: range) -> float:
        """Weight bytes a rank holds beyond the plan's TP share under `--cp-layers mla` (the MLA layers'
        attention at attention TP tp/cp, `cost.context_parallel.cp_weight_elements`); 0 otherwise."""
        cpa = self.cp_audit
        if cpa.layers != "mla" or cpa.cp <= 1:
            return 0.0
        total = 0.0
        for j in rng:
            res = self.audit.layer_results[j]
            ck = cpa.kinds[res.kind]
            for d in res.decisions:
                if d.op.name in ck.attention_ops:
                    more = cp_weight_elements(cpa, res.kind, d) - d.weight_elements_per_rank
                    total += more * self.weight_elem_bytes(res.kind, d.op)
        return total

    def kv_per_token(self, attn: AttnSpec) -> float:
        """KV cache bytes per token of one layer on one rank, as its token mixer states it
        (`Mixer.kv_bytes`: MLA caches the latent whole on every rank, GQA this rank's KV heads).
        DP attention: a rank caches its own requests' tokens with every head, 1/N of the batch's
        tokens when the requests are spread evenly (docs/design.md, "DP attention"). CP: by default every CP
        rank keeps the whole sequence's KV, as SGLang and vLLM do; with `cp_kv="sharded"` (`--cp-kv sharded`)
        its own tokens', 1/cp (`tpplan.engines.context_parallel.kv_cp_share`)."""
        cp = kv_cp_share(self.deployment)
        if self.plan.dp_attention:
            return mixer(attn.kind).kv_bytes(attn, 1, self.b) / self.tp / cp
        return mixer(attn.kind).kv_bytes(attn, self.tp, self.b) / cp

    def state_per_seq(self, attn: AttnSpec) -> float:
        """Recurrent state bytes per sequence of one layer on one rank (heads split over TP), as its
        token mixer states it (`Mixer.state_bytes`: delta-rule state in fp32 plus short-conv tails)."""
        if self.plan.dp_attention:  # every head of its own sequences: 1/N of them, spread evenly
            return mixer(attn.kind).state_bytes(attn, 1, self.b, STATE_BYTES) / self.tp
        return mixer(attn.kind).state_bytes(attn, self.tp, self.b, STATE_BYTES)

    def _activations(self, rng: range, t: int) -> float:
        """Peak activation bytes of one chunk: the stream tensors that live across layers (resid,
        delta and the AttnRes bank) plus the largest live set of one op (its inputs and output)."""
        n, b, h = self.tp, self.b, self.graph.hidden
        rows_stream = t if self.plan.stream is R else math.ceil(t / n)
        rows_bank = t if self.plan.bank_placement is R else math.ceil(t / n)
        bank = bank_snapshots(self.graph, rng.stop)  # the most the bank holds inside this stage
        stream = (2 * rows_stream + bank * rows_bank) * h * b
        peak = 0.0
        seen: set[int] = set()
        for j in rng:
            res = self.audit.layer_results[j]
            if id(res) in seen:
                continue
            seen.add(id(res))
            lg = self.graph.kinds[res.kind]
            for d in res.decisions:
                live = sum(self._value_bytes(lg, res.placements.get(v, R), v, t) for v in d.op.inputs if v in lg.values)
                live += self._value_bytes(lg, res.placements.get(d.op.output, R), d.op.output, t)
                if d.op.kind is OpKind.EXPERTS:
                    m, _, n2 = experts_shape(d, t, self.tp, self.plan)
                    live += m * (d.op.int_attr("width") + n2 + n2 // 2) * b  # gathered rows + intermediates
                peak = max(peak, live)
        return stream + peak

    def _value_bytes(self, lg: LayerGraph, p: Placement, v: str, t: int) -> float:
        w = lg.values[v].width
        if p is S_TOK:
            return math.ceil(t / self.tp) * w * self.b
        if p is S_COL:
            return t * w / self.tp * self.b
        return t * w * self.b


def repeated(call: KernelCall, ops: list[OpTime]) -> OpTime:
    """Extra passes of an op already priced (`KernelCall.repeat_of`, CP's scan correction, serial chain
    wait or K/V expansion): its price `call.times` over, under the step's own name."""
    rec = next(o for o in ops if o.op == call.repeat_of)
    f = call.times
    flops, nbytes, secs = rec.flops_per_rank * f, rec.bytes_per_rank * f, rec.seconds * f
    return OpTime(rec.layer_kind, call.op, rec.role, rec.category, flops, nbytes, secs, call.redundant, None, None,
                  secs, rec.extrapolated, rec.source)  # fmt: skip


_CACHE: dict[tuple[object, ...], tuple[Predictor, tuple[object, ...]]] = {}
_CACHE_MAX = 512


def cached_predictor(
    graph: ModelGraph,
    plan: Plan,
    topo: Topology,
    mesh: Mesh,
    dtype: str,
    expert_dtype: str | None,
    audit: PlanAudit | None = None,
    *,
    engine: str | None = None,
    pipeline: PipelineModel | None = None,
) -> Predictor:
    """`Predictor(...)`, cached per (graph, plan, topology, mesh, dtype, engine, PP schedule, and the set of
    lowering passes, `lower.registry.generation`): the scheduler calls batch_time per batch. (A recorded
    run's implementations, `bench --repredict`, build their own.)"""
    pipeline = pipeline or pipeline_model()
    key = (id(graph), id(topo), plan, mesh, dtype, expert_dtype, engine, pipeline, generation())
    hit = _CACHE.get(key)
    if hit is not None and hit[1][0] is graph and hit[1][1] is topo:
        return hit[0]
    p = Predictor(graph, plan, topo, mesh, dtype, expert_dtype, audit, engine=engine, pipeline=pipeline)
    if len(_CACHE) >= _CACHE_MAX:
        _CACHE.pop(next(iter(_CACHE)))
    _CACHE[key] = (p, (graph, topo))  # keep the objects alive so their ids stay theirs
    return p


__all__ = ["STATE_BYTES", "Predictor", "cached_predictor"]
