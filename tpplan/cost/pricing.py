"""The cost model's prices one at a time: what a search needs to price plans it has not built yet.

`predict_plan` prices a whole plan. A search prices decisions (one op run one way, one collective)
before any whole plan exists, and sums them; for its sum to equal `predict_plan`'s, it must use the
same prices. `Pricer` hands them out: it lowers each decision as a fragment of a layer (the layer kind
with just that op decision, or just that planned move) through the same registered lowering passes
`predict_plan` lowers whole layers with (`tpplan.lower.lower_layer`), and prices the fragment's steps
with the predictor's own step pricers (`cost.kernel_pricer`, `cost.collective_pricer`), both through the
baseline's `cost.plan_steps.PlanSteps` (the half of a `Predictor` that lowers and prices, without its
sums), so the two cannot drift apart; a pass added later is picked up by both:

- `op_time`: one op decision, for one batch (its MoE mode comes from the decision, its EP size from
  the mesh asked for);
- `weight_bytes`: the weight one rank holds for it (routed experts at their weight dtype);
- `collective_time` and `layout_copy_time`: one collective, and the runtime's copy around it;
- `final_reduce_time`: the reduction before the final norm; `stage_sends_time`: PP's boundaries;
- `kv_bytes_per_token`, `state_bytes_per_seq`, `embedding_bytes`: the state and weights outside
  the plan's decisions;
- `cp_exchange_time`: with context parallelism, one layer's CP collectives (they depend on the
  graph and TP, not on the plan's decisions); every other price is then the slowest CP rank's, on
  its share of the batch (the lowering's `local_segments`), and a recurrence's own price
  includes the state hand-off's extra pass (scan correction or serial chain), as `predict_plan`
  lists them beside it.

Batches are `Segments`: (new tokens, context) per request, as `tpplan.cost.segments` states them.
"""

from __future__ import annotations

from dataclasses import replace

from tpplan.audit import PlanAudit
from tpplan.cost.context_parallel import cp_weight_elements
from tpplan.cost.plan_steps import PlanSteps
from tpplan.cost.prediction import CollectiveTime, OpTime
from tpplan.cost.segments import Segments, batch_pairs
from tpplan.cost.topology import Topology
from tpplan.layout.plan import Plan
from tpplan.layout.propagate import CommEvent, LayerResult, OpDecision
from tpplan.layout.transitions import TRANSITIONS
from tpplan.lower import LayerProgram, Lowering, lower_layer, lower_outline
from tpplan.lower.passes.cp import exchange_call
from tpplan.lower.passes.tp_sp import final_reduction
from tpplan.mesh import Mesh
from tpplan.models.graph import LayerGraph, ModelGraph
from tpplan.placement import P, Placement
from tpplan.plans.named import baseline


class Pricer:
    """Per-op, per-collective and per-state prices on `mesh` (TP x CP x PP, replicas) on `topology`: each
    decision lowered as a fragment of a layer through the registered lowering passes (`tpplan.lower`), its
    steps priced by the predictor's own step pricers (`kernels`, `comms`)."""

    def __init__(
        self,
        graph: ModelGraph,
        topology: Topology,
        mesh: Mesh,
        *,
        dtype: str = "bf16",
        expert_dtype: str | None = None,
        engine: str | None = None,
        audit: PlanAudit | None = None,
    ) -> None:
        """`audit`: the baseline's at TP `mesh.tp`, when the caller has it (audited here otherwise). With
        `mesh.replicas` > 1, prices are one replica's; the search's walk screens with the workload dealt
        between them (`tpplan.cost.workload.replica_workloads`, `search.setup.Screen`)."""
        self.graph, self.topology, self.tp, self.pp, self.cp = graph, topology, mesh.tp, mesh.pp, mesh.cp
        self.dtype, self.expert_dtype, self.engine = dtype, expert_dtype, engine
        self.deployment = mesh
        self._base = PlanSteps(graph, baseline(), topology, mesh, dtype, expert_dtype, audit, engine=engine)
        self.cp_audit = self._base.cp_audit
        self.kernels, self.comms = self._base.kernels, self._base.comms

    @property
    def baseline_audit(self) -> PlanAudit:
        """The baseline's audit (validates that the model splits over `tp` ranks at all)."""
        return self._base.audit

    def fragment(self, result: LayerResult, segs: Segments, plan: Plan | None = None) -> tuple[LayerProgram, Lowering]:
        """A fragment of a layer (`result`: some of its decisions and planned moves) lowered for one batch by
        every registered pass, as `predict_plan` lowers whole layers, under `plan` (default the baseline:
        the fragment's own decisions and moves say how it runs), and its lowering context."""
        ctx = self._base.lowering(segs)
        ctx = replace(ctx, results=(result,), plan=plan if plan is not None else ctx.plan)
        return lower_layer(ctx, 0), ctx

    def op_time(
        self, lg: LayerGraph, d: OpDecision, segs: Segments, mesh: Mesh | None = None, redundant_experts: int = 0
    ) -> OpTime:
        """One op of one layer as decided (`d.split` is the MoE mode for routed experts), for one batch of
        `segs`: its kernel step and the extra passes the CP pass adds of it (a recurrence's scan correction
        or serial wait, `--cp-layers mla`'s K/V expansion), priced as `predict_plan` prices them. `mesh`:
        the deployment with the EP size (`Mesh.ep`) routed experts split EP run at (default the pricer's);
        `redundant_experts`: the copies beside them under EP or all-to-all (`Plan.redundant_experts`)."""
        ep = (mesh or self.deployment).ep
        plan = self._base.plan.with_(moe="ep", ep_size=ep) if d.split == "ep" else None
        if redundant_experts and d.split in ("ep", "a2a"):
            plan = (plan or self._base.plan).with_(redundant_experts=redundant_experts)
        layer, ctx = self.fragment(LayerResult(lg.kind, self.tp, decisions=[d]), segs, plan)
        local = ctx.local_segments
        t, pairs, cached = batch_pairs(local)  # segs: a windowed/chunked mask's pairs
        calls = layer.kernels()
        ot = self.kernels.price(lg, next(k for k in calls if k.repeat_of is None), t, pairs, cached, local)
        factor = sum(k.times for k in calls if k.repeat_of == d.op.name)
        return replace(ot, seconds=ot.seconds * (1 + factor)) if factor else ot

    def cp_exchange_time(self, kind: str, segs: Segments) -> float:
        """One layer of `kind`'s CP collectives for one batch (0 without CP): the lowering's CP exchange
        steps (`tpplan.lower.passes.cp`), priced as `predict_plan` prices them."""
        if self.cp <= 1:
            return 0.0
        ctx = self._base.lowering(segs)
        steps = [exchange_call(ctx, x) for x in self.cp_audit.kinds[kind].exchanges]
        return sum(self.comms.collective(kind, c).seconds for c in steps)

    def weight_bytes(self, lg: LayerGraph, d: OpDecision) -> float:
        """Weight bytes one rank holds for this op decision, in the format the checkpoint stores it
        (quantization_config; routed experts at the expert dtype)."""
        elements = cp_weight_elements(self.cp_audit, lg.kind, d)  # `--cp-layers mla`: attention TP
        return elements * self._base.kernels.weight_elem_bytes(lg.kind, d.op)

    def replaced_by_cp(self, layer_kind: str, c: CommEvent) -> bool:
        """Whether a CP exchange takes this collective's place (`--cp-layers mla`: o_proj's), so it costs 0."""
        return c.value in self.cp_audit.kinds[layer_kind].replaces

    def collective_time(self, layer_kind: str, c: CommEvent, segs: Segments) -> CollectiveTime:
        """One planned move of a layer for one batch: the collective steps the lowering makes of it (none
        where a CP exchange takes its place, `--cp-layers mla`), priced as `predict_plan` prices them."""
        layer, ctx = self.fragment(LayerResult(layer_kind, self.tp, comms=[c]), segs)
        priced = self._base.collective_times(layer_kind, [s for s in layer.collectives() if s.event == c], ctx)
        if not priced:
            why = "replaced by CP" if self.replaced_by_cp(layer_kind, c) else "not run"
            return CollectiveTime(layer_kind, c.label, c.collective.value, c.region, 0.0, 0.0, why)
        if len(priced) == 1:
            return priced[0]
        return replace(priced[0], nbytes=sum(x.nbytes for x in priced), seconds=sum(x.seconds for x in priced))

    def layout_copy_time(self, lg: LayerGraph, c: CommEvent, segs: Segments) -> float:
        """Seconds of the runtime's pack/unpack copies the lowering puts beside planned move `c` (0 when it
        needs none, or a CP exchange takes its place)."""
        layer, _ = self.fragment(LayerResult(lg.kind, self.tp, comms=[c]), segs)
        return sum(self.comms.copy(lg.kind, s).seconds for s in layer.copies() if s.value == c.value)

    def final_reduce_time(self, stream: Placement, segs: Segments) -> float:
        """The reduction of the last layer's partial sum into the stream (`stream`) before the final norm,
        for one batch: the lowering's final reduction step (`lower.passes.tp_sp.final_reduction`)."""
        if self.tp <= 1:
            return 0.0
        step = final_reduction(self._base.lowering(segs), TRANSITIONS[(P, stream)])
        return self.comms.collective("final", step).seconds

    def stage_sends_time(self, stream: Placement, segs: Segments) -> float:
        """Every pipeline-stage boundary's send (and re-gather unless the stream is token-sharded)
        for one batch; 0 without PP. Depends on the plan only through its stream placement: the
        program's outline under the baseline with that stream (`lower_outline`)."""
        ctx = self._base.lowering(segs)
        outline = lower_outline(replace(ctx, plan=ctx.plan.with_(stream=stream)))
        return sum(self.comms.send(s.send) for s in outline.stages if s.send is not None)

    def stage_layers(self) -> list[range]:
        """The layers each pipeline stage holds."""
        return list(self._base.stages)

    def kv_bytes_per_token(self, layer: int) -> float:
        """KV cache bytes per token of layer `layer` on one rank."""
        return self._base.kv_per_token(self.graph.spec.layers[layer].attn)

    def state_bytes_per_seq(self, layer: int) -> float:
        """Recurrent state bytes per sequence of layer `layer` on one rank."""
        return self._base.state_per_seq(self.graph.spec.layers[layer].attn)

    def embedding_bytes(self) -> float:
        """The vocab-parallel embedding's bytes per rank (the head holds as much again, untied)."""
        spec = self.graph.spec
        return spec.vocab * spec.hidden / self.tp * self._base.b


__all__ = ["Pricer"]
