"""Which part of a full HF tensor a TP rank keeps: index ranges, no tensors (torch-free).

The op-kind registry (`tpplan.models.opkinds`) and the families say, per op, which `Cut` of each
tensor a rank holds under a plan; `tpplan.runtime.shard` applies the cuts to real tensors. Keeping
the ranges here lets a family state its shard layout next to its weight names without torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpplan.errors import TpplanError

Ranges = tuple[tuple[int, int], ...]  # half-open index ranges along one dim, concatenated in order


@dataclass(frozen=True)
class Cut:
    """Which part of a full tensor a rank keeps: `ranges` along `dim`, or all of it (dim None)."""

    dim: int | None = None
    ranges: Ranges = ()

    @property
    def full(self) -> bool:
        return self.dim is None


FULL = Cut()


def head_range(heads: int, tp: int, rank: int) -> tuple[int, int]:
    """The heads [lo, hi) rank `rank` of `tp` ranks owns; one shared head each when TP exceeds the heads."""
    if heads % tp == 0:
        k = heads // tp
        return rank * k, (rank + 1) * k
    if tp % heads == 0:
        h = rank // (tp // heads)
        return h, h + 1
    raise TpplanError(
        f"tp={tp}", f"{heads} heads cannot be split over {tp} ranks", "use a TP size that divides the heads"
    )


def head_cut(dim: int, size: int, heads: int, tp: int, rank: int) -> Cut:
    """Rows (dim 0) or columns (dim 1) of `size` made of `heads` equal heads."""
    lo, hi = head_range(heads, tp, rank)
    per = size // heads
    return Cut(dim, ((lo * per, hi * per),))


def expert_ownership(experts: int, mode: str, tp: int, rank: int, ep_size: int | None) -> tuple[range, int, int]:
    """(experts this rank holds, its slice index and slice count of each expert's intermediate)."""
    if tp <= 1:
        return range(experts), 0, 1
    if mode == "a2a":
        per = experts // tp
        return range(rank * per, (rank + 1) * per), 0, 1
    if mode == "ep":
        ep = ep_size or 1
        inner = tp // ep
        group, part = rank // inner, rank % inner
        per = experts // ep
        return range(group * per, (group + 1) * per), part, inner
    return range(experts), rank, tp
