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

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from tpplan.audit import Audits, PlanAudit
from tpplan.dtypes import WEIGHT_BITS
from tpplan.errors import TpplanError
from tpplan.layout.plan import OverlapName, Plan
from tpplan.mesh import Mesh
from tpplan.models.graph import ModelGraph
from tpplan.plans.files import Deployment as FileDeployment
from tpplan.plans.files import plan_file_data
from tpplan.search.combine import search
from tpplan.search.naming import Behaviour, behaviour, describe, named_behaviours
from tpplan.search.objectives import Cost, Objective, PredictObjective, VolumeObjective, plan_cost
from tpplan.search.results import (
    GIB,
    JSON_SCHEMA_VERSION,
    SERVING_SHARE,
    Excluded,
    RankedPlan,
    SearchOutcome,
    SearchStats,
)
from tpplan.search.results import deployment_label as _label

if TYPE_CHECKING:
    from tpplan.cost.deployment import Fabric
    from tpplan.cost.topology import Topology
    from tpplan.cost.workload import Workload


@dataclass
class _Setup:
    """One search's checked inputs, and what it keeps while it runs (audits, named behaviours)."""

    graph: ModelGraph
    topo: Topology | None
    wl: Workload | None
    cap: float | None
    memory_cap: float | str | None  # as asked
    objective: str
    tokens: int
    dtype: str
    expert_dtype: str | None
    top: int
    all_plans: bool
    dp_attention: bool
    audits: Audits
    overlap: OverlapName | None = None  # also rank each all-to-all plan under this engine overlap
    cp_layers: str = "all"  # "mla": every CP of the grid sits inside its TP group (layout.context_parallel)
    cp_kv: str = "engines"  # KV per CP rank: the engines' whole sequence, or "sharded" (1/cp)
    named: dict[int, dict[Behaviour, str]] = field(default_factory=dict)  # TP -> named plans' behaviours
    baselines: dict[Grid, RankedPlan] = field(default_factory=dict)  # (TP, PP, CP, replicas) -> baseline

    @property
    def has_moe(self) -> bool:
        """Whether the model has MoE layers (a found plan's words speak of experts only then)."""
        return any(layer.mlp.kind == "moe" for layer in self.graph.spec.layers)

    def baseline_audit(self, tp: int) -> PlanAudit:
        from tpplan.plans.named import baseline as baseline_plan

        return self.audits.of(baseline_plan(), tp, self.dtype)


def deployments(
    graph: ModelGraph, topo: Fabric | None, tp: int | None, pp: int | None, cp: int | None = None
) -> list[tuple[int, int, int]]:
    """(TP, PP, CP) triples to search: the ones asked for, or every split of the topology's GPUs,
    widest TP first (the first is the reference the baseline is taken at); without `cp`, also the
    TP x CP splits without PP for CP in `CP_SIZES`, TP inside one node, where the model's mixers have
    a CP method."""
    from tpplan.layout.context_parallel import CP_SIZES, audit_cp

    layers = graph.spec.num_layers
    if pp is not None and (pp < 1 or pp > layers):
        raise TpplanError(f"pp={pp}", f"must be between 1 and the model's {layers} layers", "use a smaller pp")
    if cp is not None and cp < 1:
        raise TpplanError(f"cp={cp}", "the CP size must be at least 1", "use cp=1 or more")
    c = cp or 1
    if topo is None:
        if pp not in (None, 1):
            raise TpplanError(f"pp={pp}", "pipeline stages need a topology to price", "pass a topology")
        if c > 1:
            raise TpplanError(f"cp={c}", "context parallelism is priced in time: it needs a topology",
                              "pass a topology")  # fmt: skip
        if tp is None or tp < 1:
            raise TpplanError(f"tp={tp}", "the TP size must be at least 1", "use tp=1 or more")
        return [(tp, 1, 1)]
    world, gpn = topo.world_size, topo.gpus_per_node
    if c > 1 and not audit_cp(graph, tp or 1, c).legal:
        raise TpplanError(f"cp={c}", "; ".join(audit_cp(graph, tp or 1, c).reasons), "search without cp")
    if world % c:
        raise TpplanError(f"cp={c}", f"does not divide the topology's {world} GPUs", "use a divisor")
    if tp is not None or pp is not None:
        p = pp or 1
        n = tp if tp is not None else world // (p * c)
        if tp is None and world % (p * c):
            raise TpplanError(f"pp={p}", f"does not divide the topology's {world} GPUs", "give tp as well")
        if n < 1:
            raise TpplanError(f"tp={n}", "the TP size must be at least 1", "use tp=1 or more")
        if n * p * c > world:
            raise TpplanError(
                f"tp={n}" + (f" pp={p}" if p > 1 else "") + (f" cp={c}" if c > 1 else ""),
                f"topology {topo.name} has only {world} GPUs ({topo.nodes} x {gpn})",
                "use a smaller tp/pp/cp or a topology with more nodes",
            )
        if n > gpn and n % gpn:
            why = f"a TP group larger than a node must fill whole nodes of {gpn} GPUs"
            raise TpplanError(f"tp={n}", why, f"use a multiple of {gpn}")
        return [(n, p, c)]
    out = []
    share = world // c
    for n in range(share, 0, -1):
        p = share // n
        if share % n or p > layers or (n > gpn and n % gpn):
            continue
        out.append((n, p, c))
    if cp is None:  # TP x CP with the TP group inside one node (CP spans the nodes); `cp` searches any split
        for k in CP_SIZES[1:]:
            n = world // k
            if world % k or n < 1 or n > gpn or not audit_cp(graph, n, k).legal:
                continue
            out.append((n, 1, k))
    return out


Grid = tuple[int, int, int, int]
"""One deployment a search covers: (TP, PP, CP, replicas)."""


@dataclass(frozen=True)
class _ReplicaGpus:
    """The GPUs one of `replicas` replicas gets of a topology, as `deployments` enumerates splits of
    them: whole nodes, or a share of one node (replicas alike: `Deployment.check`)."""

    name: str
    nodes: int
    gpus_per_node: int
    world_size: int


def _replica_gpus(topo: Topology, replicas: int) -> _ReplicaGpus:
    world, gpn = topo.world_size, topo.gpus_per_node
    where = f"replicas={replicas}"
    if world % replicas:
        raise TpplanError(where, f"does not divide the topology's {world} GPUs", "use a divisor of the GPUs")
    one = world // replicas
    if gpn % one and one % gpn:
        raise TpplanError(where, f"a replica of {one} GPUs would straddle nodes of {gpn} GPUs",
                          f"use replicas of a divisor or a multiple of {gpn} GPUs")  # fmt: skip
    return _ReplicaGpus(f"{topo.name} / {replicas} replicas", max(1, one // gpn), gpn, one)


def deployment_grid(
    graph: ModelGraph,
    topo: Topology | None,
    tp: int | None,
    pp: int | None,
    cp: int | None = None,
    replicas: int | Literal["all"] | None = None,
    workload: Workload | None = None,
) -> list[Grid]:
    """(TP, PP, CP, replicas) to search. `replicas` R: R copies, each with the TP x PP (x CP) splits of
    its world / R GPUs (`deployments` of one replica's GPUs, or the one `tp`/`pp` fix). None: R = 1
    (`deployments`). "all": R = 1 and, with a workload and neither `tp` nor `pp` given, every R > 1
    that divides the GPUs into replicas placed alike, at most the workload's concurrency (each
    replica serves its own clients: `tpplan.cost.workload.replica_workloads`); without a workload
    there are no requests to split (a replica's forward time is its deployment's). Replicas are
    asked for, not searched by default: each R is a whole second grid of walks (docs/benchmarks.md)."""
    if replicas == "all":
        return _all_replicas(graph, topo, tp, pp, cp, workload)
    if replicas is not None and replicas < 1:
        raise TpplanError(f"replicas={replicas}", "must be at least 1", "use replicas=1 or more")
    if replicas is not None and replicas > 1:
        if topo is None:
            raise TpplanError(f"replicas={replicas}", "replicas split a workload's requests in time: they need a "
                              "topology", "pass a topology")  # fmt: skip
        if workload is not None:
            from tpplan.cost.workload import replica_workloads

            replica_workloads(workload, replicas)  # refuses more replicas than clients or requests
        share = _replica_gpus(topo, replicas)
        return [(n, p, c, replicas) for n, p, c in deployments(graph, share, tp, pp, cp)]
    return [(n, p, c, 1) for n, p, c in deployments(graph, topo, tp, pp, cp)]


def _all_replicas(
    graph: ModelGraph, topo: Topology | None, tp: int | None, pp: int | None, cp: int | None, workload: Workload | None
) -> list[Grid]:
    grid = [(n, p, c, 1) for n, p, c in deployments(graph, topo, tp, pp, cp)]
    if topo is None or workload is None or tp is not None or pp is not None:
        return grid
    most = min(workload.concurrency, workload.total_requests)
    for r in range(2, min(most, topo.world_size) + 1):
        try:
            share = _replica_gpus(topo, r)
            grid += [(n, p, c, r) for n, p, c in deployments(graph, share, None, None, cp)]
        except TpplanError:  # not a divisor, straddling nodes, or a CP size the replica cannot hold
            continue
    return grid


def memory_cap_gib_of(value: float | str | None, topo: Topology | None) -> float | None:
    """The memory cap in GiB per rank: "serving" SERVING_SHARE of one GPU, "gpu" all of it (None
    without a topology), None no cap, else the number given. `search` and `report` both read it here."""
    if value in ("gpu", "serving"):
        share = 1.0 if value == "gpu" else SERVING_SHARE
        return topo.gpu.memory_GiB * share if topo is not None else None
    return float(value) if value is not None else None


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


def _evaluate(s: _Setup, pa: PlanAudit, cost: Cost, tp: int, pp: int, cp: int = 1, replicas: int = 1) -> RankedPlan:
    """One plan's result: the audit's volumes and, with a topology, `predict_plan`'s time and memory
    (the audit handed in: the prediction does not audit again)."""
    if s.topo is None:
        return RankedPlan(pa.plan, tp, pp, pa, cost, cost.score, None, behaviour(pa), cp=cp, replicas=replicas)
    from tpplan.cost.predict import predict_plan
    from tpplan.simulate.serving import with_serving_loop

    # ranked by the engine's serving loop (fixed costs, CPU overlap, PP schedule), as the memo ranks
    predict = with_serving_loop(predict_plan)
    mesh = Mesh(tp, pp=pp, replicas=replicas, cp=cp, cp_layers=s.cp_layers, cp_kv=s.cp_kv)
    pr = predict(s.graph, pa.plan, s.topo, mesh=mesh, workload=s.wl, tokens=s.tokens, dtype=s.dtype,
                 expert_dtype=s.expert_dtype, audit=pa)  # fmt: skip
    score = cost.score
    if s.objective == "time":  # what plans are ranked by: predict's own figure
        score = pr.ttft.mean_s if pr.ttft is not None else pr.forward_s
    return RankedPlan(pa.plan, tp, pp, pa, cost, score, pr, behaviour(pa), cp=cp, replicas=replicas)


@dataclass
class _Deployed:
    """What one deployment's search left: ranked plans, exclusions, stats."""

    entries: list[RankedPlan]
    excluded: dict[str, Excluded]
    reserve: float
    families: int
    walks: int
    objective: str
    label: str


def _objective(s: _Setup, tp: int, pp: int, cp: int = 1, replicas: int = 1) -> Objective:
    if s.objective == "time":
        assert s.topo is not None
        from tpplan.cost.pricing import Pricer

        pricer = Pricer(
            s.graph,
            s.topo,
            Mesh(tp, pp=pp, replicas=replicas, cp=cp, cp_layers=s.cp_layers, cp_kv=s.cp_kv),
            dtype=s.dtype,
            expert_dtype=s.expert_dtype,
            audit=s.baseline_audit(tp),
        )
        return PredictObjective(pricer, workload=s.wl, tokens=s.tokens)
    return VolumeObjective(s.dtype)


def _lower_bound(s: _Setup, score: float, pp: int) -> float:
    """What `predict_plan` can say of a plan the search scored `score`, at least: the score itself
    (forward time, volume, or TTFT without PP), or with PP the unpipelined TTFT over `pp` (a batch
    occupies a stage at least 1/pp of its trip through all of them). With a workload the ranked TTFT is
    the serving loop's, whose fixed costs only add to the idealised schedule's (taken, not proven, never
    to shorten a request's TTFT)."""
    return score / pp if s.wl is not None and pp > 1 else score


def _search_deployment(
    s: _Setup, tp: int, pp: int, cutoff: float = float("inf"), cp: int = 1, replicas: int = 1
) -> _Deployed:
    """Search one (TP, PP, CP, replicas); audit and predict its best plans until `top` fit, or until what the
    next could score at best is no better than `cutoff` (the `top`-th best of earlier deployments).

    Activations (one chunk's peak) are not additive: the search caps the rest. A ranked plan that
    its own activations push over the cap is excluded; if that happens, the search runs once more
    with the largest such activations reserved, and the plans that fit from both runs are kept.
    """
    graph, cap, top = s.graph, s.cap, s.top
    base = s.baseline_audit(tp)  # raises (a clear TpplanError) if the model does not split over tp
    obj = _objective(s, tp, pp, cp, replicas)
    label = _label(tp, pp, cp, replicas)
    if (cp > 1 or replicas > 1) and cap is not None:
        # CP keeps every CP group's TP x PP weights, a replica all of them: baseline's (no replication,
        # the least any plan holds) with KV, state and embedding is a floor on every plan's memory;
        # over the cap, none fits.
        floor = plan_cost(obj, graph, base).memory
        if floor > cap:
            over = Excluded("every plan", label, None, search_memory_bytes=floor, why="floor")
            return _Deployed([], {"every plan": over}, 0.0, 0, 0, obj.name, label)
    reserve = 0.0
    kept: dict[str, RankedPlan] = {}
    excluded: dict[str, Excluded] = {}
    families = walks = 0
    for attempt in range(2):
        res = search(graph, tp, obj, top=top, memory_cap=None if cap is None else cap - reserve, dtype=s.dtype,
                     per_family=not s.all_plans, audits=s.audits)  # fmt: skip
        families, walks = res.globals_searched, walks + res.walks
        worst_act, fitted = 0.0, 0
        for c in res.over_cap:
            name, _, _ = describe(c.glob, c.configs, s.has_moe)
            excluded.setdefault(name, Excluded(name, label, c.score, search_memory_bytes=c.memory))
        for c in res.candidates:
            if fitted >= top or _lower_bound(s, c.score, pp) >= cutoff:
                break
            name, short, summary = describe(c.glob, c.configs, s.has_moe)
            pa = s.audits.of(c.plan.with_(name=name, title=short, summary=summary), tp, s.dtype)
            if not pa.legal:  # cannot happen: the search walks the audit's own propagation
                raise AssertionError(f"search returned an illegal plan {name}: {[v.sentence() for v in pa.violations]}")
            got = _evaluate(s, pa, c.cost, tp, pp, cp, replicas)
            mem = got.prediction.memory if got.prediction is not None else None
            if cap is not None and mem is not None and mem.total > cap:
                worst_act = max(worst_act, float(mem.activations))
                excluded[name] = Excluded(name, label, got.score, memory_bytes=mem.total, why="activations")
                continue
            fitted += 1
            kept.setdefault(name, got)
        if worst_act <= reserve or attempt:
            break
        reserve = worst_act
    if s.dp_attention:
        for got in _dp_entries(s, tp, pp, excluded, cp, replicas):
            kept.setdefault(got.plan.name, got)
    if s.overlap is not None:
        for got in _overlap_entries(s, list(kept.values()), tp, pp, cp, replicas):
            kept.setdefault(got.plan.name, got)
    return _Deployed(list(kept.values()), excluded, reserve, families, walks, obj.name, label)


def _dp_entries(
    s: _Setup, tp: int, pp: int, excluded: dict[str, Excluded], cp: int = 1, replicas: int = 1
) -> list[RankedPlan]:
    """The named DP-attention plans (docs/design.md, "DP attention"), ranked beside the search's:
    the search's space has no DP global choice, so these are scored outside it, by the figure
    ranked plans are ranked by (`predict_plan`'s time, or the audit's bytes per token, which is
    the volume objective's score), and kept only when legal and within the memory cap."""
    from tpplan.plans.named import DP_PLANS, make_plan

    out = []
    for name in DP_PLANS:
        try:
            pa = s.audits.of(make_plan(name, s.graph, tp), tp, s.dtype)
        except TpplanError:
            continue
        if not pa.legal:
            continue
        got = _evaluate(s, pa, Cost(pa.comm_bytes_per_token, pa.weight_bytes_per_rank), tp, pp, cp, replicas)
        total = got.memory_total
        if s.cap is not None and total is not None and total > s.cap:
            excluded[name] = Excluded(name, _label(tp, pp, cp, replicas), got.score, memory_bytes=total, why="memory")
            continue
        out.append(got)
    return out


def _overlap_entries(
    s: _Setup, ranked: list[RankedPlan], tp: int, pp: int, cp: int = 1, replicas: int = 1
) -> list[RankedPlan]:
    """Each kept plan with all-to-all experts once more under the engine's micro-batch overlap
    (`<plan>+tbo` / `+dbo`, docs/cost-model.md), ranked beside it: the overlap changes no byte, only
    the predicted time, so it is scored after the search, like the DP plans. Same memory. Async TP:
    `_async_tp_entries`."""
    from tpplan.plans.named import overlapped

    assert s.overlap is not None
    if s.overlap == "asynctp":
        return _async_tp_entries(s, ranked, tp, pp, cp, replicas)
    out = []
    for got in ranked:
        if got.plan.moe != "a2a" or got.plan.overlap is not None:
            continue
        plan = overlapped(got.plan, s.overlap, s.graph)
        out.append(_evaluate(s, s.audits.of(plan, tp, s.dtype), got.search_cost, tp, pp, got.cp, got.replicas))
    return out


def _async_tp_entries(
    s: _Setup, ranked: list[RankedPlan], tp: int, pp: int, cp: int, replicas: int
) -> list[RankedPlan]:
    """Each kept plan with something to fuse once more under async TP (`<plan>+asynctp`); with `--all`
    (`all_plans`) also every other plan whose fused time could beat the best so far: plans in order of
    a lower bound of their fused time (`tpplan.search.async_tp.FusableFree`) until the bound reaches
    the best, so the best fused plan of the deployment is found as brute force finds it. Only with a
    time objective and the TP group inside one NVLink node (across nodes the ops cannot reach their
    peers)."""
    from tpplan.plans.named import async_tp
    from tpplan.search.async_tp import FusableFree

    if s.objective != "time" or s.topo is None or tp > s.topo.gpus_per_node or s.topo.intra.kind != "nvlink":
        return []
    seen = {r.plan.name for r in ranked}
    out: list[RankedPlan] = []

    def fuse(plan: Plan, cost: Cost) -> float:
        """Rank `plan` fused (if it has a pair and fits the cap); its score, or infinity."""
        try:
            fused = async_tp(plan, s.graph, tp)
        except TpplanError:  # nothing to fuse in this plan
            return float("inf")
        got = _evaluate(s, s.audits.of(fused, tp, s.dtype), cost, tp, pp, cp, replicas)
        if s.cap is not None and got.memory_total is not None and got.memory_total > s.cap:
            return float("inf")
        out.append(got)
        return got.score

    if not ranked:  # fusing changes no memory: where no plan fits, no fused plan does
        return out
    best = min(r.score for r in ranked)
    for got in ranked:
        if got.plan.overlap is None:
            best = min(best, fuse(got.plan, got.search_cost))
    if not s.all_plans:  # the best of each family, fused: fast, and not a proof (docs/design.md)
        return out
    base = _objective(s, tp, pp, cp, replicas)
    bound, k = FusableFree(base, s.graph), s.top  # plans per walk, doubled while the bound allows better
    while True:
        res = search(s.graph, tp, bound, top=k, memory_cap=s.cap, dtype=s.dtype, audits=s.audits)
        for c in res.candidates:
            if _lower_bound(s, c.score, pp) >= best:
                return out
            name, short, summary = describe(c.glob, c.configs, s.has_moe)
            if name in seen:
                continue
            seen.add(name)
            pa = s.audits.of(c.plan.with_(name=name, title=short, summary=summary), tp, s.dtype)
            best = min(best, fuse(pa.plan, plan_cost(base, s.graph, pa)))
        if len(res.candidates) < k:
            return out
        k *= 2


def _while_searching(s: _Setup, grid: list[Grid]) -> None:
    """The parent's share while forked workers search: the reference deployment's baseline and
    named plans, which the answer needs after the search (a core is idle at the grid's tail).
    A model that does not split there says so after the search, as before."""
    try:
        _baseline(s, *grid[0])
        _named(s, grid[0][0])
    except TpplanError:
        pass


def _at_the_tail(s: _Setup, done: list[_Deployed | tuple[str, str, str]]) -> None:
    """The parent's share once a core idles at the grid's tail: the named plans' behaviours and the
    baselines at the deployments whose plans rank best so far, which the answer needs after the
    search if they stay there (each is computed once per search either way)."""
    import contextlib

    leaders = sorted((r for d in done if isinstance(d, _Deployed) for r in d.entries), key=lambda r: r.score)
    for r in leaders[: s.top]:
        with contextlib.suppress(TpplanError):
            _named(s, r.tp)
            _baseline(s, r.tp, r.pp, r.cp, r.replicas)


def _baseline(s: _Setup, tp: int, pp: int, cp: int = 1, replicas: int = 1) -> RankedPlan:
    """Megatron TP at this deployment, for reference (priced once per search)."""
    hit = s.baselines.get((tp, pp, cp, replicas))
    if hit is None:
        pa = s.baseline_audit(tp)
        cost = plan_cost(_objective(s, tp, pp, cp, replicas), s.graph, pa)
        hit = s.baselines[(tp, pp, cp, replicas)] = _evaluate(s, pa, cost, tp, pp, cp, replicas)
    return hit


def _named(s: _Setup, tp: int) -> dict[Behaviour, str]:
    """The named plans' behaviours at TP `tp` (computed once per search and TP)."""
    if tp not in s.named:
        s.named[tp] = named_behaviours(s.graph, tp, s.dtype, audits=s.audits)
    return s.named[tp]


def _name_ranked(s: _Setup, ranked: list[RankedPlan], top: int) -> list[RankedPlan]:
    """The best `top` plans, a rediscovered named plan shown under its name (once per deployment).
    Named plans are matched only here, for the plans shown: it costs an audit of each named plan."""
    out: list[RankedPlan] = []
    seen: set[tuple[str, str]] = set()
    for r in ranked:
        same = _named(s, r.tp).get(r.behaviour)
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


_GRID_SETUP: _Setup | None = None  # what forked grid workers search (inherited, not pickled)


def _search_one(
    n: int, p: int, cutoff: float = float("inf"), c: int = 1, r: int = 1
) -> _Deployed | tuple[str, str, str]:
    """One deployment; a model that does not split over it gives the error's (where, reason, fix),
    which, unlike the exception, crosses a process boundary."""
    assert _GRID_SETUP is not None
    try:
        return _search_deployment(_GRID_SETUP, n, p, cutoff, c, r)
    except TpplanError as e:
        return (e.where, e.reason, e.fix)


def _search_all(
    s: _Setup, grid: list[Grid], say: Callable[[str], None] = lambda _step: None
) -> list[_Deployed | tuple[str, str, str]]:
    """Every deployment's search, in grid order: on as many cores as there are (forked workers,
    each one deployment) when the grid has several, else in turn, each evaluating only plans that
    can still rank (`cutoff`: the `top`-th best score of the deployments before it). Forked
    workers inherit the baselines' audits (made before the fork) and send back their plans'."""
    global _GRID_SETUP
    import contextlib
    import multiprocessing as mp
    import os
    import threading

    _GRID_SETUP = s
    try:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        # fork only a single-threaded process (forking threads can deadlock the child)
        if min(len(grid), cores) > 1 and "fork" in mp.get_all_start_methods() and threading.active_count() == 1:
            from concurrent.futures import as_completed

            from tpplan.search.pool import forked_pool

            for n, _, _, _ in grid:  # audited here once, inherited by every worker (and the deltas after)
                with contextlib.suppress(TpplanError):  # the worker for that deployment reports it
                    s.baseline_audit(n)
            if s.topo is not None and s.objective == "time":  # imported once, before forking, not per worker
                import tpplan.cost.predict
                import tpplan.cost.pricing  # noqa: F401
            workers = min(len(grid), cores)
            with forked_pool(workers) as pool:
                futures = [pool.submit(_search_one, n, p, float("inf"), c, r) for n, p, c, r in grid]
                _while_searching(s, grid)
                for done, _ in enumerate(as_completed(futures), 1):
                    say(f"searched {done} of {len(grid)} deployments")
                    if done < len(futures) and len(futures) - done < workers:  # a core idles at the tail
                        _at_the_tail(s, [f.result() for f in futures if f.done()])
                out = [f.result() for f in futures]
            for got in out:
                if isinstance(got, _Deployed):
                    got.entries = [replace(r, audit=s.audits.add(r.audit, s.dtype)) for r in got.entries]
            return out
        out = []
        scores: list[float] = []
        for i, (n, p, c, r) in enumerate(grid):
            say(f"searching {_label(n, p, c, r)} ({i + 1} of {len(grid)})")
            cutoff = sorted(scores)[s.top - 1] if len(scores) >= s.top else float("inf")
            got = _search_one(n, p, cutoff, c, r)
            out.append(got)
            if isinstance(got, _Deployed):
                scores += [r.score for r in got.entries]
        return out
    finally:
        _GRID_SETUP = None


def search_plans(
    graph: ModelGraph,
    topology: Topology | None,
    *,
    workload: Workload | None = None,
    tp: int | None = None,
    pp: int | None = None,
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
    cp: int | None = None,
    cp_layers: str = "all",
    replicas: int | Literal["all"] | None = None,
    cp_kv: str = "engines",
) -> SearchOutcome:
    """Search every deployment of `topology` (or the one `tp`/`pp` fix), rank the plans that fit,
    and make each a plan file: the one search `tpplan search` and `tpplan report` run.

    `memory_cap_gib`: GiB per rank; "serving" (default) is SERVING_SHARE of the topology's GPU
    memory, "gpu" all of it (no cap without a topology); None is no cap. `objective`: "time"
    (predicted mean TTFT with a workload, else forward time of `tokens`; needs a topology) or
    "volume" (bytes per token per rank). `audits` (of this graph) are used and kept: pass the
    memo's to share them. `overlap` ("tbo", "dbo") also ranks every kept all-to-all plan under that
    engine's micro-batch overlap, "asynctp" every kept plan with something to fuse under async TP.
    `progress` is told each step. `cp`: only that context-parallel size (default: CP 1 at every TP x PP
    split, and TP x CP for CP 2, 4, 8 where the model allows it).
    `cp_layers="mla"`: instead, each TP x PP split with CP inside its TP group, only the MLA layers
    token-sharded (SGLang PR #38344; `search.cp_grid.mla_deployments`). `cp_kv`: the KV a CP rank keeps
    ("engines", default: the whole sequence's, as SGLang and vLLM do; "sharded": tpplan's own 1/cp).
    `replicas`: only that many copies of each deployment, the workload's requests split between them
    (default: 1, and with a workload and no `tp`/`pp` every replica count `deployment_grid` offers)."""
    say = progress or (lambda _step: None)
    t0 = time.perf_counter()
    _check(topology, workload, memory_cap_gib, top, tokens, expert_dtype, objective)
    cap_gib = memory_cap_gib_of(memory_cap_gib, topology)
    kept = audits if audits is not None and audits.graph is graph else Audits(graph)
    s = _Setup(graph, topology, workload, cap_gib * GIB if cap_gib is not None else None, memory_cap_gib, objective,
               tokens, dtype, expert_dtype, top, all_plans, dp_attention, kept, overlap=overlap,
               cp_layers=cp_layers, cp_kv=cp_kv)  # fmt: skip
    if overlap is not None and overlap != "asynctp":  # async TP: per plan and TP size, in _overlap_entries
        from tpplan.engines.overlap import overlap_named

        why = overlap_named(overlap).refusal(graph.spec.model_type)
        if why is not None:
            raise TpplanError(f"overlap={overlap}", f"{overlap_named(overlap).engine} {why}", "rank without it")
    if objective == "volume" and pp not in (None, 1):
        raise TpplanError(f"pp={pp}", "pipeline stages do not change bytes per token", "drop pp or rank by time")
    if objective == "volume" and replicas not in (None, 1):
        raise TpplanError(f"replicas={replicas}", "replicas split requests in time, not bytes per token",
                          "drop replicas or rank by time")  # fmt: skip
    if objective == "volume" and cp not in (None, 1):
        raise TpplanError(f"cp={cp}", "context parallelism is priced in time, not bytes per token",
                          "drop cp or rank by time")  # fmt: skip
    grid: list[Grid] | None = None
    if objective == "time" or tp is not None:
        mla = cp_layers == "mla" and objective == "time"
        grid = deployment_grid(graph, topology, tp, pp, (1 if mla else cp) if objective == "time" else 1, replicas,
                               workload if objective == "time" else None)  # fmt: skip
        if mla:
            from tpplan.search.cp_grid import mla_deployments

            grid = mla_deployments(graph, grid, cp)
    if grid is None:  # volume without tp: every GPU of the topology in one TP group (as before)
        grid = [(topology.world_size if topology is not None else 0, 1, 1, 1)]
        if grid[0][0] < 1:
            raise TpplanError("tp=None", "the TP size must be at least 1", "use tp=1 or more")
    results: list[_Deployed] = []
    skipped: list[tuple[str, str]] = []
    say(f"searching {len(grid)} deployment(s): {', '.join(_label(*g) for g in grid)}")
    searched = _search_all(s, grid, say)
    search_s = time.perf_counter() - t0  # every deployment's search and its plans' checks
    for g, got in zip(grid, searched, strict=True):
        if isinstance(got, _Deployed):
            results.append(got)
            continue
        if len(grid) == 1:
            raise TpplanError(*got)
        skipped.append((_label(*g), got[1]))  # a TP size the model does not split over
    if not results:
        raise TpplanError(f"tp={tp} pp={pp}", "the model splits over none of the deployments searched",
                          "give a tp it splits over")  # fmt: skip
    say("pricing the best plans and their baselines")
    ref = grid[[_label(*g) for g in grid].index(results[0].label)]
    base = _baseline(s, *ref)
    base = replace(base, same_as_named=_named(s, base.tp).get(base.behaviour))
    ranked = _name_ranked(s, sorted((r for d in results for r in d.entries), key=lambda r: r.score), top)
    # Deltas compare like with like: each plan against baseline at its own TP x PP; what the
    # deployment change alone does is baseline there against baseline at the reference deployment.
    shape_bases: dict[str, RankedPlan] = {base.deployment: base}
    shown: list[RankedPlan] = []
    for r in ranked:
        same = shape_bases.get(r.deployment)
        if same is None:
            same = shape_bases[r.deployment] = _baseline(s, r.tp, r.pp, r.cp, r.replicas)
        shown.append(replace(r, rank=len(shown) + 1, baseline=same, reference=base))
    found_for = {
        "topology": topology.name if topology is not None else None,
        "nodes": topology.nodes if topology is not None else None,
        "workload": workload.name if workload is not None else None,
        "dtype": dtype,
        "expert_dtype": expert_dtype,
        "objective": results[0].objective,
    }
    files = [plan_file_data(r.plan, graph, {**found_for, "rank": r.rank, "score": r.score},
                            FileDeployment(tp=r.tp, pp=r.pp, cp=r.cp, replicas=r.replicas, cp_layers=s.cp_layers,
                                           cp_kv=s.cp_kv)) for r in shown]  # fmt: skip
    # each deployment's best plan, as the ranking names it: the one figure per deployment every command shows
    best_each = [_name_ranked(s, [min(d.entries, key=lambda r: r.score)], 1)[0] for d in results if d.entries]
    return SearchOutcome(
        model=graph.spec.name,
        graph_layer_kinds=tuple(graph.kinds),
        grid=tuple(grid),
        topology=topology,
        workload=workload,
        dtype=dtype,
        expert_dtype=expert_dtype,
        objective=results[0].objective,
        ranks_by_time=objective == "time",
        all_plans=all_plans,
        memory_cap=memory_cap_gib,
        memory_cap_bytes=s.cap,
        reserve_bytes=max(d.reserve for d in results),
        baseline=base,
        baselines=tuple(shape_bases.values()),
        ranked=tuple(shown),
        deployment_best=tuple(best_each),
        excluded=tuple(e for d in results for e in d.excluded.values()),
        stats=SearchStats(
            tuple(_label(*g) for g in grid),
            tuple(skipped),
            sum(d.families for d in results),
            sum(d.walks for d in results),
            search_s,
        ),
        plan_files=files,
    )


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
    options), `nodes` its node count, `workload` a preset or file; `options` as `search_plans`."""
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
    return search_plans(graph, topo, workload=wl, **options)  # type: ignore[arg-type]


def search_report(model: str, topology: str | None, **kwargs: Any) -> dict[str, object]:
    """`run_search`'s JSON (docs/search-json.md): the ranked plans, baseline, exclusions, stats."""
    return run_search(model, topology, **kwargs).to_json()


__all__ = [
    "JSON_SCHEMA_VERSION",
    "SERVING_SHARE",
    "Grid",
    "SearchOutcome",
    "deployment_grid",
    "deployments",
    "memory_cap_gib_of",
    "run_search",
    "search_plans",
    "search_report",
]
