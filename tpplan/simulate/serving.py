"""The serving loop as audit, search and report ask for it: an arrival process and one summary per deployment.

`Arrival` is what the user asked for (the workload's closed loop, Poisson at a rate, or a trace);
`arrivals_for` turns it into requests; `serving_summary` runs the engine's loop on a predictor's
step prices and returns what the JSON carries (docs/audit-json.md, `serving`): TTFT mean and
percentiles with the fixed costs' band, the idealised loop's mean beside it, the queueing share,
prefill throughput, the engine's settings and what the loop does not model for it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from tpplan.cost.draft import draft_memory, eagle3_draft
from tpplan.cost.pipeline import loop_note
from tpplan.cost.prediction import PlanPrediction
from tpplan.cost.predictor import Predictor, cached_predictor
from tpplan.cost.topology import Topology
from tpplan.cost.workload import MAX_REQUESTS, Workload
from tpplan.engines.speculative import Speculative
from tpplan.errors import TpplanError
from tpplan.layout.plan import Plan
from tpplan.mesh import Mesh
from tpplan.models.graph import ModelGraph
from tpplan.simulate.engine import EngineLoop, decode_conditions, engine_loop, serve, workload_arrivals
from tpplan.simulate.loop import LoopConfig
from tpplan.simulate.requests import Arrivals, ClosedLoop, Shape, poisson
from tpplan.simulate.results import LoopResult
from tpplan.simulate.trace import load_trace


@dataclass(frozen=True)
class Arrival:
    """How requests arrive: the workload's closed loop (neither rate nor trace), Poisson at `rate`
    requests/s (the workload's prompts, `requests` of them, drawn with `seed`), or a trace file."""

    rate: float | None = None
    trace: str | None = None
    requests: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.rate is not None and self.trace is not None:
            raise TpplanError(f"arrival_rate={self.rate:g} and trace={self.trace}", "are two arrival processes",
                              "give one of them")  # fmt: skip
        if self.requests is not None and not 1 <= self.requests <= MAX_REQUESTS:
            raise TpplanError(f"requests={self.requests}", f"must be 1 to {MAX_REQUESTS}", "pass a request count")

    def describe(self) -> str:
        """The arrival process in words, from its values (the memo says which one it ranked by)."""
        if self.trace is not None:
            return f"the requests of trace `{self.trace}`"
        n = f"{self.requests:,} requests" if self.requests is not None else "each workload's requests"
        if self.rate is None:
            return f"each workload's closed loop at its concurrency, {n}"
        return f"Poisson at {self.rate:g} req/s, {n}, seed {self.seed}"

    def to_json(self, arrivals: Arrivals) -> dict[str, object]:
        n = len(arrivals.requests)
        if isinstance(arrivals, ClosedLoop):
            return {"kind": "closed", "concurrency": arrivals.concurrency, "requests": n}
        if self.trace is not None:
            return {"kind": "trace", "file": self.trace, "requests": n}
        return {"kind": "poisson", "rate_per_s": self.rate, "seed": self.seed, "requests": n}


def arrivals_for(arrival: Arrival, workload: Workload | None, max_context: int | None = None) -> Arrivals:
    """The requests `arrival` describes; Poisson and the closed loop take their prompts from `workload`.
    `max_context` bounds a trace's prompts (a workload's are taken as its author set them, as the cost
    model always has)."""
    if arrival.trace is not None:
        return load_trace(arrival.trace, max_context)
    if workload is None:  # named by the field that asked for arrivals (the CLI: its option)
        asked = f"arrival_rate={arrival.rate:g}" if arrival.rate is not None else f"requests={arrival.requests}"
        raise TpplanError(
            asked, "a closed loop or a rate takes its prompts from a workload", "give workload= or trace="
        )
    n = arrival.requests or workload.total_requests
    if arrival.rate is None:
        return workload_arrivals(workload.with_overrides(f"workload {workload.name}", num_requests=n))
    lens = workload.input_lens or [workload.prompt_len(0)]
    shapes = [Shape(x, workload.output_len, workload.cached_share) for x in lens]
    return poisson(arrival.rate, shapes, n, arrival.seed)


def _run(
    p: Predictor, arrivals: Arrivals, loop: EngineLoop, cfg: LoopConfig | None, spec: Speculative | None
) -> LoopResult:
    """The loop's prefill steps (`spec`: each with the draft's pass as the engine runs it)."""
    return serve(p, arrivals, loop if cfg is None else replace(loop, config=cfg), spec)


def serving_summary(
    p: Predictor, arrivals: Arrivals, chunk_tokens: int, gpus_per_node: int, *, per_request: bool = False,
    speculative: Speculative | None = None,
) -> tuple[LoopResult, dict[str, object]]:  # fmt: skip
    """The engine's loop (`p.pipeline`'s engine) on `p`'s deployment: the result and its JSON summary
    (`speculative`: its prefill steps run the draft's pass, its decode block's steps are speculative steps)."""
    spec = speculative
    loop = engine_loop(p.pipeline, p.deployment, chunk_tokens, gpus_per_node)
    res = _run(p, arrivals, loop, None, spec)
    ideal = _run(p, arrivals, engine_loop(p.pipeline, p.deployment, chunk_tokens, gpus_per_node, fixed_costs=False),
                 None, spec)  # fmt: skip
    low, high = (_run(p, arrivals, loop, replace(loop.config, step_overhead_s=c.step_s, request_in_s=c.request_s),
                      spec) for c in loop.costs.band())  # fmt: skip
    out: dict[str, object] = {
        "engine": p.pipeline.engine,
        "ttft": res.summary(),
        "ttft_band": {k: [low.summary()[k], high.summary()[k]] for k in ("mean_s", "p50_s", "p90_s", "p99_s")},
        "idealised_mean_s": ideal.mean_s,
        "settings": _settings(loop, chunk_tokens, p.deployment),
        "conditions": [*loop.conditions(), *filter(None, [loop_note(p.engine or p.topo.gpu.kernel_engine)])],
    }
    if per_request:
        out["requests"] = [t.to_json() for t in res.timelines]
    dec = decode_block(p, arrivals, chunk_tokens, gpus_per_node, per_request=per_request, speculative=speculative)
    if dec is not None:
        out["decode"] = dec
    return res, out


def _settings(loop: EngineLoop, chunk_tokens: int, mesh: Mesh) -> dict[str, object]:
    """The loop's settings in the serving JSON; with replicas, the request router that spread the requests."""
    out: dict[str, object] = {
        "chunk_tokens": chunk_tokens,
        "in_flight": loop.config.in_flight,
        "chunks_overlap": loop.config.chunks_overlap,
        "cpu_overlap": loop.costs.cpu_overlap,
        "request_s": loop.costs.request_s,
        "step_s": loop.costs.step_s,
        "sources": [m.url for m in loop.costs.sources],
    }
    if mesh.replicas > 1 and loop.router is not None:  # `tpplan.engines.routing`: the launch lines start it too
        r = loop.router
        out["router"] = {"name": r.name, "what": r.what, "sources": [f.source.cite() for f in r.rule.facts]}
    return out


def decode_block(
    p: Predictor, arrivals: Arrivals, chunk_tokens: int, gpus_per_node: int, *, per_request: bool = False,
    speculative: Speculative | None = None,
) -> dict[str, object] | None:  # fmt: skip
    """The same requests through the engine's loop with decode (docs/audit-json.md, `serving.decode`):
    TTFT beside decode's steps, TPOT/ITL, request latency and output tokens/s; None when every request
    has one output token. `speculative`: each decode step a speculative step (`settings.speculative`)."""
    if all(r.output_tokens <= 1 for r in arrivals.requests):
        return None
    cap, capacity = replica_kv(p, speculative=speculative)
    running, pool = cap if cap is not None else (None, None)
    loop = engine_loop(p.pipeline, p.deployment, chunk_tokens, gpus_per_node, decode=True, max_running=running,
                       kv_tokens=pool, speculative=speculative)  # fmt: skip
    rule = loop.rules.decode_step
    settings: dict[str, object] = {"mixed_steps": loop.config.mixed, "max_running": loop.config.max_running,
                "kv_tokens": loop.config.kv_tokens, "kv_capacity": capacity,
                "rule": None if rule is None else rule.source.cite()}  # fmt: skip
    if speculative is not None:
        settings["speculative"] = speculative_json(p, speculative, loop.config.max_running)
    try:
        res = serve(p, arrivals, loop, speculative)
    except TpplanError as err:  # a request whose KV does not fit the pool alone: this deployment cannot serve it
        return {"admitted": False, "reason": str(err), "settings": settings}
    summary = res.decode_summary(p.deployment.gpus)
    if summary is None:
        return None
    conditions = decode_conditions(speculative, p)
    if cap is None:
        conditions.append("no KV-pool or running-request cap: the engine's KV sizing was not read for this version")
    out: dict[str, object] = {
        "admitted": True,
        **summary,
        "ttft_s": {k: res.summary()[f"{k}_s"] for k in ("mean", "p50", "p90", "p99")},
        "settings": settings,
        "conditions": conditions,
    }
    if per_request:
        out["requests"] = [t.to_json() for t in res.timelines]
    return out


def speculative_json(p: Predictor, spec: Speculative, max_running: int | None) -> dict[str, object]:
    """`settings.speculative`: the inputs, the draft's memory (`draft`: None where its config is not read),
    the engine's flags for them (with the running cap the loop served with, `launch_flags`) and where they
    were read."""
    from tpplan.engines.speculative import launch_flags, sources

    engine, eagle3 = p.pipeline.engine, eagle3_draft(spec)
    flags = launch_flags(engine, spec, max_running, eagle3=eagle3)
    draft = draft_memory(p, spec)
    return {**spec.to_json(), "draft": None if draft is None else draft.to_json(), "flags": list(flags),
            "sources": [s.cite() for s in sources(engine, eagle3=eagle3)]}  # fmt: skip


def replica_kv(
    p: Predictor, pd: bool = False, speculative: Speculative | None = None
) -> tuple[tuple[int, int] | None, str | None]:
    """(running-request cap, KV tokens) of one replica as `p`'s engine version sizes them at its defaults
    (`tpplan.cost.kv_capacity`: per rank; with DP attention each rank keeps its own requests, so the
    replica holds attention-DP times both; `pd`: a P/D server's; `speculative`: with its draft's weights and
    KV layers, `tpplan.cost.draft`), and the capacity's label; (None, None) where the engine's KV sizing
    was not read."""
    from tpplan.cost.kv_capacity import kv_capacity

    draft = draft_memory(p, speculative)  # before the try: an MTP draft on a model without MTP layers is refused
    try:
        kv = kv_capacity(p, p.pipeline.engine, pd=pd, draft=draft)
    except TpplanError:
        return None, None
    dp = p.tp if p.plan.dp_attention else 1
    return (max(1, kv.max_running * dp), max(1, kv.tokens * dp)), f"{kv.label}: {kv.tokens:,} tokens per rank"


PredictFn = Callable[..., PlanPrediction]


def with_serving_loop(predict: PredictFn, arrival: Arrival | None = None) -> PredictFn:
    """`predict` (`predict_plan`'s signature) with each prediction's TTFT taken from the engine's serving
    loop (fixed costs included) over `arrival` (None: the workload's closed loop), on the prediction's
    own step prices, and what the loop leaves out for that engine in `serving_conditions`: what the
    memo ranks and judges deployments by."""

    def run(graph: ModelGraph, plan: Plan, topo: Topology, **kw: Any) -> PlanPrediction:
        return on_serving_loop(predict(graph, plan, topo, **kw), graph, plan, topo, arrival, **kw)

    return run


def on_serving_loop(
    pred: PlanPrediction, graph: ModelGraph, plan: Plan, topo: Topology, arrival: Arrival | None = None, **kw: Any
) -> PlanPrediction:
    """`pred` (`predict_plan`'s, of these arguments) with its TTFT taken from the engine's serving loop, as
    `with_serving_loop` does; `pred` as it is without a workload."""
    wl: Workload | None = kw.get("workload")
    if wl is None or pred.ttft is None:
        return pred
    p = cached_predictor(graph, plan, topo, kw["mesh"], kw.get("dtype", "bf16"),
                         kw.get("expert_dtype"), kw.get("audit"), engine=kw.get("engine"),
                         pipeline=kw.get("pipeline"))  # fmt: skip
    loop = engine_loop(p.pipeline, p.deployment, wl.chunk_size, topo.gpus_per_node)
    ctx = graph.spec.numerics.max_position_embeddings
    arrivals = workload_arrivals(wl) if arrival is None else arrivals_for(arrival, wl, ctx)
    res = serve(p, arrivals, loop)
    return replace(pred, ttft=res.as_ttft(), serving_conditions=loop.conditions(figures=False))


__all__ = [
    "Arrival",
    "arrivals_for",
    "decode_block",
    "on_serving_loop",
    "replica_kv",
    "serving_summary",
    "with_serving_loop",
]
