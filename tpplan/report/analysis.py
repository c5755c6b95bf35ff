"""Everything the memo states, computed: audits over plans and TP sizes, predictions, verdicts,
next steps, and the places where tpplan's model differs from the seed's hand analysis.

The time/memory/TTFT predictor (`tpplan.cost.predict.predict_plan`, `load_predictor`) can be
passed in or turned off; without it the memo rests on the audit alone, and says so. Everything
below is torch-free.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from tpplan.audit import Audits
from tpplan.cost.pipeline import PipelineModel, serving_pipeline
from tpplan.cost.provenance import question_provenance
from tpplan.cost.topology import Topology
from tpplan.cost.workload import Workload
from tpplan.dtypes import DTYPE_BYTES
from tpplan.engines import Launch, engine_plans
from tpplan.engines.recipes import recipes
from tpplan.errors import TpplanError
from tpplan.layout.plan import OverlapName
from tpplan.layout.propagate import LayerResult
from tpplan.mesh import Mesh
from tpplan.models.graph import ModelGraph
from tpplan.models.spec import MLASpec
from tpplan.placement import COLLECTIVE_SHORT, Collective
from tpplan.plans.files import is_plan_file, read_plan_file
from tpplan.report.crossover import crossovers
from tpplan.report.deployments import Parts, rank_deployments, workload_parts
from tpplan.report.differences import differences
from tpplan.report.kernel_sources import sensitivity_of
from tpplan.report.memo_ask import MemoAsk
from tpplan.report.memo_variants import (
    Found,
    Scope,
    Shape,
    add_a2a_everywhere,
    add_baselines,
    add_found,
    add_overlapped,
    add_pp_across_nodes,
    audit_or_none,
    current_variant,
    plan_variants,
)
from tpplan.report.prompt_length import price_lengths, races
from tpplan.report.results import Analysis, BoundaryRow, Variant
from tpplan.report.rows import DeploymentKey
from tpplan.report.verdicts import bottom_line, judge, next_steps
from tpplan.units import GIB

if TYPE_CHECKING:
    from tpplan.cost.prediction import PlanPrediction
    from tpplan.engines.schema import EngineVersion
    from tpplan.simulate.serving import Arrival

PredictFn = Callable[..., "PlanPrediction"]  # `predict_plan`'s signature

# The named plans every memo compares; today's deployment (`--current`) joins them when it is
# another plan (e.g. ep4: TP32 with EP4).
MEMO_PLANS = (
    "baseline",
    "sglang-input-scattered",
    "input-scattered",
    "input-scattered+restore",
    "latent-scattered",
    "sequence-parallel",
    "gate-aware",
    "sp-moe",
)


@dataclass(frozen=True)
class Searched:
    """What the memo keeps of `tpplan search`'s answer: its ranked plans and the deployments searched."""

    found: list[Found]
    grid: list[tuple[int, int, int, int]]  # (TP, PP, CP, replicas), the search's order (its first: the reference)


SearchFn = Callable[..., Searched]


def load_search() -> SearchFn:
    """The best plans of `tpplan search` itself (`tpplan.search.search_plans`, the one search: the
    same objective, memory cap, TP x CP x PP grid and overlap), imported when a memo searches; its
    audits are the memo's (`audits`)."""
    from tpplan.search import MeshAsk, search_plans

    def best(
        graph: ModelGraph,
        topology: Topology,
        workload: Workload | None,
        *,
        ask: MeshAsk,
        dtype: str,
        expert_dtype: str | None,
        memory_cap_gib: float | str | None,
        top: int,
        audits: Audits | None = None,
        overlap: OverlapName | None = None,
        dp_attention: bool = False,
        redundant_experts: int = 0,
    ) -> Searched:
        outcome = search_plans(
            graph,
            topology,
            workload=workload,
            ask=ask,  # the search's default grid (cp, replicas None): TP x PP splits and TP x CP
            memory_cap_gib=memory_cap_gib,
            top=top,
            dtype=dtype,
            expert_dtype=expert_dtype,
            audits=audits,
            overlap=overlap,
            dp_attention=dp_attention,
            redundant_experts=redundant_experts,
        )
        found = [Found(r.plan, r.tp, r.pp, r.rank or i, r.cp, r.score, r.replicas)
                 for i, r in enumerate(outcome.ranked, 1)]  # fmt: skip
        # each deployment's best too, so the memo's deployment rows are the search's (not only its top plans)
        shown = {(r.deployment, str(r.plan.describe())) for r in outcome.ranked}
        found += [Found(r.plan, r.tp, r.pp, 0, r.cp, r.score, r.replicas) for r in outcome.deployment_best
                  if (r.deployment, str(r.plan.describe())) not in shown]  # fmt: skip
        return Searched(found, [(m.tp, m.pp, m.cp, m.replicas) for m in outcome.grid])

    return best


def load_predictor(arrival: Arrival | None = None) -> PredictFn:
    """`tpplan.cost.predict.predict_plan` (imported when a memo predicts), its TTFT from the engine's
    serving loop (`tpplan.simulate.serving.with_serving_loop`: fixed costs, the engine's PP schedule and
    CPU overlap) over `arrival` (None: each workload's closed loop), so the memo ranks and judges
    deployments by the simulated TTFT."""
    from tpplan.cost.predict import predict_plan
    from tpplan.simulate.serving import with_serving_loop

    return with_serving_loop(predict_plan, arrival)


def attn_formula(res: LayerResult, n: int) -> str:
    """The seed's unit arithmetic for one layer's attention-input boundary, e.g.
    `RS(delta 7168) + AG(qkv_latent 2112) = 7168 + 2112 = 9280`."""
    comms = [c for c in res.comms if c.region == "attn_side" and not c.internal]
    if not comms:
        return "no collective = 0"
    names = " + ".join(f"{COLLECTIVE_SHORT[c.collective.value]}({c.value.split(':')[0]} {c.width})" for c in comms)
    terms = []
    for c in comms:
        if c.collective is Collective.ALL_REDUCE:
            terms.append(f"2x{c.width}")
        elif c.collective is Collective.ALL_TO_ALL:
            terms.append(f"{c.width}/{n}")
        else:
            terms.append(f"{c.width}")
    total = f"{res.units('attn_side'):g}"
    sums = " + ".join(terms)
    return f"{names} = {total}" if sums == total else f"{names} = {sums} = {total}"


def _mla_kind(graph: ModelGraph) -> str | None:
    return next((k for k, lg in graph.kinds.items() if isinstance(lg.spec.attn, MLASpec)), None)


def _tp_sizes(m: _Memo) -> list[int]:
    """Powers of two from 2 up to the cluster (and the memo's main TP) for the volume sweep."""
    top = max(m.topology.world_size, m.n)
    sizes = [2**i for i in range(1, int(math.log2(top)) + 1)]
    return sorted({*sizes, m.n})


def volume_sweep(audits: Audits, names: list[str], sizes: list[int], dtype: str) -> dict[str, list[tuple[int, float]]]:
    """Bytes per token per rank of each plan at each TP size it can run at (legal or not), from
    `audits` (of the memo's graph)."""
    out: dict[str, list[tuple[int, float]]] = {}
    for name in names:
        pts = []
        for n in sizes:
            pa = audit_or_none(audits, name, n, dtype)
            if pa is not None:
                pts.append((n, pa.comm_bytes_per_token))
        out[name] = pts
    return out


def _prediction(m: _Memo, fn: PredictFn, v: Variant, wl: Workload, topology: Topology | None = None) -> PlanPrediction:
    """`fn` (the memo's predictor) on variant `v` at `wl` on `topology` (None: the memo's; the kernel-source
    comparison passes each source's): its mesh with its CP layers and the memo's KV under CP (tpplan's own
    accounting, when asked for), PP TTFT as the memo's engine schedules it (cost/pipeline.py)."""
    extra: dict[str, object] = {"expert_dtype": m.expert_dtype} if m.expert_dtype else {}
    if v.pp > 1:
        extra["pipeline"] = m.pp_schedule
    mesh = replace(v.parallel, cp_kv=m.cp_kv, router=m.router)
    return fn(m.graph, v.plan, topology or m.topology, mesh=mesh, workload=wl, tokens=wl.chunk_size, dtype=m.dtype,
              audit=v.audit, **extra)  # fmt: skip


def _predict(m: _Memo, v: Variant) -> None:
    """`v`'s prediction at each workload; a failure is kept as the variant's `prediction_error` (the
    baseline at the main TP always predicts: a failure there is a bad input, raised)."""
    assert m.fn is not None
    for wl in m.workloads:
        try:
            v.predictions[wl.name] = _prediction(m, m.fn, v, wl)
        except (TpplanError, NotImplementedError, ValueError) as exc:
            if isinstance(exc, TpplanError) and v.plan.name == "baseline" and v.shape[1:] == (1, 1, 1):
                raise  # the baseline always predicts: a failure here is a bad input (e.g. --expert-dtype)
            v.prediction_error = f"{type(exc).__name__}: {exc}"
            v.predictions.clear()
            return


def _same_decisions(variants: list[Variant]) -> dict[str, str]:
    """Variants whose decisions equal an earlier variant's at the same shape (e.g. gate-aware on a
    model where input-scattered is legal: nothing to repair)."""
    out: dict[str, str] = {}
    seen: dict[tuple[int, int, int, str], str] = {}
    for v in variants:
        sig = (v.tp, v.pp, v.cp, repr(v.plan.describe()))
        if sig in seen:
            out[v.key] = seen[sig]
        else:
            seen[sig] = v.key
    return out


def _boundary_rows(graph: ModelGraph, mla: str | None, variants: list[Variant], n: int) -> list[BoundaryRow]:
    """The seed's per-MLA-layer table (2H, H + L, 2H + L), re-derived from the graph."""
    if mla is None:
        return []
    spec = graph.kinds[mla].spec.attn
    assert isinstance(spec, MLASpec)
    H, L = graph.hidden, spec.latent_width
    rows = [
        ("original hidden all-reduce", "2H", 2 * H, "baseline"),
        ("ideal DeepSeek path: hidden RS + latent AG", "H + L", H + L, "input-scattered"),
        ("restore the hidden: RS + hidden AG + latent AG", "2H + L", 2 * H + L, "input-scattered+restore"),
        ("minimal prototype: keep hidden AR + latent AG", "2H + L", 2 * H + L, "latent-scattered"),
    ]
    out = []
    for path, f, units, plan_name in rows:
        v = next((x for x in variants if x.key == plan_name), None)
        if v is not None:
            res = v.audit.kinds[mla].result
            out.append(BoundaryRow(path, f, units, plan_name, res.units("attn_side"), v.legal, attn_formula(res, n)))
    return out


def analyse(
    model: str | ModelGraph,
    topology: Topology,
    workloads: list[Workload],
    ask: MemoAsk | None = None,
    *,
    predictor: PredictFn | None = None,
    use_default_predictor: bool = True,
    search_fn: SearchFn | None = None,
    audits: Audits | None = None,
    progress: Callable[[str], None] | None = None,
) -> Analysis:
    """Audit, predict and judge every plan against today's deployment (`ask.current`); `ask` is `tpplan
    report`'s options (`MemoAsk`; None: the defaults). The main TP is `ask.deployment.tp`, else a saved
    plan's, else the whole topology. `predictor` replaces the default one (`load_predictor`: TTFT from the
    engine's serving loop over `ask.arrival`); with none and `use_default_predictor=False` the memo rests on
    the audit alone. The memo searches what `tpplan search` does with the same options (`search_fn`: the
    search; default `load_search`), baseline priced at every deployment of its grid (the deployment ranking)
    and each deployment's plan at `ask.prompt_lengths`. Every plan is audited once (`audits`, of `model`'s
    graph: the search, the predictions and the volume sweep share them). `progress` is told each step."""
    ask = ask if ask is not None else MemoAsk()
    m = _memo(model, topology, workloads, ask, predictor, use_default_predictor, audits, progress)
    variants = _named_variants(m, list(ask.plans), m.pair)
    cur = current_variant(m.audits, ask.current, m.n, topology.world_size, m.dtype, variants)
    finder = search_fn or (load_search() if ask.search_top > 0 and not ask.plans else None)
    grid, best_found = _search(m, finder, variants)
    single = _with_comparisons(m, variants, grid)
    _engines_and_predictions(m, variants)
    a = _judged(m, variants, cur)
    if m.fn is not None:
        m.say("thresholds: where each plan overtakes baseline")
        a.crossovers = crossovers(m.graph, [v.plan for v in variants if v.shape == (m.n, 1, 1, 1) and v.legal],
                                  topology, mesh=Mesh(m.n), dtype=m.dtype, expert_dtype=m.expert_dtype,
                                  tokens=ask.crossover_tokens, audits=m.audits)  # fmt: skip
    a.grid, a.overlap, a.cp_kv, a.arrival = grid, ask.overlap, m.cp_kv, ask.arrival
    if best_found is not None:
        f = best_found
        a.search_best = (f.plan.name, Mesh(f.tp, pp=f.pp, cp=f.cp, replicas=f.replicas).label())
    if m.fn is not None and grid:
        _rank_deployments(m, a, single, grid)
        lengths = ask.prompt_lengths
        if lengths and workloads and (ask.arrival is None or ask.arrival.trace is None):  # a trace has its own
            _price_prompt_lengths(m, a, lengths)
    if m.fn is not None and m.fn is m.predict_fn:
        m.say("the answer under each kernel-price source")
        fn = m.fn
        a.kernel_sources = sensitivity_of(a, lambda v, wl, topo: _prediction(m, fn, v, wl, topo))
    m.say("where the model differs from a volume-only analysis")
    a.differences = differences(a, _chunk(m))
    return a


@dataclass(frozen=True)
class _Memo:
    """What every step of one memo reads: the model's graph and its audits, the topology and workloads, the
    question (`ask`), the main TP, the engine pair and the deployed engine's PP schedule, the predictor
    (None: predictions off) and the default one (whose parts can be priced again), and where progress goes."""

    graph: ModelGraph
    audits: Audits
    topology: Topology
    workloads: list[Workload]
    ask: MemoAsk
    n: int
    pair: tuple[EngineVersion, EngineVersion]
    pp_schedule: PipelineModel
    fn: PredictFn | None
    predict_fn: PredictFn | None
    say: Callable[[str], None]

    @property
    def dtype(self) -> str:
        return self.ask.dtype

    @property
    def expert_dtype(self) -> str | None:
        return self.ask.expert_dtype

    @property
    def cp_kv(self) -> str:
        """The KV a CP rank keeps (`--cp-kv`): "engines", the whole sequence's; "sharded", tpplan's 1/cp."""
        return self.ask.deployment.cp_kv

    @property
    def router(self) -> str | None:
        """The request router over the replicas (`--router`; None: the engine release's default)."""
        return self.ask.deployment.router

    @property
    def scope(self) -> Scope:
        """What every variant of this memo shares (`memo_variants`)."""
        return Scope(self.audits, self.n, self.dtype, self.ask.deployment.cp_layers)


def _memo(
    model: str | ModelGraph,
    topology: Topology,
    workloads: list[Workload],
    ask: MemoAsk,
    predictor: PredictFn | None,
    use_default_predictor: bool,
    audits: Audits | None,
    progress: Callable[[str], None] | None,
) -> _Memo:
    """The memo's shared inputs, its options checked against the topology (a bad --tp or --dtype is refused
    before any work)."""
    from tpplan.engines import select_pair
    from tpplan.models.config import load_model
    from tpplan.models.graph import build_model_graph

    engines = ask.engine_list
    pair = select_pair(engines)
    pp_schedule = serving_pipeline(engines[0] if engines else None)  # the first --engine names the deployed one
    graph = model if isinstance(model, ModelGraph) else build_model_graph(load_model(model))
    audits = audits if audits is not None and audits.graph is graph else Audits(graph)
    world = topology.world_size
    files = [read_plan_file(p).deployment for p in ask.plans if is_plan_file(p)]
    n = ask.deployment.tp or (files[0].tp if files else world)  # a memo about a saved plan: its TP is the main one
    if n > world:
        raise TpplanError(f"--tp {n}", f"topology {topology.name} has only {world} GPUs", f"use --tp {world} or less")
    if ask.dtype not in DTYPE_BYTES:
        raise TpplanError(f"--dtype {ask.dtype}", "unknown dtype", f"choose one of {', '.join(DTYPE_BYTES)}")
    predict_fn = load_predictor(ask.arrival) if use_default_predictor else None
    say = progress or (lambda _step: None)
    return _Memo(graph, audits, topology, workloads, ask, n, pair, pp_schedule, predictor or predict_fn, predict_fn,
                 say)  # fmt: skip


def _chunk(m: _Memo) -> int:
    """The chunk the engine lines and the differences are written for: the first workload's (8,192 without)."""
    return m.workloads[0].chunk_size if m.workloads else 8192


def _with_comparisons(m: _Memo, variants: list[Variant], grid: list[Shape]) -> list[Shape]:
    """Add the memo's comparison variants (PP across nodes, all-to-all everywhere, overlapped, a baseline at
    each deployment) to `variants`; returns the grid's deployments of one copy each (the fewest replicas:
    `deployments.DeploymentKey` has R)."""
    add_pp_across_nodes(m.scope, variants, m.topology)
    fewest = min((g[3] for g in grid), default=1)
    single = [g for g in grid if g[3] == fewest]
    add_a2a_everywhere(m.scope, variants, single)
    if m.ask.overlap is not None:
        add_overlapped(m.scope, variants, m.ask.overlap)
    add_baselines(m.scope, variants, single)
    return single


def _engines_and_predictions(m: _Memo, variants: list[Variant]) -> None:
    """Each variant's engine lines and, with a predictor, its predictions."""
    server = m.ask.server
    for i, v in enumerate(variants, 1):
        m.say(f"predicting plan {i} of {len(variants)} ({v.key})")
        mesh = replace(v.parallel, router=m.router)  # its replicas behind the memo's request router
        launch = Launch(m.graph.spec, mesh, dp=server.data_parallel, chunk=_chunk(m), gpu=m.topology.gpu.name,
                        nodes=m.topology.nodes)  # fmt: skip
        # the deployed engine's recipe first (the first --engine's, whose loop and PP schedule price the memo):
        # the verdicts and the bottom line cite the first engine whose flags run the plan
        found = recipes(v.plan, launch, prefill_cp=server.prefill_cp, engines=m.pair)
        v.engines = sorted(found, key=lambda r: r.version != m.pp_schedule.engine)
        if m.fn is not None:
            _predict(m, v)


def _named_variants(m: _Memo, plans: list[str] | None, pair: tuple[EngineVersion, EngineVersion]) -> list[Variant]:
    """The plans asked for, or the memo's own plans and those the engines' data says they run on this
    model class, at the main TP (a saved plan at its own deployment, which must fit the topology)."""
    names = plans or [*MEMO_PLANS, *engine_plans(m.graph.spec, (pair[0].key, pair[1].key))]
    variants = plan_variants(m.audits, list(dict.fromkeys(["baseline", *names])), bool(plans), m.n, m.dtype)
    world = m.topology.world_size
    for v in variants:
        if v.parallel.gpus > world:
            raise TpplanError(
                f"--plan {v.plan.extra.get('file', v.plan.name)}",
                f"it was found at {v.deployment} ({v.parallel.gpus} GPUs); the topology has {world}",
                "pass --nodes to give the topology that many GPUs",
            )
    return variants


def _search(m: _Memo, finder: SearchFn | None, variants: list[Variant]) -> tuple[list[Shape], Found | None]:
    """`tpplan search` on the memo's inputs (the grid, memory cap and overlap it searches), its plans joined
    to `variants`: the deployments it searched and its best (none without a search)."""
    if finder is None:
        return [], None
    m.say("searching plans (as tpplan search)")
    ask = m.ask
    searched = finder(m.graph, m.topology, m.workloads[0] if m.workloads else None, ask=ask.deployment,
                      dtype=m.dtype, expert_dtype=m.expert_dtype, memory_cap_gib=ask.memory_cap_gib,
                      top=ask.search_top, audits=m.audits, overlap=ask.overlap,
                      dp_attention=ask.dp_attention, redundant_experts=ask.redundant_experts)  # fmt: skip
    return searched.grid, add_found(m.scope, variants, searched.found)


def _judged(m: _Memo, variants: list[Variant], cur: Variant) -> Analysis:
    """The analysis: each variant's verdict against today's deployment `cur` inside the band of its
    prediction, the next steps and the bottom line, the volume sweep and the seed's boundary table."""
    from tpplan.search.ranking import memory_cap_gib_of

    graph, n = m.graph, m.n
    mla = _mla_kind(graph)
    named = [v.plan.name for v in variants if v.shape == (n, 1, 1, 1) and v.plan.found_by != "search"]
    sweep = volume_sweep(m.audits, named, _tp_sizes(m), m.dtype)
    wl = m.workloads[0].name if m.workloads else None
    # The band of what the current deployment's time sums: its prediction composed it (`predict_plan`);
    # a prediction that carries none (a stand-in predictor's) or none at all has the topology's.
    band = question_provenance(cur.predictions.get(wl) if wl is not None else None, m.topology, cur.tp * cur.pp)
    same = _same_decisions(variants)

    def formula(v: Variant) -> str:
        kind = mla or next(iter(v.audit.kinds))
        return attn_formula(v.audit.kinds[kind].result, v.tp) if kind in v.audit.kinds else ""

    cap_gib = memory_cap_gib_of(m.ask.memory_cap_gib, m.topology)
    limit = cap_gib * GIB if cap_gib is not None else float("inf")

    def shape_base(v: Variant) -> Variant | None:
        return next((b for b in variants if b.plan.name == "baseline" and b.shape == v.shape), None)

    verdicts = [judge(v, cur, formula(v), wl, band, same.get(v.key), limit, shape_base(v)) for v in variants]
    steps = next_steps(variants, cur, wl, band, limit)
    note = None if m.fn is not None else (
        "Time, memory and TTFT predictions are turned off for this memo; "
        "the verdicts below rest on the audit's volumes, legality and memory."
    )  # fmt: skip
    a = Analysis(graph.spec.name, graph, m.topology, m.workloads, n, m.dtype, variants, sweep,
                 _boundary_rows(graph, mla, variants, n), verdicts, steps, [], note, m.ask.bench, cur.key,
                 band, bottom_line(steps, cur, wl, band), same, engines=(m.pair[0].key, m.pair[1].key),
                 pp_engine=m.pp_schedule.engine)  # fmt: skip
    a.memory_cap_bytes = limit
    return a


def _rank_deployments(m: _Memo, a: Analysis, single: list[Shape], grid: list[Shape]) -> None:
    """Each workload's deployment rows over the search's grid, each row's TTFT in its priced parts where
    the default predictor made it."""
    keys: list[DeploymentKey] = [(*g, None) for g in single]

    def parts_of(v: Variant, w: str) -> Parts | None:
        """The priced parts of `v`'s prediction at `w` (only when `predict_plan` made it)."""
        p = v.predictions.get(w)
        if m.fn is not m.predict_fn or p is None or p.ttft is None:
            return None
        from tpplan.cost.predictor import cached_predictor
        from tpplan.cost.segments import segments_of

        mesh = Mesh(v.tp, pp=v.pp, replicas=v.replicas, cp=v.cp, cp_layers=v.cp_layers, cp_kv=m.cp_kv, router=m.router)
        pipeline = m.pp_schedule if v.pp > 1 else None
        pred = cached_predictor(m.graph, v.plan, m.topology, mesh, m.dtype, m.expert_dtype, v.audit, pipeline=pipeline)
        return workload_parts(pred, [segments_of(b) for b in p.ttft.batches])

    for w in m.workloads:
        a.deployments[w.name] = rank_deployments(a.variants, keys, w.name, a.memory_cap_bytes, parts_of, grid)


def _price_prompt_lengths(m: _Memo, a: Analysis, prompt_lengths: tuple[int, ...]) -> None:
    """Each deployment's plan (the first workload's rows) priced at every prompt length, and where one
    overtakes another."""
    assert m.fn is not None
    fn = m.fn
    m.say(f"prompt lengths {prompt_lengths[0]:,}-{prompt_lengths[-1]:,}: each deployment's plan")
    rows = [r for r in a.deployments[m.workloads[0].name]]
    chosen = [c for r in rows if (c := a.variant(r.variant)) is not None]

    def at(v: Variant, w: Workload) -> tuple[float, float] | None:
        try:
            p = _prediction(m, fn, v, w)
        except (TpplanError, NotImplementedError, ValueError):
            return None
        return (float(p.ttft.mean_s), float(p.memory.total)) if p.ttft is not None else None

    a.length_points = price_lengths(chosen, m.workloads[0], at, a.memory_cap_bytes, prompt_lengths)
    a.length_races = races(chosen, a.length_points, prompt_lengths)
