"""The bench's GPU-only kernels and when each runs: fla's window attention, DSA's fused indexer and sparse attention.

Both run only on CUDA with their library (fla, triton); elsewhere the bench keeps its portable kernels
(`masked_attention.banded_attention`, the reference indexer). A kernel that raises on the GPU (e.g. triton
out of shared memory at a head dim: neither was compiled on a GPU when written) falls back for that shape
from then on, and `kernel_refusals` says which and why; the names returned say what ran.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, cast

from torch import Tensor

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
    """The GPU kernels that raised in this process (kernel and shape -> the error), each fallen back since."""
    return dict(_REFUSED)


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
    kernel = _sparse_kernel() if sparse_attention_ok(q) else None
    key = f"sparse attention, head dims {q.shape[-1]}/{v.shape[-1]}, {q.shape[1]}/{k.shape[1]} heads"
    if kernel is None or key in _REFUSED:
        return None
    try:
        return SPARSE_ATTENTION, kernel(q, k, v, indices, scale)
    except Exception as exc:  # e.g. triton out of shared memory, or a head dim it cannot split
        _refuse(key, exc)
        return None


__all__ = [
    "FLA_SINKS",
    "FLA_WINDOW",
    "FUSED_INDEXER",
    "REFERENCE_INDEXER",
    "SPARSE_ATTENTION",
    "fla_window",
    "fused_indexer_ok",
    "kernel_refusals",
    "selected_keys",
    "serving_indexer",
    "sparse_attention_ok",
    "try_fla_window",
    "try_sparse_attention",
]
