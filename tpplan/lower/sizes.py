"""Collective sizes by nccl-tests' conventions: what one rank sends and the size a benchmark would use.

The lowering sizes its collective steps with these and the collective pricer (`tpplan.cost.collectives`)
times them, so they live below both. Sizes follow nccl-tests' "size" convention: all_reduce = the
buffer, all_gather = the gathered output, reduce_scatter = the full input, all_to_all = one rank's
whole send buffer, send_recv = the message (docs/cost-model.md).
"""

from __future__ import annotations

from tpplan.errors import TpplanError

COLLECTIVE_KINDS: tuple[str, ...] = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "send_recv")


def bus_factor(kind: str, n: int) -> float:
    """nccl-tests' busbw/algbw factor: makes busbw comparable to link speed across group sizes."""
    check_kind(kind)
    if n <= 1:
        return 0.0 if kind != "send_recv" else 1.0
    if kind == "all_reduce":
        return 2.0 * (n - 1) / n
    if kind == "send_recv":
        return 1.0
    return (n - 1) / n  # reduce_scatter, all_gather, all_to_all


def ring_volume_per_rank(kind: str, elements: float, n: int) -> float:
    """Elements (or bytes) one rank sends for a collective over a logical tensor of `elements`.

    `elements` is the logical activation T*W (docs/cost-model.md): all_reduce 2(n-1)/n,
    reduce_scatter and all_gather (n-1)/n, all_to_all (n-1)/n^2
    (each rank holds T*W/n and keeps 1/n of it), send_recv the whole message.
    """
    check_kind(kind)
    if n <= 1:
        return 0.0 if kind != "send_recv" else float(elements)
    if kind == "all_to_all":
        return (n - 1) / (n * n) * elements
    return bus_factor(kind, n) * elements


def nccl_size(kind: str, elements: float, n: int) -> float:
    """Map a logical T*W tensor to nccl-tests' size (all_to_all: the per-rank buffer)."""
    check_kind(kind)
    return elements / n if kind == "all_to_all" else float(elements)


def nccl_bytes(kind: str, sent_elements: float, n: int, dtype_bytes: float) -> float:
    """nccl-tests size in bytes of a collective in which one rank sends `sent_elements` (ring
    algorithms): the inverse of `ring_volume_per_rank`, then `nccl_size`."""
    per_logical = ring_volume_per_rank(kind, 1.0, n)
    if per_logical <= 0:
        return 0.0
    return nccl_size(kind, sent_elements / per_logical, n) * dtype_bytes


def check_kind(kind: str) -> None:
    if kind not in COLLECTIVE_KINDS:
        raise TpplanError(
            f"collective kind {kind!r}",
            "unknown collective",
            f"use one of {', '.join(COLLECTIVE_KINDS)}",
        )


__all__ = ["COLLECTIVE_KINDS", "bus_factor", "check_kind", "nccl_bytes", "nccl_size", "ring_volume_per_rank"]
