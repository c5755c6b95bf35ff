"""The engines' own attention kernels for the bench and the sweeps, where a folder of their builds is given.

The bench's window, chunk and sparse kernels are tpplan's (fla's Triton window kernel, SDPA per chunk, a Triton
gather kernel for DSA); the engines run FlashAttention 3 and FlashMLA on Hopper. With env
`TPPLAN_ENGINE_KERNELS=FOLDER` (a folder holding `vllm_flash_attn/_vllm_fa3_C.abi3.so`, from the vLLM 0.34.0
wheel, and the `flash_mla` package of sgl-flash-mla 1.0.0, SGLang 0.5.23's pin) these run instead:

- `fa3_attention`: FA3's varlen forward, called as vLLM 0.34.0 calls it
  (vllm/vllm_flash_attn/flash_attn_interface.py, `flash_attn_varlen_func`, fa_version 3:
  `torch.ops._vllm_fa3_C.fwd`): causal bottom-right, GQA in the kernel, a window w as window_size
  (w - 1, 0) (vllm/v1/attention/backends/flash_attn.py: `(sliding_window - 1, 0)`), gpt-oss's sinks as
  `s_aux` (bf16, one per head, at most 64 query heads, v as wide as q: the checks in `mha_fwd`,
  hopper/flash_api_stable.cpp of vllm-project/flash-attention, whose messages this .so carries), Llama 4's
  chunks as one sequence per chunk (varlen), as vLLM's chunked local attention splits a request into virtual
  batches.
- `flashmla_sparse`: FlashMLA's sparse prefill in the absorbed MQA 576/512 form (`flash_mla_sparse_fwd`, the
  SM90 kernels in the legacy namespace: `use_legacy=True`), q [T, H, 576] bf16, one latent row per key
  [S, 1, 576], indices [T, 1, topk] int32 (-1 = none); heads padded with zero rows to 64 on Hopper as SGLang
  0.5.23 pads them (sglang/srt/layers/attention/dsa_backend.py, `_forward_flashmla_sparse`: "requires num_heads
  to be a multiple of 64 (Hopper)") and vLLM 0.34.0 where it does not take its own build's small-head kernel
  (vllm/v1/attention/backends/mla/flashmla_sparse.py, `_bf16_flash_mla_kernel`, `prefill_padding = 64`); this
  build checks `h_q == 64 || h_q == 128`. Both engines also pass `topk_length` (valid slots per row), which is
  not passed here: the kernel masks the -1 slots (SGLang's comment there: "the output is unchanged").
- `flashmla_decode`: FlashMLA's dense bf16 MLA decode (`flash_mla_with_kvcache`, legacy namespace) over a
  paged latent cache of 64-row blocks.

Each library is loaded at most once per process (`torch.ops.load_library` for FA3's .so, an import of
`flash_mla` from the folder through `runtime.fast_kernels.optional_callable`); where the folder is not set,
lacks the files or a load fails, the reason is in `gpu_kernels.kernel_refusals()` and the bench keeps its own
kernels. Never imported by the planner.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from tpplan.runtime.fast_kernels import import_failure, optional_callable

ENV = "TPPLAN_ENGINE_KERNELS"
FA3 = "vllm-0.34.0 FA3 (_vllm_fa3_C.fwd varlen)"
FLASHMLA_SPARSE = "FlashMLA (sgl-flash-mla 1.0.0) flash_mla_sparse_fwd, absorbed MQA 576/512"
FLASHMLA_DECODE = "FlashMLA (sgl-flash-mla 1.0.0) flash_mla_with_kvcache, dense bf16, 64-row pages"
FA3_SO = "vllm_flash_attn/_vllm_fa3_C.abi3.so"
LEGACY_ONLY = "; its SM90 kernels (_C_legacy) loaded alone and called as flash_mla_interface.py calls them"
LATENT, ROPE = 512, 64  # the absorbed form: kv_lora_rank + the rope part (DeepSeek-V3.2, GLM-5.1)
SINK_HEADS = 64  # FA3 takes s_aux with at most this many query heads ("We only support query heads <= 64 with S aux")
HEAD_PAD = 64  # FlashMLA's sparse prefill takes 64 or 128 heads (vLLM pads to this multiple)
PAGE = 64  # FlashMLA's KV page rows
TOPK_BLOCK = 128  # FlashMLA's sparse kernels take top-k in whole blocks (`topk mod B_TOPK`): 64 or 128 wide
_REASONS: dict[str, str] = {}  # library -> why it is not loaded (kept for `gpu_kernels.kernel_refusals`)


def refusals() -> dict[str, str]:
    """The engine kernels not loaded in this process, each with why (only those a caller asked for)."""
    return dict(_REASONS)


def _folder(lib: str) -> Path | None:
    raw = os.environ.get(ENV, "")
    if not raw:
        _REASONS[lib] = f"not loaded: env {ENV} is not set (a folder of the engines' kernel builds)"
        return None
    path = Path(raw)
    if not path.is_dir():
        _REASONS[lib] = f"not loaded: {ENV}={raw} is not a folder"
        return None
    return path


@functools.cache
def fa3_ops() -> Any | None:
    """`torch.ops._vllm_fa3_C` from `$TPPLAN_ENGINE_KERNELS/vllm_flash_attn/_vllm_fa3_C.abi3.so`, loaded once;
    None (reason in `refusals`) where the folder or the file is missing, CUDA is not there or the load fails."""
    folder = _folder("FA3")
    if folder is None:
        return None
    so = folder / FA3_SO
    if not so.is_file():
        _REASONS["FA3"] = f"not loaded: {so} is missing"
        return None
    if not torch.cuda.is_available():
        _REASONS["FA3"] = "not loaded: no CUDA device (FA3 is a Hopper kernel)"
        return None
    try:
        torch.ops.load_library(str(so))
        return torch.ops._vllm_fa3_C
    except Exception as exc:  # OSError (a missing symbol of this torch), RuntimeError
        _REASONS["FA3"] = f"load failed: {type(exc).__name__}: {exc}"[:300]
        return None


@functools.cache
def _flash_mla(name: str) -> Callable[..., Any] | None:
    """`flash_mla.name` imported from the folder (its package loads its two .so files itself), once."""
    folder = _folder("FlashMLA")
    if folder is None:
        return None
    if not (folder / "flash_mla" / "__init__.py").is_file():
        _REASONS["FlashMLA"] = f"not loaded: {folder / 'flash_mla'} is not an installed flash_mla package"
        return None
    if not torch.cuda.is_available():
        _REASONS["FlashMLA"] = "not loaded: no CUDA device (FlashMLA is a Hopper kernel)"
        return None
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))  # this folder's flash_mla, not another one on the path
    fn = optional_callable("flash_mla", name)
    if fn is None:
        _REASONS["FlashMLA"] = f"import failed: {import_failure('flash_mla', name)}"
        fn = _legacy_only(folder, name)
    return fn


# -- FlashMLA's SM90 kernels alone, where the package does not import ------------------------------------------
# The package loads its SM100 extension first and fails without it; the SM90 kernels (`_C_legacy`) may still load.
# Then they are called as sgl-flash-mla 1.0.0's flash_mla/flash_mla_interface.py calls them on the legacy side
# (`flash_mla_sparse_fwd`, `flash_mla_with_kvcache` with indices None: `dense_decode_fwd`).


@functools.cache
def _legacy_ops(folder: Path) -> Any | None:
    """`torch.ops.flash_mla_legacy` from the folder's `flash_mla/_C_legacy.*.so`, loaded once; None if it fails."""
    so = sorted((folder / "flash_mla").glob("_C_legacy.*.so"))
    try:
        if not so:
            raise FileNotFoundError("no _C_legacy .so")
        torch.ops.load_library(str(so[0]))
        return torch.ops.flash_mla_legacy
    except Exception as exc:  # OSError (a missing symbol), FileNotFoundError
        _REASONS["FlashMLA"] += f"; its SM90 .so alone: {type(exc).__name__}: {exc}"[:300]
        return None


@dataclasses.dataclass
class _LegacyMeta:
    """`FlashMLASchedMeta`'s two fields the dense decode fills on its first call."""

    tile_scheduler_metadata: Any = None
    num_splits: Any = None


def _legacy_only(folder: Path, name: str) -> Callable[..., Any] | None:
    ops = _legacy_ops(folder)
    if ops is None:
        return None
    if LEGACY_ONLY not in _REASONS["FlashMLA"]:
        _REASONS["FlashMLA"] += LEGACY_ONLY

    def sparse(q: Tensor, kv: Tensor, indices: Tensor, sm_scale: float, d_v: int = LATENT, **_: Any) -> Any:
        return ops.sparse_prefill_fwd(q, kv, indices, sm_scale, d_v, None, None, False, True)

    def meta() -> tuple[_LegacyMeta, None]:
        return _LegacyMeta(), None

    def decode(q: Tensor, k_cache: Tensor, block_table: Tensor, cache_seqlens: Tensor, head_dim_v: int,
               sched: _LegacyMeta, num_splits: None = None, softmax_scale: float | None = None,
               causal: bool = False, **_: Any) -> tuple[Tensor, Tensor]:  # fmt: skip
        scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
        out, lse, sched.tile_scheduler_metadata, sched.num_splits = ops.dense_decode_fwd(
            q, k_cache, head_dim_v, cache_seqlens, block_table, scale, causal, sched.tile_scheduler_metadata,
            sched.num_splits,
        )  # fmt: skip
        return out, lse

    fns: dict[str, Callable[..., Any]] = {"flash_mla_sparse_fwd": sparse, "get_mla_metadata": meta,
                                          "flash_mla_with_kvcache": decode}  # fmt: skip
    return fns.get(name)


def engine_enabled(switch: str) -> bool:
    """An engine kernel is tried unless env `switch` is "0" (then the bench's own kernel runs)."""
    return os.environ.get(switch, "1") != "0"


# -- FlashAttention 3 (window, sinks, chunks, GQA) ------------------------------------------------------


def chunk_seqlens(t: int, s: int, chunk: int) -> tuple[list[int], list[int], int]:
    """Varlen boundaries of chunked attention for the last t of s positions: (cu_seqlens_q, cu_seqlens_k,
    first key): each chunk a sequence of its queries over its keys from the chunk's start (keys before
    `first` are read by no query)."""
    first = (s - t) // chunk * chunk
    cu_q, cu_k = [0], [0]
    c0 = first
    while c0 < s:
        hi = min(s, c0 + chunk)
        cu_q.append(cu_q[-1] + hi - max(s - t, c0))
        cu_k.append(cu_k[-1] + hi - c0)
        c0 = hi
    return cu_q, cu_k, first


@functools.lru_cache(maxsize=256)
def _int32(values: tuple[int, ...], device: str) -> Tensor:
    """A small int32 tensor on `device`, made once per value (the engines build their varlen metadata once per
    batch, not per layer: no host-to-device copy inside a timed call)."""
    return torch.tensor(values, dtype=torch.int32, device=device)


def fa3_args(
    q: Tensor, k: Tensor, v: Tensor, scale: float, window: int | None = None, sinks: Tensor | None = None,
    chunk: int | None = None,
) -> tuple[Any, ...]:  # fmt: skip
    """The 37 arguments of `torch.ops._vllm_fa3_C.fwd` as vLLM 0.34.0's `flash_attn_varlen_func` passes them
    (fa_version 3, no paged cache, no fp8): q [T, H, d] the last T of S positions, k/v [S, Hk, d] (Hk
    divides H), causal; `window` w -> window_size (w - 1, 0); `sinks` [H] -> s_aux bf16; `chunk` -> one
    varlen sequence per chunk."""
    t, s = q.shape[0], k.shape[0]
    if chunk:
        cu_q, cu_k, first = chunk_seqlens(t, s, chunk)
        k, v = k[first:], v[first:]
    else:
        cu_q, cu_k = [0, t], [0, s]
    seq_q, seq_k = _int32(tuple(cu_q), str(q.device)), _int32(tuple(cu_k), str(q.device))
    max_q = max(b - a for a, b in itertools.pairwise(cu_q))
    max_k = max(b - a for a, b in itertools.pairwise(cu_k))
    left = window - 1 if window else -1
    aux = None if sinks is None else sinks.to(torch.bfloat16).contiguous()  # "We only support bf16 dtype for S aux."
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    return (
        q, k, v, None, None, None, None,  # k_new, v_new, q_v, out
        seq_q, seq_k, None, None, None,  # cu_seqlens_q, cu_seqlens_k, cu_seqlens_k_new, seqused_q, seqused_k
        max_q, max_k, None, None, None,  # max_seqlen_q, max_seqlen_k, block_table, kv_batch_idx, leftpad_k
        None, None, None, None, None, None,  # rotary cos/sin/seqlens, q/k/v descale
        scale, True, left, -1 if not window else 0, 0.0, True,  # scale, causal, window left/right, softcap, rotary
        None, 0, None, 0, aux, 1, 0, None,  # scheduler_metadata, num_splits, pack_gqa, sm_margin, s_aux, cp
    )  # fmt: skip


def fa3_attention(
    q: Tensor, k: Tensor, v: Tensor, scale: float, window: int | None = None, sinks: Tensor | None = None,
    chunk: int | None = None, op: Callable[..., Any] | None = None,
) -> Tensor:  # fmt: skip
    """`kernels.causal_attention(..., window=, chunk=, sinks=)` by FA3 ([T, H * dv]); `op`: the fwd op
    (default the loaded one; the CPU tests pass a stand-in)."""
    ops = None if op is not None else fa3_ops()
    run = op or (ops.fwd if ops is not None else None)
    if run is None:
        raise RuntimeError(f"fa3_attention: FA3 is not loaded ({refusals().get('FA3')})")
    out = run(*fa3_args(q, k, v, scale, window, sinks, chunk))[0]
    return out.reshape(q.shape[0], -1)


# -- FlashMLA (DSA's sparse prefill, MLA decode) ------------------------------------------------------------


def absorbed_form(q: Tensor, k: Tensor, indices: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The engines' absorbed (latent) MQA form of a DSA attention at the same queries, heads, keys and
    selection: q [T, H, d] (the last T of S positions) -> [T, H, 576], k [S, Hk, d] -> one latent row per key
    [S, 1, 576] (key head 0), indices [T, topk] -> [T, 1, topk'] int32, a key after its query marked -1 (the
    engines' top-k marks unused slots so; FlashMLA applies no causal mask) and topk' the next multiple of
    `TOPK_BLOCK` (-1 filled: the kernel's `topk mod B_TOPK` check). Rows are zero-padded or cut to 576 columns:
    the runtime's per-head layout does not hold the latent (nor the absorbed up-projections), so this is the
    engines' work at these shapes, not the model's values (the output is not the layer's; for q and k
    already in the latent form, 576 wide with one KV head, it is exact)."""
    width = LATENT + ROPE
    t, s = q.shape[0], k.shape[0]
    pos = torch.arange(s - t, s, device=indices.device, dtype=torch.int32)[:, None]
    ix = indices.to(torch.int32)
    ix = torch.where(ix <= pos, ix, -1)
    wide = -(-ix.shape[1] // TOPK_BLOCK) * TOPK_BLOCK
    if wide > ix.shape[1]:
        ix = torch.nn.functional.pad(ix, (0, wide - ix.shape[1]), value=-1)

    def fit(x: Tensor) -> Tensor:
        d = x.shape[-1]
        return x[..., :width] if d >= width else torch.nn.functional.pad(x, (0, width - d))

    qa = fit(q).to(torch.bfloat16).contiguous()
    kv = fit(k[:, :1]).to(torch.bfloat16).contiguous()
    return qa, kv, ix.reshape(t, 1, -1).contiguous()


def flashmla_sparse(
    q: Tensor, kv: Tensor, indices: Tensor, scale: float, fn: Callable[..., Any] | None = None
) -> Tensor:
    """FlashMLA's sparse prefill of absorbed-form q [T, H, 576], kv [S, 1, 576], indices [T, 1, topk] int32:
    [T, H, 512]. Heads padded with zero rows to a multiple of `HEAD_PAD` (vLLM's rule), their rows dropped;
    `fn`: the kernel (default `flash_mla_sparse_fwd`; the CPU tests pass a stand-in)."""
    run = fn or _flash_mla("flash_mla_sparse_fwd")
    if run is None:
        raise RuntimeError(f"flashmla_sparse: FlashMLA is not loaded ({refusals().get('FlashMLA')})")
    h = q.shape[1]
    pad = -(-h // HEAD_PAD) * HEAD_PAD
    qp = q if pad == h else torch.nn.functional.pad(q, (0, 0, 0, pad - h))
    out = run(qp.contiguous(), kv, indices, scale, d_v=LATENT, use_legacy=True)[0]
    return out[:, :h]


def paged_latent(latent: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """A latent cache [B, L, 1, 576] (L a multiple of `PAGE`) as FlashMLA's paged cache: (k_cache [B * L /
    64, 64, 1, 576], block_table [B, L / 64] int32, cache_seqlens [B] int32)."""
    b, n = latent.shape[0], latent.shape[1]
    if n % PAGE:
        raise ValueError(f"paged_latent: {n} cached keys are not a multiple of {PAGE}")
    pages = n // PAGE
    cache = latent.reshape(b * pages, PAGE, 1, latent.shape[-1])
    table = torch.arange(b * pages, dtype=torch.int32, device=latent.device).reshape(b, pages)
    lens = torch.full((b,), n, dtype=torch.int32, device=latent.device)
    return cache, table, lens


def flashmla_decode(
    q: Tensor, latent: Tensor, scale: float, fns: tuple[Callable[..., Any], Callable[..., Any]] | None = None
) -> Tensor:
    """MLA decode, one new token per request: q [B, H, 576] against the latent cache [B, L, 1, 576] ->
    [B, H, 512] by FlashMLA's dense bf16 decode (`flash_mla_with_kvcache`, `use_legacy=True`, causal as vLLM
    0.34.0's FlashMLA backend passes it: vllm/v1/attention/backends/mla/flashmla.py). The block table, lengths
    and scheduler metadata are made once per shape and reused (the interface allows reuse at equal shapes; an
    engine builds them once per step, not per layer). `fns`: (get_mla_metadata, flash_mla_with_kvcache),
    default the loaded ones (the CPU tests pass stand-ins)."""
    meta_fn, run = fns or (_flash_mla("get_mla_metadata"), _flash_mla("flash_mla_with_kvcache"))
    if meta_fn is None or run is None:
        raise RuntimeError(f"flashmla_decode: FlashMLA is not loaded ({refusals().get('FlashMLA')})")
    key = (*q.shape, latent.shape[1], str(q.device), id(meta_fn))
    if key not in _DECODE_STATE:
        _DECODE_STATE[key] = (*paged_latent(latent)[1:], meta_fn()[0])
    table, lens, meta = _DECODE_STATE[key]
    cache = latent.reshape(-1, PAGE, 1, latent.shape[-1])  # a view: `paged_latent`'s pages
    out = run(q.unsqueeze(1), cache, table, lens, LATENT, meta, None, softmax_scale=scale, causal=True,
              use_legacy=True)[0]  # fmt: skip
    return out[:, 0]


_DECODE_STATE: dict[tuple[Any, ...], tuple[Tensor, Tensor, Any]] = {}  # shape -> (block table, lengths, metadata)


def fa3_loaded() -> bool:
    return fa3_ops() is not None


def flashmla_loaded() -> bool:
    return _flash_mla("flash_mla_sparse_fwd") is not None


__all__ = [
    "ENV",
    "FA3",
    "FLASHMLA_DECODE",
    "FLASHMLA_SPARSE",
    "absorbed_form",
    "chunk_seqlens",
    "engine_enabled",
    "fa3_args",
    "fa3_attention",
    "fa3_loaded",
    "fa3_ops",
    "flashmla_decode",
    "flashmla_loaded",
    "flashmla_sparse",
    "paged_latent",
    "refusals",
]
