"""Dtype names and sizes, written once for the planner, the cost model, the runtime and the bench.

The CLI and the audit speak short names (`--dtype bf16`); torch and the runtime's trace speak
torch's names without the `torch.` prefix (`bfloat16`). Both tables below come from one list.
"""

from __future__ import annotations

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1}
"""Bytes per element of the activation dtypes a plan is audited and priced in (short names)."""

WEIGHT_BITS = {"bf16": 16.0, "fp16": 16.0, "fp32": 32.0, "fp8": 8.0, "mxfp4": 4.25}  # mxfp4: 4 bits + e8m0/32
"""Stored bits per weight element of the formats `--expert-dtype` names (scales included)."""

TORCH_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "fp8": "float8_e4m3fn"}
"""Short name -> torch's name."""

SHORT_NAMES = {torch_name: short for short, torch_name in TORCH_NAMES.items()}
"""torch's name -> short name."""

TORCH_DTYPE_BYTES = {TORCH_NAMES[short]: size for short, size in DTYPE_BYTES.items()} | {"int64": 8}
"""Bytes per element by torch's name; int64 for the MoE all-to-all's send counts."""


def dtype_name(dtype: str) -> str:
    """Canonical dtype name (torch's, without the `torch.` prefix) from `bf16`/`fp32`/... or itself."""
    name = TORCH_NAMES.get(dtype, dtype.removeprefix("torch."))
    if name not in TORCH_DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}")
    return name


__all__ = ["DTYPE_BYTES", "SHORT_NAMES", "TORCH_DTYPE_BYTES", "TORCH_NAMES", "WEIGHT_BITS", "dtype_name"]
