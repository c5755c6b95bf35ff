"""The cost model's prices one at a time: what a search needs to price plans it has not built yet.

`predict_plan` prices a whole plan. A search prices decisions (one op run one way, one collective)
before any whole plan exists, and sums them; for its sum to equal `predict_plan`'s, it must use the
same prices. `Pricer` hands them out, from the predictor `predict_plan` itself uses, so the two
cannot drift apart:

- `op_time`: one op decision, for one batch (its MoE mode and EP size come from the decision);
- `weight_bytes`: the weight one rank holds for it (routed experts at their weight dtype);
- `collective_time` and `layout_copy_time`: one collective, and the runtime's copy around it;
- `final_reduce_time`: the reduction before the final norm; `stage_sends_time`: PP's boundaries;
- `kv_bytes_per_token`, `state_bytes_per_seq`, `embedding_bytes`: the state and weights outside
  the plan's decisions;
- `cp_exchange_time`: with context parallelism, one layer's CP collectives (they depend on the
  graph and TP, not on the plan's decisions); every other price is then the slowest CP rank's, on
  its share of the batch (`cost.context_parallel.local_segments`), and a recurrence's own price
  includes the state hand-off's extra pass (scan correction or serial chain), as `predict_plan`
  lists them beside it.

Batches are `Segments`: (new tokens, context) per request, as `tpplan.cost.segments` states them.
"""

from __future__ import annotations

import math
from dataclasses import replace

from tpplan.audit import PlanAudit
from tpplan.cost.comm import price_collective
from tpplan.cost.context_parallel import cp_weight_elements
from tpplan.cost.prediction import CollectiveTime, OpTime
from tpplan.cost.predictor import Predictor
from tpplan.cost.segments import Segments, batch_pairs
from tpplan.cost.topology import Topology
from tpplan.dtypes import dtype_name
from tpplan.layout.plan import Plan
from tpplan.layout.propagate import CommEvent, OpDecision
from tpplan.lower.batch import local_segments
from tpplan.lower.passes.cp import exchange_call
from tpplan.lower.passes.tp_sp import kernel_call
from tpplan.lower.sizes import nccl_bytes
from tpplan.mesh import Mesh
from tpplan.models.graph import LayerGraph, ModelGraph
from tpplan.placement import Collective, Placement, R
from tpplan.plans.named import baseline


class Pricer:
    """Per-op, per-collective and per-state prices on `mesh` (TP x CP x PP, replicas) on `topology`."""

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
        `mesh.replicas` > 1, prices are one replica's; the search splits the workload between them
        (`tpplan.cost.workload.replica_workloads`)."""
        self.graph, self.topology, self.tp, self.pp, self.cp = graph, topology, mesh.tp, mesh.pp, mesh.cp
        self.dtype, self.expert_dtype, self.engine = dtype, expert_dtype, engine
        self.deployment = mesh
        self._base = Predictor(graph, baseline(), topology, mesh, dtype, expert_dtype, audit, engine=engine)
        self.cp_audit = self._base.cp_audit
        self._by_plan: dict[tuple[str, int | None, Placement], Predictor] = {("tp", None, R): self._base}

    @property
    def baseline_audit(self) -> PlanAudit:
        """The baseline's audit (validates that the model splits over `tp` ranks at all)."""
        return self._base.audit

    def _for(self, moe: str, ep_size: int | None, stream: Placement = R) -> Predictor:
        key = (moe, ep_size if moe == "ep" else None, stream)
        hit = self._by_plan.get(key)
        if hit is None:
            plan: Plan = baseline().with_(moe=moe, ep_size=key[1], stream=stream)
            hit = Predictor(
                self.graph, plan, self.topology, self.deployment, self.dtype, self.expert_dtype,
                audit=self._base.audit, sources=self._base.kernels.compute.sources,
            )  # fmt: skip
            self._by_plan[key] = hit
        return hit

    def op_time(self, lg: LayerGraph, d: OpDecision, segs: Segments, ep_size: int | None = None) -> OpTime:
        """One op of one layer as decided (`d.split` is the MoE mode for routed experts; `ep_size`
        the EP size when it is `ep`), for one batch of `segs`."""
        pred = self._for("ep", ep_size) if d.split == "ep" else self._base
        local = self._local(segs)
        t, pairs, ctx = batch_pairs(local)
        call = kernel_call(d, t, self.tp, pred.plan, dtype_name(self.dtype))  # the step the lowering makes of it
        ot = pred.kernels.price(lg, call, t, pairs, ctx, local)  # segs: a windowed/chunked mask's pairs
        factor = self._state_factor(lg.kind, d.op.name)
        return replace(ot, seconds=ot.seconds * (1 + factor)) if factor else ot

    def _local(self, segs: Segments) -> Segments:
        """The slowest CP rank's share of a batch (the batch itself without CP, or under `--cp-layers mla`)."""
        return local_segments(segs, self._base.cp, self._base.cp_split)

    def _rows(self, segs: Segments) -> int:
        return sum(math.ceil(n / self._base.cp) for n, _ in segs)

    def _state_factor(self, kind: str, op: str) -> int:
        """Extra local passes of an op under CP: a recurrence's 1 (scan correction) or cp-1 (serial chain),
        `--cp-layers mla`'s K/V expansion n-1 (every rank expands every key), else 0
        (the lowering's CP pass lists them as steps of their own, `tpplan.lower.passes.cp`)."""
        if self.cp <= 1:
            return 0
        ck = self.cp_audit.kinds[kind]
        for name, times in ck.replicated:
            if name == op:
                return times - 1
        for x in ck.exchanges:
            if x.op == op and x.method == "state_scan":
                return 1
            if x.op == op and x.method == "state_serial":
                return self.cp - 1
        return 0

    def cp_exchange_time(self, kind: str, segs: Segments) -> float:
        """One layer of `kind`'s CP collectives for one batch (0 without CP): the lowering's CP exchange
        steps (`tpplan.lower.passes.cp`), priced as `predict_plan` prices them."""
        if self.cp <= 1:
            return 0.0
        ctx = self._base.lowering(segs)
        steps = [exchange_call(ctx, x) for x in self.cp_audit.kinds[kind].exchanges]
        return sum(self._base.comms.collective(kind, c).seconds for c in steps)

    def weight_bytes(self, lg: LayerGraph, d: OpDecision) -> float:
        """Weight bytes one rank holds for this op decision, in the format the checkpoint stores it
        (quantization_config; routed experts at the expert dtype)."""
        elements = cp_weight_elements(self.cp_audit, lg.kind, d)  # `--cp-layers mla`: attention TP
        return elements * self._base.kernels.weight_elem_bytes(lg.kind, d.op)

    def replaced_by_cp(self, layer_kind: str, c: CommEvent) -> bool:
        """Whether a CP exchange takes this collective's place (`--cp-layers mla`: o_proj's), so it costs 0."""
        return c.value in self.cp_audit.kinds[layer_kind].replaces

    def collective_time(self, layer_kind: str, c: CommEvent, segs: Segments) -> CollectiveTime:
        """One collective of a layer for one batch (the TP group as it sits on the nodes)."""
        t = self._rows(segs)
        if self.replaced_by_cp(layer_kind, c):
            return CollectiveTime(layer_kind, c.label, c.collective.value, c.region, 0.0, 0.0, "replaced by CP")
        return self._by_volume(layer_kind, c.label, c.collective.value, c.region, c.elements_per_token, t)

    def _by_volume(
        self, layer_kind: str, label: str, kind: str, region: str, elements_per_token: float, t: int
    ) -> CollectiveTime:
        """One collective of `kind` on the TP group (as it sits on the nodes) for a batch of `t` tokens,
        whose ring volume per rank is `elements_per_token` x t; sized as nccl-tests does."""
        nbytes = nccl_bytes(kind, elements_per_token * t, self.tp, self._base.b)
        est = price_collective(kind, nbytes, self.tp, self.topology, ranks_per_node=self._base.rpn,
                               sources=self._base.kernels.compute.sources)  # fmt: skip
        return CollectiveTime(layer_kind, label, kind, region, nbytes, est.time_s, est.algorithm)

    def layout_copy_time(self, lg: LayerGraph, c: CommEvent, segs: Segments) -> float:
        """Seconds of the runtime's pack/unpack copy around collective `c` (0 when it needs none)."""
        if self.replaced_by_cp(lg.kind, c):
            return 0.0
        op = self._base.layout_copy(lg, c, self._rows(segs))
        return op.seconds if op is not None else 0.0

    def final_reduce_time(self, collective: Collective, elements_per_token: float, segs: Segments) -> float:
        """The reduction of the last layer's partial sum before the final norm."""
        t = self._rows(segs)
        return self._by_volume("final", "final", collective.value, "mlp_side", elements_per_token, t).seconds

    def stage_sends_time(self, stream: Placement, segs: Segments) -> float:
        """Every pipeline-stage boundary's send (and re-gather unless the stream is token-sharded)
        for one batch; 0 without PP. Depends on the plan only through its stream placement."""
        pred = self._for("tp", None, stream)
        return sum(pred.send_seconds(s.send) for s in pred.outline(segs).stages if s.send is not None)

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
