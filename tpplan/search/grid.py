"""The deployments a search covers: every TP x PP (x CP) split of a topology's GPUs, and replicas of them.

`deployments` lists (TP, PP, CP) for one set of GPUs, `deployment_grid` adds the replica counts
(each a `Mesh`), `mla_deployments` the `--cp-layers mla` grid, `search_grid` is the grid one search
covers; `memory_cap_gib_of` reads the memory cap the search and the memo share. Split out of
`ranking.py` (which searches each of them) along that seam.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

from tpplan.errors import TpplanError
from tpplan.mesh import Mesh
from tpplan.models.graph import ModelGraph
from tpplan.search.results import SERVING_SHARE

if TYPE_CHECKING:
    from tpplan.cost.topology import Topology
    from tpplan.cost.workload import Workload
    from tpplan.mesh import Fabric


@dataclass(frozen=True)
class MeshAsk:
    """The deployment a search is asked for: each size fixed, or None to search it (`replicas` "all": every
    replica count the GPUs and the workload allow, `deployment_grid`), and the CP options every mesh of the
    grid is priced with (`tpplan.mesh.Mesh`), and the request router over its replicas. The CLI's
    --tp/--pp/--cp/--replicas/--cp-layers/--cp-kv/--router."""

    tp: int | None = None
    pp: int | None = None
    cp: int | None = None
    replicas: int | Literal["all"] | None = None
    cp_layers: str = "all"
    cp_kv: str = "engines"
    router: str | None = None  # what spreads the requests over the replicas (None: the engine release's default)


def deployments(graph: ModelGraph, topo: Fabric | None, ask: MeshAsk) -> list[tuple[int, int, int]]:
    """(TP, PP, CP) triples to search: the ones `ask` fixes, or every split of the topology's GPUs,
    widest TP first (the first is the reference the baseline is taken at); without `cp`, also the
    TP x CP splits without PP for CP in `CP_SIZES`, TP inside one node, where the model's mixers have
    a CP method."""
    from tpplan.layout.context_parallel import CP_SIZES, audit_cp

    tp, pp, cp = ask.tp, ask.pp, ask.cp
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
    if c > 1 and not (cpa := audit_cp(graph, Mesh(tp or 1, cp=c))).legal:
        raise TpplanError(f"cp={c}", "; ".join(cpa.reasons), "search without cp")
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
            if world % k or n < 1 or n > gpn or not audit_cp(graph, Mesh(n, cp=k)).legal:
                continue
            out.append((n, 1, k))
    return out


@dataclass(frozen=True)
class _ReplicaGpus:
    """The GPUs one of `replicas` replicas gets of a topology, as `deployments` enumerates splits of
    them: whole nodes, or a share of one node (replicas alike: `Mesh.check`)."""

    name: str
    nodes: int
    gpus_per_node: int
    world_size: int


def _replica_gpus(topo: Topology, copies: Mesh) -> _ReplicaGpus:
    """One replica's share of `topo` when `copies.replicas` replicas split it (the sizes inside a replica are
    what `deployments` then searches on that share)."""
    world, gpn, replicas = topo.world_size, topo.gpus_per_node, copies.replicas
    where = f"replicas={replicas}"
    if world % replicas:
        raise TpplanError(where, f"does not divide the topology's {world} GPUs", "use a divisor of the GPUs")
    one = world // replicas
    if gpn % one and one % gpn:
        raise TpplanError(where, f"a replica of {one} GPUs would straddle nodes of {gpn} GPUs",
                          f"use replicas of a divisor or a multiple of {gpn} GPUs")  # fmt: skip
    return _ReplicaGpus(f"{topo.name} / {replicas} replicas", max(1, one // gpn), gpn, one)


def deployment_grid(
    graph: ModelGraph, topo: Topology | None, ask: MeshAsk, workload: Workload | None = None
) -> list[Mesh]:
    """The meshes (TP, PP, CP, replicas) to search for `ask` (its CP options are the caller's to add).
    `replicas` R: R copies, each with the TP x PP (x CP) splits of
    its world / R GPUs (`deployments` of one replica's GPUs, or the one `tp`/`pp` fix). None: R = 1
    (`deployments`). "all": R = 1 and, with a workload and neither `tp` nor `pp` given, every R > 1
    that divides the GPUs into replicas placed alike, at most the workload's concurrency (every replica
    needs a client: `tpplan.cost.workload.check_replicas`); without a workload
    there are no requests to split (a replica's forward time is its deployment's). Replicas are
    asked for, not searched by default: each R is a whole second grid of walks (docs/benchmarks.md)."""
    replicas = ask.replicas
    if replicas == "all":
        return _all_replicas(graph, topo, ask, workload)
    if replicas is not None and replicas < 1:
        raise TpplanError(f"replicas={replicas}", "must be at least 1", "use replicas=1 or more")
    if replicas is not None and replicas > 1:
        if topo is None:
            raise TpplanError(f"replicas={replicas}", "replicas split a workload's requests in time: they need a "
                              "topology", "pass a topology")  # fmt: skip
        if workload is not None:
            from tpplan.cost.workload import replica_workloads

            replica_workloads(workload, Mesh(1, replicas=replicas))  # refuses more replicas than clients or requests
        share = _replica_gpus(topo, Mesh(1, replicas=replicas))
        return [Mesh(n, pp=p, cp=c, replicas=replicas) for n, p, c in deployments(graph, share, ask)]
    return [Mesh(n, pp=p, cp=c) for n, p, c in deployments(graph, topo, ask)]


def _all_replicas(graph: ModelGraph, topo: Topology | None, ask: MeshAsk, workload: Workload | None) -> list[Mesh]:
    grid = [Mesh(n, pp=p, cp=c) for n, p, c in deployments(graph, topo, ask)]
    if topo is None or workload is None or ask.tp is not None or ask.pp is not None:
        return grid
    most = min(workload.concurrency, workload.total_requests)
    for r in range(2, min(most, topo.world_size) + 1):
        try:
            share = _replica_gpus(topo, Mesh(1, replicas=r))
            grid += [Mesh(n, pp=p, cp=c, replicas=r) for n, p, c in deployments(graph, share, MeshAsk(cp=ask.cp))]
        except TpplanError:  # not a divisor, straddling nodes, or a CP size the replica cannot hold
            continue
    return grid


def mla_deployments(graph: ModelGraph, splits: list[Mesh], ask: MeshAsk) -> list[Mesh]:
    """The search's `--cp-layers mla` grid: each of `splits` (CP 1 meshes of the search's grid) with the asked
    CP (default each of CP_SIZES above 1) inside its TP group, where CP divides TP and the model has MLA layers;
    TpplanError when none is.

    Under `mla` (SGLang PR #38344's full-sequence CP, `tpplan.layout.context_parallel`) CP adds no GPU:
    TP8 x CP8 runs on the TP group's 8 GPUs, the MLA attention at TP 8/8 = 1 on 1/8 of the queries. So
    the grid is the CP 1 splits again, each with every CP size that divides its TP where the model has
    MLA layers. It is asked for (`search --cp-layers mla`), not in the default grid, as replicas and
    overlap are: each CP size is another grid of walks (K3 on 4x8 H200: 12 deployments, 9.6 s user CPU
    at load 6, against the default's 5 s), and the default grid's points would have to carry the
    layer set to hold both."""
    from tpplan.layout.context_parallel import CP_SIZES, audit_cp

    cp = ask.cp
    sizes = (cp,) if cp is not None else CP_SIZES[1:]
    legal = [replace(m, cp=k) for m in splits for k in sizes if k > 1]
    out = [m for m in legal if audit_cp(graph, replace(m, cp_layers="mla")).legal]
    if not out:
        n, k = (splits[0].tp if splits else 1), sizes[0]
        why = audit_cp(graph, Mesh(n, cp=k, cp_layers="mla")).reasons or [f"CP {k} is not above 1"]
        raise TpplanError(f"cp_layers=mla cp={cp}", "; ".join(why), "search with cp_layers=all")
    return out


def search_grid(
    graph: ModelGraph, topo: Topology | None, ask: MeshAsk, workload: Workload | None, objective: str
) -> list[Mesh]:
    """The meshes one search covers, each with `ask`'s CP options and request router: `deployment_grid`'s when
    ranking by time or with a TP size fixed (under `--cp-layers mla` its CP 1 splits, each with CP inside its TP
    group, `mla_deployments`), else every GPU of the topology in one TP group (volume)."""
    grid: list[Mesh] | None = None
    if objective == "time" or ask.tp is not None:
        mla = ask.cp_layers == "mla" and objective == "time"
        grid_cp = (1 if mla else ask.cp) if objective == "time" else 1
        grid = deployment_grid(graph, topo, replace(ask, cp=grid_cp), workload if objective == "time" else None)
        if mla:
            grid = mla_deployments(graph, grid, ask)
    if grid is None:  # volume without tp: every GPU of the topology in one TP group (as before)
        world = topo.world_size if topo is not None else 0
        if world < 1:
            raise TpplanError("tp=None", "the TP size must be at least 1", "use tp=1 or more")
        grid = [Mesh(world)]
    return [replace(m, cp_layers=ask.cp_layers, cp_kv=ask.cp_kv, router=ask.router) for m in grid]


def memory_cap_gib_of(value: float | str | None, topo: Topology | None) -> float | None:
    """The memory cap in GiB per rank: "serving" SERVING_SHARE of one GPU, "gpu" all of it (None
    without a topology), None no cap, else the number given. `search` and `report` both read it here."""
    if value in ("gpu", "serving"):
        share = 1.0 if value == "gpu" else SERVING_SHARE
        return topo.gpu.memory_GiB * share if topo is not None else None
    return float(value) if value is not None else None


__all__ = ["MeshAsk", "deployment_grid", "deployments", "memory_cap_gib_of", "mla_deployments", "search_grid"]
