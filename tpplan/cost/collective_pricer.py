"""The collective pricer: one communication step of the lowered program (`tpplan.lower`) -> its price.

- a `Collective` step: its priced bytes (nccl-tests size) on its group as the group sits on the nodes,
  through the cluster's curves, an engine's collective tables and the link model
  (`cost.comm.price_collective`), times the calls it chains one after another;
- a `LayoutCopy` step: the runtime's pack/unpack copy beside a collective, memory-bound work of its
  own (read + write of the local buffer at the HBM roofline, through a measured profile where the
  topology has one);
- a `SendRecv` step: a pipeline-stage boundary, sent and re-gathered as the engine's PP schedule does
  (`cost.pipeline`).

The kernels between them are the compute pricer's (`cost.kernel_pricer`). Formulas and assumptions:
docs/cost-model.md ("Prediction", "Collectives").
"""

from __future__ import annotations

from tpplan.cost.comm import price_collective
from tpplan.cost.compute import PROFILE, ROOFLINE
from tpplan.cost.kernel_pricer import profiled_seconds, roofline_seconds
from tpplan.cost.kernel_source import KernelSource
from tpplan.cost.pipeline import PipelineModel
from tpplan.cost.prediction import LAYOUT_COPY_KERNEL, CollectiveTime, OpTime
from tpplan.cost.topology import Topology
from tpplan.dtypes import DTYPE_BYTES
from tpplan.lower.program import Collective, LayoutCopy, SendRecv


class CollectivePricer:
    """Prices communication steps on `topo`'s cluster, for activations in `dtype`. `sources`: kernel
    sources whose collective tables answer where the cluster states nothing (`cost.comm`); `pipeline`:
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


__all__ = ["CollectivePricer"]
