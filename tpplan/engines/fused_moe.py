"""The row tile of each engine's fused-MoE Triton kernel: BLOCK_SIZE_M, the rows of one expert a program
multiplies at once. `moe_align_block_size` pads every active expert's rows up to a multiple of it, so at
decode (one or two rows per expert) the padded rows, not the routed ones, are what the kernel computes.

Read from the engines' default configs (the kernel's choice where no tuned JSON for the GPU and shape is
shipped, or `SGLANG_MOE_CONFIG_DIR` / `VLLM_TUNED_CONFIG_FOLDER` names none). M is the kernel's token count
(the rows of `hidden_states` entering it, before top-k), E the experts the rank holds. Tuned files the wheels
ship for some GPU and shape override these; two read for DeepSeek-V3 at TP8 on H200 (E=256, N=256, fp8
block 128x128), nearest-M key: SGLang 0.5.23 `configs/triton_3_1_0/...` BLOCK_SIZE_M 64 from M=24 on (16 at
M of 1, 2 and 16, 64 at 4 and 8), the default below gives 64 throughout; vLLM 0.34.0 `configs/...` 8 up to
M=4, 16 up to M=512, 64 beyond, the default gives 16 up to M=64 and 64 beyond. Not transcribed per GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpplan.engines import sglang_source, vllm
from tpplan.engines.schema import Source

MoeFormat = str  # a kernel source's weight format (`cost.kernel_source.GemmDtype`): "bf16", "fp8_block", ...

SGLANG_DEFAULT = sglang_source.rel(
    "python/sglang/srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py", "get_default_config"
)
VLLM_DEFAULT = Source(vllm.REPO, "vllm/model_executor/layers/fused_moe/fused_moe.py", "get_default_config", vllm.REL)
# Formats whose experts run the fused-MoE Triton kernel above; mxfp4/nvfp4 experts run other kernels
# (triton_kernels, Marlin, FlashInfer), whose tiles were not read.
TRITON_FORMATS = ("bf16", "fp8", "fp8_block", "int4")
UNREAD_TILE = 128  # an engine whose fused-MoE tile nobody read: the GEMM table's own 128-row tile


@dataclass(frozen=True)
class RowTile:
    """BLOCK_SIZE_M at one M, and where it was read."""

    rows: int
    source: Source


def _sglang(tokens: int, experts: int, fmt: MoeFormat) -> int:
    """SGLang 0.5.23 `get_default_config`: fp8 block-quant 64; fp8 per-tensor 64 for M <= E else 128 (the
    non-low-shared-memory branch, Hopper and Blackwell); every other dtype 16 for M <= E else 64."""
    if fmt == "fp8_block":
        return 64
    if fmt == "fp8":
        return 64 if tokens <= experts else 128
    return 16 if tokens <= experts else 64


def _vllm(tokens: int, fmt: MoeFormat) -> int:
    """vLLM 0.34.0 `get_default_config`: fp8 block-quant 16 for M <= 64 else 64; int4/int8 weight-only
    block formats 16 / 32 / 64 at M <= 20 / 40 / more (the CUDA wna16 kernel: min(16, next power of 2 of M));
    else (bf16, fp16, fp8 per-tensor) 16 / 32 / 64 / 128 at M <= 32 / 96 / 512 / more."""
    if fmt == "fp8_block":
        return 16 if tokens <= 64 else 64
    if fmt == "int4":
        return 16 if tokens <= 20 else (32 if tokens <= 40 else 64)
    for edge, rows in ((32, 16), (96, 32), (512, 64)):
        if tokens <= edge:
            return rows
    return 128


def row_tile(engine: str, tokens: int, experts: int, fmt: MoeFormat) -> RowTile:
    """The fused-MoE row tile `engine` ("sglang@0.5.23", "vllm", ...) runs at `tokens` tokens over `experts`
    local experts in weight format `fmt`; an engine tpplan has not read keeps a 128-row tile, cited unread."""
    name = engine.split("@")[0].lower()
    if fmt not in TRITON_FORMATS:
        return RowTile(
            UNREAD_TILE,
            Source.unread(
                name,
                "fused MoE",
                f"the row tile of {fmt} experts' kernel",
                why="only the Triton formats' configs hold a fixed tile: SGLang 0.5.23 runs mxfp4 experts through "
                "FlashInfer 0.7.2 (layers/quantization/mxfp4.py Mxfp4MoEMethod: trtllm_fp4_block_scale_moe on SM100, "
                "cutlass_fused_moe on SM90 and SM120) and autotunes it at startup (runner/flashinfer_autotune.py "
                "should_run_flashinfer_autotune: flashinfer_mxfp4), FlashInfer picking the CUTLASS tile per shape by "
                "profiling (fused_moe/core.py AutoTuner over get_valid_tactics): a run-time choice, not a constant "
                "in the source; the triton_kernels and Marlin paths were not read, nor the tiles of vLLM 0.34.0's "
                "mxfp4 backends (fused_moe/oracle/mxfp4.py _get_priority_backends: FlashInfer TRT-LLM or DeepGEMM "
                "on SM100+, Humming or Marlin on SM90; gpt-oss has its own list with the vendored triton_kernels)",
            ),
        )
    if name == "sglang":
        return RowTile(_sglang(tokens, experts, fmt), SGLANG_DEFAULT)
    if name == "vllm":
        return RowTile(_vllm(tokens, fmt), VLLM_DEFAULT)
    return RowTile(
        UNREAD_TILE,
        Source.unread(
            name,
            "fused MoE",
            "the grouped-expert kernel's row tile",
            why="only SGLang's and vLLM's fused MoE were read; this engine's MoE kernels are not among the "
            "wheels read (sglang 0.5.23, vllm 0.33.0 and 0.34.0)",
        ),
    )


__all__ = ["SGLANG_DEFAULT", "TRITON_FORMATS", "UNREAD_TILE", "VLLM_DEFAULT", "RowTile", "row_tile"]
