"""Full (unsharded) state dicts keyed by HF checkpoint names, and the per-op parameter map.

The canonical names are the layer graph's weight names under `model.layers.{i}.` (the release
checkpoints' spelling: `self_attn.q_a_proj.weight`, `self_attn.q_conv1d.weight`, `self_attn.A_log`,
`mlp.experts.{e}.gate_proj.weight`, ...), plus the few tensors the graph does not list (conv
weights it names, A_log/dt_bias, q/k norms, e_score_correction_bias, K3's AttnRes vectors).
Aliases used by other releases and by transformers' in-memory modules (stacked experts, fused KDA
conv, `forget_gate.*`, `block_sparse_moe`, `w1/w2/w3`) are normalised on load, so a distributed
runtime can shard one dict no matter where it came from. This module knows names and shapes only;
which tensors an op reads is registered with its op kind or mixer (`tpplan.models.opkinds`,
`params_for_op`, re-exported here).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import Tensor

from tpplan.errors import TpplanError
from tpplan.models.config import numerics_from_config
from tpplan.models.graph import ModelGraph
from tpplan.models.numerics import Numerics
from tpplan.models.opkinds import params_for_op

__all__ = [
    "Numerics",
    "check_weights",
    "expected_params",
    "load_safetensors",
    "normalize_names",
    "numerics_from_config",
    "params_for_op",
    "random_weights",
]


def expected_params(graph: ModelGraph, numerics: Numerics) -> dict[str, tuple[int, ...]]:
    """Every canonical tensor name of the model and its shape."""
    h, v = graph.hidden, graph.spec.vocab
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,)}
    if not numerics.tie_embeddings:
        out["lm_head.weight"] = (v, h)
    if graph.spec.attn_res_block_size:
        out["model.output_attn_res_proj.weight"] = (1, h)
        out["model.output_attn_res_norm.weight"] = (h,)
    for i, kind in enumerate(graph.layer_kinds):
        for op in graph.kinds[kind].ops:
            for name, shape in params_for_op(op, numerics).values():
                out[f"model.layers.{i}.{name}"] = shape
    return out


# ----------------------------------------------------------------------------------------------
# Random init


def _is_norm(name: str) -> bool:
    return bool(re.search(r"(norm|layernorm)\.weight$", name)) and "res_norm" not in name


def random_weights(
    graph: ModelGraph, numerics: Numerics, *, seed: int = 0, std: float = 0.02, dtype: torch.dtype = torch.float32
) -> dict[str, Tensor]:
    """Deterministic random weights with the checkpoint's names and shapes.

    Small-std matrices keep tiny models numerically tame; norms sit near their identity value
    (1, or 0 for Qwen3-Next's (1 + w)), A_log/dt_bias follow the FLA initialisations.
    """
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, Tensor] = {}
    for name, shape in expected_params(graph, numerics).items():
        if name.endswith("A_log"):
            t = torch.empty(shape).uniform_(1.0, 16.0, generator=gen).log()
        elif name.endswith("dt_bias"):
            t = torch.empty(shape).uniform_(-4.0, -1.0, generator=gen)
        elif name.endswith("e_score_correction_bias"):
            t = torch.randn(shape, generator=gen) * 0.01
        elif _is_norm(name) or name.endswith("res_norm.weight"):
            base = 0.0 if (numerics.norm_offset and _is_norm(name) and "linear_attn.norm" not in name) else 1.0
            t = base + 0.1 * torch.randn(shape, generator=gen)
        elif name.endswith("conv1d.weight"):
            t = torch.randn(shape, generator=gen) * 0.3
        elif name.endswith("res_proj.weight"):
            t = torch.randn(shape, generator=gen) * 0.5
        elif name == "model.embed_tokens.weight":
            t = torch.randn(shape, generator=gen)
        else:
            t = torch.randn(shape, generator=gen) * std
        out[name] = t.to(dtype)
    return out


# ----------------------------------------------------------------------------------------------
# Loading and name normalisation

_RENAMES = [
    (re.compile(r"\.block_sparse_moe\."), ".mlp."),
    (re.compile(r"\.self_attn\.forget_gate\."), ".self_attn."),
    (re.compile(r"\.experts\.(\d+)\.w1\.weight$"), r".experts.\1.gate_proj.weight"),
    (re.compile(r"\.experts\.(\d+)\.w3\.weight$"), r".experts.\1.up_proj.weight"),
    (re.compile(r"\.experts\.(\d+)\.w2\.weight$"), r".experts.\1.down_proj.weight"),
    (re.compile(r"\.mlp\.e_score_correction_bias$"), ".mlp.gate.e_score_correction_bias"),  # MiniMax-M2
]


def normalize_names(raw: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Map alias spellings onto canonical names (see the module docstring); unknown names pass through."""
    out: dict[str, Tensor] = {}
    # gpt-oss stacks experts transposed ([E, W, 2I] with gate/up interleaved by column, down [E, I, W])
    # and biases them; its `gate_up_proj_bias` tells the layout apart from the [E, 2I, W] one.
    oss = {n.removesuffix("_bias") for n in raw if n.endswith(".experts.gate_up_proj_bias")}
    oss |= {n.removesuffix("gate_up_proj") + "down_proj" for n in oss}
    for name, t in raw.items():
        if name in oss or name.removesuffix("_bias") in oss:
            out.update(_gpt_oss_experts(name, t))
            continue
        if ".feed_forward." in name:  # Llama 4: the MLP is `feed_forward`, experts stacked [E, W, 2I] / [E, I, W]
            name = name.removeprefix("language_model.").replace(".feed_forward.", ".mlp.")
            if name.endswith(".experts.gate_up_proj"):
                base, inter = name.removesuffix(".gate_up_proj"), t.shape[2] // 2
                for e in range(t.shape[0]):
                    out[f"{base}.{e}.gate_proj.weight"] = t[e, :, :inter].t()
                    out[f"{base}.{e}.up_proj.weight"] = t[e, :, inter:].t()
                continue
            if name.endswith(".experts.down_proj"):
                base = name.removesuffix(".down_proj")
                for e in range(t.shape[0]):
                    out[f"{base}.{e}.down_proj.weight"] = t[e].t()
                continue
        for pat, rep in _RENAMES:
            name = pat.sub(rep, name)
        if name.startswith("language_model."):
            name = name.removeprefix("language_model.")
        if name.startswith("model.language_model."):  # transformers' multimodal wrappers (Kimi-K2.5)
            name = "model." + name.removeprefix("model.language_model.")
        if name.endswith(".experts.gate_up_proj"):  # stacked [E, 2I, W]: gate rows first
            base = name.removesuffix(".gate_up_proj")
            inter = t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{base}.{e}.gate_proj.weight"] = t[e, :inter]
                out[f"{base}.{e}.up_proj.weight"] = t[e, inter:]
        elif name.endswith(".experts.down_proj"):  # stacked [E, W, I]
            base = name.removesuffix(".down_proj")
            for e in range(t.shape[0]):
                out[f"{base}.{e}.down_proj.weight"] = t[e]
        elif name.endswith(".self_attn.conv1d.weight"):  # KDA: q/k/v convs stacked on dim 0
            base = name.removesuffix(".conv1d.weight")
            w = t.shape[0] // 3
            for j, p in enumerate("qkv"):
                out[f"{base}.{p}_conv1d.weight"] = t[j * w : (j + 1) * w]
        elif name.endswith("self_attn.A_log"):
            out[name] = t.reshape(-1)
        else:
            out[name] = t
    return out


def _gpt_oss_experts(name: str, t: Tensor) -> dict[str, Tensor]:
    """Per-expert canonical tensors from one of gpt-oss's stacked expert tensors (or biases)."""
    base, what = name.rsplit(".", 1)
    out: dict[str, Tensor] = {}
    for e in range(t.shape[0]):
        if what == "gate_up_proj":  # [E, W, 2I], columns g0 u0 g1 u1 ...
            out[f"{base}.{e}.gate_proj.weight"] = t[e, :, 0::2].t()
            out[f"{base}.{e}.up_proj.weight"] = t[e, :, 1::2].t()
        elif what == "gate_up_proj_bias":  # [E, 2I]
            out[f"{base}.{e}.gate_proj.bias"] = t[e, 0::2]
            out[f"{base}.{e}.up_proj.bias"] = t[e, 1::2]
        elif what == "down_proj":  # [E, I, W]
            out[f"{base}.{e}.down_proj.weight"] = t[e].t()
        else:  # down_proj_bias [E, W]
            out[f"{base}.{e}.down_proj.bias"] = t[e]
    return out


def check_weights(weights: Mapping[str, Tensor], graph: ModelGraph, numerics: Numerics, where: str = "weights") -> None:
    """Raise a `TpplanError` naming the first missing tensor or wrong shape."""
    for name, shape in expected_params(graph, numerics).items():
        if name not in weights:
            raise TpplanError(
                where,
                f"tensor '{name}' is missing (expected shape {list(shape)})",
                "use a checkpoint made for this config, or check the name mapping",
            )
        found = tuple(weights[name].shape)
        if found != shape:
            raise TpplanError(
                where,
                f"tensor '{name}' has shape {list(found)}, expected {list(shape)}",
                "the checkpoint does not match this config.json",
            )


def load_safetensors(
    folder: str | Path, graph: ModelGraph, numerics: Numerics, dtype: torch.dtype | None = None
) -> dict[str, Tensor]:
    """Read every `*.safetensors` file of `folder` (safetensors only: no pickle), normalise names, check."""
    from tpplan.runtime.checkpoint_files import checkpoint_files, open_checkpoint

    raw: dict[str, Tensor] = {}
    for f in checkpoint_files(folder):  # each checked first: a FIFO or a pickle renamed is one line (issue 35)
        with open_checkpoint(f) as fh:
            for key in fh.keys():  # noqa: SIM118 - safe_open has no __iter__
                raw[key] = fh.get_tensor(key)
    out = normalize_names(raw)
    if dtype is not None:
        out = {k: v.to(dtype) for k, v in out.items()}
    check_weights(out, graph, numerics, where=str(folder))
    return out
