"""DeepSeek-V3.2 family (deepseek_v32, glm_moe_dsa): MLA + the DSA lightning indexer, with MoE.

DeepSeek Sparse Attention adds an indexer to every MLA layer: its own projections (`wq_b` from the
normed q latent, `wk` and `weights_proj` from the hidden, `k_norm` a LayerNorm) score every query
against every earlier key, and each query attends only to its top-`index_topk` keys. The indexer
is graph ops with their real inputs, so the placement algebra decides what each plan must gather:
its projections are token-local linears (replicated, as vLLM and SGLang hold them), and the
selection is its own token mixer that needs every token of every index head (`_indexer_rule`).
Under input-scattered the hidden is token-sharded, so `wk` and `weights_proj` give token-sharded
outputs the indexer cannot use: the audit says so and prices the all-gathers that fix it.

GLM-5 (`glm_moe_dsa`) is the same model with interleaved RoPE in the indexer; its cross-layer
top-k sharing (`indexer_types` "shared") is refused (the released GLM-5.1 runs every indexer).
MTP layers (`num_nextn_predict_layers`) are not part of prefill and are not modelled.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from pydantic import Field

from tpplan.errors import TpplanError
from tpplan.models.families import Family, register
from tpplan.models.families._common import Raw, validate
from tpplan.models.families.deepseek_v3 import build_mla, mla_kv_bytes, mla_numerics, run_mla
from tpplan.models.families.deepseek_v3 import build_spec as build_v3_spec
from tpplan.models.opkinds import Kernels, Mixer, Params, RunCtx, State, Strategy, Tensor, Weights, register_mixer
from tpplan.models.ops import Builder, Op, OpKind, Value, WeightSplit
from tpplan.models.spec import LayerSpec, MLASpec, ModelSpec
from tpplan.placement import Placement, R


@dataclass(frozen=True)
class DSASpec:
    """MLA with DeepSeek Sparse Attention's lightning indexer."""

    mla: MLASpec
    index_heads: int
    index_head_dim: int
    index_topk: int
    index_rope_interleave: bool  # GLM-5: interleaved pairs; DeepSeek-V3.2: half-split

    kind: Literal["dsa"] = "dsa"

    @property
    def heads(self) -> int:
        return self.mla.heads


# ----------------------------------------------------------------------------------------------
# The indexer: three token-local projections and the top-k selection


def build_dsa(b: Builder, a: DSASpec, x: str) -> str:
    def indexer(b: Builder) -> tuple[str, ...]:
        hi, di = a.index_heads, a.index_head_dim
        b.linear(
            "idx_wq_b",
            "q_latent_n",
            "idx_q",
            hi * di,
            WeightSplit.REPLICATED,
            weight="self_attn.indexer.wq_b.weight",
            note="indexer query up-projection from the normed q latent (replicated)",
        )
        b.linear(
            "idx_wk",
            x,
            "idx_k",
            di,
            WeightSplit.REPLICATED,
            weight="self_attn.indexer.wk.weight",
            note="indexer key projection from the hidden (one shared key head, replicated)",
        )
        b.linear(
            "idx_weights_proj",
            x,
            "idx_w",
            hi,
            WeightSplit.REPLICATED,
            weight="self_attn.indexer.weights_proj.weight",
            note="indexer per-head weights from the hidden (replicated)",
        )
        b.op(
            "indexer",
            OpKind.TOKEN_MIX,
            ("idx_q", "idx_k", "idx_w"),
            "topk",
            a.index_topk,
            ctx_flops_per_token=2.0 * hi * di + 2.0 * hi,
            weight="self_attn.indexer.k_norm.weight",
            weight_shape=(di,),
            attrs={
                "impl": "dsa_indexer",
                "index_heads": hi,
                "head_dim": di,
                "topk": a.index_topk,
                "rope_dim": a.mla.rope_dim,
                "interleave": a.index_rope_interleave,
            },
            note=f"lightning indexer: scores each query against every earlier key, keeps the top {a.index_topk}",
        )
        return ("topk",)

    b.prefix = "mla"  # roles as MLA's (`mla.qkv_a`, ...): plans name the latent the same way
    return build_mla(b, a.mla, x, extra=indexer, impl="mla_dsa")


def _indexer_rule(op: Op, split: str, values: Mapping[str, Value], prefer_tokens: bool) -> list[Strategy]:
    # Every key for every query, and the top-k of a sum over all index heads: nothing can be split.
    return [Strategy((R,) * len(op.inputs), R)]


def _indexer_why(op: Op, needed: Placement, got: Placement, shards: int) -> str:
    return (
        "the indexer scores each query against every earlier token's key and takes the top-k of a sum over "
        "all its heads, so it needs every token's key and weights (its top-k is not a per-rank partial result)"
    )


def _indexer_params(op: Op, numerics: Any) -> Params:
    d = op.int_attr("head_dim")
    return {"k_norm": (op.weight, (d,)), "k_norm_bias": ("self_attn.indexer.k_norm.bias", (d,))}


def _run_indexer(op: Op, inputs: list[Tensor], w: Weights, state: State, ctx: RunCtx, K: Kernels) -> Tensor:
    a = op.attrs
    rope = replace(ctx.rope, interleave=bool(a["interleave"]))
    return K.dsa_indexer(
        *inputs, head_dim=op.int_attr("head_dim"), rope_dim=op.int_attr("rope_dim"), positions=ctx.positions, rope=rope,
        topk=op.int_attr("topk"), k_norm_weight=w["k_norm"], k_norm_bias=w["k_norm_bias"], cache=state,
    )  # fmt: skip


def _dsa_kv_bytes(attn: DSASpec, shards: int, b: float) -> float:
    """The MLA latent plus the indexer's key (index_head_dim per token), both whole on every rank."""
    return mla_kv_bytes(attn.mla, shards, b) + attn.index_head_dim * b


register_mixer(
    Mixer(
        "dsa_indexer", "attention", _run_indexer, params=_indexer_params, rule=_indexer_rule, why=_indexer_why,
        topk_indexer=True,
    )
)  # fmt: skip
register_mixer(Mixer("mla_dsa", "attention", run_mla, params=lambda op, nu: {}, latent_kv=True, sparse_topk=True))
register_mixer(
    Mixer("dsa", "attention", run_mla, build=build_dsa, kv_bytes=_dsa_kv_bytes, latent_kv=True, sparse_topk=True)
)

# ----------------------------------------------------------------------------------------------
# Config


class RawDSA(Raw):
    """The fields DSA adds to deepseek_v3's (read by `deepseek_v3.build_spec`)."""

    q_lora_rank: int = Field(gt=0)
    index_n_heads: int = Field(gt=0)
    index_head_dim: int = Field(gt=0)
    index_topk: int = Field(gt=0)
    indexer_rope_interleave: bool | None = None
    indexer_types: list[str] | None = None
    num_nextn_predict_layers: int = Field(default=0, ge=0)


def build_spec(raw: dict[str, Any], label: str, name: str, model_type: str) -> ModelSpec:
    c: RawDSA = validate(RawDSA, raw, label)
    base = build_v3_spec(raw, label, name, model_type)
    if c.indexer_types and any(t != "full" for t in c.indexer_types):
        raise TpplanError(
            f"{label}: field 'indexer_types'",
            "layers that reuse another layer's top-k ('shared') are not modelled",
            "use a config whose indexer_types are all 'full' (as GLM-5.1 releases it)",
        )
    mla = base.layers[0].attn
    assert isinstance(mla, MLASpec)
    if c.index_head_dim < mla.rope_dim:
        raise TpplanError(
            f"{label}: field 'index_head_dim'",
            f"{c.index_head_dim} is smaller than qk_rope_head_dim={mla.rope_dim}",
            "correct index_head_dim",
        )
    interleave = c.indexer_rope_interleave
    if interleave is None:
        interleave = model_type == "glm_moe_dsa"
    dsa = DSASpec(mla, c.index_n_heads, c.index_head_dim, c.index_topk, interleave)
    layers = tuple(LayerSpec(dsa, layer.mlp) for layer in base.layers)
    notes = (
        f"prefill sparse attention is priced as the engines run it: absorbed MQA over each query's top "
        f"index_topk={c.index_topk} latent rows, dense per-head MHA for steps the engine keeps dense "
        f"(tpplan.engines.sparse_mla); tpplan's runtime computes it per head; volumes are exact",
        *mtp_note(c.num_nextn_predict_layers),
    )
    return replace(base, family="deepseek_v32", layers=layers, notes=notes)


def mtp_note(layers: int) -> tuple[str, ...]:
    """The audit's note for a config with multi-token-prediction layers (prefill never runs them)."""
    if not layers:
        return ()
    return (f"{layers} MTP layer(s) (num_nextn_predict_layers) are not part of prefill: not planned, not in memory",)


register(
    Family(
        "deepseek_v32",
        {
            "deepseek_v32": "DeepSeek-V3.2 (MLA + DSA lightning indexer, MoE)",
            "glm_moe_dsa": "GLM-5 / GLM-5.1 (MLA + DSA lightning indexer, MoE)",
        },
        build_spec,
        numerics=mla_numerics,
        signature=frozenset({"index_n_heads", "index_head_dim", "index_topk", "kv_lora_rank", "q_lora_rank"}),
    )
)
