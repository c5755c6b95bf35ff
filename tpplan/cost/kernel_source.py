"""What a source of kernel prices answers: one op class at one per-rank shape, or one collective.

A GPU model prices compute from an ordered list of sources (an engine's measured database, tpplan's
own fitted physical models, the datasheet roofline); the first that answers wins. A source answers
`None` where it has nothing to say (no row, another GPU, an op class it does not know), so the next
source is asked. Every answer names where it came from and whether it left the source's measured
range, so the memo's provenance and bands can say which source priced which op class.

Shapes are per rank, in the units the kernels see: a GEMM's M is the rows one rank multiplies, an
attention's heads are the heads one rank holds, an MoE's experts/intermediate are the full model's
with the TP and EP sizes that split them (engines' MoE kernels are measured that way).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

GemmDtype = Literal["bf16", "fp8", "fp8_block", "mxfp4", "nvfp4", "int4"]
AttentionKind = Literal["mha", "mla"]
CollectiveName = Literal["all_reduce", "reduce_scatter", "all_gather", "all_to_all", "send_recv"]


@dataclass(frozen=True)
class GemmShape:
    """C[m, n] = A[m, k] @ W[k, n] on one rank, with the weight stored as `dtype`."""

    m: int
    k: int
    n: int
    dtype: GemmDtype = "bf16"


@dataclass(frozen=True)
class AttentionShape:
    """One prefill attention call on one rank: `tokens` new tokens attending to `context` cached ones
    plus themselves (causal). `heads`/`kv_heads` are the rank's; MLA gives its q/k and v head dims."""

    tokens: int
    context: int
    heads: int
    kv_heads: int
    head_dim_qk: int
    head_dim_v: int
    kind: AttentionKind = "mha"
    window: int | None = None
    batch: int = 1


@dataclass(frozen=True)
class MoeShape:
    """The routed experts of one MoE layer for `tokens` tokens (the rank's whole batch before
    dispatch), split TP `tp` x EP `ep` as the engine's MoE kernel is measured."""

    tokens: int
    hidden: int
    intermediate: int
    experts: int
    top_k: int
    tp: int
    ep: int
    dtype: GemmDtype = "bf16"


@dataclass(frozen=True)
class CollectiveShape:
    """One collective of `nbytes` (nccl-tests' size convention) on `ranks` GPUs, `ranks_per_node` of
    them per node."""

    kind: CollectiveName
    nbytes: float
    ranks: int
    ranks_per_node: int


STAND_IN = " (stand-in for {wanted})"  # appended to a source's name where rows of another format priced a shape


def stand_in(used: str, wanted: str, matching: tuple[str, ...]) -> str:
    """The suffix a source's price name carries where the rows it used (`used`, a table's format name)
    are not among those of the asked format (`matching`), so the memo can say which format priced it."""
    return "" if used in matching else STAND_IN.format(wanted=wanted)


@dataclass(frozen=True)
class KernelPrice:
    """Seconds for one call, the source that gave them, and whether the source extrapolated."""

    seconds: float
    source: str
    extrapolated: bool = False


@runtime_checkable
class KernelSource(Protocol):
    """A source of prices. Each method returns None where the source has no answer."""

    name: str

    def gemm(self, shape: GemmShape) -> KernelPrice | None: ...

    def attention(self, shape: AttentionShape) -> KernelPrice | None: ...

    def moe(self, shape: MoeShape) -> KernelPrice | None: ...

    def collective(self, shape: CollectiveShape) -> KernelPrice | None: ...


__all__ = [
    "STAND_IN",
    "AttentionShape",
    "CollectiveShape",
    "GemmShape",
    "KernelPrice",
    "KernelSource",
    "MoeShape",
    "stand_in",
]
