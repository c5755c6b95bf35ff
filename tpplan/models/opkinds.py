"""Op kinds registered once: rule, cost class, weight names, shard cuts and reference kernel.

Every `OpKind` of the layer graph has one `OpKindDef` here, and every token mixer (the `impl` of a
TOKEN_MIX op: MLA, GQA, KDA, Gated DeltaNet, short conv, ...) one `Mixer`, registered by the family
module that introduces it (`tpplan.models.families`). The planner (placement rules, audit, cost)
and the runtime (weights, shards, executor) look ops up here instead of dispatching on the kind in
if-chains, so a new op kind or mixer is written in one place.

This module is torch-free: `params` and `cuts` are names, shapes and index ranges; `run` receives
the runtime's kernel module `K` (`tpplan.runtime.kernels`, whose kernels hold their own GPU fast
paths) from the executor; `assemble` imports torch lazily. Importing it never imports the runtime.

The types are `models/opkind_types.py`, the per-kind definitions and their table
`models/opkind_defs.py`; this module re-exports them and holds the look-ups.
"""

from __future__ import annotations

from tpplan.models.numerics import Numerics
from tpplan.models.opkind_defs import OP_KINDS, run_experts
from tpplan.models.opkind_types import (
    COST_CLASSES,
    TRUE,
    Cuts,
    ExpertShare,
    Kernels,
    Mixer,
    OpKindDef,
    Params,
    RankCtx,
    RunCtx,
    RunFn,
    Shape,
    ShardCtx,
    State,
    Strategy,
    Tensor,
    Weights,
    mixer,
    mixer_names,
    register_mixer,
)
from tpplan.models.ops import Op, OpKind, WeightSplit


def op_kind(kind: OpKind) -> OpKindDef:
    """The registered definition of `kind`."""
    return OP_KINDS[kind]


def cost_class(op: Op) -> str:
    """How the cost model prices `op` (one of COST_CLASSES)."""
    return OP_KINDS[op.kind].cost(op)


def kernel_key(op: Op, moe_split: str | None = None) -> str | None:
    """The kernel class of an op, as `GpuSpec.kernel_profiles` keys it; None for plain GEMMs.

    GEMMs have their own measured shape table. Every other op kind is one class (attention and
    recurrences by implementation: an MLA prefill and a KDA scan are different kernels); the router
    is its own class because runtimes score it in fp32, unlike the bf16 GEMMs around it. Routed
    experts are one class per MoE mode (`experts.tp`, `experts.a2a`, `experts.ep`): the grouped GEMMs
    run on different group counts and shapes in each, which the dense-table estimate does not rank
    the way the hardware does (2xH200: a profile fitted on TP experts mispriced all-to-all ones by 28%).
    `moe_split`: the op's split under the plan (`OpDecision.split`); only routed experts read it, so a
    caller passes every op's split without asking its kind.
    """
    if not OP_KINDS[op.kind].profiled:
        return None
    if op.kind is OpKind.TOKEN_MIX:
        return f"token_mix.{op.attrs.get('impl') or 'conv'}"
    if OP_KINDS[op.kind].routed_experts and moe_split:
        return f"experts.{moe_split}"
    return op.kind.value


def mixer_of(op: Op) -> Mixer | None:
    """The token mixer a TOKEN_MIX op runs (its `impl`), None for ops of other kinds or without one."""
    impl = op.attrs.get("impl")
    return mixer(str(impl)) if OP_KINDS[op.kind].mixes_tokens and impl is not None else None


def band_class(op: Op) -> str | None:
    """The error-table class (`cost/presets/bands/errors.toml`) of `op`'s band where it is not its cost
    category's: attention under a sliding window or in chunks (Llama 4), DSA's indexer and DSA's sparse
    attention, whose measured errors (docs/benchmarks.md, 2026-12-06d and 06e: FA3, FlashMLA, the bench's Triton
    indexer) the full-attention error does not cover. None: the op's category's band."""
    mx = mixer_of(op)
    if mx is None:
        return None
    if mx.topk_indexer:
        return "dsa_indexer"
    if mx.sparse_topk:
        return "attention_sparse"
    if mx.cost != "attention":
        return None
    if op.attrs.get("window"):
        return "attention_window"
    return "attention_chunked" if op.attrs.get("chunk") else None


def weight_split(op: Op, moe: str, replicated: bool) -> str:
    """The split `op`'s weight takes under a plan: the plan's MoE mode (`moe`) for routed experts,
    `replicated` where the plan replicates a weight that may be (`replicated`: `Plan.replicates` of the
    op), else the op's own default split."""
    d = OP_KINDS[op.kind]
    if d.routed_experts:
        return moe
    if d.replicable and replicated:
        return WeightSplit.REPLICATED
    return op.split


def params_for_op(op: Op, numerics: Numerics) -> Params:
    """Local key -> (name under `model.layers.{i}.`, full shape) for everything `op` reads."""
    return OP_KINDS[op.kind].params(op, numerics)


__all__ = [
    "COST_CLASSES",
    "OP_KINDS",
    "TRUE",
    "Cuts",
    "ExpertShare",
    "Kernels",
    "Mixer",
    "OpKindDef",
    "Params",
    "RankCtx",
    "RunCtx",
    "RunFn",
    "Shape",
    "ShardCtx",
    "State",
    "Strategy",
    "Tensor",
    "Weights",
    "band_class",
    "cost_class",
    "kernel_key",
    "mixer",
    "mixer_names",
    "mixer_of",
    "op_kind",
    "params_for_op",
    "register_mixer",
    "run_experts",
    "weight_split",
]
