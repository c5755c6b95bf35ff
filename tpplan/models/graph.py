"""Op-level dataflow graphs of one decoder layer, built from a `LayerSpec`.

A layer graph is a list of ops in execution order. Every op names its input and output values;
every value has a per-token width and, where it is made of heads, a head count (the unit a
feature shard may cut at). Ops carry the facts placement rules need (does it mix tokens? does
it need whole rows? which weight does it own and how is that weight split by default?) and the
facts the cost model needs (weight size, FLOPs per token). The same graph drives the audit, the
cost model and the runtime, so names follow HF checkpoint names where one exists.

Each layer graph reads two values from outside:
- `resid`: the residual stream (true values, K3: the running block prefix), and
- `delta`: the previous block's output, usually a partial sum still to be reduced.
It produces `resid_out` (the stream after the attention add) and `mlp_out` (this layer's MLP
output, the next layer's `delta`). K3's attention residual reads the snapshot bank `bank` too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from tpplan.models.spec import (
    DenseMLPSpec,
    GDNSpec,
    GQASpec,
    KDASpec,
    LayerSpec,
    MLASpec,
    ModelSpec,
    MoESpec,
)


class OpKind(StrEnum):
    """What an op does, as far as placement rules care."""

    LINEAR = "linear"  # y = x W^T, token-local; weight [out, in]
    NORM = "norm"  # RMSNorm over the whole feature row of a token
    HEAD_NORM = "head_norm"  # RMSNorm within each head (optionally gated by a second input)
    SLICE = "slice"  # a contiguous feature range of its input
    UNARY = "unary"  # elementwise non-linear map (sigmoid, activation)
    MUL = "mul"  # elementwise product of two values
    SWIGLU = "swiglu"  # silu(gate) * up
    ADD = "add"  # elementwise sum (residual adds, expert sums)
    TOKEN_MIX = "token_mix"  # attention / recurrence / short conv: mixes tokens within a head
    ROUTER = "router"  # MoE gating: scores from the whole row, top-k per token
    EXPERTS = "experts"  # routed experts (grouped GEMMs)
    ATTN_RES = "attn_res"  # K3 block attention residual: softmax over snapshot rows per token


class WeightSplit(StrEnum):
    """How a weight is placed on the TP group."""

    COL = "col"  # split by output heads/features: each rank owns out/N rows of W
    ROW = "row"  # split by input features: each rank owns in/N columns of W
    REPLICATED = "replicated"  # every rank holds all of W (memory price: full size per rank)
    EXPERT = "expert"  # routed experts: split over ranks by the MoE mode (TP, EP or all-to-all)
    NONE = "none"  # no weight (or a tiny per-feature vector that follows its activation)


@dataclass(frozen=True)
class Value:
    name: str
    width: int  # features per token
    heads: int = 0  # head groups the width is made of (0: not head-structured)


@dataclass(frozen=True)
class Op:
    """One op of a layer. `role` is the plan-facing name, e.g. `mla.g_proj`."""

    name: str
    kind: OpKind
    inputs: tuple[str, ...]
    output: str
    role: str
    weight: str = ""  # HF parameter name under the layer, e.g. `self_attn.g_proj.weight`
    weight_shape: tuple[int, ...] = ()
    split: WeightSplit = WeightSplit.NONE  # the Megatron default placement of `weight`
    split_heads: int = 0  # the head count that must divide by N for a COL/ROW split
    flops_per_token: float = 0.0  # forward FLOPs per token, context-independent part
    ctx_flops_per_token: float = 0.0  # per token per token of context (attention scores)
    note: str = ""  # what the op is, in words, for explanations
    attrs: dict[str, object] = field(default_factory=dict, compare=False, hash=False)

    @property
    def weight_numel(self) -> int:
        n = 1
        for d in self.weight_shape:
            n *= d
        return n if self.weight_shape else 0


@dataclass(frozen=True)
class Block:
    """The ops of one sub-block: `attn` (token mixer) or `mlp`."""

    name: str  # "attn" | "mlp"
    kind: str  # "mla" | "kda" | "gqa" | "gdn" | "dense" | "moe"
    ops: tuple[Op, ...]


@dataclass(frozen=True)
class LayerGraph:
    kind: str  # e.g. "mla+moe"
    spec: LayerSpec
    hidden: int
    values: dict[str, Value]
    entry: tuple[Op, ...]  # residual add + norm (or AttnRes) feeding attention
    attn: Block
    middle: tuple[Op, ...]  # residual add + norm feeding the MLP
    mlp: Block
    attn_res: bool = False

    @property
    def ops(self) -> tuple[Op, ...]:
        return self.entry + self.attn.ops + self.middle + self.mlp.ops

    def region_of(self, op: Op) -> str:
        """`attn_side` (the seed's attention-input boundary and the attention block) or `mlp_side`."""
        if op in self.entry or op in self.attn.ops:
            return "attn_side"
        return "mlp_side"

    def consumers(self, value: str) -> list[Op]:
        return [op for op in self.ops if value in op.inputs]


# ----------------------------------------------------------------------------------------------
# Builders


class _Builder:
    """Accumulates values and ops with short helpers, so each family reads like its forward."""

    def __init__(self, prefix: str, hidden: int) -> None:
        self.prefix = prefix  # role namespace, e.g. "mla"
        self.hidden = hidden
        self.values: dict[str, Value] = {}
        self.ops: list[Op] = []

    def value(self, name: str, width: int, heads: int = 0) -> str:
        self.values[name] = Value(name, width, heads)
        return name

    def op(
        self,
        name: str,
        kind: OpKind,
        inputs: tuple[str, ...],
        out: str,
        out_width: int,
        out_heads: int = 0,
        **kw: object,
    ) -> str:
        self.value(out, out_width, out_heads)
        role = kw.pop("role", f"{self.prefix}.{name}")
        self.ops.append(Op(name=name, kind=kind, inputs=inputs, output=out, role=role, **kw))  # type: ignore[arg-type]
        return out

    def linear(
        self,
        name: str,
        x: str,
        out: str,
        out_features: int,
        split: WeightSplit,
        heads: int = 0,
        weight: str = "",
        note: str = "",
    ) -> str:
        in_features = self.values[x].width
        return self.op(
            name,
            OpKind.LINEAR,
            (x,),
            out,
            out_features,
            heads if split is WeightSplit.COL else 0,
            weight=weight,
            weight_shape=(out_features, in_features),
            split=split,
            split_heads=heads,
            flops_per_token=2.0 * in_features * out_features,
            note=note,
        )

    def norm(self, name: str, x: str, out: str, weight: str, note: str = "RMSNorm") -> str:
        w = self.values[x].width
        return self.op(
            name, OpKind.NORM, (x,), out, w, weight=weight, weight_shape=(w,), flops_per_token=4.0 * w, note=note
        )


def _entry_ops(b: _Builder, prefix: str, attn_res: bool, norm_weight: str, post: bool) -> None:
    """Residual add and pre-norm (or K3's AttnRes aggregation) before a sub-block."""
    h = b.hidden
    src, delta = ("resid", "delta") if not post else ("resid_mid", "attn_out")
    stream = "resid_mid" if not post else "resid_out"
    side = "attn" if not post else "mlp"
    b.op(
        f"{prefix}residual_add",
        OpKind.ADD,
        (src, delta),
        stream,
        h,
        role=f"layer.{side}_add",
        flops_per_token=h,
        note="residual add (stream + block output)",
    )
    normed = "x" if not post else "y"
    if attn_res:
        b.op(
            f"{prefix}attn_res",
            OpKind.ATTN_RES,
            ("bank", stream),
            normed,
            h,
            role=f"layer.{side}_in",
            weight=f"{side}_res",
            weight_shape=(3, h),
            flops_per_token=0.0,
            note="block attention residual: per-token softmax over the snapshot bank and the "
            "running prefix, then RMSNorm (replaces the pre-norm)",
        )
    else:
        b.op(
            f"{prefix}norm",
            OpKind.NORM,
            (stream,),
            normed,
            h,
            role=f"layer.{side}_in",
            weight=norm_weight,
            weight_shape=(h,),
            flops_per_token=4.0 * h,
            note="input_layernorm" if not post else "post_attention_layernorm",
        )
    b.ops[-1].attrs["norm_of"] = stream


def _mla(b: _Builder, a: MLASpec, x: str) -> str:
    n = a.heads
    qk = a.qk_head_dim
    if a.q_lora_rank:
        b.linear(
            "qkv_a",
            x,
            "qkv_latent",
            a.latent_width,
            WeightSplit.REPLICATED,
            weight="self_attn.fused_qkv_a_proj_with_mqa.weight",
            note="fused q_a_proj + kv_a_proj_with_mqa (token-local down-projection to the latent)",
        )
        b.ops[-1].attrs["parts"] = {
            "self_attn.q_a_proj.weight": a.q_lora_rank,
            "self_attn.kv_a_proj_with_mqa.weight": a.kv_lora_rank + a.rope_dim,
        }
        b.op(
            "q_latent",
            OpKind.SLICE,
            ("qkv_latent",),
            "q_latent",
            a.q_lora_rank,
            attrs={"start": 0},
            note="q part of the latent",
        )
        b.op(
            "kv_latent",
            OpKind.SLICE,
            ("qkv_latent",),
            "kv_latent",
            a.kv_lora_rank,
            attrs={"start": a.q_lora_rank},
            note="kv part of the latent",
        )
        b.op(
            "k_rope",
            OpKind.SLICE,
            ("qkv_latent",),
            "k_rope",
            a.rope_dim,
            attrs={"start": a.q_lora_rank + a.kv_lora_rank},
            note="shared rope key",
        )
        b.norm("q_a_layernorm", "q_latent", "q_latent_n", "self_attn.q_a_layernorm.weight")
        b.linear(
            "q_b_proj",
            "q_latent_n",
            "q",
            n * qk,
            WeightSplit.COL,
            heads=n,
            weight="self_attn.q_b_proj.weight",
            note="query up-projection, split by head",
        )
    else:
        b.linear(
            "q_proj",
            x,
            "q",
            n * qk,
            WeightSplit.COL,
            heads=n,
            weight="self_attn.q_proj.weight",
            note="query projection from the full hidden (no q_lora), split by head",
        )
        b.linear(
            "kv_a",
            x,
            "kv_a_out",
            a.kv_lora_rank + a.rope_dim,
            WeightSplit.REPLICATED,
            weight="self_attn.kv_a_proj_with_mqa.weight",
            note="kv down-projection (token-local)",
        )
        b.op("kv_latent", OpKind.SLICE, ("kv_a_out",), "kv_latent", a.kv_lora_rank, attrs={"start": 0})
        b.op("k_rope", OpKind.SLICE, ("kv_a_out",), "k_rope", a.rope_dim, attrs={"start": a.kv_lora_rank})
    b.norm("kv_a_layernorm", "kv_latent", "kv_latent_n", "self_attn.kv_a_layernorm.weight")
    b.linear(
        "kv_b_proj",
        "kv_latent_n",
        "kv",
        n * (a.nope_dim + a.v_dim),
        WeightSplit.COL,
        heads=n,
        weight="self_attn.kv_b_proj.weight",
        note="key/value up-projection, split by head",
    )
    b.op(
        "attention",
        OpKind.TOKEN_MIX,
        ("q", "kv", "k_rope"),
        "attn",
        n * a.v_dim,
        n,
        ctx_flops_per_token=2.0 * n * (qk + a.v_dim),
        attrs={"impl": "mla", "heads": n, "rope": a.use_rope},
        note="causal softmax attention over all tokens of its heads",
    )
    out = "attn"
    if a.output_gate:
        b.linear(
            "g_proj",
            x,
            "gate_logits",
            n * a.v_dim,
            WeightSplit.COL,
            heads=n,
            weight="self_attn.g_proj.weight",
            note="output gate projection from the full hidden, split by head",
        )
        b.op(
            "gate_sigmoid",
            OpKind.UNARY,
            ("gate_logits",),
            "gate",
            n * a.v_dim,
            n,
            attrs={"fn": "sigmoid"},
            flops_per_token=n * a.v_dim,
        )
        b.op(
            "gate_mul",
            OpKind.MUL,
            ("attn", "gate"),
            "attn_gated",
            n * a.v_dim,
            n,
            flops_per_token=n * a.v_dim,
            note="elementwise output gate",
        )
        out = "attn_gated"
    b.linear(
        "o_proj",
        out,
        "attn_out",
        b.hidden,
        WeightSplit.ROW,
        heads=n,
        weight="self_attn.o_proj.weight",
        note="output projection, split by input heads",
    )
    return "attn_out"


def _kda(b: _Builder, a: KDASpec, x: str) -> str:
    n, d, w = a.heads, a.head_dim, a.width
    for p in ("q", "k", "v"):
        b.linear(
            f"{p}_proj",
            x,
            p,
            w,
            WeightSplit.COL,
            heads=n,
            weight=f"self_attn.{p}_proj.weight",
            note=f"{p} projection from the full hidden, split by head",
        )
        b.op(
            f"{p}_conv1d",
            OpKind.TOKEN_MIX,
            (p,),
            f"{p}_c",
            w,
            n,
            weight=f"self_attn.{p}_conv1d.weight",
            weight_shape=(w, 1, a.conv_kernel),
            split=WeightSplit.COL,
            split_heads=n,
            flops_per_token=2.0 * w * a.conv_kernel,
            attrs={"impl": "short_conv", "kernel": a.conv_kernel},
            note=f"depthwise causal short conv over {a.conv_kernel} neighbouring tokens",
        )
    b.linear(
        "f_a_proj",
        x,
        "f_low",
        d,
        WeightSplit.REPLICATED,
        weight="self_attn.f_a_proj.weight",
        note="forget-gate low-rank down-projection",
    )
    b.linear(
        "f_b_proj",
        "f_low",
        "f",
        w,
        WeightSplit.COL,
        heads=n,
        weight="self_attn.f_b_proj.weight",
        note="forget-gate up-projection, split by head",
    )
    b.linear(
        "b_proj",
        x,
        "beta_logits",
        n,
        WeightSplit.COL,
        heads=n,
        weight="self_attn.b_proj.weight",
        note="per-head write strength beta",
    )
    b.op(
        "kda",
        OpKind.TOKEN_MIX,
        ("q_c", "k_c", "v_c", "f", "beta_logits"),
        "o",
        w,
        n,
        weight="self_attn.A_log",
        weight_shape=(n,),
        split=WeightSplit.COL,
        split_heads=n,
        flops_per_token=8.0 * n * d * d,
        attrs={"impl": "kda", "heads": n, "head_dim": d},
        note="chunked gated delta-rule recurrence over all tokens of its heads",
    )
    if a.full_rank_gate:
        b.linear(
            "g_proj",
            x,
            "g_out",
            w,
            WeightSplit.COL,
            heads=n,
            weight="self_attn.g_proj.weight",
            note="full-rank output gate from the full hidden, split by head",
        )
    else:
        b.linear(
            "g_a_proj",
            x,
            "g_low",
            d,
            WeightSplit.REPLICATED,
            weight="self_attn.g_a_proj.weight",
            note="output-gate low-rank down-projection",
        )
        b.linear(
            "g_b_proj",
            "g_low",
            "g_out",
            w,
            WeightSplit.COL,
            heads=n,
            weight="self_attn.g_b_proj.weight",
            note="output-gate up-projection, split by head",
        )
    b.op(
        "o_norm",
        OpKind.HEAD_NORM,
        ("o", "g_out"),
        "o_n",
        w,
        n,
        weight="self_attn.o_norm.weight",
        weight_shape=(d,),
        flops_per_token=6.0 * w,
        attrs={"gate": "sigmoid", "head_dim": d},
        note="gated RMSNorm per head",
    )
    b.linear(
        "o_proj",
        "o_n",
        "attn_out",
        b.hidden,
        WeightSplit.ROW,
        heads=n,
        weight="self_attn.o_proj.weight",
        note="output projection, split by input heads",
    )
    return "attn_out"


def _gqa(b: _Builder, a: GQASpec, x: str) -> str:
    n, kv, d = a.heads, a.kv_heads, a.head_dim
    q_width = n * d * (2 if a.output_gate else 1)
    b.linear(
        "q_proj",
        x,
        "q_full",
        q_width,
        WeightSplit.COL,
        heads=n,
        weight="self_attn.q_proj.weight",
        note="query" + (" and output gate (doubled q_proj)" if a.output_gate else "") + ", split by head",
    )
    b.linear(
        "k_proj",
        x,
        "k",
        kv * d,
        WeightSplit.COL,
        heads=kv,
        weight="self_attn.k_proj.weight",
        note="key projection, split by KV head (replicated when TP exceeds the KV heads)",
    )
    b.linear(
        "v_proj",
        x,
        "v",
        kv * d,
        WeightSplit.COL,
        heads=kv,
        weight="self_attn.v_proj.weight",
        note="value projection, split by KV head",
    )
    q = "q_full"
    if a.output_gate:
        b.op(
            "q_split",
            OpKind.SLICE,
            ("q_full",),
            "q",
            n * d,
            n,
            attrs={"gated_query": True, "head_dim": d},
            note="query half of each head",
        )
        b.op(
            "gate_split",
            OpKind.SLICE,
            ("q_full",),
            "gate_logits",
            n * d,
            n,
            attrs={"gated_query": True, "head_dim": d, "gate": True},
            note="gate half of each head",
        )
        q = "q"
    b.op(
        "attention",
        OpKind.TOKEN_MIX,
        (q, "k", "v"),
        "attn",
        n * d,
        n,
        ctx_flops_per_token=4.0 * n * d,
        weight="self_attn.q_norm.weight" if a.qk_norm else "",
        weight_shape=(d,) if a.qk_norm else (),
        attrs={
            "impl": "gqa",
            "heads": n,
            "kv_heads": kv,
            "head_dim": d,
            "qk_norm": a.qk_norm,
            "rotary_dim": a.rotary_dim,
        },
        note="causal softmax attention over all tokens of its heads",
    )
    out = "attn"
    if a.output_gate:
        b.op("gate_sigmoid", OpKind.UNARY, ("gate_logits",), "gate", n * d, n, attrs={"fn": "sigmoid"})
        b.op("gate_mul", OpKind.MUL, ("attn", "gate"), "attn_gated", n * d, n, note="elementwise output gate")
        out = "attn_gated"
    b.linear(
        "o_proj",
        out,
        "attn_out",
        b.hidden,
        WeightSplit.ROW,
        heads=n,
        weight="self_attn.o_proj.weight",
        note="output projection, split by input heads",
    )
    return "attn_out"


def _gdn(b: _Builder, a: GDNSpec, x: str) -> str:
    nk = a.k_heads
    qkvz = 2 * a.key_dim + 2 * a.value_dim
    b.linear(
        "in_proj_qkvz",
        x,
        "qkvz",
        qkvz,
        WeightSplit.COL,
        heads=nk,
        weight="linear_attn.in_proj_qkvz.weight",
        note="q, k, v and output gate z from the full hidden, split by key-head group",
    )
    b.linear(
        "in_proj_ba",
        x,
        "ba",
        2 * a.v_heads,
        WeightSplit.COL,
        heads=nk,
        weight="linear_attn.in_proj_ba.weight",
        note="beta and decay logits, split by key-head group",
    )
    conv_dim = 2 * a.key_dim + a.value_dim
    b.op(
        "gated_deltanet",
        OpKind.TOKEN_MIX,
        ("qkvz", "ba"),
        "o_n",
        a.value_dim,
        nk,
        weight="linear_attn.conv1d.weight",
        weight_shape=(conv_dim, 1, a.conv_kernel),
        split=WeightSplit.COL,
        split_heads=nk,
        flops_per_token=2.0 * conv_dim * a.conv_kernel + 8.0 * a.v_heads * a.k_head_dim * a.v_head_dim,
        attrs={
            "impl": "gdn",
            "k_heads": nk,
            "v_heads": a.v_heads,
            "k_head_dim": a.k_head_dim,
            "v_head_dim": a.v_head_dim,
            "kernel": a.conv_kernel,
        },
        note="short conv over tokens, gated delta rule and gated RMSNorm per head",
    )
    b.linear(
        "out_proj",
        "o_n",
        "attn_out",
        b.hidden,
        WeightSplit.ROW,
        heads=nk,
        weight="linear_attn.out_proj.weight",
        note="output projection, split by input heads",
    )
    return "attn_out"


def _dense_mlp(
    b: _Builder, m: DenseMLPSpec, x: str, out: str, prefix: str, weight_prefix: str, intermediate: int | None = None
) -> str:
    i = intermediate or m.intermediate
    g = b.linear(
        f"{prefix}gate_proj",
        x,
        f"{prefix}gate",
        i,
        WeightSplit.COL,
        heads=i,
        weight=f"{weight_prefix}.gate_proj.weight",
        note="gate projection, split by column",
    )
    u = b.linear(
        f"{prefix}up_proj",
        x,
        f"{prefix}up",
        i,
        WeightSplit.COL,
        heads=i,
        weight=f"{weight_prefix}.up_proj.weight",
        note="up projection, split by column",
    )
    b.op(f"{prefix}act", OpKind.SWIGLU, (g, u), f"{prefix}act", i, i, flops_per_token=4.0 * i)
    return b.linear(
        f"{prefix}down_proj",
        f"{prefix}act",
        out,
        b.hidden,
        WeightSplit.ROW,
        heads=i,
        weight=f"{weight_prefix}.down_proj.weight",
        note="down projection, split by row",
    )


def _moe(b: _Builder, m: MoESpec, x: str, prefix_hf: str) -> str:
    h = b.hidden
    b.op(
        "router",
        OpKind.ROUTER,
        (x,),
        "routing",
        m.experts,
        weight=f"{prefix_hf}.gate.weight",
        weight_shape=(m.experts, h),
        split=WeightSplit.REPLICATED,
        flops_per_token=2.0 * h * m.experts,
        attrs={"top_k": m.top_k, "scoring": m.scoring, "n_group": m.n_group, "topk_group": m.topk_group},
        note=f"router: {m.scoring} scores over {m.experts} experts, top-{m.top_k}",
    )
    ew = h
    xin = x
    if m.latent:
        xin = b.linear(
            "latent_down",
            x,
            "x_latent",
            m.latent,
            WeightSplit.REPLICATED,
            weight=f"{prefix_hf}.routed_expert_down_proj.weight",
            note="latent MoE down-projection (replicated)",
        )
        ew = m.latent
    per_expert = 3 * ew * m.expert_intermediate
    last = "mlp_out" if not m.shared_intermediate else None  # the routed sum may be the block output
    b.op(
        "experts",
        OpKind.EXPERTS,
        (xin, "routing"),
        (last if not m.latent and last else "routed"),
        ew,
        weight=f"{prefix_hf}.experts",
        weight_shape=(m.experts, 3, ew, m.expert_intermediate),
        split=WeightSplit.EXPERT,
        split_heads=m.expert_intermediate,
        flops_per_token=2.0 * per_expert * m.top_k,
        attrs={"experts": m.experts, "top_k": m.top_k, "width": ew, "intermediate": m.expert_intermediate},
        note=f"{m.experts} routed experts, {m.top_k} per token, SwiGLU {ew}->{m.expert_intermediate}->{ew}",
    )
    routed = b.ops[-1].output
    if m.latent:
        if m.latent_norm:
            b.norm(
                "latent_norm",
                "routed",
                "routed_n",
                f"{prefix_hf}.routed_expert_norm.weight",
                note="RMSNorm of the summed expert output in the latent",
            )
            routed = "routed_n"
        routed = b.linear(
            "latent_up",
            routed,
            last or "routed_h",
            h,
            WeightSplit.REPLICATED,
            weight=f"{prefix_hf}.routed_expert_up_proj.weight",
            note="latent MoE up-projection (replicated)",
        )
    if last:
        return last
    shared = _dense_mlp(
        b,
        DenseMLPSpec(m.shared_intermediate),
        x,
        "shared_out",
        "shared_",
        f"{prefix_hf}.shared_expert" + ("" if m.shared_gate else "s"),
        intermediate=m.shared_intermediate,
    )
    if m.shared_gate:
        b.op(
            "shared_gate",
            OpKind.ROUTER,
            (x,),
            "shared_gate_logit",
            1,
            weight=f"{prefix_hf}.shared_expert_gate.weight",
            weight_shape=(1, h),
            split=WeightSplit.REPLICATED,
            flops_per_token=2.0 * h,
            attrs={"scalar_gate": True},
            note="shared-expert gate: sigmoid of one logit per token",
        )
        shared = b.op(
            "shared_scale",
            OpKind.MUL,
            ("shared_out", "shared_gate_logit"),
            "shared_scaled",
            h,
            attrs={"sigmoid_second": True, "broadcast": True},
            note="scale shared expert",
        )
    b.op("moe_sum", OpKind.ADD, (routed, shared), "mlp_out", h, flops_per_token=h, note="routed + shared experts")
    return "mlp_out"


def build_layer(spec: LayerSpec, hidden: int, kind: str, attn_res: bool = False) -> LayerGraph:
    """Build the dataflow of one decoder layer."""
    entry = _Builder("layer", hidden)
    for v, w in (("resid", hidden), ("delta", hidden)):
        entry.value(v, w)
    if attn_res:
        entry.value("bank", hidden)
    _entry_ops(entry, "attn_", attn_res, "input_layernorm.weight", post=False)

    a = _Builder(spec.attn.kind, hidden)
    a.values.update(entry.values)
    builders = {"mla": _mla, "kda": _kda, "gqa": _gqa, "gdn": _gdn}
    builders[spec.attn.kind](a, spec.attn, "x")  # type: ignore[arg-type]

    mid = _Builder("layer", hidden)
    mid.values.update(a.values)
    _entry_ops(mid, "mlp_", attn_res, "post_attention_layernorm.weight", post=True)

    m = _Builder(spec.mlp.kind, hidden)
    m.values.update(mid.values)
    if isinstance(spec.mlp, MoESpec):
        _moe(m, spec.mlp, "y", "mlp")
    else:
        _dense_mlp(m, spec.mlp, "y", "mlp_out", "", "mlp")
    return LayerGraph(
        kind=kind,
        spec=spec,
        hidden=hidden,
        values=m.values,
        entry=tuple(entry.ops),
        attn=Block("attn", spec.attn.kind, tuple(a.ops)),
        middle=tuple(mid.ops),
        mlp=Block("mlp", spec.mlp.kind, tuple(m.ops)),
        attn_res=attn_res,
    )


@dataclass(frozen=True)
class ModelGraph:
    spec: ModelSpec
    kinds: dict[str, LayerGraph]  # distinct layer structures
    layer_kinds: tuple[str, ...]  # kind of each layer, in order

    @property
    def hidden(self) -> int:
        return self.spec.hidden

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(self.kinds, 0)
        for k in self.layer_kinds:
            out[k] += 1
        return out


def build_model_graph(spec: ModelSpec) -> ModelGraph:
    """One `LayerGraph` per distinct layer structure, and the kind of every layer."""
    attn_res = spec.attn_res_block_size is not None
    kinds = {key: build_layer(ls, spec.hidden, key, attn_res) for key, ls in spec.layer_kinds().items()}
    by_spec = {ls: key for key, ls in spec.layer_kinds().items()}
    return ModelGraph(spec, kinds, tuple(by_spec[ls] for ls in spec.layers))
