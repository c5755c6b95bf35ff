"""DeepSeek-V3 family (deepseek_v3, kimi_k2): multi-head latent attention (MLA) + MoE.

Owns the MLA token mixer, which Kimi-Linear and K3 reuse for their full-attention layers: its
graph (fused token-local down-projection to the latent, per-head up-projections, optional K3
output gate), its kernel call (latent KV cache, interleaved YaRN RoPE) and its KV-cache bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from pydantic import Field

from tpplan.errors import TpplanError
from tpplan.models.families import Family, register
from tpplan.models.families._common import (
    SHARED_EXPERTS,
    TOP_K,
    MLAFields,
    MoEFields,
    Scoring,
    first_k_dense,
    moe_layer,
    text_config,
    validate,
    wrapped_text,
)
from tpplan.models.opkinds import Kernels, Mixer, RunCtx, State, Tensor, Weights, register_mixer
from tpplan.models.ops import Builder, Op, OpKind, WeightSplit
from tpplan.models.spec import DenseMLPSpec, LayerSpec, MLASpec, ModelSpec, MoESpec

# ----------------------------------------------------------------------------------------------
# The MLA token mixer


def build_mla(
    b: Builder, a: MLASpec, x: str, extra: Callable[[Builder], tuple[str, ...]] | None = None, impl: str = "mla"
) -> str:
    """MLA as ops. `extra(b)` adds ops after the latents and before the attention and returns more
    attention inputs (DeepSeek-V3.2's indexer and its top-k); `impl` names the attention's mixer."""
    n = a.heads
    qk = a.qk_head_dim
    if a.q_lora_rank:
        _mla_q_lora(b, a, x)
    else:
        _mla_q_direct(b, a, x)
    _latent_norm(b, "kv")
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
    more = extra(b) if extra is not None else ()
    b.op(
        "attention",
        OpKind.TOKEN_MIX,
        ("q", "kv", "k_rope", *more),
        "attn",
        n * a.v_dim,
        n,
        ctx_flops_per_token=2.0 * n * (qk + a.v_dim),
        attrs={"impl": impl, "heads": n, "rope": a.use_rope},
        note="causal softmax attention over all tokens of its heads",
    )
    out = _output_gate(b, a, x) if a.output_gate else "attn"
    b.out_proj(out, n)
    return "attn_out"


def _mla_q_lora(b: Builder, a: MLASpec, x: str) -> None:
    """The query through its own latent (q_lora): one fused down-projection for q and kv, sliced."""
    n, qk = a.heads, a.qk_head_dim
    assert a.q_lora_rank is not None  # called only for a config with a q latent
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
    _latent_norm(b, "q")
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


def _mla_q_direct(b: Builder, a: MLASpec, x: str) -> None:
    """The query projected from the full hidden (no q_lora); kv's own down-projection, sliced."""
    n, qk = a.heads, a.qk_head_dim
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


def _output_gate(b: Builder, a: MLASpec, x: str) -> str:
    """The sigmoid output gate on the attention (from the full hidden, split by head); its output's name."""
    n = a.heads
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
        "attn_gate",  # not "gate": a dense MLP's gate_proj output in the same layer is "gate"
        n * a.v_dim,
        n,
        attrs={"fn": "sigmoid"},
        flops_per_token=n * a.v_dim,
    )
    b.op(
        "gate_mul",
        OpKind.MUL,
        ("attn", "attn_gate"),
        "attn_gated",
        n * a.v_dim,
        n,
        flops_per_token=n * a.v_dim,
        note="elementwise output gate",
    )
    return "attn_gated"


def _latent_norm(b: Builder, part: str) -> None:
    """RMSNorm of the `part` latent (q or kv), at the latent's own epsilon."""
    b.norm(f"{part}_a_layernorm", f"{part}_latent", f"{part}_latent_n", f"self_attn.{part}_a_layernorm.weight")
    b.ops[-1].attrs["latent_eps"] = True


def run_mla(op: Op, inputs: list[Tensor], w: Weights, state: State, ctx: RunCtx, K: Kernels) -> Tensor:
    """MLA core on this rank's heads: widths from the graph's values, RoPE unless NoPE (Kimi-Linear)."""
    a = op.attrs
    q, kv, k_rope = inputs[:3]
    n = op.int_attr("heads")
    rope_dim = k_rope.shape[1]
    qk = ctx.per_head(op.inputs[0], n)
    nope, v_dim = qk - rope_dim, ctx.per_head(op.output, n)
    rope = ctx.rope if a.get("rope", True) else None
    scale = (qk**-0.5) * (ctx.rope.softmax_scale_factor() if rope is not None else 1.0)
    # A fourth input is DSA's top-k key positions per query: attend only to those (and causally).
    keep = K.index_mask(inputs[3], int(ctx.positions[-1]) + 1) if len(inputs) > 3 else None
    return K.mla_attention(
        q, kv, k_rope, nope_dim=nope, rope_dim=rope_dim, v_dim=v_dim, positions=ctx.positions, rope=rope,
        scale=scale, cache=state, keep=keep,
    )  # fmt: skip


def mla_kv_bytes(attn: MLASpec, shards: int, b: float) -> float:
    """The compressed latent (kv_lora + rope) is cached whole on every TP rank, not split:
    SGLang's MLATokenToKVPool allocates [tokens, 1, kv_lora_rank + qk_rope_head_dim] per layer
    on each rank (python/sglang/srt/mem_cache/memory_pool.py), and vLLM's
    ModelConfig.get_num_kv_heads (vllm/config/model.py) returns 1 for MLA ("When using MLA
    during decode it becomes MQA") whatever the TP size."""
    return (attn.kv_lora_rank + attn.rope_dim) * b


register_mixer(
    Mixer(
        "mla", "attention", run_mla, build=build_mla, params=lambda op, nu: {}, kv_bytes=mla_kv_bytes,
        latent_kv=True, cp_layers_mla=True, cp="latent_all_gather",
    )
)  # fmt: skip


# ----------------------------------------------------------------------------------------------
# Config


class RawMLAMoE(MLAFields, MoEFields):
    """deepseek_v3 / kimi_k2 (DeepseekV3ForCausalLM)."""

    intermediate_size: int = Field(gt=0)
    # widens MoEFields' required field (pydantic allows it; mypy calls it unsafe)
    num_experts_per_tok: int | None = Field(default=None, gt=0, validation_alias=TOP_K)  # type: ignore[assignment]
    n_shared_experts: int | None = Field(default=0, ge=0, validation_alias=SHARED_EXPERTS)
    first_k_dense_replace: int = Field(default=0, ge=0)
    moe_layer_freq: int = Field(default=1, gt=0)
    n_group: int | None = Field(default=1, gt=0)
    topk_group: int | None = Field(default=1, gt=0)
    scoring_func: Scoring = "sigmoid"
    num_nextn_predict_layers: int = Field(default=0, ge=0)


def build_spec(raw: dict[str, Any], label: str, name: str, model_type: str) -> ModelSpec:
    c: RawMLAMoE = validate(RawMLAMoE, raw, label)
    mla = c.mla()
    dense = DenseMLPSpec(c.intermediate_size)
    moe = None
    if c.num_experts:
        if not c.num_experts_per_tok or not c.moe_intermediate_size:
            raise TpplanError(
                label,
                "n_routed_experts is set but num_experts_per_tok or moe_intermediate_size is missing",
                "add both fields, or set n_routed_experts to 0 for a dense model",
            )
        moe = c.routed(
            label,
            c.n_group or 1,
            c.topk_group or 1,
            shared_intermediate=(c.n_shared_experts or 0) * c.moe_intermediate_size,
            scoring=c.scoring_func,
        )
    first_k_dense(label, c.first_k_dense_replace, c.num_hidden_layers)
    layers = tuple(
        LayerSpec(mla, moe if moe and moe_layer(i, c.first_k_dense_replace, c.moe_layer_freq, moe.experts) else dense)
        for i in range(c.num_hidden_layers)
    )
    return c.model_spec(label, name, model_type, "deepseek_v3", layers, mtp_layers=c.num_nextn_predict_layers)


def mla_numerics(text: Mapping[str, Any]) -> dict[str, Any]:
    """MLA families rotate interleaved pairs unless the config says otherwise, and bias the router."""
    return {"rope_interleave": bool(text.get("rope_interleave", True)), "router_bias": True}


register(
    Family(
        "deepseek_v3",
        {"deepseek_v3": "DeepSeek-V3 family (MLA + MoE)", "kimi_k2": "Kimi-K2 (DeepSeek-V3 architecture)"},
        build_spec,
        numerics=mla_numerics,
        signature=frozenset({"kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "n_routed_experts", "n_group"}),
    )
)


# ----------------------------------------------------------------------------------------------
# Kimi-K2.5: a multimodal wrapper whose text model is a kimi_k2 / deepseek_v3 `text_config`


def build_kimi_k25(raw: dict[str, Any], label: str, name: str, model_type: str) -> ModelSpec:
    """The text model only (the vision tower does not run in text prefill)."""
    fix = "add the kimi_k2 (deepseek_v3) text_config from the checkpoint's config.json"
    text = wrapped_text(raw, label, model_type, ("deepseek_v3", "kimi_k2"), fix)
    spec = build_spec(text, f"{label} (text_config)", name, model_type)
    return replace(spec, family="kimi_k25")


register(
    Family(
        "kimi_k25",
        {"kimi_k25": "Kimi-K2.5 (a kimi_k2 text_config; the vision tower is not modelled)"},
        build_kimi_k25,
        numerics=mla_numerics,
        text_config=text_config,
        signature=frozenset({"text_config", "vision_config", "media_placeholder_token_id"}),
    )
)


# ----------------------------------------------------------------------------------------------
# DeepSeek-V2 (and V2-Lite, whose q_proj reads the full hidden): MLA + softmax-routed MoE


def build_deepseek_v2(raw: dict[str, Any], label: str, name: str, model_type: str) -> ModelSpec:
    """As V3 but the router scores by softmax (no correction bias) and, under
    `topk_method: group_limited_greedy`, ranks expert groups by their best score."""
    spec = build_spec({"scoring_func": "softmax", **raw}, label, name, model_type)
    method = raw.get("topk_method", "greedy")
    if method not in ("greedy", "group_limited_greedy"):
        raise TpplanError(
            f"{label}: field 'topk_method'",
            f"{method!r:.40} is not a DeepSeek-V2 routing tpplan implements",
            "use greedy or group_limited_greedy",
        )
    greedy = method == "greedy"

    def v2(m: Any) -> Any:
        if not isinstance(m, MoESpec):
            return m
        if greedy:
            return replace(m, n_group=1, topk_group=1)
        return replace(m, group_score="max")

    return replace(spec, family="deepseek_v2", layers=tuple(replace(ly, mlp=v2(ly.mlp)) for ly in spec.layers))


def v2_numerics(text: Mapping[str, Any]) -> dict[str, Any]:
    """Interleaved (complex) RoPE like V3, no router correction bias, no top-k renormalisation unless asked."""
    return {
        "rope_interleave": True,
        "router_bias": False,
        "renormalize": bool(text.get("norm_topk_prob", False)),
    }


register(
    Family(
        "deepseek_v2",
        {"deepseek_v2": "DeepSeek-V2 / V2-Lite (MLA with or without q_lora, softmax-routed MoE)"},
        build_deepseek_v2,
        numerics=v2_numerics,
        signature=frozenset({"kv_lora_rank", "qk_rope_head_dim", "n_routed_experts", "topk_method"}),
    )
)
