"""Per-rank weight shards under a plan: each rank materialises only the slices its ops read.

The plan's propagation (`tpplan.layout.propagate.OpDecision`) says, per op, how its weight is
placed (`split`: col / row / replicated, or the MoE mode tp / ep / a2a) and where its output
lives. This module turns that into row/column ranges of the HF-named tensors:

- column-parallel linears keep their heads' rows, row-parallel ones their heads' columns; a rank
  owns heads [r*h/N, (r+1)*h/N), or, when N exceeds the heads (GQA KV heads), head r // (N/h);
- token mixers with a head-sharded output keep their heads' per-head parameters: KDA's q/k/v
  convs, A_log and dt_bias; Gated DeltaNet's fused conv, whose channels are laid out
  [q (all heads) | k (all heads) | v (all heads)], so a rank keeps three separate ranges;
- Qwen3-Next's doubled q_proj is laid out per head as [query | gate], so a head slice of rows
  keeps both halves of its heads;
- MLA's fused qkv_a (q_a_proj ++ kv_a_proj_with_mqa) is replicated or token-sharded, never cut;
- routed experts: `tp` keeps every expert's slice of the intermediate, `a2a` keeps E/N whole
  experts, `ep` keeps E/ep experts each cut over the N/ep ranks of its group;
- the embedding is vocab-parallel (rank r holds rows [r*ceil(V/N), ...)), so the first block
  reads a partial sum, as the audit assumes.

The ranges themselves are registered with each op kind and token mixer (`tpplan.models.opkinds`,
`tpplan.models.families`); `Cut` and the head arithmetic live in `tpplan.models.cuts`.
A `WeightSource` serves slices by name: from a full in-memory dict (random init) or lazily from
safetensors files, where only the requested ranges are read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch
from torch import Tensor

from tpplan.errors import TpplanError
from tpplan.layout.plan import Plan
from tpplan.layout.propagate import LayerResult, OpDecision
from tpplan.models.cuts import FULL, Cut, expert_ownership, head_cut, head_range
from tpplan.models.graph import ModelGraph, Op
from tpplan.models.opkinds import ShardCtx, op_kind
from tpplan.runtime.checkpoint_files import checkpoint_files, open_checkpoint
from tpplan.runtime.weights import Numerics, load_safetensors, normalize_names, params_for_op


class WeightSource(Protocol):
    """Serves (a slice of) a full tensor by canonical HF name."""

    def get(self, name: str, cut: Cut) -> Tensor: ...


def _apply(t: Tensor, cut: Cut) -> Tensor:
    if cut.full:
        return t
    assert cut.dim is not None
    parts = [t.narrow(cut.dim, lo, hi - lo) for lo, hi in cut.ranges]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=cut.dim)


@dataclass
class DictSource:
    """Slices of an in-memory full state dict (e.g. `random_weights`)."""

    weights: Mapping[str, Tensor]

    def get(self, name: str, cut: Cut) -> Tensor:
        return _apply(self.weights[name], cut)


@dataclass
class SafetensorsSource:
    """Reads only the requested ranges from `*.safetensors` files (safetensors only, no pickle).

    Checkpoints whose names are already canonical are read lazily, slice by slice. A checkpoint
    that uses alias spellings (stacked experts, fused KDA conv, w1/w2/w3) is loaded whole once and
    normalised (`weights.load_safetensors`), then sliced.
    """

    folder: Path
    graph: ModelGraph
    numerics: Numerics
    _index: dict[str, Path] = field(default_factory=dict)
    _full: dict[str, Tensor] | None = None

    def __post_init__(self) -> None:
        for f in checkpoint_files(self.folder):  # each checked first (issue 35)
            with open_checkpoint(f) as fh:
                for key in fh.keys():  # noqa: SIM118 - safe_open has no __iter__
                    self._index[key] = f
        if any(_aliased(name) for name in self._index):
            self._full = load_safetensors(self.folder, self.graph, self.numerics)

    def get(self, name: str, cut: Cut) -> Tensor:
        if self._full is not None:
            return _apply(self._full[name], cut)
        if name not in self._index:
            raise TpplanError(str(self.folder), f"tensor '{name}' is missing", "use a checkpoint made for this config")
        with open_checkpoint(self._index[name]) as fh:
            if cut.full or name.endswith("A_log"):  # A_log may be stored [1, 1, n, 1]: tiny, read whole
                return _apply(fh.get_tensor(name).reshape(-1) if name.endswith("A_log") else fh.get_tensor(name), cut)
            sl = fh.get_slice(name)
            parts = []
            for lo, hi in cut.ranges:
                index = (*(slice(None) for _ in range(cut.dim or 0)), slice(lo, hi))
                parts.append(sl[index])
            return parts[0] if len(parts) == 1 else torch.cat(parts, dim=cut.dim or 0)


def _aliased(name: str) -> bool:
    """True for a checkpoint spelling that `weights.normalize_names` rewrites."""
    return normalize_names({name: torch.empty(0)}).keys() != {name} if not _stacked(name) else True


def _stacked(name: str) -> bool:
    return name.endswith((".experts.gate_up_proj", ".experts.down_proj", ".self_attn.conv1d.weight"))


# ----------------------------------------------------------------------------------------------
# Cuts per op


def op_cuts(op: Op, dec: OpDecision, n: int, rank: int, numerics: Numerics, plan: Plan | None) -> dict[str, Cut]:
    """Local key (as `params_for_op` names it) -> the cut rank `rank` keeps under `plan` (its EP size; None:
    no EP); missing keys: not held."""
    spec = params_for_op(op, numerics)
    if n <= 1:
        return dict.fromkeys(spec, FULL)
    sc = ShardCtx(str(dec.split), dec.strategy.output, n, rank, plan.ep_size if plan is not None else None)
    return op_kind(op.kind).cuts(op, spec, sc)


def load_op(
    op: Op, layer: int, cuts: Mapping[str, Cut], source: WeightSource, numerics: Numerics, device: torch.device,
    dtype: torch.dtype,
) -> dict[str, Tensor]:  # fmt: skip
    """The tensors `op` reads on this rank, assembled like `executor.layer_weights` (fused, stacked)."""
    spec = params_for_op(op, numerics)
    prefix = f"model.layers.{layer}."
    got = {key: source.get(prefix + spec[key][0], cut).to(device=device, dtype=dtype) for key, cut in cuts.items()}
    return op_kind(op.kind).assemble(op, got)


@dataclass
class ModelShard:
    """Everything one rank holds: per-(layer, op) tensors, its vocab rows, and the top-level vectors."""

    rank: int
    n: int
    ops: dict[tuple[int, str], dict[str, Tensor]]
    embed: Tensor  # [rows, H]: vocab rows [vocab_lo, vocab_lo + rows)
    vocab_lo: int
    top: dict[str, Tensor]  # model.norm.weight, AttnRes output vectors

    def numel(self) -> int:
        """Elements this rank holds (for memory checks: shards, not the full model)."""
        total = self.embed.numel() + sum(t.numel() for t in self.top.values())
        return total + sum(t.numel() for w in self.ops.values() for t in w.values())


def shard_model(
    graph: ModelGraph,
    layers: list[LayerResult],
    n: int,
    rank: int,
    source: WeightSource,
    numerics: Numerics,
    *,
    plan: Plan | None = None,
    device: torch.device | None = None,
    dtype: torch.dtype = torch.float32,
) -> ModelShard:
    """Materialise rank `rank`'s shard of every op under the per-layer decisions in `layers` of `plan`
    (its EP size cuts the experts; under its DP attention every rank holds the whole embedding table)."""
    if plan is not None and plan.redundant_experts:  # the runtime deals each logical expert to one rank only
        raise TpplanError(f"plan={plan.name}", "tpplan's runtime does not hold redundant expert copies",
                          "run the plan without +redundant<r> (the planner prices it; the engines run it)")  # fmt: skip
    whole_embedding = plan is not None and bool(plan.dp_attention)
    dev = device or torch.device("cpu")
    ops: dict[tuple[int, str], dict[str, Tensor]] = {}
    for i, res in enumerate(layers):
        for dec in res.decisions:
            cuts = op_cuts(dec.op, dec, n, rank, numerics, plan)
            ops[(i, dec.op.name)] = load_op(dec.op, i, cuts, source, numerics, dev, dtype)
    vocab = graph.spec.vocab
    per = vocab if whole_embedding else -(-vocab // n)
    lo, hi = min(rank * per, vocab), min((rank + 1) * per, vocab)
    if whole_embedding:
        lo, hi = 0, vocab
    embed = source.get("model.embed_tokens.weight", Cut(0, ((lo, hi),))).to(device=dev, dtype=dtype)
    top = {"model.norm.weight": source.get("model.norm.weight", FULL).to(device=dev, dtype=dtype)}
    if graph.spec.attn_res_block_size:
        for name in ("model.output_attn_res_proj.weight", "model.output_attn_res_norm.weight"):
            top[name] = source.get(name, FULL).to(device=dev, dtype=dtype)
    return ModelShard(rank, n, ops, embed, lo, top)


__all__ = [
    "FULL",
    "Cut",
    "DictSource",
    "ModelShard",
    "SafetensorsSource",
    "WeightSource",
    "expert_ownership",
    "head_cut",
    "head_range",
    "op_cuts",
    "shard_model",
]
