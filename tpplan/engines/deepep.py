"""SGLang's DeepEP all-to-all as read in 0.5.23 (`--moe-a2a-backend deepep`), and what DeepEP's low-latency
kernels put on the wire.

- `--deepep-mode` defaults to `auto` (`MODE_DEFAULT`); `DeepEPMode.resolve` turns `auto` into `normal` for a
  batch with any extend (prefill) request and into `low_latency` otherwise (`MODE_RESOLVE`), so an SGLang
  decode step dispatches and combines with the low-latency kernels (`LL_DISPATCH`), prefill with the normal
  (high-throughput) ones. `--deepep-mode normal` also turns off decode CUDA graphs (`NORMAL_NO_GRAPHS`).
- The low-latency dispatch sends one message per (token, selected expert) to the expert's rank, no merging of a
  token's experts on one rank: a 16-byte header, the hidden row in FP8 and one fp32 scale per 128 elements
  (`LL_MESSAGE`); the dispatcher's output dtype is FP8 unless the quantization config asks otherwise
  (`FP8_DEFAULT`). The combine sends each expert's bf16 output row back to its token's rank and reduces
  there (SGLang passes no LogFMT compression).
- Each rank's buffers are sized for `SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK` tokens (128 by default;
  `MAX_TOKENS`): a decode batch per rank above it does not fit the low-latency path.
"""

from __future__ import annotations

import math
from typing import Literal

from tpplan.engines import sglang_source
from tpplan.engines.schema import Source

Mode = Literal["auto", "normal", "low_latency"]
_MOE = "python/sglang/srt/layers/moe"
MODE_DEFAULT = sglang_source.rel("python/sglang/srt/arg_groups/fields/exec_.py", "deepep_mode: ... = 'auto'")
MODE_RESOLVE = sglang_source.rel(f"{_MOE}/utils.py", "DeepEPMode.resolve")
LL_DISPATCH = sglang_source.rel(
    f"{_MOE}/token_dispatcher/deepep.py",
    "_DeepEPDispatcherImplLowLatency._dispatch_core / _combine_core (buffer.low_latency_dispatch / _combine)",
)
FP8_DEFAULT = sglang_source.rel(f"{_MOE}/utils.py", "get_deepep_output_dtype (7. otherwise FP8)")
NORMAL_NO_GRAPHS = sglang_source.rel("python/sglang/srt/arg_groups/moe_hook.py", "_handle_a2a_moe")
MAX_TOKENS_SOURCE = sglang_source.rel(
    "python/sglang/srt/environ.py", "SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK = EnvInt(128)"
)
LL_MESSAGE = Source(
    "deepseek-ai/DeepEP",
    "csrc/kernels/internode_ll.cu",
    "dispatch: num_bytes_per_msg = sizeof(int4) + kHidden + num_scales * sizeof(float) (FP8; rounded up to 16 bytes, "
    "which changes nothing at hidden sizes that are multiples of 512), one per top-k expert",
    "commit 2df3680e",
)
LL_MEASURED = Source(
    "deepseek-ai/DeepEP",
    "README.md",
    "'Low-latency kernels with pure RDMA' (H800, CX7 400 Gb/s, 128 tokens, hidden 7168, top-8)",
    "commit 0aaa6744",
)
DEFAULT_MODE: Mode = "auto"  # what tpplan's launch lines pass: prefill normal, decode low latency, CUDA graphs on
DECODE_LOW_LATENCY = (
    "--deepep-mode auto: batches with a prefill request dispatch with DeepEP's normal kernels, decode batches with "
    "its low-latency kernels (one message per token and expert; tpplan prices decode steps so); `normal` would "
    "also turn off decode CUDA graphs"
)
MAX_TOKENS = 128  # SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK's default
HEADER_BYTES = 16  # int4: the token's index at its source and three reserved ints
SCALE_GROUP = 128  # hidden elements per fp32 FP8 scale


def mode_at(mode: Mode, extend: bool) -> Literal["normal", "low_latency"]:
    """The mode a batch runs in (`DeepEPMode.resolve`): `auto` is normal with an extend request, else low latency."""
    if mode != "auto":
        return mode
    return "normal" if extend else "low_latency"


def dispatch_message_bytes(hidden: int) -> int:
    """One low-latency dispatch message: header, FP8 row, its fp32 scales."""
    return HEADER_BYTES + hidden + 4 * math.ceil(hidden / SCALE_GROUP)


def combine_message_bytes(hidden: int) -> int:
    """One low-latency combine message: an expert's bf16 output row."""
    return 2 * hidden


__all__ = [
    "DECODE_LOW_LATENCY",
    "DEFAULT_MODE",
    "FP8_DEFAULT",
    "LL_DISPATCH",
    "LL_MEASURED",
    "LL_MESSAGE",
    "MAX_TOKENS",
    "MAX_TOKENS_SOURCE",
    "MODE_DEFAULT",
    "MODE_RESOLVE",
    "NORMAL_NO_GRAPHS",
    "Mode",
    "combine_message_bytes",
    "dispatch_message_bytes",
    "mode_at",
]
