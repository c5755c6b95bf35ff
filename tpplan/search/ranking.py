"""`tpplan search`'s answer: search every deployment, re-audit and predict the ranked plans.

Deployments. With a topology and neither `--tp` nor `--pp`, every TP x PP split of the topology's
GPUs (TP x PP = nodes x GPUs per node; a TP group larger than a node fills whole nodes) is searched,
each with every EP size its TP allows (the search's MoE modes); `--tp` and/or `--pp` fix one. Asked
for (`--replicas all`, with a workload and neither fixed), also R replicas of each split of GPUs / R
for every R dividing the GPUs (`deployment_grid`; `--replicas R` fixes R): the requests split
between them. Plans
from all deployments are ranked together by what `predict_plan` says of them: mean TTFT (pipelined,
with a workload) or forward time. Within a deployment the search is exact for forward time at any
PP and for mean TTFT at PP 1; at PP > 1 it picks plans by the unpipelined TTFT (docs/design.md).

Memory. With a topology, the cap defaults to SERVING_SHARE (90%) of one GPU's memory (`"serving"`):
the predicted memory already holds the workload's own KV cache at its concurrency, and the rest is
what a serving engine keeps besides weights, activations and that KV cache (more KV blocks than one
wave needs, CUDA graphs, NCCL buffers, allocator slack); vLLM itself uses 0.92 of a GPU by default
(`CacheConfig.gpu_memory_utilization`, vllm/config/cache.py at 002f10e0). A plan over the cap is
never ranked; `"gpu"` caps at the whole GPU and `memory_cap_gib=None` (`--memory-cap none`) lifts
the cap. Without a topology there is no memory to fit, so no cap unless one is given.

`search_plans` is the one search: `tpplan search` and `tpplan report` both call it with objects
(graph, topology, workload; the CLI resolves names and files), and it hands back a typed
`SearchOutcome` (`tpplan.search.results`; its `to_json` is docs/search-json.md). Every audit goes
through one `tpplan.audit.Audits` (passed in, or made here): the baseline of a deployment is
audited once, and the ranked plans' audits are there for the memo. `run_search` resolves names
first (scripts and tests).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from tpplan.audit import Audits
from tpplan.dtypes import WEIGHT_BITS
from tpplan.errors import TpplanError
from tpplan.layout.plan import OverlapName
from tpplan.mesh import Mesh
from tpplan.models.graph import ModelGraph
from tpplan.plans.files import Deployment as FileDeployment
from tpplan.plans.files import PlanFile, plan_file_data
from tpplan.search.combine import search
from tpplan.search.grid import MeshAsk, deployment_grid, deployments, memory_cap_gib_of, search_grid
from tpplan.search.memo import Memo
from tpplan.search.naming import describe
from tpplan.search.objectives import plan_cost
from tpplan.search.results import (
    GIB,
    JSON_SCHEMA_VERSION,
    SERVING_SHARE,
    Excluded,
    RankedPlan,
    SearchOutcome,
    SearchStats,
)
from tpplan.search.setup import (
    Deployed,
    Screen,
    Setup,
    baseline_of,
    evaluate,
    lower_bound,
    named_of,
    objective_of,
    over_cap,
    over_floor,
)
from tpplan.search.variants import dp_entries, overlap_entries

if TYPE_CHECKING:
    from concurrent.futures import ProcessPoolExecutor

    from tpplan.cost.topology import Topology
    from tpplan.cost.workload import Workload
    from tpplan.layout.plan import Plan
    from tpplan.search.objectives import Cost, Objective


def _check(
    topo: Topology | None,
    workload: Workload | None,
    memory_cap_gib: float | str | None,
    top: int,
    tokens: int,
    expert_dtype: str | None,
    objective: str,
) -> None:
    """Every input checked before any search runs (TpplanError: exit 2)."""
    if objective not in ("time", "volume"):
        raise TpplanError(f"objective={objective}", "unknown objective", "choose time or volume")
    if top < 1:
        raise TpplanError(f"top={top}", "must be at least 1", "ask for one plan or more")
    if isinstance(memory_cap_gib, str) and memory_cap_gib not in ("gpu", "serving"):
        raise TpplanError(f"memory_cap_gib={memory_cap_gib}", "not a size", "give GiB per rank (e.g. 140) or none")
    if isinstance(memory_cap_gib, float | int) and memory_cap_gib <= 0:
        raise TpplanError(f"memory_cap_gib={memory_cap_gib}", "must be positive", "give GiB per rank, e.g. 140")
    if tokens < 1:
        raise TpplanError(f"tokens={tokens}", "must be positive", "give the batch size in tokens, e.g. 8192")
    if expert_dtype is not None and expert_dtype not in WEIGHT_BITS:
        raise TpplanError(
            f"expert_dtype={expert_dtype}", "unknown weight dtype", f"choose one of {', '.join(WEIGHT_BITS)}"
        )
    if topo is None and (objective == "time" or workload is not None):
        raise TpplanError("topology=None", "predicted time needs a topology", "pass one (e.g. h200x8-ib400)")


def _search_deployment(s: Setup, mesh: Mesh, cutoff: float = float("inf"), memo: Memo | None = None) -> Deployed:
    """Search one mesh (TP, PP, CP, replicas); audit and predict its best plans until `top` fit, or until what the
    next could score at best is no better than `cutoff` (the `top`-th best of earlier deployments). `memo`:
    the walks, audits, predictions and variants made are kept there, and those kept already are taken from it
    (`search.memo`: the same search again with another cutoff).

    Activations (one chunk's peak) are not additive: the search caps the rest. A ranked plan that
    its own activations push over the cap is excluded; if that happens, the search runs once more
    with the largest such activations reserved, and the plans that fit from both runs are kept.
    """
    graph, cap, top, tp = s.graph, s.cap, 1 if s.every_deployment else s.top, mesh.tp
    base = s.baseline_audit(mesh)  # raises (a clear TpplanError) if the model does not split over tp
    memo = memo or Memo()
    obj: Callable[[], Objective] = functools.cache(lambda: objective_of(s, mesh))  # its pricer: made where used
    label, name_of = mesh.label(), memo.get("objective", None, lambda: obj().name)
    over = over_floor(s, mesh, memo, lambda: plan_cost(obj(), graph, base).memory)
    if over is not None:
        return Deployed([], {"every plan": over}, 0.0, 0, 0, name_of, label)
    reserve = 0.0
    kept: dict[str, RankedPlan] = {}
    excluded: dict[str, Excluded] = {}
    families = walks = 0
    # an inexact screen (`Screen`) may rank any family's best: the walk hands on every one (no more walking)
    walk_top = top if Screen.of(s, mesh).exact or s.all_plans else 2**20
    for attempt in range(2):
        limit = None if cap is None else cap - reserve
        res = memo.get("walk", reserve, lambda limit=limit: search(graph, tp, obj(), top=walk_top, memory_cap=limit,  # type: ignore[misc]
                                                                   dtype=s.dtype, per_family=not s.all_plans,
                                                                   options=s.space, audits=s.audits))  # fmt: skip
        families, walks = res.globals_searched, walks + res.walks
        worst_act, fits = 0.0, list[float]()
        for c in res.over_cap:
            name, _, _ = describe(c.glob, c.configs, s.has_moe)
            excluded.setdefault(name, Excluded(name, label, c.score, search_memory_bytes=c.memory))
        screen = Screen.of(s, mesh)  # what the walk's score says of the printed TTFT
        for c in res.candidates:
            kth = sorted(fits)[top - 1] if len(fits) >= top else None
            if screen.stops(lower_bound(s, c.score, mesh), cutoff, kth):
                break
            name, short, summary = describe(c.glob, c.configs, s.has_moe)
            plan = c.plan.with_(name=name, title=short, summary=summary)
            got = memo.get("plan", name, lambda c=c, plan=plan: _evaluated(s, plan, c.cost, mesh))  # type: ignore[misc]
            screen.learn(lower_bound(s, c.score, mesh), got)
            mem = got.prediction.memory if got.prediction is not None else None
            if cap is not None and mem is not None and mem.total > cap:
                act, why = over_cap(mem, c.memory)
                worst_act = max(worst_act, act)
                excluded[name] = Excluded(name, label, got.score, memory_bytes=mem.total, why=why)
                continue
            fits.append(got.score)
            kept.setdefault(name, got)
        if worst_act <= reserve or attempt:
            break
        reserve = worst_act
    _add_variants(s, mesh, kept, excluded, memo)
    return Deployed(list(kept.values()), excluded, reserve, families, walks, name_of, label)


def _add_variants(s: Setup, mesh: Mesh, kept: dict[str, RankedPlan], excluded: dict[str, Excluded], memo: Memo) -> None:
    """The named DP-attention plans and the kept plans under the engine's overlap, ranked beside the search's."""
    if s.dp_attention:
        for got in memo.get("dp", tuple(excluded.items()), lambda: dp_entries(s, mesh, excluded)):
            kept.setdefault(got.plan.name, got)
    if s.overlap is not None:
        ranked = list(kept.values())
        for got in memo.get("overlap", tuple(kept), lambda: overlap_entries(s, ranked, mesh)):
            kept.setdefault(got.plan.name, got)


def _evaluated(s: Setup, plan: Plan, cost: Cost, mesh: Mesh) -> RankedPlan:
    """A search candidate's plan audited and predicted on `mesh`."""
    pa = s.audits.of(plan, mesh, s.dtype)
    if not pa.legal:  # cannot happen: the search walks the audit's own propagation
        raise AssertionError(f"search returned an illegal plan {plan.name}: {[v.sentence() for v in pa.violations]}")
    return evaluate(s, pa, cost, mesh)


def _while_searching(s: Setup, grid: list[Mesh]) -> None:
    """The parent's share while forked workers search: the reference deployment's baseline and
    named plans, which the answer needs after the search (a core is idle at the grid's tail).
    A model that does not split there says so after the search, as before."""
    try:
        baseline_of(s, grid[0])
        named_of(s, grid[0])
    except TpplanError:
        pass


def _at_the_tail(s: Setup, done: list[Deployed | tuple[str, str, str]]) -> None:
    """The parent's share once a core idles at the grid's tail: the named plans' behaviours and the
    baselines at the deployments whose plans rank best so far, which the answer needs after the
    search if they stay there (each is computed once per search either way)."""
    import contextlib

    leaders = sorted((r for d in done if isinstance(d, Deployed) for r in d.entries), key=lambda r: r.score)
    for r in leaders[: s.top]:
        with contextlib.suppress(TpplanError):
            named_of(s, r.mesh)
            baseline_of(s, r.mesh)


def _name_ranked(s: Setup, ranked: list[RankedPlan], top: int) -> list[RankedPlan]:
    """The best `top` plans, a rediscovered named plan shown under its name (once per deployment).
    Named plans are matched only here, for the plans shown: it costs an audit of each named plan."""
    out: list[RankedPlan] = []
    seen: set[tuple[str, str]] = set()
    for r in ranked:
        same = named_of(s, r.mesh).get(r.behaviour)
        if same:  # the search rediscovered a named plan: show it under its name
            plan = r.plan.with_(name=same, found_by="named")
            r = replace(r, plan=plan, audit=replace(r.audit, plan=plan))
        r = replace(r, same_as_named=same)
        key = (r.plan.name, r.deployment)
        if key in seen:
            continue
        seen.add(key)
        out.append(r)
        if len(out) == top:
            break
    return out


_GRID_SETUP: Setup | None = None  # what forked grid workers search (inherited, not pickled)
Searched = Deployed | tuple[str, str, str]  # a deployment's search, or why the model does not split over it


def _search_one(mesh: Mesh, cutoff: float = float("inf"), memo: Memo | None = None) -> Searched:
    """One deployment; a model that does not split over it gives the error's (where, reason, fix),
    which, unlike the exception, crosses a process boundary."""
    assert _GRID_SETUP is not None
    try:
        return _search_deployment(_GRID_SETUP, mesh, cutoff, memo)
    except TpplanError as e:
        return (e.where, e.reason, e.fix)


def _search_kept(mesh: Mesh, cutoff: float) -> tuple[Searched, Memo]:
    """A forked worker's deployment: the search and what it computed (`search.memo`)."""
    memo = Memo()
    return _search_one(mesh, cutoff, memo), memo


def _cutoff(s: Setup, scores: list[float]) -> float:
    """The one-core search's cutoff after deployments whose kept plans scored `scores`: the `top`-th best
    (none under `every_deployment`, which keeps each deployment's best)."""
    return sorted(scores)[s.top - 1] if len(scores) >= s.top and not s.every_deployment else float("inf")


def _search_all(s: Setup, grid: list[Mesh], say: Callable[[str], None] = lambda _step: None) -> list[Searched]:
    """Every deployment's search, in grid order, each evaluating only plans that can still rank (`cutoff`: the
    `top`-th best score of the deployments before it): on as many cores as there are (forked workers, each one
    deployment; `search.pool`, `_search_forked`, which gives the same answer) when the grid has several, else
    in turn."""
    global _GRID_SETUP
    from tpplan.search.pool import fork_workers, forked_pool

    say(f"searching {len(grid)} deployment(s): {', '.join(m.label() for m in grid)}")
    _GRID_SETUP = s
    try:
        workers = fork_workers(len(grid))
        if workers:
            _before_fork(s, grid)
            with forked_pool(workers) as pool:
                if pool is not None:
                    return _search_forked(s, grid, pool, workers, say)
        out: list[Searched] = []
        scores: list[float] = []
        for i, m in enumerate(grid):
            say(f"searching {m.label()} ({i + 1} of {len(grid)})")
            got = _search_one(m, _cutoff(s, scores))
            out.append(got)
            if isinstance(got, Deployed):
                scores += [r.score for r in got.entries]
        return out
    finally:
        _GRID_SETUP = None


def _before_fork(s: Setup, grid: list[Mesh]) -> None:
    """What every forked worker inherits rather than makes: the baselines' audits, the cost model's modules."""
    import contextlib

    for m in grid:
        with contextlib.suppress(TpplanError):  # the worker for that deployment reports it
            s.baseline_audit(m)
    if s.topo is not None and s.objective == "time":  # imported once, before forking, not per worker
        import tpplan.cost.predict
        import tpplan.cost.pricing  # noqa: F401


def _search_forked(
    s: Setup, grid: list[Mesh], pool: ProcessPoolExecutor, workers: int, say: Callable[[str], None]
) -> list[Searched]:
    """The grid searched by `pool`'s workers, the one-core search's answer. A deployment goes to a worker with
    the cutoff of the deployments settled before it (never tighter than the one-core cutoff: it keeps every
    plan that one keeps, and more); the parent settles the deployments in grid order, running each one's
    search again with the one-core cutoff from the worker's memo (`search.memo`), does its own share while
    the workers search, and says progress. The settled plans' audits are added to the search's."""
    from concurrent.futures import FIRST_COMPLETED, Future, wait

    futures: list[Future[tuple[Searched, Memo]]] = []
    out: list[Searched] = []
    scores: list[float] = []
    pending: set[Future[tuple[Searched, Memo]]] = set()
    while len(out) < len(grid):
        while len(futures) < len(grid) and len(pending) < workers:
            futures.append(pool.submit(_search_kept, grid[len(futures)], _cutoff(s, scores)))
            pending.add(futures[-1])
        if len(futures) == workers or (len(futures) == len(grid) and len(pending) < workers):
            _parent_share(s, grid, out, first=len(futures) == workers and not out)
        _, pending = wait(pending, return_when=FIRST_COMPLETED)
        while len(out) < len(futures) and futures[len(out)].done():
            got = _settled(s, grid[len(out)], *futures[len(out)].result(), _cutoff(s, scores))
            out.append(got)
            scores += [r.score for r in got.entries] if isinstance(got, Deployed) else []
            say(f"searched {len(out)} of {len(grid)} deployments")
    return out


def _parent_share(s: Setup, grid: list[Mesh], done: list[Searched], first: bool) -> None:
    """The parent's work while the workers search: at the start the reference deployment's, once a core
    idles at the grid's tail the leaders' (`_while_searching`, `_at_the_tail`)."""
    if first:
        _while_searching(s, grid)
    elif done:
        _at_the_tail(s, done)


def _settled(s: Setup, mesh: Mesh, got: Searched, memo: Memo, cutoff: float) -> Searched:
    """A worker's deployment as the one-core search leaves it: searched again with `cutoff` from the
    worker's memo where the worker had a looser one; its plans' audits added to the search's."""
    if isinstance(got, Deployed) and memo.results:
        try:
            got = _search_deployment(s, mesh, cutoff, memo)
        except TpplanError as e:  # cannot happen: the worker's search of it did not raise
            got = (e.where, e.reason, e.fix)
    if isinstance(got, Deployed):
        got.entries = [replace(r, audit=s.audits.add(r.audit, s.dtype)) for r in got.entries]
    return got


def search_plans(
    graph: ModelGraph,
    topology: Topology | None,
    *,
    workload: Workload | None = None,
    ask: MeshAsk | None = None,
    memory_cap_gib: float | str | None = "serving",
    top: int = 10,
    tokens: int = 8192,
    dtype: str = "bf16",
    expert_dtype: str | None = None,
    objective: str = "time",
    all_plans: bool = False,
    dp_attention: bool = False,
    overlap: OverlapName | None = None,
    audits: Audits | None = None,
    progress: Callable[[str], None] | None = None,
    every_deployment: bool = False,
    redundant_experts: int = 0,
) -> SearchOutcome:
    """Search every deployment of `topology` (or the ones `ask` fixes), rank the plans that fit,
    and make each a plan file: the one search `tpplan search` and `tpplan report` run.

    `memory_cap_gib`: GiB per rank; "serving" (default) is SERVING_SHARE of the topology's GPU
    memory, "gpu" all of it (no cap without a topology); None is no cap. `objective`: "time"
    (predicted mean TTFT with a workload, else forward time of `tokens`; needs a topology) or
    "volume" (bytes per token per rank). `audits` (of this graph) are used and kept: pass the
    memo's to share them. `overlap` ("tbo", "dbo") also ranks every kept all-to-all plan under that
    engine's micro-batch overlap, "asynctp" every kept plan with something to fuse under async TP.
    `progress` is told each step. `ask` (`MeshAsk`; None: nothing fixed): the sizes fixed, each None to
    search it. Its `cp`: only that context-parallel size (default: CP 1 at every TP x PP split, and TP x CP
    for CP 2, 4, 8 where the model allows it).
    `cp_layers="mla"`: instead, each TP x PP split with CP inside its TP group, only the MLA layers
    token-sharded (SGLang PR #38344; `search.grid.mla_deployments`). `cp_kv`: the KV a CP rank keeps
    ("engines", default: the whole sequence's, as SGLang and vLLM do; "sharded": tpplan's own 1/cp).
    `replicas`: only that many copies of each deployment, the workload's requests split between them
    (default: 1, and with a workload and no `tp`/`pp` every replica count `deployment_grid` offers).
    `every_deployment`: each deployment's best plan (`deployment_best`) and only it, none cut off by the
    plans of earlier ones, so `ranked` holds each deployment's best (the search under targets serves them).
    `redundant_experts`: copies beside the routed experts in every EP and all-to-all plan searched (SGLang's
    --ep-num-redundant-experts, `tpplan.engines.redundant_experts`); TP-MoE plans hold none."""
    say = progress or (lambda _step: None)
    t0 = time.perf_counter()
    ask = ask or MeshAsk()
    _check(topology, workload, memory_cap_gib, top, tokens, expert_dtype, objective)
    cap_gib = memory_cap_gib_of(memory_cap_gib, topology)
    kept = audits if audits is not None and audits.graph is graph else Audits(graph)
    s = Setup(graph, topology, workload, cap_gib * GIB if cap_gib is not None else None, memory_cap_gib, objective,
               tokens, dtype, expert_dtype, top, all_plans, dp_attention, kept, overlap=overlap,
               cp_layers=ask.cp_layers, cp_kv=ask.cp_kv, every_deployment=every_deployment,
               redundant_experts=redundant_experts)  # fmt: skip
    _check_asked(s, ask)
    grid = search_grid(graph, topology, ask, workload, objective)
    _check_copies(s, grid)
    searched = _search_all(s, grid, say)
    return _outcome(s, ask, grid, searched, time.perf_counter() - t0, say)


def _check_asked(s: Setup, ask: MeshAsk) -> None:
    """The checks that need the model or the sizes asked for, before any search runs (TpplanError: exit 2):
    an engine overlap the model cannot run, redundant experts without experts, and sizes ranking by volume
    cannot price (pipeline stages, replicas and CP change time, not bytes per token)."""
    overlap, redundant_experts, objective = s.overlap, s.redundant_experts, s.objective
    if overlap is not None and overlap != "asynctp":  # async TP: per plan and TP size, in overlap_entries
        from tpplan.engines import overlap_named

        engine = overlap_named(overlap)
        why = engine.refusal(s.graph.spec.model_type)
        if why is not None:
            raise TpplanError(f"overlap={overlap}",
                              f"{engine.engine} does not overlap micro-batches with {' '.join(engine.flags)}: {why}",
                              "search without it")  # fmt: skip
    if redundant_experts < 0:
        raise TpplanError(f"redundant_experts={redundant_experts}", "is negative", "give 0 or more")
    if redundant_experts and not s.has_moe:
        raise TpplanError(f"redundant_experts={redundant_experts}", f"{s.graph.spec.name} has no routed experts to "
                          "copy", "drop it: redundant experts apply to MoE models")  # fmt: skip
    if objective == "volume" and ask.pp not in (None, 1):
        raise TpplanError(f"pp={ask.pp}", "pipeline stages do not change bytes per token", "drop pp or rank by time")
    if objective == "volume" and ask.replicas not in (None, 1):
        raise TpplanError(f"replicas={ask.replicas}", "replicas split requests in time, not bytes per token",
                          "drop replicas or rank by time")  # fmt: skip
    if objective == "volume" and ask.cp not in (None, 1):
        raise TpplanError(f"cp={ask.cp}", "context parallelism is priced in time, not bytes per token",
                          "drop cp or rank by time")  # fmt: skip


def _check_copies(s: Setup, grid: list[Mesh]) -> None:
    """Redundant experts past every expert on every rank of the widest EP group searched (the TP size) fit
    no plan (`layout.propagate` refuses each): refused here rather than searching without them."""
    from tpplan.models.spec import MoESpec

    experts = [layer.mlp.experts for layer in s.graph.spec.layers if isinstance(layer.mlp, MoESpec)]
    most = min(experts, default=0) * (max((m.tp for m in grid), default=1) - 1)
    if s.redundant_experts > most:
        raise TpplanError(f"redundant_experts={s.redundant_experts}", f"puts more than the {min(experts)} "
                          "experts on a rank of every EP group searched", f"give at most {most}")  # fmt: skip


def _outcome(
    s: Setup, ask: MeshAsk, grid: list[Mesh], searched: list[Searched], search_s: float, say: Callable[[str], None]
) -> SearchOutcome:
    """The answer from every deployment's search (`search_s`: its seconds, the plans' checks with it): the
    ranked plans against their baselines, each deployment's best, what was excluded or skipped, the plan files."""
    results, skipped = _deployed(grid, searched, ask)
    say("pricing the best plans and their baselines")
    base, bases, shown = _against_baselines(s, grid, results)
    # each deployment's best plan, as the ranking names it: the one figure per deployment every command shows
    best_each = [_name_ranked(s, [min(d.entries, key=lambda r: r.score)], 1)[0] for d in results if d.entries]
    return SearchOutcome(
        model=s.graph.spec.name,
        graph_layer_kinds=tuple(s.graph.kinds),
        grid=tuple(grid),
        topology=s.topo,
        workload=s.wl,
        dtype=s.dtype,
        expert_dtype=s.expert_dtype,
        objective=results[0].objective,
        ranks_by_time=s.objective == "time",
        all_plans=s.all_plans,
        memory_cap=s.memory_cap,
        memory_cap_bytes=s.cap,
        reserve_bytes=max(d.reserve for d in results),
        baseline=base,
        baselines=bases,
        ranked=tuple(shown),
        deployment_best=tuple(best_each),
        excluded=tuple(e for d in results for e in d.excluded.values()),
        stats=SearchStats(
            tuple(m.label() for m in grid),
            tuple(skipped),
            sum(d.families for d in results),
            sum(d.walks for d in results),
            search_s,
        ),
        plan_files=_plan_files(s, results[0].objective, shown),
        cp_layers=ask.cp_layers,
        cp_kv=ask.cp_kv,
        router=ask.router,
    )


def _deployed(grid: list[Mesh], searched: list[Searched], ask: MeshAsk) -> tuple[list[Deployed], list[tuple[str, str]]]:
    """The deployments the model splits over, and (label, reason) for the others: a sole deployment's
    refusal, or none split over at all, is the search's error."""
    results: list[Deployed] = []
    skipped: list[tuple[str, str]] = []
    for g, got in zip(grid, searched, strict=True):
        if isinstance(got, Deployed):
            results.append(got)
            continue
        if len(grid) == 1:
            raise TpplanError(*got)
        skipped.append((g.label(), got[1]))  # a TP size the model does not split over
    if not results:
        raise TpplanError(f"tp={ask.tp} pp={ask.pp}", "the model splits over none of the deployments searched",
                          "give a tp it splits over")  # fmt: skip
    return results, skipped


def _against_baselines(
    s: Setup, grid: list[Mesh], results: list[Deployed]
) -> tuple[RankedPlan, tuple[RankedPlan, ...], list[RankedPlan]]:
    """The reference baseline (at the first deployment searched), every shown deployment's baseline, and the
    best `top` plans numbered, each beside both. Deltas compare like with like: each plan against baseline at
    its own TP x PP; what the deployment change alone does is baseline there against baseline at the reference."""
    ref = grid[[m.label() for m in grid].index(results[0].label)]
    base = baseline_of(s, ref)
    base = replace(base, same_as_named=named_of(s, base.mesh).get(base.behaviour))
    ranked = _name_ranked(s, sorted((r for d in results for r in d.entries), key=lambda r: r.score), s.top)
    shape_bases: dict[str, RankedPlan] = {base.deployment: base}
    shown: list[RankedPlan] = []
    for r in ranked:
        same = shape_bases.get(r.deployment)
        if same is None:
            same = shape_bases[r.deployment] = baseline_of(s, r.mesh)
        shown.append(replace(r, rank=len(shown) + 1, baseline=same, reference=base))
    return base, tuple(shape_bases.values()), shown


def _plan_files(s: Setup, objective: str, shown: list[RankedPlan]) -> list[PlanFile]:
    """Each shown plan as a plan file, saying what it was found for (`objective`: the name it ranked by)."""
    topology, workload = s.topo, s.wl
    found_for = {
        "topology": topology.name if topology is not None else None,
        "nodes": topology.nodes if topology is not None else None,
        "workload": workload.name if workload is not None else None,
        "dtype": s.dtype,
        "expert_dtype": s.expert_dtype,
        "objective": objective,
    }
    return [plan_file_data(r.plan, s.graph, {**found_for, "rank": r.rank, "score": r.score},
                           FileDeployment.from_mesh(r.mesh)) for r in shown]  # fmt: skip


def run_search(
    model: str | ModelGraph,
    topology: str | Topology | None,
    *,
    nodes: int | None = None,
    workload: str | Workload | None = None,
    gpu: str | None = None,
    cluster: str | None = None,
    engine: str | None = None,
    **options: Any,
) -> SearchOutcome:
    """`search_plans` for scripts and tests that have names, not objects: `model` a preset or
    config path, `topology` a preset or file (or `gpu`/`cluster`/`engine` presets, as the CLI's
    options), `nodes` its node count, `workload` a preset or file; `options` as `search_plans`, the
    asked sizes among them by name (tp=, pp=, cp=, replicas=, cp_layers=, cp_kv=, router=: `MeshAsk`'s fields)."""
    from tpplan.models.config import load_model
    from tpplan.models.graph import build_model_graph

    graph = model if isinstance(model, ModelGraph) else build_model_graph(load_model(model))
    topo: Topology | None = None
    if isinstance(topology, str) or (topology is None and (cluster or gpu or engine)):
        from tpplan.cost.topology import select_topology

        topo = select_topology(topology, nodes, gpu=gpu, cluster=cluster, engine=engine)
    elif topology is not None:
        topo = topology if nodes is None else topology.with_nodes(nodes)
    wl = workload
    if isinstance(workload, str):
        from tpplan.cost.workload import load_workload

        wl = load_workload(workload)
    asked = {k: options.pop(k) for k in ("tp", "pp", "cp", "replicas", "cp_layers", "cp_kv", "router") if k in options}
    return search_plans(graph, topo, workload=wl, ask=MeshAsk(**asked), **options)  # type: ignore[arg-type]


def search_report(model: str, topology: str | None, **kwargs: Any) -> dict[str, object]:
    """`run_search`'s JSON (docs/search-json.md): the ranked plans, baseline, exclusions, stats."""
    return run_search(model, topology, **kwargs).to_json()


__all__ = [
    "JSON_SCHEMA_VERSION",
    "SERVING_SHARE",
    "MeshAsk",
    "SearchOutcome",
    "deployment_grid",
    "deployments",
    "memory_cap_gib_of",
    "run_search",
    "search_plans",
    "search_report",
]
