"""One plan's steps and their prices: what a whole plan's `Predictor` and the search's per-decision `Pricer`
both price through.

`PlanSteps` holds one plan on one mesh and topology: its audit and CP audit, its lowering context per batch
(`tpplan.lower`), the two step pricers (`cost.kernel_pricer`, `cost.collective_pricer`) over the kernel
sources of its GPU and engine, a layer's collective steps priced as the serving engine sends them, and the
KV and state bytes its mixers keep per layer. `Predictor` (`cost.predictor`) adds the sums (layers, stages,
memory) and their caches; the search's `Pricer` (`cost.pricing`) lowers the baseline's fragments through
one of its own, without those.
"""

from __future__ import annotations

from collections.abc import Sequence

from tpplan.audit import PlanAudit, audit_plan
from tpplan.cost.collective_pricer import CollectivePricer
from tpplan.cost.compute import kernel_sources
from tpplan.cost.ep_low_latency import low_latency_steps
from tpplan.cost.kernel_pricer import KernelPricer
from tpplan.cost.pipeline import PipelineModel, serving_pipeline
from tpplan.cost.prediction import CollectiveTime
from tpplan.cost.segments import Segments, batch_pairs
from tpplan.cost.topology import Topology
from tpplan.dtypes import DTYPE_BYTES, WEIGHT_BITS
from tpplan.engines.context_parallel import kv_cp_share
from tpplan.errors import TpplanError
from tpplan.layout.context_parallel import audit_cp
from tpplan.layout.plan import Plan
from tpplan.lower import Batch, Collective, Lowering, lowering
from tpplan.lower.registry import generation
from tpplan.lower.stages import stage_layers
from tpplan.mesh import Mesh
from tpplan.models.graph import ModelGraph
from tpplan.models.opkinds import mixer
from tpplan.models.spec import AttnSpec

STATE_BYTES = 4  # KDA/GDN recurrent state is kept in fp32 (conv state in the activation dtype)


class PlanSteps:
    """One plan on `mesh` of `topo`: its lowering per batch and the step pricers that price it (`kernels`,
    `comms`), with the KV and state bytes per layer.

    `audit`: the plan's audit at TP `mesh.tp`, when the caller has it; `impls`: kernel family -> the
    implementation a recorded run used (`bench --repredict`), None for the serving set; `engine`: the
    engine whose kernel tables price before tpplan's formulas; `pipeline`: the engine whose PP schedule
    and boundary send apply. `key`: what its prices follow from, by value (`predictor_key`)."""

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
        self.deployment = mesh.check(topo)
        if expert_dtype is not None and expert_dtype not in WEIGHT_BITS:
            raise TpplanError(
                f"expert_dtype={expert_dtype}", "unknown weight dtype", f"choose one of {', '.join(WEIGHT_BITS)}"
            )
        self.graph, self.plan, self.topo, self.tp, self.pp, self.dtype = graph, plan, topo, mesh.tp, mesh.pp, dtype
        self.audit: PlanAudit = audit if audit is not None else audit_plan(graph, plan, mesh.tp, dtype)
        # Context parallelism: `cp` TP groups, each on its share of the tokens (cost/context_parallel.py).
        self.cp_audit = audit_cp(graph, mesh)
        self.cp = self.cp_audit.token_cp  # every layer's token share (1 under `mla`: only MLA attention is split)
        self.b = DTYPE_BYTES[dtype]
        self.rpn = mesh.ranks_per_node(topo.gpus_per_node)
        self.stages = stage_layers(graph.spec.num_layers, mesh)
        self.engine = engine
        self.pipeline = pipeline or serving_pipeline(engine or topo.gpu.kernel_engine)  # the loop --engine implies
        self.serving_engine = engine or self.pipeline.engine  # and whose kernels the serving set prices
        self.key = predictor_key(graph, plan, topo, mesh, dtype, expert_dtype, engine, self.pipeline, impls)
        built = kernel_sources(topo.gpu, engine)
        self.kernels = KernelPricer(graph, topo, mesh, dtype, expert_dtype, sources=built, impls=impls,
                                    serving_engine=self.serving_engine)  # fmt: skip
        self.comms = CollectivePricer(topo, dtype, self.pipeline, sources=built)
        self._lowerings: dict[Segments, Lowering] = {}

    def built_on(self, graph: ModelGraph, topo: Topology) -> bool:
        """Whether its graph and topology equal `graph` and `topo` (what `key` holds only by
        name): a cache hit on `key` is this one only where they do."""
        return (self.graph is graph or self.graph == graph) and (self.topo is topo or self.topo == topo)

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

    def collective_times(self, kind: str, steps: Sequence[Collective], ctx: Lowering) -> list[CollectiveTime]:
        """A layer's priced collective steps (of layer kind `kind`, lowered in `ctx`) priced for its batch, a
        decode step's EP all-to-all as the serving engine's DeepEP low-latency kernels send it
        (`cost.ep_low_latency`)."""
        local = ctx.local_segments
        t = batch_pairs(local)[0]
        sent = low_latency_steps([c for c in steps if c.priced], self.graph.kinds[kind], t, self.serving_engine, local)
        return [self.comms.collective(kind, c) for c in sent]

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


def predictor_key(
    graph: ModelGraph,
    plan: Plan,
    topo: Topology,
    mesh: Mesh,
    dtype: str,
    expert_dtype: str | None,
    engine: str | None,
    pipeline: PipelineModel,
    impls: dict[str, str] | None = None,
) -> tuple[object, ...]:
    """What a `PlanSteps`' (a `Predictor`'s) prices follow from, by value and cheap to hash, for the caches
    that keep one or what was built from one: plan, mesh, dtypes, engine, PP schedule, a recorded run's kernels and the
    set of lowering passes (`lower.registry.generation`); the graph by its layer kinds and width and the
    topology by its name (hashing the whole ModelSpec costs ~90 us a call), so a hit is used only where
    its graph and topology also equal the ones asked for (`Predictor.built_on`)."""
    kernels = tuple(sorted(impls.items())) if impls else None
    return (graph.layer_kinds, graph.hidden, topo.name, plan, mesh, dtype, expert_dtype, engine, pipeline, kernels,
            generation())  # fmt: skip


__all__ = ["STATE_BYTES", "PlanSteps", "predictor_key"]
