"""Pipeline stages: which layers each stage holds and what crosses a stage boundary per token."""

from __future__ import annotations

import math

from tpplan.errors import TpplanError
from tpplan.mesh import Mesh
from tpplan.models.graph import ModelGraph


def stage_layers(num_layers: int, mesh: Mesh) -> list[range]:
    """Contiguous layer ranges per stage of `mesh`'s PP, vLLM/SGLang's default partition: L // pp each,
    the remainder added to the stages just before the last one (the last stage also holds the head)."""
    pp = mesh.pp
    if pp < 1 or pp > num_layers:
        raise TpplanError(f"pp={pp}", f"must be between 1 and the {num_layers} layers", "choose a smaller PP size")
    sizes = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        sizes[-i] += 1
    out, start = [], 0
    for s in sizes:
        out.append(range(start, start + s))
        start += s
    return out


def bank_snapshots(graph: ModelGraph, layer: int) -> int:
    """K3 attention-residual snapshots held before `layer` (0-based): one per block started
    before it (a snapshot is taken at layers 0, B, 2B, ...)."""
    block = graph.spec.attn_res_block_size
    if not block or layer <= 0:
        return 0
    return math.ceil(layer / block)


def stage_boundary_width(graph: ModelGraph, layer: int) -> int:
    """Features per token that cross into a stage starting at `layer`. Both engines send
    `hidden_states` and `residual` (2H); with attention residuals (Kimi-K3) they send the stream with
    its residual folded in (H) and the attention-residual bank, one H-wide snapshot per block started
    so far (SGLang 0.5.23 `KimiK3LinearModel.forward`: `residual_batch.fold` + `to_pp` and
    `attn_res_bank`; vLLM 0.33.0 `KimiLinearModel.forward`: hidden_states + prefix sum, and the bank
    as `residual`; `tpplan.engines` cites both)."""
    bank = bank_snapshots(graph, layer)
    return (1 + bank) * graph.hidden if graph.spec.attn_res_block_size else 2 * graph.hidden


__all__ = ["bank_snapshots", "stage_boundary_width", "stage_layers"]
