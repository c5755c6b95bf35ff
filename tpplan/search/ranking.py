"""`tpplan search`'s answer: search every deployment, re-audit and predict the ranked plans.

Deployments. With a topology and neither `--tp` nor `--pp`, every TP x PP split of the topology's
GPUs (TP x PP = nodes x GPUs per node; a TP group larger than a node fills whole nodes) is searched,
each with every EP size its TP allows (the search's MoE modes); `--tp` and/or `--pp` fix one. Plans
from all deployments are ranked together by what `predict_plan` says of them: mean TTFT (pipelined,
with a workload) or forward time. Within a deployment the search is exact for forward time at any
PP and for mean TTFT at PP 1; at PP > 1 it picks plans by the unpipelined TTFT (docs/design.md).

Memory. With a topology, the cap defaults to SERVING_SHARE (90%) of one GPU's memory (`"serving"`):
the predicted memory already holds the workload's own KV cache at its concurrency, and the rest is
what a serving engine keeps besides weights, activations and that KV cache (more KV blocks than one
wave needs, CUDA graphs, NCCL buffers, allocator slack); vLLM itself uses 0.92 of a GPU by default
(`CacheConfig.gpu_memory_utilization`, vllm/config/cache.py at 002f10e0). A plan over the cap is
never ranked; `"gpu"` caps at the whole GPU and `memory_cap_gib=None` (`--memory-cap none`) lifts
the cap. Without a topology there is no memory to fit, so no cap unless one is given. `tpplan report`
runs this same search (`run_search`). The JSON is documented in docs/search-json.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from tpplan.audit import PlanAudit, audit_plan
from tpplan.cost.provenance import provenance
from tpplan.dtypes import WEIGHT_BITS
from tpplan.errors import TpplanError
from tpplan.layout.plan import Plan
from tpplan.models.graph import ModelGraph
from tpplan.plans.files import PlanFile, plan_file_data
from tpplan.search.combine import search
from tpplan.search.naming import Behaviour, behaviour, describe, named_behaviours
from tpplan.search.objectives import Cost, Objective, PredictObjective, VolumeObjective, plan_cost
from tpplan.units import GIB, pct_change_json

if TYPE_CHECKING:
    from tpplan.cost.topology import Topology
    from tpplan.cost.workload import Workload

JSON_SCHEMA_VERSION = 3  # 3: deltas vs the same-shape baseline; weights in the stored dtype
SERVING_SHARE = 0.9  # the default memory cap: this share of one GPU (see the module docstring)


@dataclass
class SearchOutcome:
    """The report (`data`, the JSON) and, in the same order as `data["plans"]`, each ranked plan as
    the file `tpplan search --save` writes."""

    data: dict[str, Any]
    plan_files: list[PlanFile] = field(default_factory=list)
    plans: list[Plan] = field(default_factory=list)  # the ranked plans themselves, same order


@dataclass
class _Setup:
    graph: ModelGraph
    topo: Topology | None
    wl: Workload | None
    cap: float | None
    cap_gib: float | None
    objective: str
    tokens: int
    dtype: str
    expert_dtype: str | None
    top: int
    all_plans: bool
    dp_attention: bool = False  # also rank the named DP-attention plans (`_dp_entries`)


def deployments(graph: ModelGraph, topo: Topology | None, tp: int | None, pp: int | None) -> list[tuple[int, int]]:
    """(TP, PP) pairs to search: the ones asked for, or every split of the topology's GPUs,
    widest TP first (the first is the reference the baseline is taken at)."""
    layers = graph.spec.num_layers
    if pp is not None and (pp < 1 or pp > layers):
        raise TpplanError(f"--pp {pp}", f"must be between 1 and the model's {layers} layers", "pass a smaller --pp")
    if topo is None:
        if pp not in (None, 1):
            raise TpplanError(f"--pp {pp}", "pipeline stages need a topology to price", "add --topology")
        if tp is None or tp < 1:
            raise TpplanError(f"--tp {tp}", "the TP size must be at least 1", "pass --tp 1 or more")
        return [(tp, 1)]
    world, gpn = topo.world_size, topo.gpus_per_node
    if tp is not None or pp is not None:
        p = pp or 1
        n = tp if tp is not None else world // p
        if tp is None and world % p:
            raise TpplanError(f"--pp {p}", f"does not divide the topology's {world} GPUs", "pass --tp as well")
        if n < 1:
            raise TpplanError(f"--tp {n}", "the TP size must be at least 1", "pass --tp 1 or more")
        if n * p > world:
            raise TpplanError(
                f"--tp {n}" + (f" --pp {p}" if p > 1 else ""),
                f"topology {topo.name} has only {world} GPUs ({topo.nodes} x {gpn})",
                "use a smaller --tp/--pp or more --nodes",
            )
        if n > gpn and n % gpn:
            why = f"a TP group larger than a node must fill whole nodes of {gpn} GPUs"
            raise TpplanError(f"--tp {n}", why, f"use a multiple of {gpn}")
        return [(n, p)]
    out = []
    for n in range(world, 0, -1):
        p = world // n
        if world % n or p > layers or (n > gpn and n % gpn):
            continue
        out.append((n, p))
    return out


def memory_cap_gib_of(value: float | str | None, topo: Topology | None) -> float | None:
    """The memory cap in GiB per rank: "serving" SERVING_SHARE of one GPU, "gpu" all of it (None
    without a topology), None no cap, else the number given. `search` and `report` both read it here."""
    if value in ("gpu", "serving"):
        share = 1.0 if value == "gpu" else SERVING_SHARE
        return topo.gpu.memory_GiB * share if topo is not None else None
    return float(value) if value is not None else None


def _label(tp: int, pp: int) -> str:
    return f"TP{tp}" + (f"xPP{pp}" if pp > 1 else "")


def _setup(
    model: str | ModelGraph,
    topology: str | Topology | None,
    nodes: int | None,
    workload: str | Workload | None,
    memory_cap_gib: float | str | None,
    top: int,
    tokens: int,
    dtype: str,
    expert_dtype: str | None,
    objective: str,
    all_plans: bool,
    gpu: str | None = None,
    cluster: str | None = None,
    engine: str | None = None,
) -> _Setup:
    """Every input checked before any search runs (TpplanError: exit 2)."""
    from tpplan.models.config import load_model
    from tpplan.models.graph import build_model_graph

    if objective not in ("time", "volume"):
        raise TpplanError(f"--objective {objective}", "unknown objective", "choose time or volume")
    if top < 1:
        raise TpplanError(f"--top {top}", "must be at least 1", "ask for one plan or more")
    if isinstance(memory_cap_gib, str) and memory_cap_gib not in ("gpu", "serving"):
        raise TpplanError(f"--memory-cap {memory_cap_gib}", "not a size", "give GiB per rank (e.g. 140) or none")
    if isinstance(memory_cap_gib, float | int) and memory_cap_gib <= 0:
        raise TpplanError(f"--memory-cap {memory_cap_gib}", "must be positive", "give GiB per rank, e.g. 140")
    if tokens < 1:
        raise TpplanError(f"--tokens {tokens}", "must be positive", "give the batch size in tokens, e.g. 8192")
    if expert_dtype is not None and expert_dtype not in WEIGHT_BITS:
        raise TpplanError(
            f"--expert-dtype {expert_dtype}", "unknown weight dtype", f"choose one of {', '.join(WEIGHT_BITS)}"
        )
    graph = model if isinstance(model, ModelGraph) else build_model_graph(load_model(model))
    topo = wl = None
    if isinstance(topology, str) or (topology is None and (cluster or gpu or engine)):
        from tpplan.cost.topology import select_topology

        topo = select_topology(topology, nodes, gpu=gpu, cluster=cluster, engine=engine)
    elif topology is not None:
        topo = topology if nodes is None else topology.with_nodes(nodes)
    elif objective == "time" or workload:
        raise TpplanError("--topology", "predicted time needs a topology", "add --topology (e.g. h200x8-ib400)")
    if isinstance(workload, str):
        from tpplan.cost.workload import load_workload

        wl = load_workload(workload)
    else:
        wl = workload
    cap_gib = memory_cap_gib_of(memory_cap_gib, topo)
    cap = cap_gib * GIB if cap_gib is not None else None
    return _Setup(graph, topo, wl, cap, cap_gib, objective, tokens, dtype, expert_dtype, top, all_plans)


def _evaluate(
    s: _Setup, plan: Plan, pa: PlanAudit, cost: Cost, tp: int, pp: int
) -> dict[str, Any]:
    """One plan's entry: the audit's volumes and, with a topology, `predict_plan`'s time and memory."""
    entry: dict[str, Any] = {
        "rank": None,
        "name": plan.name,
        "tp": tp,
        "pp": pp,
        "deployment": _label(tp, pp),
        "title": plan.title,
        "summary": plan.summary,
        "found_by": plan.found_by,
        "same_as_named": None,  # filled in for the ranked plans (`_name_ranked`)
        "legal": pa.legal,
        "decisions": plan.describe(),
        "score": cost.score,
        "search_score": cost.score,
        "comm_bytes_per_token_per_rank": pa.comm_bytes_per_token,
        "weight_bytes_per_rank": pa.weight_bytes_per_rank,
        "replicated_extra_bytes_per_rank": pa.replicated_extra_bytes,
        "search_memory_bytes_per_rank": cost.memory,
    }
    if s.topo is not None:
        from tpplan.cost.predict import predict_plan

        pr = predict_plan(
            s.graph,
            plan,
            s.topo,
            tp=tp,
            pp=pp,
            workload=s.wl,
            tokens=s.tokens,
            dtype=s.dtype,
            expert_dtype=s.expert_dtype,
            audit=pa,
        )
        m = pr.memory
        entry["forward_s"] = pr.forward_s
        entry["ttft"] = {"mean_s": pr.ttft.mean_s, "p50_s": pr.ttft.p50_s, "max_s": pr.ttft.max_s} if pr.ttft else None
        entry["memory_bytes_per_rank"] = {**asdict(m), "total": m.total}
        # one figure: the weights of the fullest stage at this TP x PP, as the prediction holds them
        entry["weight_bytes_per_rank"], entry["replicated_extra_bytes_per_rank"] = m.weights, m.replicated_extra
        if s.objective == "time":  # what plans are ranked by: predict's own figure
            entry["score"] = pr.ttft.mean_s if pr.ttft is not None else pr.forward_s
        entry["provenance"] = pr.provenance.to_json() if pr.provenance is not None else None
    return entry


@dataclass
class _Deployed:
    """What one deployment's search left: ranked entries (with their plans), exclusions, stats."""

    entries: list[tuple[dict[str, Any], Plan, Behaviour]]
    excluded: dict[str, dict[str, Any]]
    reserve: float
    families: int
    walks: int
    objective: str
    label: str


def _objective(s: _Setup, tp: int, pp: int) -> Objective:
    if s.objective == "time":
        assert s.topo is not None
        from tpplan.cost.pricing import Pricer

        pricer = Pricer(s.graph, s.topo, tp, pp=pp, dtype=s.dtype, expert_dtype=s.expert_dtype)
        return PredictObjective(pricer, workload=s.wl, tokens=s.tokens)
    return VolumeObjective(s.dtype)


def _lower_bound(s: _Setup, score: float, pp: int) -> float:
    """What `predict_plan` can say of a plan the search scored `score`, at least: the score itself
    (forward time, volume, or TTFT without PP), or with PP the unpipelined TTFT over `pp` (a batch
    occupies a stage at least 1/pp of its trip through all of them)."""
    return score / pp if s.wl is not None and pp > 1 else score


def _search_deployment(s: _Setup, tp: int, pp: int, cutoff: float = float("inf")) -> _Deployed:
    """Search one (TP, PP); re-audit and predict its best plans until `top` fit, or until what the
    next could score at best is no better than `cutoff` (the `top`-th best of earlier deployments).

    Activations (one chunk's peak) are not additive: the search caps the rest. A ranked plan that
    its own activations push over the cap is excluded; if that happens, the search runs once more
    with the largest such activations reserved, and the plans that fit from both runs are kept.
    """
    from tpplan.plans.named import baseline as baseline_plan

    graph, cap, top = s.graph, s.cap, s.top
    obj = _objective(s, tp, pp)
    audit_plan(graph, baseline_plan(), tp, s.dtype)  # raises (a clear TpplanError) if the model does not split over tp
    reserve = 0.0
    kept: dict[str, tuple[dict[str, Any], Plan, Behaviour]] = {}
    excluded: dict[str, dict[str, Any]] = {}
    families = walks = 0
    for attempt in range(2):
        res = search(
            graph,
            tp,
            obj,
            top=top,
            memory_cap=None if cap is None else cap - reserve,
            dtype=s.dtype,
            per_family=not s.all_plans,
        )
        families, walks = res.globals_searched, walks + res.walks
        worst_act, fitted = 0.0, 0
        for c in res.over_cap:
            name, _, _ = describe(c.glob, c.configs)
            excluded.setdefault(
                name,
                {
                    "name": name,
                    "deployment": _label(tp, pp),
                    "search_memory_bytes_per_rank": c.memory,
                    "score": c.score,
                },
            )
        for c in res.candidates:
            if fitted >= top or _lower_bound(s, c.score, pp) >= cutoff:
                break
            name, short, summary = describe(c.glob, c.configs)
            plan = c.plan.with_(name=name, title=short, summary=summary)
            pa = audit_plan(graph, plan, tp, s.dtype)
            if not pa.legal:  # cannot happen: the search walks the audit's own propagation
                raise AssertionError(f"search returned an illegal plan {name}: {[v.sentence() for v in pa.violations]}")
            entry = _evaluate(s, plan, pa, c.cost, tp, pp)
            mem = entry.get("memory_bytes_per_rank")
            if cap is not None and mem is not None and mem["total"] > cap:
                worst_act = max(worst_act, float(mem["activations"]))
                excluded[name] = {
                    "name": name,
                    "deployment": _label(tp, pp),
                    "memory_bytes_per_rank": mem["total"],
                    "score": entry["score"],
                    "why": "activations",
                }
                continue
            fitted += 1
            kept.setdefault(str(entry["name"]), (entry, plan, behaviour(pa)))
        if worst_act <= reserve or attempt:
            break
        reserve = worst_act
    if s.dp_attention:
        for entry, plan, beh in _dp_entries(s, tp, pp, excluded):
            kept.setdefault(str(entry["name"]), (entry, plan, beh))
    return _Deployed(list(kept.values()), excluded, reserve, families, walks, obj.name, _label(tp, pp))


def _dp_entries(
    s: _Setup, tp: int, pp: int, excluded: dict[str, dict[str, Any]]
) -> list[tuple[dict[str, Any], Plan, Behaviour]]:
    """The named DP-attention plans (docs/design.md, "DP attention"), ranked beside the search's:
    the search's space has no DP global choice, so these are scored outside it, by the figure
    ranked plans are ranked by (`predict_plan`'s time, or the audit's bytes per token, which is
    the volume objective's score), and kept only when legal and within the memory cap."""
    from tpplan.plans.named import DP_PLANS, make_plan

    out = []
    for name in DP_PLANS:
        try:
            plan = make_plan(name, s.graph, tp)
            pa = audit_plan(s.graph, plan, tp, s.dtype)
        except TpplanError:
            continue
        if not pa.legal:
            continue
        score = pa.comm_bytes_per_token
        entry = _evaluate(s, plan, pa, Cost(score, pa.weight_bytes_per_rank), tp, pp)
        mem = entry.get("memory_bytes_per_rank")
        if s.cap is not None and mem is not None and mem["total"] > s.cap:
            excluded[name] = {"name": name, "deployment": _label(tp, pp), "memory_bytes_per_rank": mem["total"],
                              "score": entry["score"], "why": "memory"}  # fmt: skip
            continue
        out.append((entry, plan, behaviour(pa)))
    return out


def _baseline(s: _Setup, tp: int, pp: int) -> tuple[dict[str, Any], Behaviour]:
    """Megatron TP at this deployment, for reference: its entry and behaviour."""
    from tpplan.plans.named import baseline as baseline_plan

    pa = audit_plan(s.graph, baseline_plan(), tp, s.dtype)
    cost = plan_cost(_objective(s, tp, pp), s.graph, pa)
    return _evaluate(s, pa.plan, pa, cost, tp, pp), behaviour(pa)


_NAMED: dict[tuple[int, int, str], dict[Any, str]] = {}


def _named(s: _Setup, tp: int) -> dict[Any, str]:
    """The named plans' behaviours at TP `tp` (computed once per model, TP and dtype)."""
    key = (id(s.graph), tp, s.dtype)
    if key not in _NAMED:
        _NAMED[key] = named_behaviours(s.graph, tp, s.dtype)
    return _NAMED[key]


def _name_ranked(
    s: _Setup, ranked: list[tuple[dict[str, Any], Plan, Behaviour]], top: int
) -> list[tuple[dict[str, Any], Plan]]:
    """The best `top` plans, a rediscovered named plan shown under its name (once per deployment).
    Named plans are matched only here, for the plans shown: it costs an audit of each named plan."""
    out: list[tuple[dict[str, Any], Plan]] = []
    seen: set[tuple[str, str]] = set()
    for entry, plan, beh in ranked:
        same = _named(s, entry["tp"]).get(beh)
        entry["same_as_named"] = same
        if same:  # the search rediscovered a named plan: show it under its name
            plan = plan.with_(name=same, found_by="named")
            entry["name"], entry["found_by"] = same, "named"
        key = (entry["name"], entry["deployment"])
        if key in seen:
            continue
        seen.add(key)
        out.append((entry, plan))
        if len(out) == top:
            break
    return out


_GRID_SETUP: _Setup | None = None  # what forked grid workers search (inherited, not pickled)


def _search_one(n: int, p: int, cutoff: float = float("inf")) -> _Deployed | tuple[str, str, str]:
    """One deployment; a model that does not split over it gives the error's (where, reason, fix),
    which, unlike the exception, crosses a process boundary."""
    assert _GRID_SETUP is not None
    try:
        return _search_deployment(_GRID_SETUP, n, p, cutoff)
    except TpplanError as e:
        return (e.where, e.reason, e.fix)


def _search_all(
    s: _Setup, grid: list[tuple[int, int]], say: Callable[[str], None] = lambda _step: None
) -> list[_Deployed | tuple[str, str, str]]:
    """Every deployment's search, in grid order: on as many cores as there are (forked workers,
    each one deployment) when the grid has several, else in turn, each evaluating only plans that
    can still rank (`cutoff`: the `top`-th best score of the deployments before it)."""
    global _GRID_SETUP
    import multiprocessing as mp
    import os
    import threading

    _GRID_SETUP = s
    try:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        # fork only a single-threaded process (forking threads can deadlock the child)
        if min(len(grid), cores) > 1 and "fork" in mp.get_all_start_methods() and threading.active_count() == 1:
            from concurrent.futures import ProcessPoolExecutor, as_completed

            with ProcessPoolExecutor(min(len(grid), cores), mp_context=mp.get_context("fork")) as pool:
                futures = [pool.submit(_search_one, n, p) for n, p in grid]
                for done, _ in enumerate(as_completed(futures), 1):
                    say(f"searched {done} of {len(grid)} deployments")
                return [f.result() for f in futures]
        out: list[_Deployed | tuple[str, str, str]] = []
        scores: list[float] = []
        for i, (n, p) in enumerate(grid):
            say(f"searching {_label(n, p)} ({i + 1} of {len(grid)})")
            cutoff = sorted(scores)[s.top - 1] if len(scores) >= s.top else float("inf")
            got = _search_one(n, p, cutoff)
            out.append(got)
            if isinstance(got, _Deployed):
                scores += [e["score"] for e, _, _ in got.entries]
        return out
    finally:
        _GRID_SETUP = None


def _provenance(
    s: _Setup, grid: list[tuple[int, int]], objective: str, entries: list[dict[str, Any]]
) -> dict[str, object] | None:
    """How the ranked times were made (None for byte volumes, which are exact counts): the widest
    band of the shown predictions (each composed per op class and source, as the memo's), else the
    topology's for the grid."""
    if objective != "time" or s.topo is None:
        return None
    shown = [e["provenance"] for e in entries if e.get("provenance")]
    if shown:
        return max(shown, key=lambda v: float(v["band"]))
    worst = max((provenance(s.topo, n * p) for n, p in grid), key=lambda v: v.band)
    return worst.to_json()


def run_search(
    model: str | ModelGraph,
    topology: str | Topology | None,
    *,
    tp: int | None = None,
    pp: int | None = None,
    nodes: int | None = None,
    workload: str | Workload | None = None,
    memory_cap_gib: float | str | None = "serving",
    top: int = 10,
    tokens: int = 8192,
    dtype: str = "bf16",
    expert_dtype: str | None = None,
    objective: str = "time",
    all_plans: bool = False,
    progress: Callable[[str], None] | None = None,
    gpu: str | None = None,
    cluster: str | None = None,
    engine: str | None = None,
    dp_attention: bool = False,
) -> SearchOutcome:
    """Search every deployment, rank the plans that fit, and make each a plan file.

    `memory_cap_gib`: GiB per rank; "serving" (default) is SERVING_SHARE of the topology's GPU memory,
    "gpu" all of it (no cap without a topology); None is no cap. `model`, `topology` and `workload`
    are names/paths or the loaded objects (`tpplan report` passes those). `progress` is told each
    step (the CLI shows it in a terminal)."""
    say = progress or (lambda _step: None)
    t0 = time.perf_counter()
    _NAMED.clear()  # one search at a time (keys hold the graph's id, which a later graph may reuse)
    s = _setup(model, topology, nodes, workload, memory_cap_gib, top, tokens, dtype, expert_dtype, objective, all_plans,
               gpu, cluster, engine)  # fmt: skip
    s = replace(s, dp_attention=dp_attention)
    if objective == "volume" and pp not in (None, 1):
        raise TpplanError(f"--pp {pp}", "pipeline stages do not change bytes per token", "drop --pp or rank by time")
    grid = deployments(s.graph, s.topo, tp, pp) if objective == "time" or tp is not None else None
    if grid is None:  # volume without --tp: every GPU of the topology in one TP group (as before)
        grid = [(s.topo.world_size if s.topo is not None else 0, 1)]
        if grid[0][0] < 1:
            raise TpplanError("--tp", "the TP size must be at least 1", "pass --tp 1 or more")
    results: list[_Deployed] = []
    skipped: list[dict[str, Any]] = []
    say(f"searching {len(grid)} deployment(s): {', '.join(_label(n, p) for n, p in grid)}")
    searched = _search_all(s, grid, say)
    search_s = time.perf_counter() - t0  # model load, every deployment's search and its plans' checks
    for (n, p), got in zip(grid, searched, strict=True):
        if isinstance(got, _Deployed):
            results.append(got)
            continue
        if len(grid) == 1:
            raise TpplanError(*got)
        skipped.append({"deployment": _label(n, p), "why": got[1]})  # a TP size the model does not split over
    if not results:
        raise TpplanError("--tp/--pp", "the model splits over none of the deployments searched", "pass --tp")
    say("pricing the best plans and their baselines")
    ref = grid[[_label(n, p) for n, p in grid].index(results[0].label)]
    base_entry, base_behaviour = _baseline(s, *ref)
    obj_name = results[0].objective
    ranked = _name_ranked(s, sorted((e for r in results for e in r.entries), key=lambda e: e[0]["score"]), top)
    base_entry["same_as_named"] = _named(s, base_entry["tp"]).get(base_behaviour)
    plans: list[dict[str, Any]] = []
    files: list[PlanFile] = []
    ranked_plans: list[Plan] = []
    found_for = {
        "topology": s.topo.name if s.topo is not None else None,
        "nodes": s.topo.nodes if s.topo is not None else None,
        "workload": s.wl.name if s.wl is not None else None,
        "dtype": dtype,
        "expert_dtype": expert_dtype,
        "objective": obj_name,
    }
    # Deltas compare like with like: each plan against baseline at its own TP x PP; what the
    # deployment change alone does is baseline there against baseline at the reference deployment.
    shape_bases: dict[str, dict[str, Any]] = {base_entry["deployment"]: base_entry}
    for entry, plan in ranked:
        same = shape_bases.get(entry["deployment"])
        if same is None:
            same = shape_bases[entry["deployment"]] = _baseline(s, entry["tp"], entry["pp"])[0]
        entry["rank"] = len(plans) + 1
        entry["baseline_score"] = same["score"]
        entry["delta_vs_baseline_pct"] = pct_change_json(entry["score"], same["score"])
        entry["deployment_delta_pct"] = pct_change_json(same["score"], base_entry["score"])
        entry["comm_delta_vs_baseline_pct"] = pct_change_json(
            entry["comm_bytes_per_token_per_rank"], same["comm_bytes_per_token_per_rank"]
        )
        plans.append(entry)
        ranked_plans.append(plan)
        files.append(
            plan_file_data(
                plan,
                s.graph,
                {**found_for, "rank": entry["rank"], "score": entry["score"]},
                entry["tp"],
                entry["pp"],
            )
        )
    excluded = [e for r in results for e in r.excluded.values()]
    reserve = max(r.reserve for r in results)
    data: dict[str, Any] = {
        "schema_version": JSON_SCHEMA_VERSION,
        "model": s.graph.spec.name,
        "tp": grid[0][0],
        "pp": grid[0][1],
        "dtype": dtype,
        "expert_dtype": expert_dtype,
        "topology": found_for["topology"],
        "nodes": found_for["nodes"],
        "gpus_per_node": s.topo.gpus_per_node if s.topo is not None else None,
        "workload": found_for["workload"],
        "objective": obj_name,
        "score_unit": "s" if objective == "time" else "bytes per token per rank",
        "mode": "all" if all_plans else "per-family",
        "memory_cap_bytes": s.cap,
        "gpu_memory_bytes": s.topo.gpu.memory_GiB * GIB if s.topo is not None else None,
        "provenance": _provenance(s, grid, objective, [base_entry, *plans]),
        "baseline": base_entry,
        "baselines": [
            {"deployment": d, "score": e["score"], "delta_pct": pct_change_json(e["score"], base_entry["score"])}
            for d, e in shape_bases.items()
        ],
        "plans": plans,
        "excluded_over_cap": {
            "count": len(excluded),
            "reason": (
                f"memory per rank above the cap of {s.cap_gib:g} GiB"
                + (", one GPU's memory" if memory_cap_gib == "gpu" else "")
                + (f", {SERVING_SHARE:.0%} of one GPU's memory" if memory_cap_gib == "serving" else "")
                + " (weights incl. replication, KV cache, recurrent state, embedding/head, and the activations"
                f" of one chunk; {reserve / GIB:.2f} GiB reserved for them in the search)"
                if s.cap is not None
                else None
            ),
            "plans": excluded,
        },
        "search": {
            "deployments": [_label(n, p) for n, p in grid],
            "skipped": skipped,
            "families": sum(r.families for r in results),
            "walk_steps": sum(r.walks for r in results),
            "seconds": round(search_s, 3),
        },
    }
    return SearchOutcome(data, files, ranked_plans)


def search_report(model: str, topology: str | None, **kwargs: Any) -> dict[str, Any]:
    """`run_search`'s JSON (docs/search-json.md): the ranked plans, baseline, exclusions, stats."""
    return run_search(model, topology, **kwargs).data


__all__ = [
    "JSON_SCHEMA_VERSION",
    "SERVING_SHARE",
    "SearchOutcome",
    "deployments",
    "memory_cap_gib_of",
    "run_search",
    "search_report",
]
