"""The plans and deployments one memo compares, each a `Variant` (one plan at one deployment): the named
plans, today's deployment (`--current`), what `tpplan search` found, PP across nodes, the engines' MoE
all-to-all plans at every deployment the search searched, their micro-batch overlap (`--overlap`), and
a baseline at each deployment so every delta compares like with like."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import cast

from tpplan.audit import Audits, PlanAudit
from tpplan.cost.topology import Topology
from tpplan.errors import TpplanError
from tpplan.layout.plan import OverlapName, Plan
from tpplan.mesh import Mesh
from tpplan.models.spec import MoESpec
from tpplan.plans.files import is_plan_file, read_plan_file
from tpplan.plans.named import make_plan
from tpplan.report.results import Variant

Shape = tuple[int, int, int, int]  # (TP, PP, CP, replicas)


@dataclass(frozen=True)
class Scope:
    """What every variant of one memo shares: the audits (of the memo's graph), the main TP, the dtype and
    the layers CP shards (`--cp-layers`)."""

    audits: Audits
    n: int
    dtype: str
    cp_layers: str


@dataclass(frozen=True)
class Found:
    """One plan `tpplan search` ranked, at the TP x CP x PP it was ranked at."""

    plan: Plan
    tp: int
    pp: int
    rank: int  # 0: the best of its deployment, below the search's top plans
    cp: int = 1
    score: float | None = None  # what the search ranked it by (mean TTFT s with a workload)
    replicas: int = 1  # identical copies of the deployment, the requests split between them


def audit_or_none(audits: Audits, name: str, n: int, dtype: str) -> PlanAudit | None:
    try:
        return audits.of(make_plan(name, audits.graph, n), Mesh(n), dtype)
    except TpplanError:
        return None


def describe_plan(plan: Plan) -> str:
    """A found plan has no prose summary: say its decisions."""
    d = plan.describe()
    parts = [f"stream {d['stream']}, partial sums reduced to {d['reduce']}"]
    for key, words in (
        ("gather", "all-gather"),
        ("gather_for", "all-gather for one consumer"),
        ("a2a", "all-to-all to heads"),
        ("replicate", "replicate"),
        ("token_shard", "token-shard"),
    ):
        if d[key]:
            parts.append(f"{words}: " + ", ".join(f"`{x}`" for x in cast("list[str]", d[key])))
    parts.append(f"MoE {d['moe']}")
    return "; ".join(parts) + "."


_TP_PP = re.compile(r"(?i)\bTP(\d+)(?:\s*[x\u00d7]\s*PP(\d+))?\b")
_EP = re.compile(r"(?i)(?:^|[\s,+])EP(\d+)\b")


def parse_current(text: str) -> tuple[str, int | None, int]:
    """`--current` as (plan name, TP or None for the report's, PP): a plan name (`ep4`,
    `sp-moe+ep4`), a deployment (`TP32 EP4`, `TP32 with EP4`, `TP8xPP4`) or both
    (`sp-moe TP8xPP4`)."""
    rest, tp, pp, ep = f" {text} ", None, 1, None
    m = _TP_PP.search(rest)
    if m:
        tp, pp = int(m[1]), int(m[2] or 1)
        rest = rest[: m.start()] + " " + rest[m.end() :]
    m = _EP.search(rest)
    if m:
        ep = int(m[1])
        rest = rest[: m.start()] + " " + rest[m.end() :]
    name = re.sub(r"(?i)\bwith\b", " ", rest).strip(" ,+:/") or "baseline"
    if " " in name:
        raise TpplanError(
            f"--current {text}", f"cannot read {name!r} as one plan", "use e.g. ep4, 'TP32 EP4' or 'sp-moe TP8xPP4'"
        )
    if ep is not None:
        name = f"ep{ep}" if name == "baseline" else f"{name}+ep{ep}"
    return name, tp, pp


def current_variant(audits: Audits, text: str, n: int, world: int, dtype: str, variants: list[Variant]) -> Variant:
    """Today's deployment: an existing variant with the same plan and shape, else a new one."""
    graph = audits.graph
    name, tp, pp = parse_current(text)
    tp = tp or n
    if tp * pp > world:
        raise TpplanError(
            f"--current {text}",
            f"TP{tp} x PP{pp} needs {tp * pp} GPUs; the topology has {world}",
            "name a deployment that fits the topology (or raise --nodes)",
        )
    try:
        plan = make_plan(name, graph, tp)
    except TpplanError as exc:
        raise TpplanError(f"--current {text}", exc.reason, exc.fix) from None
    same = next((v for v in variants if v.shape == (tp, pp, 1, 1) and v.plan.describe() == plan.describe()), None)
    if same is not None:
        return same
    v = Variant(plan, tp, pp, audits.of(plan, Mesh(tp), dtype), main_tp=n)
    variants.append(v)
    return v


def plan_variants(audits: Audits, names: list[str], asked: bool, n: int, dtype: str) -> list[Variant]:
    graph = audits.graph
    variants: list[Variant] = []
    has_moe = any(isinstance(layer.mlp, MoESpec) for layer in graph.spec.layers)
    for name in names:
        if name == "baseline" or asked:
            if is_plan_file(name):  # a saved plan is priced at the whole deployment it was ranked at
                dep = read_plan_file(name).deployment
                pl = make_plan(name, graph, dep.tp)
                variants.append(Variant(pl, dep.tp, dep.pp, audits.of(pl, Mesh(dep.tp), dtype), main_tp=n, cp=dep.cp,
                                        replicas=dep.replicas, cp_layers=dep.cp_layers))  # fmt: skip
                continue
            pl = make_plan(name, graph, n)  # asked for: an unknown or impossible plan is the user's error
            variants.append(Variant(pl, n, 1, audits.of(pl, Mesh(n), dtype), main_tp=n))
            continue
        pa = audit_or_none(audits, name, n, dtype)  # a default plan this model cannot run is left out
        if pa is not None and (has_moe or pa.plan.moe == "tp"):
            variants.append(Variant(pa.plan, n, 1, pa, main_tp=n))
    return variants


def add_found(scope: Scope, variants: list[Variant], found: list[Found]) -> Found | None:
    """The search's plans joined to `variants` (each at its shape, once; a found plan equal to a memo plan
    keeps the memo's name); the search's best, under the name the memo gives it."""
    audits, n, dtype, cp_layers = scope.audits, scope.n, scope.dtype, scope.cp_layers
    best_found: Found | None = None
    for f in found:
        pl = f.plan
        shape = (f.tp, f.pp, f.cp, f.replicas)
        alike = [v for v in variants if v.shape == shape and v.plan.describe() == pl.describe()]
        if alike:
            best_found = best_found or replace(f, plan=alike[0].plan)  # under the memo's name for it
            continue  # already in the memo at that shape
        if pl.found_by == "search":  # rank 0: a deployment's best below the search's top plans
            name = f"search-{f.rank}" if f.rank else "search-best"
            pl = pl.with_(name=name, title="found by search", summary=describe_plan(pl))
        variants.append(Variant(pl, f.tp, f.pp, audits.of(pl, Mesh(f.tp), dtype), main_tp=n, cp=f.cp,
                                replicas=f.replicas, cp_layers=cp_layers))  # fmt: skip
        best_found = best_found or replace(f, plan=pl)
    return best_found


def add_pp_across_nodes(scope: Scope, variants: list[Variant], topology: Topology) -> None:
    """On several nodes at the whole cluster's TP: baseline and the MoE all-to-all plans once more at one
    node's TP with the stages across the nodes."""
    audits, n, dtype = scope.audits, scope.n, scope.dtype
    world = topology.world_size
    if not (topology.nodes > 1 and n == world and world % topology.gpus_per_node == 0):
        return
    pp_tp, pp = topology.gpus_per_node, topology.nodes
    for name in ("baseline", "sp-moe", "sglang-sp-moe"):  # one node's TP, stages across nodes; MoE a2a
        if not any(v.plan.name == name for v in variants) or any(
            v.plan.name == name and v.tp == pp_tp and v.pp == pp for v in variants
        ):
            continue
        pa = audit_or_none(audits, name, pp_tp, dtype)
        if pa is not None and pa.legal:
            variants.append(Variant(pa.plan, pp_tp, pp, pa, main_tp=n))


def add_a2a_everywhere(scope: Scope, variants: list[Variant], single: list[Shape]) -> None:
    """The engines' MoE all-to-all plans at every other deployment of the search's grid (`single`: one
    copy of each), so each deployment row ranks more than baseline (the search's best joins where it
    runs). Replicas (R copies, the requests split) are rows where the search found its best there."""
    audits, n, dtype, cp_layers = scope.audits, scope.n, scope.dtype, scope.cp_layers
    for shape in single[1:]:
        for name in ("sp-moe", "sglang-sp-moe"):
            if not any(v.plan.name == name for v in variants) or any(
                v.plan.name == name and v.shape == shape for v in variants
            ):
                continue
            pa = audit_or_none(audits, name, shape[0], dtype)
            if pa is not None and pa.legal:
                variants.append(Variant(pa.plan, shape[0], shape[1], pa, main_tp=n, cp=shape[2], replicas=shape[3],
                                        cp_layers=cp_layers))  # fmt: skip


def add_overlapped(scope: Scope, variants: list[Variant], overlap: OverlapName) -> None:
    """`--overlap`: each legal all-to-all plan once more under the engine's micro-batch overlap."""
    audits, n, dtype = scope.audits, scope.n, scope.dtype
    from tpplan.plans.named import overlapped

    for v in [v for v in variants if v.plan.moe == "a2a" and v.plan.overlap is None and v.legal]:
        pl = overlapped(v.plan, overlap, audits.graph)  # the search refused an overlap the engine does not run
        if not any(x.shape == v.shape and x.plan.describe() == pl.describe() for x in variants):
            variants.append(Variant(pl, v.tp, v.pp, audits.of(pl, Mesh(v.tp), dtype), main_tp=n, cp=v.cp,
                                    replicas=v.replicas, cp_layers=v.cp_layers))  # fmt: skip


def add_baselines(scope: Scope, variants: list[Variant], single: list[Shape]) -> None:
    """Every delta compares like with like: a baseline at each shape a plan runs at, and at every
    deployment the search searched (the deployment ranking's rows)."""
    audits, n, dtype, cp_layers = scope.audits, scope.n, scope.dtype, scope.cp_layers
    for tp_v, pp_v, cp_v, r_v in dict.fromkeys([*(v.shape for v in list(variants)), *single]):
        if not any(v.plan.name == "baseline" and v.shape == (tp_v, pp_v, cp_v, r_v) for v in variants):
            pa = audit_or_none(audits, "baseline", tp_v, dtype)
            if pa is not None:
                variants.append(Variant(pa.plan, tp_v, pp_v, pa, main_tp=n, cp=cp_v, replicas=r_v, cp_layers=cp_layers))
