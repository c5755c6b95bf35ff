"""Reference PyTorch kernels, one per op kind of the layer graph (`tpplan.models.graph`).

Every kernel takes exactly the tensors it is given and derives head counts from their widths
(`width // head_dim`), never from a global config. That is what lets a TP rank later call the same
function on its head slice (S(col)) or token slice (S(tok)) without a second implementation.
Activations are `[T, W]` (tokens x features); everything runs in the dtype it is given, with
softmax, norms and recurrences computed in fp32 as the HF/FLA references do.

The kernels live by family in `kernels_local.py` (linear, norms, activations, RoPE),
`kernels_attention.py`, `kernels_recurrent.py` and `kernels_moe.py` (and attn_res); this module is
the one the executor calls (`K.<kernel>`) and re-exports them all. A swap of a kernel
(`bench/serving_kernels.installed`) patches it here and in its home module, whose other kernels
call it.
"""

from __future__ import annotations

from tpplan.runtime.activations import unary
from tpplan.runtime.kernels_attention import (
    causal_attention,
    dsa_indexer,
    gqa_attention,
    index_mask,
    mla_attention,
)
from tpplan.runtime.kernels_local import (
    Rope,
    apply_rope,
    gated_query_split,
    head_rms_norm,
    linear,
    mean_square,
    rms_norm,
    rms_scale,
    rope_cos_sin,
    slice_cols,
    swiglu,
)
from tpplan.runtime.kernels_moe import (
    attn_res,
    route,
    routed_experts,
    router_logits,
)
from tpplan.runtime.kernels_recurrent import (
    chunk_gated_delta_rule,
    gdn,
    gdn_conv_inputs,
    gdn_delta_rule,
    kda,
    l2norm,
    naive_gated_delta_rule,
    short_conv,
)

__all__ = [
    "Rope",
    "apply_rope",
    "attn_res",
    "causal_attention",
    "chunk_gated_delta_rule",
    "dsa_indexer",
    "gated_query_split",
    "gdn",
    "gdn_conv_inputs",
    "gdn_delta_rule",
    "gqa_attention",
    "head_rms_norm",
    "index_mask",
    "kda",
    "l2norm",
    "linear",
    "mean_square",
    "mla_attention",
    "naive_gated_delta_rule",
    "rms_norm",
    "rms_scale",
    "rope_cos_sin",
    "route",
    "routed_experts",
    "router_logits",
    "short_conv",
    "slice_cols",
    "swiglu",
    "unary",
]
