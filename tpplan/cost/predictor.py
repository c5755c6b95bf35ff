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
from collections.abc import Sequence
from dataclasses import replace

from tpplan.audit import PlanAudit, stage_weights
from tpplan.cost.context_parallel import cp_weight_elements
from tpplan.cost.pipeline import PipelineModel, serving_pipeline
from tpplan.cost.plan_steps import PlanSteps, predictor_key
from tpplan.cost.prediction import KindTime, MemoryBreakdown, OpTime
from tpplan.cost.segments import Segments, batch_pairs, cached_tokens
from tpplan.cost.topology import Topology
from tpplan.cost.workload import ReplicaShare, Workload, replica_workloads
from tpplan.layout.dp_attention import planned_transition
from tpplan.layout.plan import Plan
from tpplan.layout.propagate import CommEvent, LayerResult
from tpplan.lower import (
    KernelCall,
    LayerProgram,
    Lowering,
    Program,
    SendRecv,
    lower_layer,
    lower_outline,
)
from tpplan.lower.passes.tp_sp import layout_copy_step
from tpplan.lower.shapes import rank_shape
from tpplan.lower.stages import bank_snapshots
from tpplan.mesh import Mesh
from tpplan.models.graph import LayerGraph, ModelGraph
from tpplan.models.opkinds import op_kind
from tpplan.placement import S_COL, S_TOK, Placement, R


class Predictor(PlanSteps):
    """A plan's time per layer, per stage and per batch, and its memory per rank: its lowered program's
    kernel steps priced by a compute pricer (`kernels`), its collectives, layout copies and stage sends
    by a collective pricer (`comms`), all of one `PlanSteps` (its arguments), summed here."""

    def __init__(
        self,
        graph: ModelGraph,
        plan: Plan,
        topo: Topology,
        mesh: Mesh,
        dtype: str,
        expert_dtype: str | None,
        audit: PlanAudit | None = None,
        impls: dict[str, str] | None = None,
        *,
        engine: str | None = None,
        pipeline: PipelineModel | None = None,
    ) -> None:
        super().__init__(graph, plan, topo, mesh, dtype, expert_dtype, audit, impls, engine=engine, pipeline=pipeline)
        self.counts = graph.counts()
        self._kind_cache: dict[tuple[int, Segments], KindTime] = {}
        self._stage_cache: dict[Segments, tuple[list[float], list[float], float]] = {}
        self._outlines: dict[Segments, Program] = {}
        # Distinct layer propagations by value, each with the first of the audit's layers that has it
        # (None: a result outside them). A layer's program depends only on its propagation, so its
        # position here is the cache key of its price.
        self._distinct: list[tuple[LayerResult, int | None]] = []
        for i, r in enumerate(self.audit.layer_results):
            self._key_of(r, i)

    def _key_of(self, res: LayerResult, index: int | None = None) -> int:
        """The position of `res`'s value among the distinct propagations (added, first at `index`, if new)."""
        for k, (r, _) in enumerate(self._distinct):  # the same object first: no field compared
            if r is res:
                return k
        for k, (r, _) in enumerate(self._distinct):
            if r.kind == res.kind and r == res:
                return k
        self._distinct.append((res, index))
        return len(self._distinct) - 1

    def lowered(self, res: LayerResult, segs: Segments) -> tuple[LayerProgram, Lowering]:
        """The lowered steps of a layer whose propagation is `res`, for one batch, and their context."""
        ctx = self.lowering(segs)
        index = self._distinct[self._key_of(res)][1]
        if index is None:  # a result outside the audit's layers: lowered on its own
            ctx, index = replace(ctx, results=(res,)), 0
        return lower_layer(ctx, index), ctx

    def kind_time(self, res: LayerResult, segs: Segments) -> KindTime:
        """One layer's lowered steps priced for one batch: its kernels (at the CP rank's share of the
        batch), the layout copies, extra passes of kernels (CP), and its collectives (a one-token decode
        step's EP all-to-all as SGLang's DeepEP low-latency kernels send it: `cost.ep_low_latency`). Compute
        and communication are not overlapped here (`layers_seconds` applies the plan's overlap)."""
        key = (self._key_of(res), segs)
        hit = self._kind_cache.get(key)
        if hit is not None:
            return hit
        layer, ctx = self.lowered(res, segs)
        local = ctx.local_segments  # CP: the slowest rank's share
        t, pairs, cached = batch_pairs(local)
        lg = self.graph.kinds[res.kind]
        kernels = layer.kernels()
        ops = [self.kernels.price(lg, k, t, pairs, cached, local) for k in kernels if k.repeat_of is None]
        ops += [self.comms.copy(res.kind, c) for c in layer.copies()]
        ops += [repeated(k, ops) for k in kernels if k.repeat_of is not None]
        colls = self.collective_times(res.kind, layer.collectives(), ctx)
        kt = KindTime(res.kind, self.counts[res.kind], ops, colls)
        self._kind_cache[key] = kt
        return kt

    def layers_seconds(self, layers: Sequence[int], segs: Segments) -> float:
        """Consecutive layers (the audit's indices) of one batch: their sum, or as the plan's overlap
        (micro-batch, async TP: the program's fused pairs) runs them."""
        every = self.audit.layer_results
        results = [every[i] for i in layers]
        if self.plan.overlap is None:
            return sum(self.kind_time(r, segs).total_s for r in results)
        if self.plan.overlap == "asynctp":  # GEMM + collective fusion (cost/async_tp.py)
            from tpplan.cost.async_tp import fused_layers_seconds

            pairs = self.outline(segs).fused
            return fused_layers_seconds(self.kernels, self.plan.name, self.kind_time, every, layers, pairs, segs)
        from tpplan.cost.overlap import OverlapCosts, overlapped_seconds
        from tpplan.engines import overlap_named

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
        """A stage boundary as the engine's PP schedule sends it (`CollectivePricer.send`)."""
        return self.comms.send(send)

    def layout_copy(self, lg: LayerGraph, c: CommEvent, t: int) -> OpTime | None:
        """The runtime's layout copy around collective `c` for `t` tokens, if its transition needs one
        (the lowering's `layout_copy_step`), priced by the collective pricer."""
        if c.internal:
            return None
        move = planned_transition(self.plan, c.collective, c.src, c.dst)  # DP SUM_LEN: its all-reduce moves
        step = layout_copy_step(lg, c, move, self.tp, t)
        return None if step is None else self.comms.copy(lg.kind, step)

    def final_seconds(self, segs: Segments) -> float:
        """The reduction of the last layer's partial sum before the final norm, for one batch (0 without one)."""
        return sum((self.comms.collective("final", c).seconds for c in self.outline(segs).stages[-1].final), 0.0)

    def stage_times(self, segs: Segments) -> tuple[list[float], list[float], float]:
        """Per stage of the lowered program: compute+TP-comm seconds for one batch, the send into the next
        stage, and the final reduction (in the last stage's seconds, and on its own)."""
        hit = self._stage_cache.get(segs)
        if hit is not None:
            return hit
        stages = self.outline(segs).stages
        stage_s = [self.layers_seconds([layer.index for layer in s.layers], segs) for s in stages]
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
    def memory(self, workload: Workload | None, tokens: int, routed: Sequence[ReplicaShare] = ()) -> MemoryBreakdown:
        """Per rank, for the stage that needs the most. A workload's KV: its clients' requests (prompt and
        output each); with replicas, of the replica that needs the most (every replica holds the same
        weights), among each one's dealt share of the clients (`replica_workloads`) and the requests the routed
        run (`routed`, `cost.workload.simulate_routed`'s shares) held at once at each replica's fullest: a
        router may send one replica more requests than its share of the clients."""
        if workload is None:
            return self._memory([tokens], tokens)
        chunk = workload.chunk_size
        if self.deployment.replicas == 1:
            return self._memory(_clients(workload), chunk)
        held = [_clients(w) for w in replica_workloads(workload, self.deployment)]
        held += [list(share.peak_held) for share in routed if share.peak_held]
        return max((self._memory(seqs, chunk) for seqs in held), key=lambda m: m.total)

    def _memory(self, seqs: list[int], chunk: int) -> MemoryBreakdown:
        """Per rank, for the stage that needs the most: KV and state of requests of `seqs` tokens, activations
        of a chunk of at most `chunk` tokens (the longest request's)."""
        spec = self.graph.spec
        chunk = min(chunk, max(seqs))
        best: MemoryBreakdown | None = None
        held = stage_weights(self.audit, self.graph, self.stages, self.kernels.stored)  # the one weight figure
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
                    total += more * self.kernels.weight_elem_bytes(res.kind, d.op)
        return total

    def _activations(self, rng: range, t: int) -> float:
        """Peak activation bytes of one chunk: the stream tensors that live across layers (resid,
        delta and the AttnRes bank) plus the largest live set of one op (its inputs and output)."""
        n, b, h = self.tp, self.b, self.graph.hidden
        rows_stream = t if self.plan.stream is R else math.ceil(t / n)
        rows_bank = t if self.plan.bank_placement is R else math.ceil(t / n)
        bank = bank_snapshots(self.graph, rng.stop)  # the most the bank holds inside this stage
        stream = (2 * rows_stream + bank * rows_bank) * h * b
        peak = 0.0
        for res in {self._key_of(r): r for r in self.audit.layer_results[rng.start : rng.stop]}.values():
            lg = self.graph.kinds[res.kind]
            for d in res.decisions:
                live = sum(self._value_bytes(lg, res.placements.get(v, R), v, t) for v in d.op.inputs if v in lg.values)
                live += self._value_bytes(lg, res.placements.get(d.op.output, R), d.op.output, t)
                if op_kind(d.op.kind).routed_experts:
                    shape = rank_shape(d, t, self.tp, self.plan)
                    assert shape is not None  # routed experts state their first grouped GEMM
                    m, _, n2 = shape
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


def _clients(workload: Workload) -> list[int]:
    """Prompt + output tokens of the requests the workload's clients send first (one each)."""
    return [workload.prompt_len(i) + workload.output_len for i in range(workload.concurrency)]


def repeated(call: KernelCall, ops: list[OpTime]) -> OpTime:
    """Extra passes of an op already priced (`KernelCall.repeat_of`, CP's scan correction, serial chain
    wait or K/V expansion): its price `call.times` over, under the step's own name."""
    rec = next(o for o in ops if o.op == call.repeat_of)
    f = call.times
    flops, nbytes, secs = rec.flops_per_rank * f, rec.bytes_per_rank * f, rec.seconds * f
    return OpTime(rec.layer_kind, call.op, rec.role, rec.category, flops, nbytes, secs, call.redundant, None, None,
                  secs, rec.extrapolated, rec.source, band=rec.band)  # fmt: skip


_CACHE: dict[tuple[object, ...], Predictor] = {}
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
    """`Predictor(...)`, cached per `predictor_key`, all compared by value: the scheduler calls batch_time
    per batch. (A recorded run's implementations, `bench --repredict`, build their own.)"""
    pipeline = pipeline or serving_pipeline(engine or topo.gpu.kernel_engine)
    key = predictor_key(graph, plan, topo, mesh, dtype, expert_dtype, engine, pipeline)
    hit = _CACHE.get(key)
    if hit is not None and hit.built_on(graph, topo):
        return hit
    p = Predictor(graph, plan, topo, mesh, dtype, expert_dtype, audit, engine=engine, pipeline=pipeline)
    if len(_CACHE) >= _CACHE_MAX and key not in _CACHE:
        _CACHE.pop(next(iter(_CACHE)))
    _CACHE[key] = p
    return p


__all__ = ["Predictor", "cached_predictor"]
