"""The rows a rank's grouped expert GEMMs really compute: how many of its experts a batch reaches, and the
routed rows padded per expert to the engine's fused-MoE row tile (`tpplan.engines.fused_moe`).

At decode a batch of T tokens routes T x top_k rows over E experts, so most active experts see one or two
rows; the kernel still multiplies a whole BLOCK_SIZE_M-row tile per expert, and reads every active
expert's weights once. Pricing each expert at a 128-row tile (the GEMM table's) charged decode MoE as
compute where the engines' kernels are bound by the weights' read (issue 32)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tpplan.engines.fused_moe import RowTile, row_tile
from tpplan.engines.schema import Source

if TYPE_CHECKING:
    from tpplan.cost.kernel_models import KernelModels

# tpplan's own runtime (a recorded run re-predicted): torch._grouped_mm, whose experts model
# (`kernel_models.experts`) was fitted on the GEMM table at 128-row tiles (bench/model_fit.py).
FUSED_DECODE = "fused-moe-decode"  # what priced decode experts: the fused kernel's roofline at its row tile
RUNTIME_TILE = RowTile(128, Source("tpplan", "tpplan/bench/model_fit.py", "the experts fit's padded rows", "this tree"))


def active_experts(local: int, experts: int, top_k: int, tokens: int) -> float:
    """Expected experts of the rank's `local` reached by `tokens` tokens each routed to `top_k` distinct
    experts of `experts`, uniformly: local x (1 - (1 - top_k / experts) ** tokens). At most `local`,
    at least one when any token is routed."""
    if tokens <= 0 or local <= 0:
        return 0.0
    miss = (1.0 - min(1.0, top_k / experts)) ** tokens
    return max(1.0, local * (1.0 - miss))


@dataclass(frozen=True)
class ExpertRows:
    """One rank's grouped GEMMs: active experts, the rows routed to them, and those rows padded per expert."""

    active: int
    rows: float
    padded: int
    tile: RowTile

    @property
    def one_tile(self) -> bool:
        """Whether every active expert's rows fit one row tile: the decode regime, weight-read bound."""
        return self.rows <= self.active * self.tile.rows


def expert_rows(
    engine: str | None, local: int, experts: int, top_k: int, tokens: int, rows: float, fmt: str
) -> ExpertRows:
    """The rank's `rows` routed rows over its `local` experts for a batch of `tokens` tokens, each active
    expert's share padded to `engine`'s row tile at M = the tokens entering the rank's kernel
    (rows / top_k; every token under TP). `engine` None: tpplan's runtime (`RUNTIME_TILE`)."""
    active = max(1, round(active_experts(local, experts, top_k, tokens)))
    m = max(1, math.ceil(rows / top_k))
    tile = RUNTIME_TILE if engine is None else row_tile(engine, m, local, fmt)
    per_expert = rows / active
    padded = active * tile.rows * max(1, math.ceil(per_expert / tile.rows))
    return ExpertRows(active, rows, padded, tile)


def below_measured_rows(models: KernelModels | None, rows_per_expert: float) -> bool:
    """Whether a serving engine's experts at `rows_per_expert` lie below the rows per expert the GPU's
    experts model was measured over (its `min_rows_per_expert`). That model was fitted on tpplan's bench
    kernel (torch._grouped_mm, weights read at its own rate); below its rows, at decode, the engine runs
    its fused-MoE kernel, priced instead by the roofline: the padded rows' GEMMs or the active experts'
    weights at the HBM rate, whichever is longer."""
    c = {} if models is None else models.consts.get("experts", {})
    floor = c.get("min_rows_per_expert")
    return isinstance(floor, int | float) and rows_per_expert < floor


__all__ = ["FUSED_DECODE", "RUNTIME_TILE", "ExpertRows", "active_experts", "below_measured_rows", "expert_rows"]
