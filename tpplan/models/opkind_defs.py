"""Each op kind's definition and the table of them (`OP_KINDS`): its placement rule and the audit's
words, weight names and cuts, kernel call and weight assembly (LINEAR, row-wise and elementwise
kinds, TOKEN_MIX through its mixer, the router and routed experts, K3's attention residual, the
split RMSNorm). Look-ups are `models/opkinds.py`; torch is imported lazily (`assemble` only).
"""

from __future__ import annotations

from collections.abc import Mapping

from tpplan.models.cuts import FULL, Cut
from tpplan.models.numerics import Numerics
from tpplan.models.opkind_types import (
    TRUE,
    Cuts,
    ExpertShare,
    Kernels,
    Mixer,
    OpKindDef,
    Params,
    RankCtx,
    RunCtx,
    Shape,
    ShardCtx,
    State,
    Strategy,
    Tensor,
    Weights,
    const_cost,
    mixer,
    no_params,
    same_placement,
    whole_gemm,
)
from tpplan.models.ops import Op, OpKind, Value, WeightSplit
from tpplan.placement import S_COL, S_TOK, P, Placement, R

# ----------------------------------------------------------------------------------------------
# LINEAR: y = x W^T


def _linear_rule(op: Op, split: str, values: Mapping[str, Value], prefer_tokens: bool) -> list[Strategy]:
    if split == WeightSplit.COL:
        return [Strategy((R,), S_COL)]
    if split == WeightSplit.ROW:
        return [Strategy((S_COL,), P)]
    if op.attrs.get("bias"):  # affine, not linear: partial sums would add the bias N times
        return same_placement(1, (S_TOK, R) if prefer_tokens else (R, S_TOK))
    return same_placement(1, (S_TOK, R, P) if prefer_tokens else (R, S_TOK, P))


def _linear_why(op: Op, needed: Placement, got: Placement, shards: int) -> str | None:
    if needed is R:
        if shards and op.split_heads and op.split_heads % shards == 0 and len(op.weight_shape) == 2:
            out, inp = op.weight_shape
            return (
                f"it is column-parallel: each rank owns {op.split_heads // shards} of {op.split_heads} heads/columns "
                f"(a [{out // shards}, {inp}] slice of the weight) and must apply it to every token; from "
                f"token-sharded input a rank can only make its own slice for its own tokens, and gathering those "
                f"slices would mix different ranks' heads"
            )
        return (
            f"it is column-parallel (weight split by {op.split_heads} heads/columns), so each rank must "
            "apply its own slice of the weight to every token"
        )
    if needed is S_COL:
        return "it is row-parallel, so it reads only its own heads' columns"
    return None


def _linear_params(op: Op, numerics: Numerics) -> Params:
    parts = op.parts()
    if not parts:  # fused rows, e.g. MLA's qkv_a = q_a_proj ++ kv_a_proj_with_mqa
        out = {"weight": (op.weight, op.weight_shape)}
        if op.attrs.get("bias"):  # y = x W^T + b (Qwen2's q/k/v)
            out["bias"] = (op.weight.removesuffix(".weight") + ".bias", (op.weight_shape[0],))
        return out
    return {f"part{j}": (name, (rows, op.weight_shape[1])) for j, (name, rows) in enumerate(parts.items())}


def _linear_cuts(op: Op, params: Params, sc: ShardCtx) -> Cuts:
    """A biased linear is affine, not linear: y = x W^T + b. Where its output is a partial sum (a
    row-parallel weight, or any weight applied to a partial sum) the bias must enter the sum once, so
    only rank 0 holds it; a column-parallel output keeps its heads' part of the bias."""
    from tpplan.models.cuts import head_cut

    shape = op.weight_shape
    if sc.split == "col" and "head_blocks" in op.attrs:
        return _head_block_cuts(op, sc)
    if sc.split == "col":
        rows = head_cut(0, shape[0], op.split_heads, sc.shards, sc.rank)
        return {"weight": rows} | ({"bias": rows} if "bias" in params else {})
    if sc.split == "row":  # partial sums: the bias is added once, by rank 0
        cols = {"weight": head_cut(1, shape[1], op.split_heads, sc.shards, sc.rank)}
        return cols | ({"bias": FULL} if "bias" in params and sc.rank == 0 else {})
    return dict.fromkeys(params, FULL)


def _linear_run(op: Op, inputs: list[Tensor], w: Weights, state: State, ctx: RunCtx, K: Kernels) -> Tensor:
    y = K.linear(inputs[0], w["weight"])
    return y + w["bias"].to(y.dtype) if "bias" in w else y


def _linear_shape(op: Op, rc: RankCtx) -> Shape:
    """(M, K, N) on one rank: the weight's column slice (output head-sharded), its row slice (a
    row-split weight), or the whole weight (replicated, or run on the rank's token rows only)."""
    out, inp = op.weight_shape
    m, wpr = rc.rows, rc.weight_elements
    if m < rc.tokens or rc.split == WeightSplit.REPLICATED:
        return m, inp, out
    if rc.output is S_COL:
        return m, inp, max(1, wpr // inp)
    if rc.split == WeightSplit.ROW:
        return m, max(1, wpr // out), out
    return m, inp, out


def _head_block_cuts(op: Op, sc: ShardCtx) -> Cuts:
    """Parts made of head-major blocks (`head_blocks[j]`: per-head row counts of part j's blocks,
    e.g. Qwen3.5's in_proj_qkv = [q heads | k heads | v heads]): a rank keeps its heads of each block."""
    from tpplan.models.cuts import head_range

    lo, hi = head_range(op.split_heads, sc.shards, sc.rank)
    out: Cuts = {}
    for j, blocks in enumerate(op.head_blocks()):
        ranges, off = [], 0
        for per in blocks:
            ranges.append((off + lo * per, off + hi * per))
            off += op.split_heads * per
        out[f"part{j}"] = Cut(0, tuple(ranges))
    return out


def _linear_assemble(op: Op, got: dict[str, Tensor]) -> dict[str, Tensor]:
    if "parts" not in op.attrs:
        return got
    import torch

    parts = [got[f"part{j}"] for j in range(len(op.parts()))]
    if "head_blocks" not in op.attrs:
        return {"weight": torch.cat(parts, dim=0)}
    # Interleave the blocks per head group: [block0 of head g, block1 of head g, ...] for each held
    # head g, the layout a per-key-head-group fused projection (Qwen3-Next's in_proj_qkvz) has.
    cols = parts[0].shape[1]
    pieces = []
    for w, blocks in zip(parts, op.head_blocks(), strict=True):
        heads = w.shape[0] // sum(blocks)
        pieces += [blk.reshape(heads, -1) for blk in torch.split(w, [heads * per for per in blocks], dim=0)]
    return {"weight": torch.cat(pieces, dim=1).reshape(-1, cols)}


# ----------------------------------------------------------------------------------------------
# Row-wise and elementwise kinds


def _true_rows_rule(op: Op, split: str, values: Mapping[str, Value], prefer_tokens: bool) -> list[Strategy]:
    return same_placement(len(op.inputs), (S_TOK, R) if prefer_tokens else TRUE)


def _whole_row_why(op: Op, needed: Placement, got: Placement, shards: int) -> str:
    if got is P:
        return "it is non-linear in its input, so it needs true values, not partial sums"
    return "it reads the whole feature row of each token"


def _elementwise_rule(op: Op, split: str, values: Mapping[str, Value], prefer_tokens: bool) -> list[Strategy]:
    return same_placement(len(op.inputs), (R, S_TOK, S_COL))


def _elementwise_why(op: Op, needed: Placement, got: Placement, shards: int) -> str:
    return "an elementwise op needs both operands in the same placement, split the same way"


def _norm_run(op: Op, inputs: list[Tensor], w: Weights, state: State, ctx: RunCtx, K: Kernels) -> Tensor:
    nu = ctx.numerics
    eps = nu.latent_eps if op.attrs.get("latent_eps") else nu.eps
    return K.rms_norm(inputs[0], w["weight"], eps, nu.norm_offset)


def _head_norm_run(op: Op, inputs: list[Tensor], w: Weights, state: State, ctx: RunCtx, K: Kernels) -> Tensor:
    a = op.attrs
    gate = inputs[1] if len(inputs) > 1 else None
    return K.head_rms_norm(
        inputs[0], w["weight"], ctx.numerics.eps, op.int_attr("head_dim"), gate, str(a.get("gate", "sigmoid"))
    )


def _slice_rule(op: Op, split: str, values: Mapping[str, Value], prefer_tokens: bool) -> list[Strategy]:
    if op.attrs.get("gated_query"):  # per-head split of a head-structured value
        return same_placement(1, (R, S_TOK, S_COL))
    return same_placement(1, (R, S_TOK, P))


def _slice_run(op: Op, inputs: list[Tensor], w: Weights, state: State, ctx: RunCtx, K: Kernels) -> Tensor:
    a = op.attrs
    if a.get("gated_query"):
        return K.gated_query_split(inputs[0], op.int_attr("head_dim"), bool(a.get("gate", False)))
    return K.slice_cols(inputs[0], op.int_attr("start"), ctx.values[op.output].width)


def _mul_rule(op: Op, split: str, values: Mapping[str, Value], prefer_tokens: bool) -> list[Strategy]:
    # A product with a true factor is linear in the other factor, so partial sums survive it,
    # unless the plain factor goes through a non-linearity first.
    out = same_placement(2, (R, S_TOK, S_COL))
    if op.attrs.get("sigmoid_second"):
        out.append(Strategy((P, R), P))
    else:
        out += [Strategy((P, R), P), Strategy((R, P), P)]
    return out


def _mul_run(op: Op, inputs: list[Tensor], w: Weights, state: State, ctx: RunCtx, K: Kernels) -> Tensor:
    other = inputs[1].sigmoid() if op.attrs.get("sigmoid_second") else inputs[1]
    return inputs[0] * other


def _add_rule(op: Op, split: str, values: Mapping[str, Value], prefer_tokens: bool) -> list[Strategy]:
    if op.role.startswith("layer."):  # the residual stream holds true values only
        return same_placement(2, (R, S_TOK))
    return same_placement(2, (R, S_TOK, S_COL, P))


# ----------------------------------------------------------------------------------------------
# TOKEN_MIX: delegated to the registered mixer named by the op's `impl`


def _mix(op: Op) -> Mixer:
    return mixer(str(op.attrs["impl"]))


def _token_mix_rule(op: Op, split: str, values: Mapping[str, Value], prefer_tokens: bool) -> list[Strategy]:
    # Mixes tokens within each head: needs every token of the heads it computes. Inputs that are
    # not head-structured (MLA's shared rope key) are needed whole.
    own = _mix(op).rule if "impl" in op.attrs else None
    if own is not None:
        return own(op, split, values, prefer_tokens)
    heads_in = tuple(S_COL if values[v].heads else R for v in op.inputs)
    return [Strategy(heads_in, S_COL), Strategy((R,) * len(op.inputs), R)]


def _token_mix_why(op: Op, needed: Placement, got: Placement, shards: int) -> str:
    own = _mix(op).why if "impl" in op.attrs else None
    said = own(op, needed, got, shards) if own is not None else None
    if said is not None:
        return said
    return f"it is {op.note or 'token mixing'}: each output token depends on other tokens, so it needs every token"


def _token_mix_cuts(op: Op, params: Params, sc: ShardCtx) -> Cuts:
    if sc.output is not S_COL:
        return dict.fromkeys(params, FULL)
    return _mix(op).cuts(op, params, sc)


# ----------------------------------------------------------------------------------------------
# MoE: router and routed experts


def _router_params(op: Op, numerics: Numerics) -> Params:
    out = {"weight": (op.weight, op.weight_shape)}
    if not op.attrs.get("scalar_gate") and numerics.router_bias:
        out["bias"] = (op.weight.replace(".weight", ".e_score_correction_bias"), (op.weight_shape[0],))
    if op.attrs.get("logit_bias"):
        out["logit_bias"] = (op.weight.replace(".weight", ".bias"), (op.weight_shape[0],))
    return out


def _router_run(op: Op, inputs: list[Tensor], w: Weights, state: State, ctx: RunCtx, K: Kernels) -> Tensor:
    a, nu = op.attrs, ctx.numerics
    if a.get("scalar_gate"):
        return K.linear(inputs[0], w["weight"])
    return K.route(
        inputs[0],
        w["weight"],
        top_k=op.int_attr("top_k"),
        scoring=str(a["scoring"]),
        n_group=op.int_attr("n_group"),
        topk_group=op.int_attr("topk_group"),
        bias=w.get("bias"),
        logit_bias=w.get("logit_bias"),
        renormalize=nu.renormalize,
        scaling=nu.routed_scaling_factor,
        group_score=str(a.get("group_score", "top2_sum")),
    )


def _router_dtype(op: Op, act: str) -> str:
    """Router scores are float32 (the kernels route in fp32); a scalar gate is a plain linear."""
    return act if op.attrs.get("scalar_gate") else "float32"


def _experts_rule(op: Op, split: str, values: Mapping[str, Value], prefer_tokens: bool) -> list[Strategy]:
    if split == "a2a":
        return [Strategy((S_TOK, S_TOK), S_TOK)]
    return [Strategy((R, R), P)]


def _experts_share(op: Op, rc: RankCtx) -> ExpertShare:
    """(experts, intermediate width, routed rows) one rank runs (E: the physical experts, redundant copies
    included): all-to-all E/N experts whole on T*k/N rows; EP E/ep experts at 1/(N/ep) of the intermediate
    on T*k/ep rows; TP every expert at 1/N of the intermediate on all T*k rows."""
    e, k, inter = op.int_attr("experts"), op.int_attr("top_k"), op.int_attr("intermediate")
    e += rc.redundant_experts  # more experts per rank, the same rows spread over them
    n, t = rc.shards, rc.tokens
    if rc.split == "a2a":
        return e // n, inter, t * k / n
    if rc.split == "ep":
        ep = rc.expert_groups or 1
        return e // ep, inter // (n // ep), t * k / ep
    return e, inter // n, float(t * k)


def _experts_shape(op: Op, rc: RankCtx) -> Shape:
    """(routed rows, width, 2 x intermediate) of the first grouped GEMM (gate+up) on one rank."""
    _, inter, rows = _experts_share(op, rc)
    return max(1, round(rows)), op.int_attr("width"), 2 * inter


def _experts_params(op: Op, numerics: Numerics) -> Params:
    a, w = op.attrs, op.weight
    e, wid, inter = op.int_attr("experts"), op.int_attr("width"), op.int_attr("intermediate")
    out: Params = {}
    for j in range(e):
        out[f"gate.{j}"] = (f"{w}.{j}.gate_proj.weight", (inter, wid))
        out[f"up.{j}"] = (f"{w}.{j}.up_proj.weight", (inter, wid))
        out[f"down.{j}"] = (f"{w}.{j}.down_proj.weight", (wid, inter))
        if a.get("bias"):
            out[f"gate_bias.{j}"] = (f"{w}.{j}.gate_proj.bias", (inter,))
            out[f"up_bias.{j}"] = (f"{w}.{j}.up_proj.bias", (inter,))
            out[f"down_bias.{j}"] = (f"{w}.{j}.down_proj.bias", (wid,))
    return out


def _experts_cuts(op: Op, params: Params, sc: ShardCtx) -> Cuts:
    from tpplan.errors import TpplanError
    from tpplan.models.cuts import expert_ownership

    owned, part, parts = expert_ownership(op.int_attr("experts"), sc.split, sc.shards, sc.rank, sc.expert_groups)
    inter = op.int_attr("intermediate")
    if inter % parts:
        raise TpplanError(f"{op.name}", f"intermediate {inter} does not split over {parts}", "change TP/EP")
    rows = Cut(0, ((part * inter // parts, (part + 1) * inter // parts),)) if parts > 1 else FULL
    cols = Cut(1, rows.ranges) if parts > 1 else FULL
    out: Cuts = {}
    for j in owned:
        out[f"gate.{j}"] = rows
        out[f"up.{j}"] = rows
        out[f"down.{j}"] = cols
        if op.attrs.get("bias"):
            out[f"gate_bias.{j}"] = rows
            out[f"up_bias.{j}"] = rows
            if part == 0:  # the down projection sums over intermediate slices: its bias enters once
                out[f"down_bias.{j}"] = FULL
    return out


def _experts_assemble(op: Op, got: dict[str, Tensor]) -> dict[str, Tensor]:
    import torch

    owned = sorted({int(key.split(".")[1]) for key in got})
    parts = ("gate", "up", "down", "gate_bias", "up_bias", "down_bias")
    return {p: torch.stack([got[f"{p}.{j}"] for j in owned]) for p in parts if f"{p}.{owned[0]}" in got}


def run_experts(op: Op, x: Tensor, routing: Tensor, w: Weights, K: Kernels) -> Tensor:
    """Routed experts with this rank's (stacked) weights; biases and gpt-oss's clamped SwiGLU from attrs."""
    clamp, scale_inputs = op.attrs.get("clamp"), bool(op.attrs.get("scale_inputs"))
    if not op.attrs.get("bias") and not clamp and not scale_inputs:  # the plain contract (a benchmark may swap it)
        # Every token picks exactly top_k of the columns when this rank's routing holds all experts: a
        # hint that lets a serving kernel route without a host sync (the reference does not need it).
        every = routing.shape[-1] == op.int_attr("experts")
        return K.routed_experts(x, routing, w["gate"], w["up"], w["down"], top_k=op.int_attr("top_k") if every
                                else None)  # fmt: skip
    return K.routed_experts(
        x, routing, w["gate"], w["up"], w["down"], gate_bias=w.get("gate_bias"), up_bias=w.get("up_bias"),
        down_bias=w.get("down_bias"), clamp=tuple(clamp) if isinstance(clamp, list | tuple) and clamp else None,
        scale_inputs=scale_inputs,
    )  # fmt: skip


# ----------------------------------------------------------------------------------------------
# ATTN_RES: K3's block attention residual


def _attn_res_params(op: Op, numerics: Numerics) -> Params:
    h = op.weight_shape[1]
    w = op.weight
    mod, norm = ("self_attention", "input_layernorm") if w == "attn_res" else ("mlp", "post_attention_layernorm")
    return {
        "proj": (f"{mod}_res_proj.weight", (1, h)),
        "score_norm": (f"{mod}_res_norm.weight", (h,)),
        "out_norm": (f"{norm}.weight", (h,)),
    }


def _attn_res_run(op: Op, inputs: list[Tensor], w: Weights, state: State, ctx: RunCtx, K: Kernels) -> Tensor:
    eps = ctx.numerics.eps
    mixed = K.attn_res(inputs[1], inputs[0], w["proj"], w["score_norm"], eps)
    return K.rms_norm(mixed, w["out_norm"], eps)


# ----------------------------------------------------------------------------------------------
# MEAN_SQ / RMS_SCALE: an RMSNorm over a row that TP splits by head (MiniMax-M2's q/k norm)


def _mean_sq_rule(op: Op, split: str, values: Mapping[str, Value], prefer_tokens: bool) -> list[Strategy]:
    # A mean over the feature dim: on a head split each rank holds a summand of it (P).
    k = len(op.inputs)
    return [Strategy((S_COL,) * k, P), Strategy((R,) * k, R), Strategy((S_TOK,) * k, S_TOK)]


def _mean_sq_run(op: Op, inputs: list[Tensor], w: Weights, state: State, ctx: RunCtx, K: Kernels) -> Tensor:
    return K.mean_square(inputs, [ctx.values[v].width for v in op.inputs], ctx.tp)


def _rms_scale_rule(op: Op, split: str, values: Mapping[str, Value], prefer_tokens: bool) -> list[Strategy]:
    return [
        Strategy((S_COL, R), S_COL, partial_to_need=True),
        Strategy((R, R), R),
        Strategy((S_TOK, S_TOK), S_TOK),
    ]


def _rms_scale_why(op: Op, needed: Placement, got: Placement, shards: int) -> str:
    return "it scales each token's row by the norm statistic of that same token, so both must be split the same way"


def _rms_scale_cuts(op: Op, params: Params, sc: ShardCtx) -> Cuts:
    from tpplan.models.cuts import head_cut

    if sc.output is not S_COL:
        return dict.fromkeys(params, FULL)
    return {"weight": head_cut(0, op.weight_shape[0], op.split_heads, sc.shards, sc.rank)}


def _rms_scale_run(op: Op, inputs: list[Tensor], w: Weights, state: State, ctx: RunCtx, K: Kernels) -> Tensor:
    col = op.int_attr("column", 0)
    return K.rms_scale(inputs[0], inputs[1][:, col : col + 1], w["weight"], ctx.numerics.eps)


# ----------------------------------------------------------------------------------------------
# The registry


OP_KINDS: dict[OpKind, OpKindDef] = {
    d.kind: d
    for d in (
        OpKindDef(
            OpKind.LINEAR,
            _linear_rule,
            _linear_run,
            const_cost("gemm"),
            why=_linear_why,
            profiled=False,
            params=_linear_params,
            cuts=_linear_cuts,
            assemble=_linear_assemble,
            linear=True,
            replicable=True,
            shape=_linear_shape,
        ),
        OpKindDef(
            OpKind.NORM, _true_rows_rule, _norm_run, const_cost("elementwise"), why=_whole_row_why, fused_norm=True
        ),
        OpKindDef(
            OpKind.HEAD_NORM,
            _elementwise_rule,
            _head_norm_run,
            const_cost("elementwise"),
            why=_elementwise_why,
            fused_norm=True,
        ),
        OpKindDef(OpKind.SLICE, _slice_rule, _slice_run, const_cost("free"), profiled=False, params=no_params),
        OpKindDef(
            OpKind.UNARY,
            _elementwise_rule,
            lambda op, inputs, w, state, ctx, K: K.unary(inputs[0], str(op.attrs["fn"])),
            const_cost("elementwise"),
            why=_elementwise_why,
            params=no_params,
        ),
        OpKindDef(OpKind.MUL, _mul_rule, _mul_run, const_cost("elementwise"), why=_elementwise_why, params=no_params),
        OpKindDef(
            OpKind.SWIGLU,
            _elementwise_rule,
            lambda op, inputs, w, state, ctx, K: K.swiglu(*inputs, act=str(op.attrs.get("act", "silu"))),
            const_cost("elementwise"),
            why=_elementwise_why,
            params=no_params,
        ),
        OpKindDef(
            OpKind.ADD,
            _add_rule,
            lambda op, inputs, w, state, ctx, K: inputs[0] + inputs[1],
            const_cost("elementwise"),
            why=_elementwise_why,
            params=no_params,
            sums_inputs=True,
        ),
        OpKindDef(
            OpKind.TOKEN_MIX,
            _token_mix_rule,
            lambda op, inputs, w, state, ctx, K: _mix(op).run(op, inputs, w, state, ctx, K),
            lambda op: _mix(op).cost,
            why=_token_mix_why,
            params=lambda op, nu: _mix(op).params(op, nu),
            cuts=_token_mix_cuts,
            mixes_tokens=True,
        ),
        OpKindDef(
            OpKind.ROUTER,
            _true_rows_rule,
            _router_run,
            const_cost("gemm"),
            why=_whole_row_why,
            params=_router_params,
            replicable=True,
            output_dtype=_router_dtype,
            shape=whole_gemm,
        ),
        OpKindDef(
            OpKind.EXPERTS,
            _experts_rule,
            lambda op, inputs, w, state, ctx, K: run_experts(op, inputs[0], inputs[1], w, K),
            const_cost("experts"),
            why=lambda op, needed, got, n: (
                "routed experts under tensor or expert parallelism (no all-to-all) need every token on every rank"
            ),
            params=_experts_params,
            cuts=_experts_cuts,
            assemble=_experts_assemble,
            routed_experts=True,
            shape=_experts_shape,
            expert_share=_experts_share,
        ),
        OpKindDef(
            OpKind.ATTN_RES,
            lambda op, split, values, prefer: same_placement(len(op.inputs), TRUE),
            _attn_res_run,
            const_cost("attn_res"),
            why=_whole_row_why,
            params=_attn_res_params,
            reads_bank=True,
        ),
        OpKindDef(
            OpKind.MEAN_SQ,
            _mean_sq_rule,
            _mean_sq_run,
            const_cost("elementwise"),
            why=lambda op, needed, got, n: "it averages over each token's whole row",
            params=no_params,
        ),
        OpKindDef(
            OpKind.RMS_SCALE,
            _rms_scale_rule,
            _rms_scale_run,
            const_cost("elementwise"),
            why=_rms_scale_why,
            cuts=_rms_scale_cuts,
        ),
    )
}


__all__ = ["OP_KINDS", "run_experts"]
