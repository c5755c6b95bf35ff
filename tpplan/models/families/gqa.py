"""Plain GQA decoders (llama, mistral, qwen3, qwen3_moe): grouped-query softmax attention.

Owns the GQA token mixer, which Qwen3-Next reuses with its doubled q_proj output gate: the graph
(q/k/v projections split by head, KV heads replicated when TP exceeds them), the q/k norm weight
names, the kernel call (optional per-head q/k RMSNorm, partial rotary) and the KV-cache bytes.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from tpplan.errors import TpplanError
from tpplan.models.cuts import FULL, head_cut
from tpplan.models.families import Family, register
from tpplan.models.families._common import GQAFields, MoEFields, qwen_moe_layer, validate
from tpplan.models.opkinds import Cuts, Kernels, Mixer, Params, RunCtx, ShardCtx, State, Tensor, Weights, register_mixer
from tpplan.models.ops import Builder, Op, OpKind, WeightSplit
from tpplan.models.spec import DenseMLPSpec, GQASpec, LayerSpec, ModelSpec

# ----------------------------------------------------------------------------------------------
# The GQA token mixer


def build_gqa(b: Builder, a: GQASpec, x: str) -> str:
    """Grouped-query attention as ops: q/k/v projections, the attention, its output gate and projection."""
    n, kv, d = a.heads, a.kv_heads, a.head_dim
    _gqa_projections(b, a, x)
    q = _gqa_query_split(b, a) if a.output_gate else "q_full"
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
            "sinks": a.sinks,
            "window": a.window,
            "chunk": a.chunk,
            "scale": a.scale,
            "rope_theta": a.rope_theta,
            "qk_l2norm": a.qk_l2norm,
            "temperature": a.temperature,
        },
        note=_attention_note(a),
    )
    out = "attn"
    if a.output_gate:
        # "attn_gate", not "gate": a dense MLP's gate_proj output in the same layer is "gate"
        b.op("gate_sigmoid", OpKind.UNARY, ("gate_logits",), "attn_gate", n * d, n, attrs={"fn": "sigmoid"})
        b.op("gate_mul", OpKind.MUL, ("attn", "attn_gate"), "attn_gated", n * d, n, note="elementwise output gate")
        out = "attn_gated"
    b.out_proj(out, n)
    if a.o_bias:  # affine row-parallel output: rank 0 adds the bias to its partial sum
        b.ops[-1].attrs["bias"] = True
    return "attn_out"


def _gqa_projections(b: Builder, a: GQASpec, x: str) -> None:
    """q (doubled where it carries the output gate), k and v from the full hidden, split by (KV) head."""
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
    if a.qkv_bias:
        for op in b.ops[-3:]:
            op.attrs["bias"] = True


def _gqa_query_split(b: Builder, a: GQASpec) -> str:
    """The query and gate halves of each head of a gated q_proj; the query's name."""
    n, d = a.heads, a.head_dim
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
    return "q"


def _attention_note(a: GQASpec) -> str:
    seen = (
        f"the last {a.window} tokens (sliding window)"
        if a.window
        else f"the tokens of its {a.chunk}-token chunk"
        if a.chunk
        else "all tokens"
    )
    return f"causal softmax attention over {seen} of its heads" + (", with a learned sink per head" if a.sinks else "")


def _gqa_params(op: Op, numerics: Any) -> Params:
    d = op.int_attr("head_dim")
    out: Params = {}
    if op.attrs["qk_norm"]:
        out = {"q_norm": ("self_attn.q_norm.weight", (d,)), "k_norm": ("self_attn.k_norm.weight", (d,))}
    if op.attrs.get("sinks"):
        out["sinks"] = ("self_attn.sinks", (op.int_attr("heads"),))
    return out


def _gqa_cuts(op: Op, params: Params, sc: ShardCtx) -> Cuts:
    """Head-sharded: q/k norms are per head_dim (shared by every head), sinks are one per query head."""
    out = dict.fromkeys(params, FULL)
    if "sinks" in params:
        heads = op.int_attr("heads")
        out["sinks"] = head_cut(0, heads, heads, sc.shards, sc.rank)
    return out


def _gqa_run(op: Op, inputs: list[Tensor], w: Weights, state: State, ctx: RunCtx, K: Kernels) -> Tensor:
    a, nu = op.attrs, ctx.numerics
    rope = ctx.rope
    if a.get("rope_theta"):  # a layer with its own unscaled RoPE base (Gemma 3's local layers)
        rope = K.Rope(op.float_attr("rope_theta"), rope.interleave, None, rope.max_position_embeddings)
    return K.gqa_attention(
        *inputs, head_dim=op.int_attr("head_dim"), positions=ctx.positions, rope=rope,
        rotary_dim=op.int_attr("rotary_dim"),
        q_norm=w.get("q_norm"), k_norm=w.get("k_norm"), eps=nu.eps, norm_offset=nu.norm_offset, cache=state,
        window=a.get("window"), chunk=a.get("chunk"), sinks=w.get("sinks"), scale=a.get("scale"),
        qk_l2norm=bool(a.get("qk_l2norm")), temperature=a.get("temperature"),
    )  # fmt: skip


def gqa_kv_bytes(attn: GQASpec, shards: int, b: float) -> float:
    """K and V of this rank's KV heads, max(1, kv_heads // shards) as vLLM's ModelConfig.get_num_kv_heads
    (vllm/config/model.py) does with the TP size (heads replicated when TP exceeds them)."""
    return 2 * max(1, attn.kv_heads // shards) * attn.head_dim * b


register_mixer(
    Mixer(
        "gqa", "attention", _gqa_run, build=build_gqa, params=_gqa_params, cuts=_gqa_cuts, kv_bytes=gqa_kv_bytes,
        head_kv=True, cp="kv_all_gather",
    )
)  # fmt: skip

# ----------------------------------------------------------------------------------------------
# Config


class RawGQA(GQAFields, MoEFields):
    """llama / qwen3 / qwen3_moe / mistral (and their MoE variants under any expert-count spelling)."""

    # absent: MHA. A pydantic field may widen its base's type (the base requires it); mypy calls that unsafe.
    num_key_value_heads: int | None = Field(default=None, gt=0)  # type: ignore[assignment]
    intermediate_size: int = Field(gt=0)
    decoder_sparse_step: int = Field(default=1, gt=0)
    mlp_only_layers: list[int] = Field(default_factory=list)
    attention_bias: bool = False  # llama/mistral spelling; qwen2 always has q/k/v biases
    sliding_window: int | None = Field(default=None, gt=0)
    use_sliding_window: bool = False  # qwen2 / qwen3: sliding_window counts only when this is set

    @model_validator(mode="before")
    @classmethod
    def _mixtral_expert_width(cls, data: Any) -> Any:
        """Mixtral's spelling (num_local_experts) has no moe_intermediate_size: each expert is
        intermediate_size wide."""
        if isinstance(data, dict) and "num_local_experts" in data and "moe_intermediate_size" not in data:
            data = {**data, "moe_intermediate_size": data.get("intermediate_size")}
        return data


# transformers' MistralAttention / MixtralAttention pass `config.sliding_window` to every layer; an
# absent key takes the config class's default (MistralConfig: 4096, MixtralConfig: None).
SLIDING_EVERY_LAYER = {"mistral": 4096, "mixtral": None}


def sliding_window(c: RawGQA, label: str, model_type: str) -> int | None:
    """The window every layer attends within (None: full attention)."""
    if model_type in SLIDING_EVERY_LAYER:
        return c.sliding_window if "sliding_window" in c.model_fields_set else SLIDING_EVERY_LAYER[model_type]
    if c.use_sliding_window and c.sliding_window:
        raise TpplanError(
            f"{label}: field 'use_sliding_window'",
            f"{model_type}'s sliding-window layers (from max_window_layers on) are not modelled",
            "set use_sliding_window to false, as the released checkpoints do",
        )
    return None


def build_spec(raw: dict[str, Any], label: str, name: str, model_type: str) -> ModelSpec:
    c: RawGQA = validate(RawGQA, raw, label)
    if not c.head_dim and c.hidden_size % c.num_attention_heads:
        raise TpplanError(
            label, "hidden_size is not divisible by num_attention_heads and head_dim is not given", "add head_dim"
        )
    gqa = c.gqa(
        label,
        qk_norm=model_type.startswith("qwen3"),
        qkv_bias=model_type == "qwen2" or c.attention_bias,
        window=sliding_window(c, label, model_type),
    )
    dense = DenseMLPSpec(c.intermediate_size)
    moe = c.routed(label)  # any spelling, any model_type of this family (Mixtral-style llama/mistral too)
    layers = tuple(
        LayerSpec(gqa, moe if moe and qwen_moe_layer(i, c.decoder_sparse_step, c.mlp_only_layers) else dense)
        for i in range(c.num_hidden_layers)
    )
    return c.model_spec(label, name, model_type, "gqa", layers)


register(
    Family(
        "gqa",
        {
            "llama": "plain GQA decoder, dense MLP",
            "qwen3": "plain GQA decoder with q/k norm, dense MLP",
            "qwen3_moe": "GQA decoder with MoE",
            "mistral": "plain GQA decoder, dense MLP",
            "mixtral": "GQA decoder with softmax top-k routed experts (num_local_experts)",
            "qwen2": "GQA decoder with q/k/v biases, dense MLP",
        },
        build_spec,
        signature=frozenset({"num_key_value_heads", "head_dim", "rope_theta"}),
    )
)
