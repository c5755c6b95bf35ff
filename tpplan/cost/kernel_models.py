"""Physical models of the serving kernels: time from the work's shape, with a few constants fitted per GPU.

Why: a roofline with one efficiency misses how these kernels behave where the plans differ (few
heads per rank, few tokens per expert), and per-op profiles fitted on one slice only hold there.
Each model here has a form taken from what the kernel does, and constants fitted on isolated
timings of the kernel (`tpplan.bench.kernel_sweep`, fit in `tpplan.bench.model_fit`); they are
checked on regimes they were not fitted on (docs/benchmarks.md, "Physical kernel models").

- attention (SDPA over a KV cache, the runtime's `causal_attention`): t = a + b x rows + F / R,
  with F the causal score + value FLOPs as executed (MLA's v zero-padded to the q/k head dim) and
  rows = heads x tokens x (dqk + dv): the per-query work (load q, rescale, write o). Two constant
  sets: no context and with context (the lower-right causal mask over a cache takes another
  kernel, about 60% of the rate).
- recurrence (fla's chunked KDA): t = smoothmax(floor, work), floor = c0 + c1 x T (the chain of
  small per-chunk kernels, launch-bound) and work = b x heads x T, smoothmax(x, y) = (x^p + y^p)^(1/p).
  Below some heads per rank the floor dominates and time stops shrinking with the work.
- experts (grouped GEMM, `torch._grouped_mm`): t = c0 + smoothmax(weight bytes / BW, compute), with
  compute the GEMM table's time for the tile-padded per-expert shapes (`cost.gemm`): few tokens per
  expert read every expert's weights (memory-bound), many are compute-bound at the GEMM rate.
- short_conv: t = a + bytes / BW over the [T, C] input and output.
- attn_res (K3's softmax over depth, the runtime's torch path): t = a + bytes / BW over the fp32
  rows it builds, T x (snapshots + 1) x hidden x 4 bytes.

`KernelModels` holds the constants (`GpuSpec.kernel_models`, by model name); each `*_s` method
returns None where the GPU has no constants for that kernel (the caller keeps its roofline).
Constants named `min_<dim>` / `max_<dim>` give the range the sweep measured (heads, tokens,
context, experts, rows_per_expert, channels, snapshots); `extrapolated` says when a shape is
outside it, so a prediction can say it was priced where nothing was measured.
"""

from __future__ import annotations

from collections.abc import Mapping

Consts = Mapping[str, float]


def smoothmax(x: float, y: float, p: float) -> float:
    """(x^p + y^p)^(1/p): max(x, y) for large p, their sum at p = 1; overlap of two limits.
    Computed relative to the larger (seconds to a large power underflow)."""
    m = max(x, y)
    if m <= 0:
        return 0.0
    return m * ((x / m) ** p + (y / m) ** p) ** (1.0 / p)


def attention_flops(heads: int, tokens: int, context: int, dqk: int, dv: int) -> float:
    """Causal attention FLOPs for `tokens` new queries after `context` cached keys: per (query, key)
    pair 2*dqk for the score and 2*dv for the value product; pairs = T*context + T*(T+1)/2 per head."""
    pairs = tokens * context + tokens * (tokens + 1) / 2
    return 2.0 * heads * pairs * (dqk + dv)


def attention_s(c: Consts, heads: int, tokens: int, dqk: int, dv: int, flops: float) -> float:
    """a + b x heads x tokens x (dqk + dv) + F / R (constants of one branch)."""
    return c["a_s"] + c["b_s"] * heads * tokens * (dqk + dv) + flops / (c["tflops"] * 1e12)


def recurrence_s(c: Consts, heads: int, tokens: int) -> float:
    """smoothmax(c0 + c1*T, b*heads*T) (see the module docstring)."""
    floor = c["c0_s"] + c["c1_s"] * tokens
    work = c["b_s"] * heads * tokens
    return smoothmax(floor, work, c["p"])


def experts_s(c: Consts, active: int, width: int, inter: int, compute_s: float, weight_bytes: float = 2.0) -> float:
    """c0 + smoothmax(weights / BW, compute_s) for gate, up and down of `active` experts."""
    weights = active * 3.0 * width * inter * weight_bytes
    return c["c0_s"] + smoothmax(weights / (c["TBps"] * 1e12), compute_s, c["p"])


def attn_res_bytes(tokens: int, hidden: int, snapshots: float) -> float:
    """The fp32 rows the attention residual builds: [T, snapshots + 1, hidden]."""
    return 4.0 * tokens * (snapshots + 1.0) * hidden


def stream_s(c: Consts, nbytes: float) -> float:
    """a + bytes / BW: a memory-bound kernel (short conv, routing gathers and scatters)."""
    return c["a_s"] + nbytes / (c["TBps"] * 1e12)


# Kernel family (tpplan.bench.config.impl_class) -> the implementation the constants were fitted on
# (`OpResult.impl` starts with it). A recorded run whose op ran something else keeps the roofline.
FITTED_ON = {
    "mla": "torch SDPA",
    "gqa": "torch SDPA",
    "kda": "fla.chunk_kda",
    "experts": "torch._grouped_mm",
    "short_conv": "torch conv1d",
    "attn_res": "torch, fp32 rows",
}


class KernelModels:
    """The fitted constants of one GPU (`GpuSpec.kernel_models`): name -> constants."""

    NAMES = ("attention_causal", "attention_prefix", "kda", "experts", "short_conv", "attn_res")

    def __init__(self, consts: Mapping[str, Consts]) -> None:
        self.consts = consts

    def extrapolated(self, name: str, **dims: float) -> bool:
        """True when any given dimension lies outside the range model `name` was measured over."""
        c = self.consts.get(name)
        if c is None:
            return False
        for dim, v in dims.items():
            lo, hi = c.get(f"min_{dim}"), c.get(f"max_{dim}")
            if (lo is not None and v < lo) or (hi is not None and v > hi):
                return True
        return False

    @staticmethod
    def fitted_for(family: str, impl: str | None) -> bool:
        """Whether the constants for `family` describe `impl` (None, unknown: no)."""
        want = FITTED_ON.get(family)
        return want is not None and impl is not None and impl.startswith(want)

    def attention(self, heads: int, tokens: int, context: int, dqk: int, dv: int, flops: float) -> float | None:
        c = self.consts.get("attention_prefix" if context > 0 else "attention_causal")
        return None if c is None else attention_s(c, heads, tokens, dqk, dv, flops)

    def recurrence(self, impl: str, heads: int, tokens: int) -> float | None:
        c = self.consts.get(impl)
        return None if c is None else recurrence_s(c, heads, tokens)

    def experts(self, active: int, width: int, inter: int, compute_s: float, weight_bytes: float) -> float | None:
        c = self.consts.get("experts")
        return None if c is None else experts_s(c, active, width, inter, compute_s, weight_bytes)

    def attn_res(self, rows: int, hidden: int, snapshots: float) -> float | None:
        c = self.consts.get("attn_res")
        return None if c is None else stream_s(c, attn_res_bytes(rows, hidden, snapshots))

    def stream(self, nbytes: float) -> float | None:
        c = self.consts.get("short_conv")
        return None if c is None else stream_s(c, nbytes)


__all__ = [
    "KernelModels",
    "attention_flops",
    "attention_s",
    "attn_res_bytes",
    "experts_s",
    "recurrence_s",
    "smoothmax",
    "stream_s",
]
