"""Single-process reference execution of a `ModelGraph`: the graph is the model.

`run_reference` embeds the tokens, then for every layer walks its graph's ops in order, calling
`execute_op` for each; there is no per-family forward. `execute_op` is the seam a distributed
interpreter reuses: it maps one op plus the tensors it was handed (full, head-sliced or
token-sliced) to one output tensor, with carried state in a per-op dict.

Two facts the graph does not spell out are handled here:
- K3 block attention residuals (AttnRes). Layer i's value `resid_mid` is the running block prefix.
  At a block boundary (i % attn_res_block_size == 0) the attention-side AttnRes first mixes the
  prefix with the existing bank, then the prefix is frozen into the bank (b_0 = the embedding at
  layer 0) and the running prefix restarts from zero, so `resid_out` = attn_out there. After the
  last layer the output AttnRes (`model.output_attn_res_*`) mixes bank and prefix before the final
  norm. The bank is per token, so chunked prefill needs no bank carry: each chunk builds its own.
  This follows SGLang's `AttnResidual` / `KimiK3DecoderLayer` formulation.
- Chunked prefill: positions continue from the tokens already processed; attention ops keep a
  KV cache, short convs the last K-1 inputs, KDA/GDN the recurrent state, all in `state`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from tpplan.models.graph import LayerGraph, ModelGraph, Op, Value
from tpplan.models.opkinds import op_kind
from tpplan.runtime import kernels as K
from tpplan.runtime.weights import Numerics, params_for_op


@dataclass
class ExecContext:
    """What an op needs besides its tensors: numerics and the absolute positions of this chunk."""

    numerics: Numerics
    positions: Tensor  # [T] absolute token positions of the current chunk
    layer: int = 0
    rope: K.Rope = field(default_factory=K.Rope)
    values: Mapping[str, Value] = field(default_factory=dict)  # the current layer graph's values
    tp: int = 1  # ranks the graph's head-split values are spread over (MEAN_SQ's partial share)

    def per_head(self, value: str, heads: int) -> int:
        """Per-head width of a graph value: a constant of the model, valid on any head slice."""
        return self.values[value].width // heads


def numerics_for(graph: ModelGraph) -> Numerics:
    """The numerics validated with the config the graph was built from (never re-read by name:
    a file's `_name_or_path` may name another model)."""
    return graph.spec.numerics


def layer_weights(op: Op, layer: int, weights: Mapping[str, Tensor], numerics: Numerics) -> dict[str, Tensor]:
    """The tensors `op` of layer `layer` reads, by local key; fused and stacked forms assembled here."""
    prefix = f"model.layers.{layer}."
    spec = params_for_op(op, numerics)
    got = {key: weights[prefix + name] for key, (name, _) in spec.items()}
    return op_kind(op.kind).assemble(op, got)


def execute_op(
    op: Op, inputs: list[Tensor], w: Mapping[str, Tensor], state: dict[str, Any], ctx: ExecContext
) -> Tensor:
    """Run one graph op with its registered reference kernel (`tpplan.models.opkinds`). `w` comes from
    `layer_weights` (or a rank's slice of it); `state` is this op's carried state for chunked
    prefill (empty dict on the first chunk)."""
    return op_kind(op.kind).run(op, inputs, w, state, ctx, K)


@dataclass
class RunState:
    """Everything carried between prefill chunks: the next position and per-(layer, op) state."""

    position: int = 0
    ops: dict[tuple[int, str], dict[str, Any]] = field(default_factory=dict)


def run_reference(
    graph: ModelGraph,
    weights: Mapping[str, Tensor],
    input_ids: Tensor,
    *,
    chunk: int | None = None,
    numerics: Numerics | None = None,
    return_hidden: bool = False,
) -> Tensor:
    """Logits [T, vocab] (or the final normed hidden [T, H]) for one sequence of token ids.

    With `chunk`, tokens are fed `chunk` at a time with state carried between chunks; the result
    must equal the one-shot run (tested), which is what chunked prefill relies on.
    """
    nu = numerics or numerics_for(graph)
    ids = input_ids.reshape(-1)
    resolved = {
        (i, op.name): layer_weights(op, i, weights, nu)
        for i, kind in enumerate(graph.layer_kinds)
        for op in graph.kinds[kind].ops
    }
    st = RunState()
    step = chunk or ids.numel()
    outs = [
        forward_chunk(graph, weights, resolved, ids[s : s + step], st, nu, return_hidden)
        for s in range(0, ids.numel(), step)
    ]
    return torch.cat(outs, dim=0)


def take_bank_snapshot(
    op: Op, lg: LayerGraph, env: dict[str, Tensor], bank: Tensor, block: int | None, layer: int
) -> Tensor:
    """K3's block boundary, on one process's full tensors: at the entry attention-residual op of a
    layer that opens a block, the stream it normed joins the bank and restarts at zero (in `env`).
    Returns the bank, grown or as it was."""
    if not (op_kind(op.kind).reads_bank and op in lg.entry and block and layer % block == 0):
        return bank
    stream = str(op.attrs.get("norm_of", op.inputs[1]))
    bank = torch.cat([bank, env[stream][:, None, :]], dim=1)
    env["bank"] = bank
    env[stream] = torch.zeros_like(env[stream])
    return bank


def final_hidden(
    weights: Mapping[str, Tensor], nu: Numerics, resid: Tensor, delta: Tensor, bank: Tensor, block: int | None
) -> Tensor:
    """The last layer's stream and delta summed, K3's output attention-residual over the bank (block >
    0), then the final norm: every runner's last step."""
    final = resid + delta
    if block:
        final = K.attn_res(
            final,
            bank,
            weights["model.output_attn_res_proj.weight"],
            weights["model.output_attn_res_norm.weight"],
            nu.eps,
        )
    return K.rms_norm(final, weights["model.norm.weight"], nu.eps, nu.norm_offset)


def lm_head(weights: Mapping[str, Tensor]) -> Tensor:
    """The output projection: `lm_head`, or the embedding where the model ties them."""
    return weights.get("lm_head.weight", weights["model.embed_tokens.weight"])


def forward_chunk(
    graph: ModelGraph,
    weights: Mapping[str, Tensor],
    resolved: Mapping[tuple[int, str], Mapping[str, Tensor]],
    ids: Tensor,
    st: RunState,
    nu: Numerics,
    return_hidden: bool = False,
    observe: Callable[[int, dict[str, Tensor]], None] | None = None,
) -> Tensor:
    """One prefill chunk through every layer, advancing `st`; `observe(layer, values)` sees each
    layer's values (the distributed verifier compares against them)."""
    t = ids.numel()
    positions = torch.arange(st.position, st.position + t, device=ids.device)
    rope = K.Rope(nu.rope_theta, nu.rope_interleave, nu.rope_scaling, nu.max_position_embeddings)
    ctx = ExecContext(nu, positions, rope=rope)
    emb = weights["model.embed_tokens.weight"][ids] * nu.embed_scale
    resid, delta = emb, torch.zeros_like(emb)
    block = graph.spec.attn_res_block_size
    bank = emb.new_zeros(t, 0, emb.shape[1])
    for i, kind in enumerate(graph.layer_kinds):
        lg = graph.kinds[kind]
        ctx.layer = i
        ctx.values = lg.values
        env: dict[str, Tensor] = {"resid": resid, "delta": delta, "bank": bank}
        for op in lg.ops:
            out = execute_op(
                op, [env[n] for n in op.inputs], resolved[(i, op.name)], st.ops.setdefault((i, op.name), {}), ctx
            )
            env[op.output] = out
            bank = take_bank_snapshot(op, lg, env, bank, block, i)
        resid = env[lg.middle_add.output]
        delta = env["mlp_out"]
        if observe is not None:
            observe(i, env)
    hidden = final_hidden(weights, nu, resid, delta, bank, block)
    st.position += t
    if return_hidden:
        return hidden
    return K.linear(hidden, lm_head(weights))
