"""The collectives pricer: (kind, bytes, group, algorithm, cluster) -> seconds and the algorithm.

Order, first answer wins: what the cluster states about this collective (its measured curves,
`Cluster.curves`: points per kind x algorithm x ranks; the constants `tpplan calibrate` fitted; the
intra-node all-reduce algorithms it declares, such as NVLS), then a kernel source's measured
collective (an engine's NCCL / custom all-reduce tables, `KernelSource.collective`, where a command
named an engine), then the link model (ring, tree, hierarchical). An engine's tables thus add data
where the cluster has none and never replace what it says: an NVLS-off cluster keeps its NVLS-off
curves under `--engine` (AIC's tables are NCCL's defaults, NVLS on). The arithmetic is in
`cost.collectives`; this module is the one entry point the op pricer and the search call.
"""

from __future__ import annotations

from collections.abc import Sequence

from tpplan.cost.collectives import CollectiveEstimate, collective_time
from tpplan.cost.kernel_source import CollectiveShape, KernelSource
from tpplan.cost.topology import Topology
from tpplan.lower.sizes import bus_factor


def price_collective(
    kind: str,
    nbytes: float,
    group_size: int,
    topo: Topology,
    *,
    ranks_per_node: int | None = None,
    algorithm: str | None = None,
    sources: Sequence[KernelSource] = (),
) -> CollectiveEstimate:
    """One collective of `nbytes` (nccl-tests size) on `group_size` ranks of `topo`'s cluster."""
    rpn = ranks_per_node if ranks_per_node is not None else min(group_size, topo.gpus_per_node)
    if (
        sources
        and algorithm is None
        and group_size > 1
        and nbytes > 0
        and not cluster_states(kind, group_size, topo, rpn)
    ):
        shape = CollectiveShape(kind, float(nbytes), group_size, rpn)  # type: ignore[arg-type]  # kind: a Collective value, typed str
        for src in sources:
            price = src.collective(shape)
            if price is not None:
                collective_time(kind, nbytes, group_size, topo, ranks_per_node=rpn)  # the same checks of the group
                algbw = nbytes / price.seconds / 1e9
                busbw = algbw * bus_factor(kind, group_size)
                return CollectiveEstimate(kind, nbytes, group_size, price.seconds, price.source, algbw, busbw,
                                          {price.source: price.seconds})  # fmt: skip
    return collective_time(kind, nbytes, group_size, topo, ranks_per_node=rpn, algorithm=algorithm)


def cluster_states(kind: str, group_size: int, topo: Topology, ranks_per_node: int) -> bool:
    """Whether the cluster itself says how this collective runs on this group: a measured curve for the kind,
    group and placement, fitted constants (one node), or a declared intra-node all-reduce algorithm."""
    if any(
        c.kind == kind
        and c.ranks == group_size
        and (c.ranks_per_node or min(group_size, topo.gpus_per_node)) == ranks_per_node
        for c in topo.curves
    ):
        return True
    one_node = ranks_per_node == group_size
    if one_node and kind in topo.fitted:
        return True
    return (
        kind == "all_reduce"
        and one_node
        and any(a.min_ranks <= group_size <= (a.max_ranks or group_size) for a in topo.intra.all_reduce)
    )


__all__ = ["cluster_states", "price_collective"]
