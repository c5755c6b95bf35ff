"""Normalized model specs: what tpplan needs to know about a model, parsed from an HF config.json.

Each family's raw config is validated with pydantic (field names as the checkpoints spell them,
with the aliases that different releases use) and turned into one small, frozen `ModelSpec`:
a hidden width and one `LayerSpec` per layer (its token mixer and its MLP). The graph builder
(`tpplan.models.graph`) turns specs into op-level dataflow; nothing here knows about TP.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

from tpplan.models.numerics import Numerics
from tpplan.models.quant import Quantization

AttnKind = Literal["mla", "kda", "gqa", "gdn"]
MlpKind = Literal["dense", "moe"]


@dataclass(frozen=True)
class MLASpec:
    """Multi-head latent attention (DeepSeek-V3, Kimi K2/Linear/K3 full-attention layers)."""

    heads: int
    q_lora_rank: int | None  # None: q_proj reads the full hidden (Kimi-Linear)
    kv_lora_rank: int
    rope_dim: int
    nope_dim: int
    v_dim: int
    output_gate: bool = False  # K3: sigmoid(g_proj(hidden)) multiplies the attention output
    use_rope: bool = True  # Kimi-Linear's MLA is NoPE

    kind: Literal["mla"] = "mla"

    @property
    def qk_head_dim(self) -> int:
        return self.nope_dim + self.rope_dim

    @property
    def latent_width(self) -> int:
        """Width of the fused token-local down projection (the seed's L = 2112 for K3)."""
        return (self.q_lora_rank or 0) + self.kv_lora_rank + self.rope_dim


@dataclass(frozen=True)
class KDASpec:
    """Kimi Delta Attention: gated delta-rule linear attention with a depthwise short conv."""

    heads: int
    head_dim: int
    conv_kernel: int
    full_rank_gate: bool = False  # K3: one g_proj [heads*head_dim, hidden] instead of g_a/g_b

    kind: Literal["kda"] = "kda"

    @property
    def width(self) -> int:
        return self.heads * self.head_dim


@dataclass(frozen=True)
class GQASpec:
    """Softmax attention with grouped KV heads; optionally Qwen3-Next's sigmoid output gate."""

    heads: int
    kv_heads: int
    head_dim: int
    output_gate: bool = False  # q_proj doubled: query and gate, both from the full hidden
    qk_norm: bool = False
    rotary_dim: int = 0
    qkv_bias: bool = False  # Qwen2 / attention_bias: q, k and v projections add a bias
    o_bias: bool = False  # gpt-oss: o_proj adds a bias too (held by rank 0 when row-parallel)
    sinks: bool = False  # gpt-oss: one learned logit per head joins the softmax denominator
    window: int | None = None  # sliding window: a query sees its last `window` keys (itself included)
    chunk: int | None = None  # chunked attention (Llama 4): a query sees the keys of its own chunk
    scale: float | None = None  # softmax scale; None: head_dim^-0.5 (Gemma 3: query_pre_attn_scalar^-0.5)
    rope_theta: float | None = None  # this layer's RoPE base, unscaled; None: the model's (Gemma 3 local layers)
    qk_l2norm: bool = False  # Llama 4: weightless RMS norm of q and k per head, after RoPE
    temperature: tuple[float, float] | None = None  # Llama 4 NoPE layers: (floor_scale, attn_scale) query scaling

    kind: Literal["gqa"] = "gqa"

    @property
    def label(self) -> str:
        """The layer-kind name: `swa` (sliding window), `chunked`, `nope` (no RoPE, Llama 4) or `gqa`;
        roles stay `gqa.*`."""
        return "swa" if self.window else "chunked" if self.chunk else "nope" if not self.rotary_dim else "gqa"


@dataclass(frozen=True)
class GDNSpec:
    """Gated DeltaNet (Qwen3-Next linear attention)."""

    k_heads: int
    v_heads: int
    k_head_dim: int
    v_head_dim: int
    conv_kernel: int
    # Qwen3.5: separate in_proj_qkv / in_proj_z / in_proj_b / in_proj_a, each head-major, instead of
    # Qwen3-Next's in_proj_qkvz / in_proj_ba laid out per key-head group (same math after the split)
    split_proj: bool = False

    kind: Literal["gdn"] = "gdn"

    @property
    def key_dim(self) -> int:
        return self.k_heads * self.k_head_dim

    @property
    def value_dim(self) -> int:
        return self.v_heads * self.v_head_dim


@dataclass(frozen=True)
class DenseMLPSpec:
    intermediate: int
    act: str = "silu"  # gate activation: silu (SwiGLU) or gelu_tanh (Gemma's GeGLU)
    kind: Literal["dense"] = "dense"


@dataclass(frozen=True)
class MoESpec:
    """Routed experts plus optional shared experts; K3's latent MoE when `latent` is set."""

    experts: int
    top_k: int
    expert_intermediate: int
    shared_intermediate: int  # total width of the shared experts (0: none)
    scoring: Literal["sigmoid", "softmax"] = "softmax"
    n_group: int = 1
    topk_group: int = 1
    latent: int | None = None  # K3: experts run in a latent of this width
    latent_norm: bool = False
    shared_gate: bool = False  # Qwen3-Next: sigmoid(shared_expert_gate(x)) scales the shared expert
    router: str = "gate"  # the router's module name under the MLP (gpt-oss: `router`)
    router_bias: bool = False  # gpt-oss: the router's linear has a bias added to its logits
    expert_bias: bool = False  # gpt-oss: every expert projection has a bias
    clamp: tuple[float, float] | None = None  # gpt-oss SwiGLU (alpha, limit); None: plain SwiGLU
    scale_inputs: bool = False  # Llama 4: the routing weight scales the expert's input, not its output
    shared_module: str | None = None  # the shared expert's module name (default: shared_expert(s))
    group_score: Literal["top2_sum", "max"] = "top2_sum"  # how grouped routing ranks groups (V2: max)

    kind: Literal["moe"] = "moe"


class MixerSpec(Protocol):
    """What any token mixer's spec has: a family may introduce its own (DSA, biased or wide-norm GQA),
    registered with its mixer under `kind` (`opkinds.register_mixer`)."""

    @property
    def kind(self) -> str: ...


AttnSpec = MLASpec | KDASpec | GQASpec | GDNSpec | MixerSpec  # the built-in four, or a family's own
MlpSpec = DenseMLPSpec | MoESpec


@dataclass(frozen=True)
class LayerSpec:
    attn: AttnSpec
    mlp: MlpSpec
    sandwich: bool = False  # Gemma: RMSNorm on each block's output too, before its residual add

    @property
    def kind(self) -> str:
        """A short name shared by every layer with the same structure, e.g. `mla+moe`."""
        return f"{getattr(self.attn, 'label', self.attn.kind)}+{self.mlp.kind}"


@dataclass(frozen=True)
class ModelSpec:
    name: str
    model_type: str
    family: str
    hidden: int
    vocab: int
    layers: tuple[LayerSpec, ...]
    attn_res_block_size: int | None = None  # K3 block attention residuals
    tie_embeddings: bool = False
    source: str = ""
    quant: Quantization | None = None  # the checkpoint's weight formats (quantization_config)
    notes: tuple[str, ...] = ()  # what the config has that tpplan does not model (shown by the audit)
    defaulted: tuple[str, ...] = ()  # fields the config lacks, given transformers' defaults (shown by the audit)
    # multi-token-prediction (nextn) layers the checkpoint carries beside its decoder layers (the config's
    # num_nextn_predict_layers): the draft `--spec mtp` loads; prefill never runs them
    mtp_layers: int = 0
    # the validated runtime numerics of the config this spec was read from (`config.spec_from_config`);
    # not compared: two specs of one architecture are the same plan problem whatever their eps
    numerics: Numerics = field(default_factory=Numerics, compare=False)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def layer_kinds(self) -> dict[str, LayerSpec]:
        """Distinct layer structures in first-appearance order, keyed by a readable name.

        Two layers with the same attn/mlp kind but different shapes (rare) get `#2` suffixes.
        """
        kinds: dict[str, LayerSpec] = {}
        for layer in self.layers:
            if layer in kinds.values():
                continue
            key = layer.kind
            n = 2
            while key in kinds:
                key = f"{layer.kind}#{n}"
                n += 1
            kinds[key] = layer
        return kinds

    def kind_of(self, index: int) -> str:
        layer = self.layers[index]
        for key, spec in self.layer_kinds().items():
            if spec == layer:
                return key
        raise KeyError(index)

    def count_kinds(self) -> dict[str, int]:
        kinds = self.layer_kinds()
        counts = dict.fromkeys(kinds, 0)
        for layer in self.layers:
            for key, spec in kinds.items():
                if spec == layer:
                    counts[key] += 1
                    break
        return counts
