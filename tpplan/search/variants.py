"""Plans scored beside the search's own at one deployment: the named DP-attention plans, and each kept
plan under an engine's micro-batch overlap or async TP (`--dp-attention`, `--overlap`). The search's
space has none of these choices, so they are scored after it, by the same objective (`setup.evaluate`).
"""

from __future__ import annotations

from tpplan.errors import TpplanError
from tpplan.layout.plan import Plan
from tpplan.mesh import Mesh
from tpplan.search.combine import search
from tpplan.search.naming import describe
from tpplan.search.objectives import Cost, plan_cost
from tpplan.search.results import Excluded, RankedPlan
from tpplan.search.setup import Setup, evaluate, lower_bound, objective_of


def dp_entries(s: Setup, mesh: Mesh, excluded: dict[str, Excluded]) -> list[RankedPlan]:
    """The named DP-attention plans (docs/design.md, "DP attention"), ranked beside the search's:
    the search's space has no DP global choice, so these are scored outside it, by the figure
    ranked plans are ranked by (`predict_plan`'s time, or the audit's bytes per token, which is
    the volume objective's score), and kept only when legal and within the memory cap."""
    from tpplan.engines.redundant_experts import with_redundant_experts
    from tpplan.plans.named import DP_PLANS, make_plan

    tp, out = mesh.tp, []
    for name in DP_PLANS:
        try:
            plan = make_plan(name, s.graph, tp)
            if s.redundant_experts and plan.moe != "tp":  # the copies the search's EP plans hold, these too
                plan = with_redundant_experts(plan, s.redundant_experts)
            pa = s.audits.of(plan, mesh, s.dtype)
        except TpplanError:
            continue
        if not pa.legal:
            continue
        got = evaluate(s, pa, Cost(pa.comm_bytes_per_token, pa.weight_bytes_per_rank), mesh)
        total = got.memory_total
        if s.cap is not None and total is not None and total > s.cap:
            excluded[name] = Excluded(name, mesh.label(), got.score, memory_bytes=total, why="memory")
            continue
        out.append(got)
    return out


def overlap_entries(s: Setup, ranked: list[RankedPlan], mesh: Mesh) -> list[RankedPlan]:
    """Each kept plan with all-to-all experts once more under the engine's micro-batch overlap
    (`<plan>+tbo` / `+dbo`, docs/cost-model.md), ranked beside it: the overlap changes no byte, only
    the predicted time, so it is scored after the search, like the DP plans. Same memory. Async TP:
    `async_tp_entries`."""
    from tpplan.plans.named import overlapped

    assert s.overlap is not None
    if s.overlap == "asynctp":
        return async_tp_entries(s, ranked, mesh)
    out = []
    for got in ranked:
        if got.plan.moe != "a2a" or got.plan.overlap is not None:
            continue
        plan = overlapped(got.plan, s.overlap, s.graph)
        out.append(evaluate(s, s.audits.of(plan, mesh, s.dtype), got.search_cost, got.mesh))
    return out


def async_tp_entries(s: Setup, ranked: list[RankedPlan], mesh: Mesh) -> list[RankedPlan]:
    """Each kept plan with something to fuse once more under async TP (`<plan>+asynctp`); with `--all`
    (`all_plans`) also every other plan whose fused time could beat the best so far: plans in order of
    a lower bound of their fused time (`tpplan.search.async_tp.FusableFree`) until the bound reaches
    the best, so the best fused plan of the deployment is found as brute force finds it. Only with a
    time objective and the TP group inside one NVLink node (across nodes the ops cannot reach their
    peers)."""
    from tpplan.plans.named import async_tp
    from tpplan.search.async_tp import FusableFree

    tp = mesh.tp
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
        got = evaluate(s, s.audits.of(fused, mesh, s.dtype), cost, mesh)
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
    base = objective_of(s, mesh)
    bound, k = FusableFree(base, s.graph), s.top  # plans per walk, doubled while the bound allows better
    while True:
        res = search(s.graph, tp, bound, top=k, memory_cap=s.cap, dtype=s.dtype, options=s.space, audits=s.audits)
        for c in res.candidates:
            if lower_bound(s, c.score, mesh) >= best:
                return out
            name, short, summary = describe(c.glob, c.configs, s.has_moe)
            if name in seen:
                continue
            seen.add(name)
            pa = s.audits.of(c.plan.with_(name=name, title=short, summary=summary), mesh, s.dtype)
            best = min(best, fuse(pa.plan, plan_cost(base, s.graph, pa)))
        if len(res.candidates) < k:
            return out
        k *= 2


__all__ = ["async_tp_entries", "dp_entries", "overlap_entries"]
