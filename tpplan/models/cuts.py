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


def head_range(heads: int, shards: int, rank: int) -> tuple[int, int]:
    """The heads [lo, hi) rank `rank` of the `shards` ranks an op's heads are split over owns (the TP
    ranks); one shared head each when there are more shards than heads."""
    if heads % shards == 0:
        k = heads // shards
        return rank * k, (rank + 1) * k
    if shards % heads == 0:
        h = rank // (shards // heads)
        return h, h + 1
    raise TpplanError(
        f"tp={shards}", f"{heads} heads cannot be split over {shards} ranks", "use a TP size that divides the heads"
    )


def head_cut(dim: int, size: int, heads: int, shards: int, rank: int) -> Cut:
    """Rows (dim 0) or columns (dim 1) of `size` made of `heads` equal heads, split over `shards` ranks."""
    lo, hi = head_range(heads, shards, rank)
    per = size // heads
    return Cut(dim, ((lo * per, hi * per),))


def expert_ownership(
    experts: int, mode: str, shards: int, rank: int, expert_groups: int | None
) -> tuple[range, int, int]:
    """(experts this rank holds, its slice index and slice count of each expert's intermediate).

    `shards`: the ranks the experts op is split over (the TP ranks); `expert_groups`: under `ep`, the
    groups the experts are dealt to (the plan's `ep_size`), each group slicing its experts' intermediate."""
    if shards <= 1:
        return range(experts), 0, 1
    if mode == "a2a":
        per = experts // shards
        return range(rank * per, (rank + 1) * per), 0, 1
    if mode == "ep":
        groups = expert_groups or 1
        inner = shards // groups
        group, part = rank // inner, rank % inner
        per = experts // groups
        return range(group * per, (group + 1) * per), part, inner
    return range(experts), rank, shards
