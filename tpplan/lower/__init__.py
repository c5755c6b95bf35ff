"""Lowering: a plan's decisions, for a mesh and a batch, as the program one rank runs (docs/design.md,
"The pivot"). `lower(graph, plan, mesh, batch) -> Program`; the passes live in `tpplan.lower.passes`,
one module per axis or rewrite, applied in the registry's order (`tpplan.lower.registry`)."""

from tpplan.lower.batch import Batch, Segments
from tpplan.lower.context import Lowering
from tpplan.lower.lowering import lower, lower_layer, lower_outline, lower_program, lowering
from tpplan.lower.program import (
    Collective,
    FusedPair,
    KernelCall,
    LayerProgram,
    LayoutCopy,
    MicroBatch,
    Program,
    SendRecv,
    StageProgram,
    Step,
)
from tpplan.lower.registry import Pass, added, passes, register

__all__ = [
    "Batch",
    "Collective",
    "FusedPair",
    "KernelCall",
    "LayerProgram",
    "LayoutCopy",
    "Lowering",
    "MicroBatch",
    "Pass",
    "Program",
    "Segments",
    "SendRecv",
    "StageProgram",
    "Step",
    "added",
    "lower",
    "lower_layer",
    "lower_outline",
    "lower_program",
    "lowering",
    "passes",
    "register",
]
