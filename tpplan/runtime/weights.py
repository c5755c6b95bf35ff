"""Full (unsharded) state dicts keyed by HF checkpoint names, and the per-op parameter map.

The canonical names are the layer graph's weight names under `model.layers.{i}.` (the release
checkpoints' spelling: `self_attn.q_a_proj.weight`, `self_attn.q_conv1d.weight`, `self_attn.A_log`,
`mlp.experts.{e}.gate_proj.weight`, ...), plus the few tensors the graph does not list (conv
weights it names, A_log/dt_bias, q/k norms, e_score_correction_bias, K3's AttnRes vectors).
Aliases used by other releases and by transformers' in-memory modules (stacked experts, fused KDA
conv, `forget_gate.*`, `block_sparse_moe`, `w1/w2/w3`) are normalised on load, so a distributed
runtime can shard one dict no matter where it came from. This module knows names and shapes only;
`params_for_op` is the single place that says which tensors an op reads.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from tpplan.errors import TpplanError
from tpplan.models.graph import ModelGraph, Op, OpKind


@dataclass(frozen=True)
class Numerics:
    """Config facts the graph leaves out but exact execution needs (eps, RoPE, router scaling)."""

    eps: float = 1e-6
    latent_eps: float = 1e-6  # MLA q_a/kv_a_layernorm: DeepSeek's and HF's code use the 1e-6 default, not eps
    norm_offset: float = 0.0  # 1.0: Qwen3-Next's zero-centred RMSNorm scale (1 + w)
    rope_theta: float = 10000.0
    rope_interleave: bool = False
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 4096
    routed_scaling_factor: float = 1.0
    renormalize: bool = True
    router_bias: bool = False  # DeepSeek/Kimi: e_score_correction_bias in the router
    tie_embeddings: bool = False


def numerics_from_config(raw: Mapping[str, Any]) -> Numerics:
    """Read `Numerics` from a raw HF config dict (K3: its `text_config`)."""
    mt = raw.get("model_type")
    c = raw.get("text_config", raw) if mt == "kimi_k3" else raw
    family = c.get("model_type", mt) if mt != "kimi_k3" else "kimi_k3"
    mla_family = family in ("deepseek_v3", "kimi_k2", "kimi_linear", "kimi_k3")
    scaling = c.get("rope_scaling") or c.get("rope_parameters")
    if isinstance(scaling, dict) and scaling.get("rope_type", scaling.get("type", "default")) == "default":
        scaling = None
    theta = c.get("rope_theta") or (c.get("rope_parameters") or {}).get("rope_theta") or 10000.0
    return Numerics(
        eps=float(c.get("rms_norm_eps", 1e-6)),
        norm_offset=1.0 if family == "qwen3_next" else 0.0,
        rope_theta=float(theta),
        rope_interleave=bool(c.get("rope_interleave", True)) if mla_family else False,
        rope_scaling=dict(scaling) if isinstance(scaling, dict) else None,
        max_position_embeddings=int(c.get("max_position_embeddings", 4096) or 4096),
        routed_scaling_factor=float(c.get("routed_scaling_factor", 1.0) or 1.0),
        renormalize=bool(c.get("norm_topk_prob", c.get("moe_renormalize", True))),
        router_bias=mla_family,
        tie_embeddings=bool(c.get("tie_word_embeddings", False)),
    )


# ----------------------------------------------------------------------------------------------
# Which tensors each op reads


def params_for_op(op: Op, numerics: Numerics) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Local key -> (name under `model.layers.{i}.`, full shape) for everything `op` reads."""
    a = op.attrs
    w = op.weight
    if op.kind in (OpKind.LINEAR, OpKind.NORM, OpKind.HEAD_NORM) and "parts" not in a:
        return {"weight": (w, op.weight_shape)}
    if op.kind is OpKind.LINEAR:  # fused rows, e.g. MLA's qkv_a = q_a_proj ++ kv_a_proj_with_mqa
        return {f"part{j}": (name, (rows, op.weight_shape[1])) for j, (name, rows) in enumerate(a["parts"].items())}
    if op.kind is OpKind.TOKEN_MIX:
        impl = a["impl"]
        if impl == "short_conv":
            return {"weight": (w, op.weight_shape)}
        if impl == "kda":
            n, d = a["heads"], a["head_dim"]
            base = w.rsplit(".", 1)[0]
            return {"A_log": (w, (n,)), "dt_bias": (f"{base}.dt_bias", (n * d,))}
        if impl == "gqa":
            d = a["head_dim"]
            return (
                {"q_norm": ("self_attn.q_norm.weight", (d,)), "k_norm": ("self_attn.k_norm.weight", (d,))}
                if a["qk_norm"]
                else {}
            )
        if impl == "gdn":
            hv, dv = a["v_heads"], a["v_head_dim"]
            return {
                "conv": (w, op.weight_shape),
                "A_log": ("linear_attn.A_log", (hv,)),
                "dt_bias": ("linear_attn.dt_bias", (hv,)),
                "norm": ("linear_attn.norm.weight", (dv,)),
            }
        return {}  # mla: no parameters of its own
    if op.kind is OpKind.ROUTER:
        out = {"weight": (w, op.weight_shape)}
        if not a.get("scalar_gate") and numerics.router_bias:
            out["bias"] = (w.replace(".weight", ".e_score_correction_bias"), (op.weight_shape[0],))
        return out
    if op.kind is OpKind.EXPERTS:
        e, wid, inter = a["experts"], a["width"], a["intermediate"]
        out = {}
        for j in range(e):
            out[f"gate.{j}"] = (f"{w}.{j}.gate_proj.weight", (inter, wid))
            out[f"up.{j}"] = (f"{w}.{j}.up_proj.weight", (inter, wid))
            out[f"down.{j}"] = (f"{w}.{j}.down_proj.weight", (wid, inter))
        return out
    if op.kind is OpKind.ATTN_RES:
        h = op.weight_shape[1]
        mod, norm = ("self_attention", "input_layernorm") if w == "attn_res" else ("mlp", "post_attention_layernorm")
        return {
            "proj": (f"{mod}_res_proj.weight", (1, h)),
            "score_norm": (f"{mod}_res_norm.weight", (h,)),
            "out_norm": (f"{norm}.weight", (h,)),
        }
    return {}


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
]


def normalize_names(raw: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Map alias spellings onto canonical names (see the module docstring); unknown names pass through."""
    out: dict[str, Tensor] = {}
    for name, t in raw.items():
        for pat, rep in _RENAMES:
            name = pat.sub(rep, name)
        if name.startswith("language_model."):
            name = name.removeprefix("language_model.")
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
    from safetensors import safe_open

    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise TpplanError(str(folder), "no *.safetensors files found", "point at the checkpoint folder")
    raw: dict[str, Tensor] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as fh:
            for key in fh.keys():  # noqa: SIM118 - safe_open has no __iter__
                raw[key] = fh.get_tensor(key)
    out = normalize_names(raw)
    if dtype is not None:
        out = {k: v.to(dtype) for k, v in out.items()}
    check_weights(out, graph, numerics, where=str(folder))
    return out
