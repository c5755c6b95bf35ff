"""Elementwise activations shared by the reference kernels and their GPU fast paths.

Below both `kernels_local` (which re-exports through `tpplan.runtime.kernels`) and `fast_kernels`
(whose conv fast path applies the same activation), so neither imports the other to reach it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def unary(x: Tensor, fn: str) -> Tensor:
    """The elementwise map `fn` (a UNARY op's `fn` attribute: sigmoid or silu)."""
    if fn == "sigmoid":
        return torch.sigmoid(x)
    if fn == "silu":
        return F.silu(x)
    raise ValueError(f"unknown unary fn {fn!r}")
