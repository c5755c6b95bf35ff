"""What every lowering pass reads (`Lowering`): the inputs of `lower` and what follows from them once,
the CP audit, the rank's share of the batch and the activation's size."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

from tpplan.dtypes import TORCH_DTYPE_BYTES, dtype_name
from tpplan.layout.context_parallel import CpAudit, model_split
from tpplan.layout.plan import Plan
from tpplan.layout.propagate import LayerResult
from tpplan.lower.batch import Batch, Segments, batch_pairs, local_segments
from tpplan.mesh import Mesh
from tpplan.models.graph import LayerGraph, ModelGraph


@dataclass(frozen=True)
class Lowering:
    """What every pass reads: the inputs of `lower` and what follows from them once."""

    graph: ModelGraph
    plan: Plan
    mesh: Mesh
    batch: Batch
    results: tuple[LayerResult, ...]  # propagation per layer, chained as the audit chains them
    gpus_per_node: int
    cp_audit: CpAudit  # context parallelism's per-kind exchanges (`layout.context_parallel.audit_cp`)

    @property
    def tp(self) -> int:
        return self.mesh.tp

    @property
    def token_cp(self) -> int:
        """CP ranks the tokens are split over (1 under `--cp-layers mla`: no layer's batch is split)."""
        return self.cp_audit.token_cp

    @cached_property
    def local_segments(self) -> Segments:
        """The slowest CP rank's share of the batch (the batch itself without CP)."""
        return local_segments(self.batch.segments, self.token_cp, model_split(self.cp_audit))

    @cached_property
    def tokens(self) -> int:
        """Rows a layer's ops and collectives run on: the rank's share of the batch's tokens."""
        return batch_pairs(self.local_segments)[0]

    @cached_property
    def rows(self) -> int:
        """Rows of a CP rank at the ends of the model (the final reduction, stage boundaries)."""
        return sum(math.ceil(n / self.token_cp) for n, _ in self.batch.segments)

    @property
    def act(self) -> str:
        """The activation dtype, by torch's name."""
        return dtype_name(self.batch.dtype)

    @property
    def elem_bytes(self) -> int:
        return TORCH_DTYPE_BYTES[self.act]

    @property
    def ranks_per_node(self) -> int:
        """TP ranks that share a node."""
        return min(self.tp, self.gpus_per_node)

    def layer_graph(self, index: int) -> LayerGraph:
        return self.graph.kinds[self.results[index].kind]


__all__ = ["Lowering"]
