"""Qwen3-Next family (qwen3_next): gated softmax attention + Gated DeltaNet hybrid with MoE.

Owns the Gated DeltaNet token mixer: its graph (fused q/k/v/z and b/a projections laid out per
key-head group, one op for short conv + gated delta rule + gated RMSNorm), the HF names of its
conv, A_log, dt_bias and norm, how a key-head slice cuts the fused conv channels, the kernel call
and the recurrent state bytes. Its full-attention layers are GQA (`gqa`) with the doubled q_proj
output gate, q/k norm and partial rotary; its RMSNorms are zero-centred (1 + w).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from tpplan.errors import TpplanError
from tpplan.models.cuts import FULL, Cut, head_range
from tpplan.models.families import Family, register
from tpplan.models.families._common import GQAFields, MoEFields, qwen_moe_layer, validate
from tpplan.models.opkinds import Cuts, Kernels, Mixer, Params, RunCtx, ShardCtx, State, Tensor, Weights, register_mixer
from tpplan.models.ops import Builder, Op, OpKind, WeightSplit
from tpplan.models.spec import DenseMLPSpec, GDNSpec, GQASpec, LayerSpec, ModelSpec, MoESpec

# ----------------------------------------------------------------------------------------------
# Gated DeltaNet


def _gdn_projections(b: Builder, a: GDNSpec, x: str) -> None:
    """`qkvz` and `ba` from the hidden, split by key-head group (Qwen3.5's split tensors regrouped on load)."""
    nk = a.k_heads
    qkvz = 2 * a.key_dim + 2 * a.value_dim
    b.linear(
        "in_proj_qkvz",
        x,
        "qkvz",
        qkvz,
        WeightSplit.COL,
        heads=nk,
        weight="linear_attn.in_proj_qkv.weight" if a.split_proj else "linear_attn.in_proj_qkvz.weight",
        note="q, k, v and output gate z from the full hidden, split by key-head group",
    )
    if a.split_proj:  # Qwen3.5: two head-major tensors, regrouped per key head when loaded
        r = a.v_heads // nk
        b.ops[-1].attrs["parts"] = {
            "linear_attn.in_proj_qkv.weight": 2 * a.key_dim + a.value_dim,
            "linear_attn.in_proj_z.weight": a.value_dim,
        }
        b.ops[-1].attrs["head_blocks"] = [[a.k_head_dim, a.k_head_dim, r * a.v_head_dim], [r * a.v_head_dim]]
    b.linear(
        "in_proj_ba",
        x,
        "ba",
        2 * a.v_heads,
        WeightSplit.COL,
        heads=nk,
        weight="linear_attn.in_proj_b.weight" if a.split_proj else "linear_attn.in_proj_ba.weight",
        note="beta and decay logits, split by key-head group",
    )
    if a.split_proj:
        r = a.v_heads // nk
        b.ops[-1].attrs["parts"] = {
            "linear_attn.in_proj_b.weight": a.v_heads,
            "linear_attn.in_proj_a.weight": a.v_heads,
        }
        b.ops[-1].attrs["head_blocks"] = [[r], [r]]


def build_gdn(b: Builder, a: GDNSpec, x: str) -> str:
    """Gated DeltaNet: the two input projections, the token mixer, and the output projection."""
    nk = a.k_heads
    _gdn_projections(b, a, x)
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
    b.out_proj("o_n", nk, "out_proj", weight="linear_attn.out_proj.weight")
    return "attn_out"


def _gdn_params(op: Op, numerics: Any) -> Params:
    hv, dv = op.int_attr("v_heads"), op.int_attr("v_head_dim")
    return {
        "conv": (op.weight, op.weight_shape),
        "A_log": ("linear_attn.A_log", (hv,)),
        "dt_bias": ("linear_attn.dt_bias", (hv,)),
        "norm": ("linear_attn.norm.weight", (dv,)),
    }


def _gdn_cuts(op: Op, params: Params, sc: ShardCtx) -> Cuts:
    """The conv's channels are [q (all heads) | k (all heads) | v (all heads)]: three ranges per rank."""
    nk, nv = op.int_attr("k_heads"), op.int_attr("v_heads")
    dk, dv = op.int_attr("k_head_dim"), op.int_attr("v_head_dim")
    lo, hi = head_range(nk, sc.shards, sc.rank)
    r = nv // nk
    conv = Cut(0, ((lo * dk, hi * dk), (nk * dk + lo * dk, nk * dk + hi * dk),
                   (2 * nk * dk + lo * r * dv, 2 * nk * dk + hi * r * dv)))  # fmt: skip
    vh = Cut(0, ((lo * r, hi * r),))
    return {"conv": conv, "A_log": vh, "dt_bias": vh, "norm": FULL}


def _gdn_run(op: Op, inputs: list[Tensor], w: Weights, state: State, ctx: RunCtx, K: Kernels) -> Tensor:
    return K.gdn(
        inputs[0], inputs[1], conv_weight=w["conv"], a_log=w["A_log"], dt_bias=w["dt_bias"], norm_weight=w["norm"],
        eps=ctx.numerics.eps, k_head_dim=op.int_attr("k_head_dim"), v_head_dim=op.int_attr("v_head_dim"),
        v_per_k=op.int_attr("v_heads") // op.int_attr("k_heads"), state=state,
    )  # fmt: skip


def _gdn_kernel_shape(op: Op, values: Any) -> dict[str, int]:
    """The kernel's work and state are per v head; a key head serves `v_per_k` of them (`_gdn_run`)."""
    hv = op.int_attr("v_heads")
    return {"heads": hv, "v_per_k": hv // op.int_attr("k_heads"), "d": op.int_attr("k_head_dim")}


def _gdn_state_bytes(attn: GDNSpec, shards: int, b: float, state_bytes: float) -> float:
    """Delta-rule state dk x dv per v head (fp32) plus the conv tails (K-1 inputs), heads split over
    `shards` ranks (TP)."""
    heads = attn.v_heads / shards
    conv = (2 * attn.key_dim + attn.value_dim) / shards * (attn.conv_kernel - 1) * b
    return heads * attn.k_head_dim * attn.v_head_dim * state_bytes + conv


register_mixer(
    Mixer(
        "gdn", "recurrence", _gdn_run, build=build_gdn, params=_gdn_params, cuts=_gdn_cuts,
        state_bytes=_gdn_state_bytes, cp="state",
        state_dims=lambda op: (op.int_attr("v_heads"), op.int_attr("k_head_dim"), op.int_attr("v_head_dim")),
        kernel_shape=_gdn_kernel_shape,
        inner_conv_channels=lambda op: (
            2 * op.int_attr("k_heads") * op.int_attr("k_head_dim") + op.int_attr("v_heads") * op.int_attr("v_head_dim")
        ),
    )
)  # fmt: skip

# ----------------------------------------------------------------------------------------------
# Config


class RawGatedHybrid(GQAFields, MoEFields):
    """The fields Qwen3-Next and Qwen3.5 share: gated GQA every few layers, Gated DeltaNet between."""

    head_dim: int = Field(gt=0)
    full_attention_interval: int = Field(default=4, gt=0)
    layer_types: list[str] | None = None
    linear_num_key_heads: int = Field(gt=0)
    linear_num_value_heads: int = Field(gt=0)
    linear_key_head_dim: int = Field(gt=0)
    linear_value_head_dim: int = Field(gt=0)
    linear_conv_kernel_dim: int = Field(default=4, gt=0)
    shared_expert_intermediate_size: int = Field(default=0, ge=0)

    def mixers(self, label: str, rotary_factor: float, split_proj: bool = False) -> list[GQASpec | GDNSpec]:
        """Every layer's token mixer: the gated GQA on full-attention layers, Gated DeltaNet elsewhere."""
        full = full_attention_layers(self.layer_types, self.num_hidden_layers, self.full_attention_interval, label)
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise TpplanError(
                label,
                "linear_num_value_heads must be a multiple of linear_num_key_heads",
                "correct the Gated DeltaNet head counts",
            )
        gqa = self.gqa(label, output_gate=True, qk_norm=True, rotary_dim=int(self.dim * rotary_factor))
        gdn = GDNSpec(
            self.linear_num_key_heads,
            self.linear_num_value_heads,
            self.linear_key_head_dim,
            self.linear_value_head_dim,
            self.linear_conv_kernel_dim,
            split_proj=split_proj,
        )
        return [gqa if f else gdn for f in full]

    def moe(self, label: str) -> MoESpec | None:
        """Softmax-routed experts with the sigmoid-gated shared expert."""
        shared = self.shared_expert_intermediate_size
        return self.routed(label, shared_intermediate=shared, scoring="softmax", shared_gate=shared > 0)


class RawQwen3Next(RawGatedHybrid):
    intermediate_size: int = Field(gt=0)
    decoder_sparse_step: int = Field(default=1, gt=0)
    mlp_only_layers: list[int] = Field(default_factory=list)
    partial_rotary_factor: float = Field(default=0.25, gt=0, le=1)


def full_attention_layers(layer_types: list[str] | None, layers: int, interval: int, label: str) -> list[bool]:
    """Which layers are full (softmax) attention: `layer_types` if given, else every `interval`-th."""
    if layer_types is None:
        return [(i + 1) % interval == 0 for i in range(layers)]
    if len(layer_types) != layers:
        raise TpplanError(
            f"{label}: field 'layer_types'",
            f"has {len(layer_types)} entries for {layers} layers",
            "give one entry per layer, or drop layer_types to use full_attention_interval",
        )
    bad = sorted({t for t in layer_types if t not in ("full_attention", "linear_attention")})
    if bad:
        raise TpplanError(
            f"{label}: field 'layer_types'",
            f"unknown layer type(s) {bad}",
            "use 'full_attention' or 'linear_attention'",
        )
    return [t == "full_attention" for t in layer_types]


def build_spec(raw: dict[str, Any], label: str, name: str, model_type: str) -> ModelSpec:
    c: RawQwen3Next = validate(RawQwen3Next, raw, label)
    mixers = c.mixers(label, c.partial_rotary_factor)
    dense = DenseMLPSpec(c.intermediate_size)
    moe = c.moe(label)
    layers = tuple(
        LayerSpec(mixer, moe if moe and qwen_moe_layer(i, c.decoder_sparse_step, c.mlp_only_layers) else dense)
        for i, mixer in enumerate(mixers)
    )
    return c.model_spec(label, name, "qwen3_next", "qwen3_next", layers)


register(
    Family(
        "qwen3_next",
        {"qwen3_next": "Qwen3-Next (gated attention + Gated DeltaNet, MoE)"},
        build_spec,
        numerics=lambda text: {"norm_offset": 1.0},
        signature=frozenset({"linear_num_key_heads", "linear_key_head_dim", "full_attention_interval"}),
    )
)
