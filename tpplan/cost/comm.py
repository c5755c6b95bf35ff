"""The collectives pricer: (kind, bytes, group, algorithm, cluster) -> seconds and the algorithm.

Order, first answer wins: a kernel source's measured collective (an engine's NCCL / custom
all-reduce tables, `KernelSource.collective`, where a command named an engine), then the
cluster's measured curves (`Cluster.curves`: points per kind x algorithm x ranks), then the
constants `tpplan calibrate` fitted, then the link model (ring, tree, hierarchical and the
declared intra-node all-reduce algorithms, fastest wins). The arithmetic is in
`cost.collectives`; this module is the one entry point the op pricer and the search call.
"""

from __future__ import annotations

from collections.abc import Sequence

from tpplan.cost.collectives import CollectiveEstimate, bus_factor, collective_time
from tpplan.cost.kernel_source import CollectiveShape, KernelSource
from tpplan.cost.topology import Topology


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
    if sources and algorithm is None and group_size > 1 and nbytes > 0:
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


__all__ = ["price_collective"]
