"""The op-kind registry's types: what one op kind (`OpKindDef`) and one token mixer (`Mixer`) state.

`Strategy` and `ShardCtx` are what a placement rule returns and what a weight cut sees; `Params` and
`Cuts` name weights and the part a rank keeps. The mixers' registry (`register_mixer`, `mixer`) lives
here; the op kinds' definitions are `models/opkind_defs.py`, their registry `models/opkinds.py`.
Torch-free, like the rest of the registry.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tpplan.models.cuts import FULL, Cut
from tpplan.models.numerics import Numerics
from tpplan.models.ops import Op, OpKind, Value
from tpplan.placement import S_TOK, Placement, R

# The runtime half of an op kind (`run`, `assemble`) computes on torch tensors with the runtime's
# kernels. The planner never imports torch or `tpplan.runtime`, not even for types (the layer rules,
# tests/test_import_rules.py), so these name what the runtime passes and are Any on purpose.
Tensor = Any  # a torch.Tensor
Kernels = Any  # the module `tpplan.runtime.kernels`, handed in by the executor
RunCtx = Any  # the executor's per-layer context (`tpplan.runtime.executor`: numerics, rope, positions, values)
Weights = Mapping[str, Tensor]  # local weight key -> this rank's part
State = dict[str, Any]  # what a mixer carries from chunk to chunk (KV cache, recurrent state), by name
RunFn = Callable[[Op, list[Tensor], Weights, State, RunCtx, Kernels], Tensor]  # run(op, inputs, w, state, ctx, K)

Params = dict[str, tuple[str, tuple[int, ...]]]  # local key -> (name under model.layers.{i}., full shape)
Cuts = dict[str, Cut]  # local key -> the part a rank keeps (missing key: not held)


@dataclass(frozen=True)
class Strategy:
    """Required input placements and the output placement of one way to run an op.

    `partial_to_need`: a partial-sum input is reduced to exactly what this strategy needs, whatever
    the plan's reduce target (a per-token statistic summed over a feature split and read by a
    head-sharded op needs every token's total: only an all-reduce serves it).
    """

    inputs: tuple[Placement, ...]
    output: Placement
    partial_to_need: bool = False


@dataclass(frozen=True)
class ShardCtx:
    """What a cut depends on: the op's weight placement and output placement under the plan, the rank."""

    split: str  # col | row | replicated | none, or the MoE mode tp | ep | a2a
    output: Placement
    shards: int  # the ranks the op's weights are split over (the TP ranks)
    rank: int
    expert_groups: int | None = None  # routed experts under `ep`: the plan's ep_size


@dataclass(frozen=True)
class RankCtx:
    """What an op's per-rank kernel shape depends on, as propagation and the plan decided it for one
    batch on a TP group (`tpplan.lower.shapes.rank_ctx` builds it from an `OpDecision`)."""

    split: str  # the weight's split under the plan (col | row | replicated | none) or the MoE mode (tp | ep | a2a)
    output: Placement  # the op's output placement
    rows: int  # token rows the rank runs the op on (its share where it reads or writes token-sharded)
    tokens: int  # the batch's token rows
    shards: int  # the ranks of the TP group
    weight_elements: int  # the op's weight elements one rank holds
    expert_groups: int | None = None  # routed experts split EP: the plan's ep_size
    redundant_experts: int = 0  # routed experts: the plan's redundant copies (`Plan.physical_experts`)


Shape = tuple[int, int, int]  # a GEMM's (M, K, N) on one rank
ExpertShare = tuple[int, int, float]  # routed experts on one rank: (experts, intermediate width, routed rows)


def no_shape(op: Op, rc: RankCtx) -> Shape | None:
    return None


def no_share(op: Op, rc: RankCtx) -> ExpertShare | None:
    return None


def whole_gemm(op: Op, rc: RankCtx) -> Shape:
    """x W^T with the whole weight on the rank's rows: (rows, in, out)."""
    out, inp = op.weight_shape
    return rc.rows, inp, out


# Cost classes the predictor prices (`tpplan.cost.predict`): gemm (x W^T on the GEMM table),
# experts (grouped GEMMs per MoE mode), attention / recurrence (roofline at their efficiencies),
# elementwise (memory-bound roofline), attn_res (K3's depth softmax over the bank), free (views).
COST_CLASSES = ("gemm", "experts", "attention", "recurrence", "elementwise", "attn_res", "free")


def same_placement(n: int, placements: tuple[Placement, ...]) -> list[Strategy]:
    return [Strategy((p,) * n, p) for p in placements]


TRUE = (R, S_TOK)  # placements holding true values of whole rows


def own_weight(op: Op, numerics: Numerics) -> Params:
    return {"weight": (op.weight, op.weight_shape)} if op.weight else {}


def no_params(op: Op, numerics: Numerics) -> Params:
    return {}


def full_cuts(op: Op, params: Params, sc: ShardCtx) -> Cuts:
    return dict.fromkeys(params, FULL)


def as_is(op: Op, got: dict[str, Tensor]) -> dict[str, Tensor]:
    return got


@dataclass(frozen=True)
class Mixer:
    """A token mixer: the attention block of a family (`build`) and/or the TOKEN_MIX op it runs.

    `name` is both the attention spec's `kind` (a LayerSpec's token mixer, built by `build`) and
    the `impl` attr of the TOKEN_MIX op whose params, cuts, kernel and cost class it owns.
    `kv_bytes(spec, shards, b)` and `state_bytes(spec, shards, b, state_elem_bytes)` are per-rank memory
    per token (KV cache) and per sequence (recurrent state) of one layer whose heads are split over
    `shards` ranks.
    """

    name: str
    cost: str
    run: RunFn
    build: Callable[..., str] | None = None
    params: Callable[[Op, Numerics], Params] = own_weight
    cuts: Callable[[Op, Params, ShardCtx], Cuts] = full_cuts
    kv_bytes: Callable[[Any, int, float], float] = lambda spec, shards, b: 0.0
    state_bytes: Callable[[Any, int, float, float], float] = lambda spec, shards, b, sb: 0.0
    # A mixer that reads its inputs differently from "every token of its heads" (DSA's indexer)
    # states its own strategies and why; None: the TOKEN_MIX default below.
    rule: Callable[[Op, str, Mapping[str, Value], bool], list[Strategy]] | None = None
    why: Callable[[Op, Placement, Placement, int], str | None] | None = None
    # Traits callers ask instead of comparing a mixer's name (issue 30; tests/test_no_mixer_branches.py).
    # Keeps MLA's compressed latent (plus the rope key) as its KV cache, shared by every head, so the
    # engines size and absorb it as MLA's: MLA and DSA.
    latent_kv: bool = False
    # Keeps each KV head's keys and values as its KV cache (GQA, MHA, MQA): a decode step reads every
    # request's keys once per KV head of the rank, and the cache holds the k and v inputs' widths.
    head_kv: bool = False
    # Scores every cached key to choose the top-k a sparse attention reads (DSA's lightning indexer):
    # replicated on every rank, its index keys cached beside the attention's (in fp32 by the runtime).
    topk_indexer: bool = False
    # Attends only to the top-k keys its indexer selected (its fourth input): DSA's sparse MLA.
    sparse_topk: bool = False
    # Split by `--cp-layers mla`: queries token-sharded inside the TP group, every key's K/V expanded on each
    # rank from the all-gathered latent (`layout.context_parallel.audit_cp_mla`); modelled for plain MLA only.
    cp_layers_mla: bool = False
    # A recurrence whose state decays by a per-channel gate (Kimi Delta Attention; Gated DeltaNet's gate is
    # one scalar per head): SGLang's `uses_kda_attention` keys its prefill CUDA graph default on it.
    channel_gated: bool = False
    # How context parallelism splits it (`layout.context_parallel`, `runtime.context_parallel`):
    # "kv_all_gather" (every key's K/V gathered: GQA), "latent_all_gather" (MLA's latent and rope key
    # gathered, K/V expanded on each rank), "state" (the recurrent state handed on: KDA, GDN),
    # "conv_halo" (the kernel - 1 rows before a rank's chunk: short conv); None: no CP method modelled.
    cp: str | None = None
    # A recurrence's state of one op per head, (heads, dk, dv), and the channels of a short conv run
    # inside the op (GDN's, on q, k, v) whose tail CP hands on with the state; 0: none.
    state_dims: Callable[[Op], tuple[int, int, int]] | None = None
    inner_conv_channels: Callable[[Op], int] = lambda op: 0
    # The shape its kernel is timed at as a family of its own (`name`) by the per-rank sweep, whose fit
    # keys by it (`bench.rank_shapes`): "heads" or "channels" (the whole op's; a TP rank runs its share)
    # and each head's widths, from the op and its layer's values; None: timed in a shared family
    # (attention's, by its values) or not at all.
    kernel_shape: Callable[[Op, Mapping[str, Value]], dict[str, int]] | None = None


_MIXERS: dict[str, Mixer] = {}


def register_mixer(m: Mixer) -> Mixer:
    """Add a token mixer (called by the family module that introduces it, at import)."""
    if m.cost not in COST_CLASSES:
        raise ValueError(f"mixer {m.name}: unknown cost class {m.cost!r}")
    _MIXERS[m.name] = m
    return m


def mixer(name: str) -> Mixer:
    """The registered token mixer `name` (an attention spec kind or a TOKEN_MIX impl)."""
    import tpplan.models.families  # noqa: F401 - registers every family's mixers

    try:
        return _MIXERS[name]
    except KeyError:
        raise ValueError(f"no token mixer registered as {name!r}") from None


def mixer_names() -> tuple[str, ...]:
    """Every registered token mixer's name."""
    import tpplan.models.families  # noqa: F401 - registers every family's mixers

    return tuple(sorted(_MIXERS))


@dataclass(frozen=True)
class OpKindDef:
    """Everything tpplan knows about one op kind, in one place.

    rule(op, split, values, prefer_tokens) -> strategies in order of preference;
    why(op, needed, got, shards) -> a sentence for the audit, or None (generic wording);
    cost(op) -> cost class; profiled: whether measured kernel profiles price it (GEMMs: no);
    params(op, numerics) / cuts(op, params, shard_ctx) -> weight names and per-rank slices;
    run(op, inputs, weights, state, ctx, K) -> output tensor; assemble(op, got) -> fused/stacked weights.

    The flags below are what plans, the search, the audit and the runtime ask of an op's kind instead
    of naming kinds (issue 30: no `OpKind` branching outside the registry and the lowering passes);
    `tests/test_no_opkind_branches.py` keeps it so.
    """

    kind: OpKind
    rule: Callable[[Op, str, Mapping[str, Value], bool], list[Strategy]]
    run: RunFn
    cost: Callable[[Op], str]
    why: Callable[[Op, Placement, Placement, int], str | None] = lambda op, needed, got, n: None
    profiled: bool = True
    params: Callable[[Op, Numerics], Params] = own_weight
    cuts: Callable[[Op, Params, ShardCtx], Cuts] = full_cuts
    assemble: Callable[[Op, dict[str, Tensor]], dict[str, Tensor]] = as_is
    # y = x W^T on a weight the plan splits column- or row-wise (Megatron): the GEMMs async TP fuses
    # with their collectives, and the ops a plan may replicate or token-shard to run on local tokens.
    linear: bool = False
    # Holds a dense weight the plan's `replicate` may keep whole on every rank (linears, the router).
    replicable: bool = False
    # Routed experts: weights placed by the plan's MoE mode (tp | ep | a2a) rather than a col/row
    # split, inputs (hidden, routing) dispatched by all-to-all under a2a, their own bytes per weight.
    routed_experts: bool = False
    # A token mixer (attention, recurrence, short conv): each output token reads other tokens of its
    # sequence, so CP splits it, DP attention may run it on a rank's own requests, and it carries state.
    mixes_tokens: bool = False
    # K3's attention residual: reads the bank of block snapshots, and the one at a layer's entry
    # freezes the stream into the bank where a block opens.
    reads_bank: bool = False
    # A fused RMSNorm kernel over a row or within each head: memory-bound, priced by the fitted `norm`
    # stream model where the GPU has one.
    fused_norm: bool = False
    # y = the sum of its inputs (the residual add): a token-sharded stream input with zeros elsewhere is
    # already a partial sum of it, so the plan may fold the stream into the block output's all-reduce.
    sums_inputs: bool = False
    # The dtype of the op's output given the activation dtype (routers score in fp32).
    output_dtype: Callable[[Op, str], str] = lambda op, act: act
    # The per-rank kernel shape under a decision (`RankCtx`): a GEMM's (M, K, N), the first grouped
    # GEMM's (gate+up) for routed experts; None for the cost classes priced without one. The lowering
    # puts it on the op's kernel step (`tpplan.lower.passes.tp_sp.kernel_call`).
    shape: Callable[[Op, RankCtx], Shape | None] = no_shape
    # Routed experts: the rank's share of them (`ExpertShare`); None for every other kind.
    expert_share: Callable[[Op, RankCtx], ExpertShare | None] = no_share


def const_cost(name: str) -> Callable[[Op], str]:
    return lambda op: name


__all__ = [
    "COST_CLASSES",
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
    "as_is",
    "const_cost",
    "full_cuts",
    "mixer",
    "mixer_names",
    "no_params",
    "no_shape",
    "no_share",
    "own_weight",
    "register_mixer",
    "same_placement",
    "whole_gemm",
]
