"""The collective pricer: one collective, and one communication step of the lowered program, -> its price.

- `price_collective`: (kind, bytes, group, algorithm, cluster) -> seconds and the algorithm, the one entry
  point every collective price goes through (the steps below, the P/D hand-off, the search). Order,
  first answer wins: what the cluster states about this collective (`cluster_states`: its measured
  curves, `Cluster.curves`: points per kind x algorithm x ranks; the constants `tpplan calibrate` fitted;
  the intra-node all-reduce algorithms it declares, such as NVLS), then a kernel source's measured
  collective (an engine's NCCL / custom all-reduce tables, `KernelSource.collective`, where a command
  named an engine), then the link model (ring, tree, hierarchical; its arithmetic is `cost.collectives`).
  An engine's tables thus add data where the cluster has none and never replace what it says: an
  NVLS-off cluster keeps its NVLS-off curves under `--engine` (AIC's tables are NCCL's defaults, NVLS on).
- `CollectivePricer`, the program's steps:
  - a `Collective` step: its priced bytes (nccl-tests size) on its group as the group sits on the nodes,
    through `price_collective`, times the calls it chains one after another;
  - a `LayoutCopy` step: the runtime's pack/unpack copy beside a collective, memory-bound work of its
    own (read + write of the local buffer at the HBM roofline, through a measured profile where the
    topology has one);
  - a `SendRecv` step: a pipeline-stage boundary, sent and re-gathered as the engine's PP schedule does
    (`cost.pipeline`).

The kernels between them are the compute pricer's (`cost.kernel_pricer`). Formulas and assumptions:
docs/cost-model.md ("Prediction", "Collectives").
"""

from __future__ import annotations

from collections.abc import Sequence

from tpplan.cost.collectives import CollectiveEstimate, collective_time
from tpplan.cost.compute import PROFILE, ROOFLINE
from tpplan.cost.kernel_pricer import profiled_seconds, roofline_seconds
from tpplan.cost.kernel_source import CollectiveShape, KernelSource
from tpplan.cost.pipeline import PipelineModel
from tpplan.cost.prediction import LAYOUT_COPY_KERNEL, CollectiveTime, OpTime
from tpplan.cost.topology import Topology
from tpplan.dtypes import DTYPE_BYTES
from tpplan.lower.program import Collective, LayoutCopy, SendRecv
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


class CollectivePricer:
    """Prices communication steps on `topo`'s cluster, for activations in `dtype`. `sources`: kernel
    sources whose collective tables answer where the cluster states nothing (`price_collective`); `pipeline`:
    the engine whose PP schedule decides whether a stage boundary re-gathers."""

    def __init__(
        self, topo: Topology, dtype: str, pipeline: PipelineModel, *, sources: tuple[KernelSource, ...] = ()
    ) -> None:
        self.topo, self.pipeline, self.sources = topo, pipeline, sources
        self.b = DTYPE_BYTES[dtype]
        self.hbm = topo.gpu.hbm_TBps * 1e12

    def collective(self, layer_kind: str, step: Collective) -> CollectiveTime:
        """One collective step: its priced bytes on its group as the group sits on the nodes, times the
        calls it chains one after another."""
        est = price_collective(step.kind, step.priced_bytes, step.group, self.topo, ranks_per_node=step.ranks_per_node,
                               sources=self.sources)  # fmt: skip
        return CollectiveTime(layer_kind, step.label, step.kind, step.region, step.priced_bytes,
                              est.time_s * step.chain, est.algorithm)  # fmt: skip

    def copy(self, layer_kind: str, step: LayoutCopy) -> OpTime:
        """The runtime's layout copy beside a collective: memory-bound compute of its own, bytes = read +
        write of the local buffer."""
        nbytes = step.elements * self.b
        modelled = roofline_seconds(0.0, nbytes, 1.0, self.hbm)
        secs = profiled_seconds(self.topo, LAYOUT_COPY_KERNEL, step.name, modelled)
        source = PROFILE if secs != modelled else ROOFLINE
        return OpTime(layer_kind, step.name, "layout", "elementwise", 0.0, nbytes, secs, False, None,
                      LAYOUT_COPY_KERNEL, modelled, False, source)  # fmt: skip

    def send(self, step: SendRecv) -> float:
        """A stage boundary: each TP rank sends its 1/N slice to its peer and the receivers all-gather it
        over TP, as both engines do (SGLang's send_tensor_dict and vLLM's isend_tensor_dict with
        all_gather_group; `PipelineModel.boundary_gathers`). A schedule that does not gather skips the
        all-gather when the plan keeps the stream token-sharded (`SendRecv.gather_optional`)."""
        rpn = 1 if step.cross_node else 2
        secs = price_collective("send_recv", step.bytes, 2, self.topo, ranks_per_node=rpn).time_s
        if step.gather is not None and (self.pipeline.boundary_gathers or not step.gather_optional):
            secs += self.collective("boundary", step.gather).seconds
        return secs


__all__ = ["CollectivePricer", "cluster_states", "price_collective"]
