"""One engine version's serving loop for one deployment: the loop's settings from the engine's data.

`engine_loop(predictor.pipeline, deployment, chunk_tokens, gpus_per_node)` reads the engine's PP
schedule (`tpplan.engines`: micro-batches in flight, whether a prompt's chunks pipeline), its
scheduler rules (`tpplan.engines.scheduling`: whether the CPU overlaps the GPU) and the fixed costs
(`simulate.overheads`), and says what the loop leaves out for that engine (`conditions`: what a memo
puts into a recommendation's conditions). `serve` runs the loop over a predictor's step prices.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpplan.cost.draft import eagle_config
from tpplan.cost.pipeline import PipelineModel
from tpplan.cost.predictor import Predictor
from tpplan.cost.workload import Workload
from tpplan.engines import scheduler_rules
from tpplan.engines.routing import replica_router
from tpplan.engines.schema import ReplicaRouter, SchedulerRules
from tpplan.engines.speculative import EAGLE_NOT_MODELLED, EAGLE_READ_NOT_MODELLED, Speculative, running_cap
from tpplan.engines.speculative import NOT_MODELLED as SPEC_NOT_MODELLED
from tpplan.mesh import Mesh
from tpplan.models.opkinds import mixer
from tpplan.models.spec import MoESpec
from tpplan.simulate.loop import LoopConfig
from tpplan.simulate.overheads import NONE, Overheads, overheads
from tpplan.simulate.prices import predictor_prices
from tpplan.simulate.replicas import simulate
from tpplan.simulate.requests import Arrivals, ClosedLoop, Shape, closed_loop
from tpplan.simulate.results import LoopResult


@dataclass(frozen=True)
class EngineLoop:
    """The loop settings of one engine version on one deployment, and where they come from."""

    pipeline: PipelineModel
    rules: SchedulerRules
    costs: Overheads
    config: LoopConfig

    pp: int = 1
    router: ReplicaRouter | None = None  # what spreads the requests over the replicas (`tpplan.engines.routing`)

    def conditions(self, figures: bool = True) -> tuple[str, ...]:
        """What the loop does not model for this engine (under PP its PP schedule's unpriced settings,
        `pp_unpriced`) and where its fixed costs come from. `figures` False: in words without figures
        (a memo's conditions), the PP settings as a pointer to the memo's PP section that lists them."""
        pp = pp_unpriced(self.pipeline) if self.pp > 1 else ()
        if not figures:
            return (*self.rules.not_modelled, *((PP_POINTER,) if pp else ()), self.costs.condition())
        return (*self.rules.not_modelled, *pp, self.costs.describe())


PP_POINTER = 'what the engine\'s PP schedule leaves unpriced (under "Pipeline parallelism as the engines schedule it")'


def pp_unpriced(pipeline: PipelineModel) -> tuple[str, ...]:
    """The PP schedule's settings the loop leaves out. The loop prices the scheduler's CPU per step
    (`simulate.overheads`), so the schedule's note that the CPU time is not priced is dropped here."""
    return tuple(c for c in pipeline.schedule.not_modelled if "CPU time" not in c)


def cpu_overlaps(rules: SchedulerRules, deployment: Mesh, gpus_per_node: int) -> bool:
    """Whether the engine schedules the next step while the GPU runs this one, on this deployment:
    SGLang's overlap schedule is off under PP; vLLM keeps async scheduling on every executor its launch
    lines use, the Ray executor of a replica over several nodes included (`gpus_per_node` is kept for
    the engines whose rule depends on the nodes)."""
    if not rules.cpu_overlap:
        return False
    return rules.cpu_overlap_under_pp or deployment.pp == 1


def engine_loop(
    pipeline: PipelineModel,
    deployment: Mesh,
    chunk_tokens: int,
    gpus_per_node: int,
    *,
    fixed_costs: bool = True,
    decode: bool = False,
    max_running: int | None = None,
    kv_tokens: int | None = None,
    speculative: Speculative | None = None,
) -> EngineLoop:
    """The loop of `pipeline`'s engine version on `deployment` with steps of `chunk_tokens`;
    `fixed_costs` False leaves the per-request and per-step costs out (the idealised loop); the replicas are
    spread by the deployment's request router (`deployment.router`, `tpplan.engines.routing`). `decode`:
    requests decode their output tokens, in steps formed as the engine forms them (`mixes_decode`: vLLM
    shares each step's budget, SGLang runs prefill first), admitted under `max_running` and a KV pool
    of `kv_tokens` per replica (None: unbounded); `speculative`: its decode steps are speculative steps (the
    running cap as the engine sets it under speculative decoding, `tpplan.engines.speculative.running_cap`)."""
    rules = scheduler_rules(pipeline.engine)
    router = replica_router(pipeline.engine, deployment.router)  # the one the launch lines start
    costs = overheads(cpu_overlaps(rules, deployment, gpus_per_node)) if fixed_costs else NONE
    config = LoopConfig(
        chunk_tokens=chunk_tokens,
        in_flight=pipeline.in_flight(deployment),
        chunks_overlap=pipeline.chunks_overlap,
        step_overhead_s=costs.step_s,
        request_in_s=costs.request_s,
        decode=decode,
        mixed=rules.mixes_decode,
        max_running=max_running if speculative is None else running_cap(pipeline.engine, max_running),
        kv_tokens=kv_tokens,
        verify_tokens=1 if speculative is None else speculative.verify_tokens,
        accepted=1.0 if speculative is None else speculative.accepted,
        router=router.rule.prefill if router is not None else "round_robin",
        router_rule=router.rule if router is not None else None,
    )
    return EngineLoop(pipeline, rules, costs, config, deployment.pp, router)


NO_SPECULATIVE = (
    "speculative decoding and MTP (draft cost, accepted tokens per step) are not modelled: one token per step"
)
ROUTED_EXPERTS_DECODE = (
    "routed experts at decode sizes: the experts a batch reaches under uniform routing (no skew), each padded to "
    "the engine's fused-MoE row tile from its default config (tuned per-GPU config files not read), the weights "
    "read at the datasheet HBM rate; above the GPU experts model's measured rows per expert, that model (fitted on "
    "tpplan's runtime kernel, torch._grouped_mm) prices them"
)
GQA_DECODE_UNMEASURED = (
    "GQA/MHA decode attention is priced by the prefill attention pricer at the step's KV bytes and pairs; no "
    "decode (split-KV) kernel was measured"
)
DECODE_NOT_MODELLED = (
    "decode steps are priced by the same per-step op prices as prefill at M = the decode batch, each request's "
    "attention over its KV length; CUDA graphs change only the per-step scheduler cost, not the kernels' prices",
    NO_SPECULATIVE,
    "admission reserves each request's prompt + output KV: no preemption, no SGLang new_token_ratio estimate",
    "a decode step is priced at its requests' mean KV length (interpolated on a grid of 16 points per doubling)",
    ROUTED_EXPERTS_DECODE,
    GQA_DECODE_UNMEASURED,
)
"""What the loop's decode leaves out, for every engine (docs/cost-model.md, "Serving loop"); `decode_conditions`
keeps the lines about routed experts and GQA decode attention only where they apply."""


def _applies(line: str, p: Predictor | None) -> bool:
    """Whether a line of `DECODE_NOT_MODELLED` holds for `p`'s model and GPU (None: say every line): the routed
    experts' only with routed experts; GQA's only with GQA/MHA attention on a GPU without a measured GQA decode
    model (`decode_gqa`, which then prices it: `KernelPricer._decode_attention`)."""
    if p is None:
        return True
    layers = p.graph.spec.layers
    if line == ROUTED_EXPERTS_DECODE:
        return any(isinstance(layer.mlp, MoESpec) for layer in layers)
    if line == GQA_DECODE_UNMEASURED:
        gqa = any(mixer(layer.attn.kind).head_kv for layer in layers)
        return gqa and "decode_gqa" not in p.topo.gpu.kernel_models
    return True


def decode_conditions(speculative: Speculative | None, p: Predictor | None = None) -> list[str]:
    """`DECODE_NOT_MODELLED` as it applies to `p`'s model and GPU, with what speculative decoding leaves out in
    place of its line where it is on."""
    lines = [x for x in DECODE_NOT_MODELLED if _applies(x, p)]
    if speculative is None:
        return lines
    eagle: tuple[str, ...] = ()
    if speculative.method == "eagle":
        eagle = (EAGLE_NOT_MODELLED if eagle_config(speculative) is None else EAGLE_READ_NOT_MODELLED,)
    said = (*SPEC_NOT_MODELLED, *eagle)
    return [c for x in lines for c in ((x,) if x != NO_SPECULATIVE else said)]


def workload_arrivals(workload: Workload) -> ClosedLoop:
    """A closed-loop workload's requests as the loop takes them (prompts cycled, its cached share)."""
    lens = workload.input_lens or [workload.prompt_len(0)]
    shapes = [Shape(n, workload.output_len, workload.cached_share) for n in lens]
    return closed_loop(workload.concurrency, shapes, workload.total_requests)


def serve(p: Predictor, arrivals: Arrivals, loop: EngineLoop, speculative: Speculative | None = None) -> LoopResult:
    """The loop over the predictor's per-stage step prices, on its deployment's replicas (`speculative`:
    the decode steps priced as speculative steps; `loop` made with the same)."""
    return simulate(arrivals, predictor_prices(p, speculative), loop.config, p.deployment)


__all__ = [
    "DECODE_NOT_MODELLED",
    "PP_POINTER",
    "EngineLoop",
    "cpu_overlaps",
    "decode_conditions",
    "engine_loop",
    "pp_unpriced",
    "serve",
    "workload_arrivals",
]
