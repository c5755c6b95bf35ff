"""The bench's GPU-only kernels and when each runs: the engines' FA3 and FlashMLA where a folder of their builds is
given (`engine_kernels`), fla's window attention, DSA's fused indexer and sparse attention.

Both run only on CUDA with their library (fla, triton); elsewhere the bench keeps its portable kernels
(`masked_attention.banded_attention`, the reference indexer). A kernel that raises on the GPU (e.g. triton
out of shared memory at a head dim: neither was compiled on a GPU when written) falls back for that shape
from then on, and `kernel_refusals` says which and why; the names returned say what ran.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, cast

import torch
from torch import Tensor

from tpplan.bench import engine_kernels as EK
from tpplan.bench import masked_attention as MA
from tpplan.runtime import kernels_attention as KA
from tpplan.runtime.fast_kernels import optional_callable

FLA_WINDOW = (
    "window: fla parallel_attn (Triton flash, key blocks outside the window skipped, GQA in the kernel; after "
    "a cache, up to window-1 zero query rows in front)"
)
FLA_SINKS = "sinks in fla's softmax denominator"
FUSED_INDEXER = "tpplan fused Triton index scores (bf16, fp32 accumulation, query blocks) + torch.topk"
REFERENCE_INDEXER = "reference (fp32 scores by query block, stable sort)"
SPARSE_ATTENTION = "top-k (DSA): tpplan Triton sparse attention (selected keys gathered by index, online softmax)"
_REFUSED: dict[str, str] = {}  # kernel and shape -> the error it raised (`kernel_refusals`)
_REFERENCE_INDEXER = KA.dsa_indexer
_REFERENCE_INDEX_MASK = KA.index_mask
_SELECTED: list[tuple[Tensor, Tensor]] = []  # the last (keep mask, top-k indices) `selected_keys` built


def _refuse(key: str, exc: Exception) -> None:
    _REFUSED[key] = f"{type(exc).__name__}: {exc}"[:300]


def kernel_refusals() -> dict[str, str]:
    """The GPU kernels that raised in this process (kernel and shape -> the error), each fallen back since, and
    the engine kernels asked for but not loaded (`engine_kernels.refusals`: why)."""
    return {**{f"engine {k}": v for k, v in EK.refusals().items()}, **_REFUSED}


def engine_attention_ok(q: Tensor) -> bool:
    """Whether a window, chunk or sinks call may run FA3: on CUDA in bf16/fp16, head dim up to 256, env
    TPPLAN_ENGINE_FA3 not "0", FA3 loaded (`engine_kernels.fa3_ops`)."""
    if not q.is_cuda or q.dtype not in (torch.bfloat16, torch.float16) or q.shape[-1] > 256:
        return False
    return EK.engine_enabled("TPPLAN_ENGINE_FA3") and EK.fa3_loaded()


def takes_gqa(q: Tensor, v: Tensor, window: int | None, chunk: int | None, sinks: Tensor | None) -> bool:
    """Whether the masked kernel this call will run reads fewer KV heads than query heads itself (FA3, fla's
    window kernel), so the caller need not repeat them."""
    engine_sinks = sinks is None or (q.shape[1] <= EK.SINK_HEADS and q.shape[-1] == v.shape[-1])
    if (window or chunk or sinks is not None) and engine_sinks and engine_attention_ok(q):
        return True
    return bool(window) and not chunk and fla_window(q, v)


def try_engine_attention(
    q: Tensor, k: Tensor, v: Tensor, scale: float, window: int | None, chunk: int | None, sinks: Tensor | None
) -> tuple[str, Tensor] | None:  # fmt: skip
    """(name, out) of a window, a chunk and/or sinks by FA3 (`engine_kernels.fa3_attention`) where
    `engine_attention_ok` and the shape was not refused; None for the bench's own kernels."""
    if not (window or chunk or sinks is not None) or not engine_attention_ok(q):
        return None
    if sinks is not None and (q.shape[1] > EK.SINK_HEADS or q.shape[-1] != v.shape[-1]):
        return None  # FA3 refuses s_aux beyond 64 query heads or with a narrower v: the bench's own kernels
    key = f"FA3, head dim {q.shape[-1]}/{v.shape[-1]}"
    if key in _REFUSED:
        return None
    try:
        out = EK.fa3_attention(q, k, v, scale, window, sinks, chunk)
    except Exception as exc:  # e.g. a head dim or an argument this build refuses
        _refuse(key, exc)
        return None
    what = " and ".join(w for w, on in (("window", window), ("chunk", chunk)) if on) or "causal"
    return f"{what}: {EK.FA3}" + (" + sinks as s_aux" if sinks is not None else ""), out


def fla_window(q: Tensor, v: Tensor) -> bool:
    """Whether a window runs fla's `parallel_attn`: on CUDA, head dims up to 256 (its one key tile), not refused
    at this head dim, fla importable, and env TPPLAN_FLA_WINDOW not "0" (the band kernel then)."""
    if not q.is_cuda or max(q.shape[-1], v.shape[-1]) > 256 or os.environ.get("TPPLAN_FLA_WINDOW", "1") == "0":
        return False
    return f"fla window, head dim {q.shape[-1]}" not in _REFUSED and MA.fla_parallel_attn() is not None


def try_fla_window(
    q: Tensor, k: Tensor, v: Tensor, scale: float, window: int, sinks: Tensor | None
) -> tuple[str, Tensor] | None:  # fmt: skip
    """(name, out) by `masked_attention.fla_window_attention` where `fla_window` allows and it does not
    raise; None for the caller's fallback (k and v may hold fewer heads than q: GQA)."""
    if not fla_window(q, v):
        return None
    try:
        out = MA.fla_window_attention(q, k, v, scale, window, sinks)
    except Exception as exc:  # e.g. triton out of shared memory at this head dim
        _refuse(f"fla window, head dim {q.shape[-1]}", exc)
        return None
    return FLA_WINDOW + (" + " + FLA_SINKS if sinks is not None else ""), out


def _fused_indexer() -> Callable[..., Tensor] | None:
    """`bench.fused_indexer.fused_dsa_indexer` where triton imports, else None."""
    return cast(Callable[..., Tensor] | None, optional_callable("tpplan.bench.fused_indexer", "fused_dsa_indexer"))


def fused_indexer_ok(q: Tensor, head_dim: int) -> bool:
    """Whether DSA's indexer runs the fused kernel: on CUDA, a power-of-two head dim of at least 16 (the
    kernel's one tile over it; DeepSeek-V3.2 and GLM-5.1: 128), triton importable, env TPPLAN_FUSED_INDEXER
    not "0"."""
    if not q.is_cuda or head_dim < 16 or head_dim & (head_dim - 1) or os.environ.get("TPPLAN_FUSED_INDEXER") == "0":
        return False
    return _fused_indexer() is not None


def serving_indexer(q: Tensor, k: Tensor, w: Tensor, **kw: Any) -> tuple[str, Tensor]:
    """(name, `runtime.kernels.dsa_indexer`'s result) by the fused kernel where `fused_indexer_ok` and not
    refused, else the reference (a fused call that raised leaves the cache as it found it)."""
    fused = _fused_indexer() if fused_indexer_ok(q, int(kw["head_dim"])) else None
    key = f"fused indexer, {q.shape[-1] // int(kw['head_dim'])} heads"
    cache = kw.get("cache")
    before = None if cache is None else cache.get("k")
    if fused is not None and key not in _REFUSED:
        try:
            return FUSED_INDEXER, fused(q, k, w, **kw)
        except Exception as exc:  # e.g. triton out of resources
            _refuse(key, exc)
            if cache is not None and before is None:
                cache.pop("k", None)
            elif cache is not None:
                cache["k"] = before
    return REFERENCE_INDEXER, _REFERENCE_INDEXER(q, k, w, **kw)


def selected_keys(indices: Tensor, keys: int) -> Tensor:
    """`kernels.index_mask` under `installed`: the same [T, keys] mask, with the indices it came from kept
    beside it, so that the attention it is passed to can gather those keys instead of masking all S."""
    keep = _REFERENCE_INDEX_MASK(indices, keys)
    _SELECTED[:] = [(keep, indices)]
    return keep


def _sparse_kernel() -> Callable[..., Tensor] | None:
    """`bench.sparse_attention.sparse_attention` where triton imports, else None."""
    return cast(Callable[..., Tensor] | None, optional_callable("tpplan.bench.sparse_attention", "sparse_attention"))


def sparse_attention_ok(q: Tensor) -> bool:
    """Whether DSA's attention may run the Triton sparse kernel: on CUDA, env TPPLAN_SPARSE_ATTN not "0"."""
    return q.is_cuda and os.environ.get("TPPLAN_SPARSE_ATTN") != "0"


def try_sparse_attention(q: Tensor, k: Tensor, v: Tensor, scale: float, keep: Tensor) -> tuple[str, Tensor] | None:
    """(name, out) of DSA's attention by the Triton sparse kernel over the indices `keep` was built from
    (`selected_keys`) where `sparse_attention_ok`, triton imports and the shape was not refused; None
    for the caller's reference (also when `keep` did not come from `selected_keys`). k/v may hold fewer heads."""
    if not _SELECTED or _SELECTED[0][0] is not keep:
        return None
    indices = _SELECTED.pop()[1]  # one attention per mask: the [T, S] mask is not held after it
    engine = try_engine_sparse(q, k, v, scale, indices)
    if engine is not None:
        return engine
    kernel = _sparse_kernel() if sparse_attention_ok(q) else None
    key = f"sparse attention, head dims {q.shape[-1]}/{v.shape[-1]}, {q.shape[1]}/{k.shape[1]} heads"
    if kernel is None or key in _REFUSED:
        return None
    try:
        return SPARSE_ATTENTION, kernel(q, k, v, indices, scale)
    except Exception as exc:  # e.g. triton out of shared memory, or a head dim it cannot split
        _refuse(key, exc)
        return None


ENGINE_SPARSE = (
    f"top-k (DSA): {EK.FLASHMLA_SPARSE} (timing form: this layer's queries, heads, keys and top-k indices in the "
    "engines' absorbed layout; its output is not the layer's: TPPLAN_ENGINE_SPARSE=0 for the exact kernel)"
)


def engine_sparse_ok(q: Tensor) -> bool:
    """Whether DSA's attention may run FlashMLA: on CUDA, env TPPLAN_ENGINE_SPARSE not "0", FlashMLA loaded."""
    return q.is_cuda and EK.engine_enabled("TPPLAN_ENGINE_SPARSE") and EK.flashmla_loaded()


def try_engine_sparse(q: Tensor, k: Tensor, v: Tensor, scale: float, indices: Tensor) -> tuple[str, Tensor] | None:
    """(name, out [T, H * dv]) of DSA's attention timed by FlashMLA's sparse prefill in the absorbed form
    (`engine_kernels.absorbed_form`: the same T, H, S and indices, rows zero-padded to 576, values its first
    512 columns, each head's first dv of them returned) where on CUDA, env TPPLAN_ENGINE_SPARSE not "0", FlashMLA
    loaded and the shape not refused; None for the bench's own kernel. The forms differ (the runtime's per-head
    layout holds no latent), so the output is the right shape, not the layer's values: the numerics checks run
    with the Triton or reference kernel."""
    dv = v.shape[-1]
    if dv > EK.LATENT or not engine_sparse_ok(q):
        return None
    key = f"FlashMLA sparse, {q.shape[1]} heads"
    if key in _REFUSED:
        return None
    try:
        qa, kv, idx = EK.absorbed_form(q, k, indices)
        out = EK.flashmla_sparse(qa, kv, idx, scale)
    except Exception as exc:  # e.g. a head count or a top-k this build refuses
        _refuse(key, exc)
        return None
    return ENGINE_SPARSE, out[..., :dv].to(q.dtype).reshape(q.shape[0], -1)


__all__ = [
    "ENGINE_SPARSE",
    "FLA_SINKS",
    "FLA_WINDOW",
    "FUSED_INDEXER",
    "REFERENCE_INDEXER",
    "SPARSE_ATTENTION",
    "engine_attention_ok",
    "engine_sparse_ok",
    "fla_window",
    "fused_indexer_ok",
    "kernel_refusals",
    "selected_keys",
    "serving_indexer",
    "sparse_attention_ok",
    "takes_gqa",
    "try_engine_attention",
    "try_engine_sparse",
    "try_fla_window",
    "try_sparse_attention",
]
