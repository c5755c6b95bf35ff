"""Physical models of the serving kernels: time from the work's shape, with a few constants fitted per GPU.

Why: a roofline with one efficiency misses how these kernels behave where the plans differ (few
heads per rank, few tokens per expert), and per-op profiles fitted on one slice only hold there.
Each model here has a form taken from what the kernel does, and constants fitted on isolated
timings of the kernel (`tpplan.bench.kernel_sweep`, fit in `tpplan.bench.model_fit`); they are
checked on regimes they were not fitted on (docs/benchmarks.md, "Physical kernel models").

- attention (the MLA/GQA op as the runtime runs it, SDPA inside): t = a + b x rows + c x cached
  + F / R, with F the causal score + value FLOPs as executed (MLA's v zero-padded to the q/k head
  dim), rows = heads x tokens x (dqk + dv) (the per-query work: rope, concatenations, padding,
  the output) and cached = heads x context x (dqk + dv) (the KV-cache append copies the cached rows
  once per call; `c` is absent, 0, in sets fitted on the kernel alone). Two constant sets: no
  context and with context (the lower-right causal mask over a cache takes another kernel).
- recurrence (fla's chunked KDA; Gated DeltaNet's whole op, its conv and gated norm included, by
  v heads per rank): t = smoothmax(floor, work), floor = c0 + c1 x T (the chain of
  small per-chunk kernels) and work = b x heads x T, smoothmax(x, y) = (x^p + y^p)^(1/p).
  Below some heads per rank the floor dominates and time stops shrinking with the work.
- experts (grouped GEMM, `torch._grouped_mm`): t = c0 + smoothmax(weight bytes / BW, compute), with
  compute the GEMM table's time for the tile-padded per-expert shapes (`cost.gemm`): few tokens per
  expert read every expert's weights (memory-bound), many are compute-bound at the GEMM rate. The
  routing around them is memory traffic (`routing_bytes`): with `route_TBps` in the set (fitted on
  the whole op) at that rate, else at the HBM rate with the bytes of the fp32 combine.
- short_conv: t = a + bytes / BW over the [T, C] input and output.
- norm (fla's fused RMSNorm): t = a + bytes / BW over the rows read and written.
- decode attention (one new token per request; `decode_gqa`: GQA by flash-decoding, `decode_mla`: MLA
  absorbed, MQA over the latent): t = a + bytes / BW + flops / R, bytes the cache read (GQA: k and v of
  the rank's KV heads; MLA: the latent once), flops the scores and values; a rate of 0 drops its term
  (GQA: bytes alone). Fitted on the decode sweep (`tpplan.bench.decode_fit`).
- dsa_attention (DSA's sparse prefill in the engines' absorbed form, FlashMLA): the same form, bytes the
  latent rows gathered (576 wide per selected key), flops at the heads the kernel computes (padded).
- gemm_small (bf16 GEMMs at M <= 512, a decode step's projections): the same form over A, B and C read
  and written once; the sweep cycles weight copies past the L2, as a step's other layers evict them.
- attn_res (K3's softmax over depth): t = a + bytes / BW, the bytes of the implementation the set
  was fitted on (`attn_res_s`): the torch path's fp32 rows, or fla's fused kernel (each row read
  once in bf16) plus the copies that make the bank's snapshots contiguous, at their own rate.

An attention set may carry `host_s`: then its `a_s` is the kernel's own fixed cost per call and
`host_s` the host overhead of tpplan's runtime around it (Python, the launches of its small ops),
charged only where tpplan's runtime is what is priced (a recorded run's re-prediction,
`charge_host=True`); a serving engine's kernels (CUDA graphs, fused launches) do not pay it. A set
without `host_s` has the overhead inside `a_s`, as fitted (the h200-serving presets).

A set may carry `clock_factor`: its times are the boost-clock model's times that factor (the
power-capped clock state, where a large model's prefill holds the GPU at its power limit and the SM
clock ~25% below boost; measured per model in `tpplan.bench.clock_fit`). Without it, 1.

Each set may name the implementation it was fitted on (`impl`, a string); a set without one was
fitted on `FITTED_ON`'s. A recorded run's op that ran another implementation keeps the roofline.

`KernelModels` holds the constants (`GpuSpec.kernel_models`, by model name); each `*_s` method
returns None where the GPU has no constants for that kernel (the caller keeps its roofline).
Constants named `min_<dim>` / `max_<dim>` give the range the sweep measured (heads, tokens,
context, experts, rows_per_expert, channels, snapshots); `extrapolated` says when a shape is
outside it, so a prediction can say it was priced where nothing was measured.
"""

from __future__ import annotations

from collections.abc import Mapping

Consts = Mapping[str, float | str]


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


def _f(c: Consts, name: str, default: float | None = None) -> float:
    v = c.get(name, default)
    if v is None or isinstance(v, str):
        raise KeyError(name)
    return float(v)


ATTN_Q_BLOCK = 128  # query rows per flash-attention program (FA2/FA3 on Hopper: 128)


def attention_s(
    c: Consts, heads: int, tokens: int, dqk: int, dv: int, flops: float, context: int = 0, window: int | None = None
) -> float:  # fmt: skip
    """a + b x heads x tokens x (dqk + dv) + c x heads x context x (dqk + dv) + F / R (one branch's constants).

    With `sm_tflops` in the set, F / R becomes smoothmax(F / R, chain / R_sm, p): at few heads per rank the
    flash kernel has fewer query blocks than SMs, and the last (causal) block's pass over every key, on one
    SM at `sm_tflops`, bounds the time (H100 per-rank sweep: 1 head at 8K tokens ran at 167 TFLOP/s). Under
    a sliding `window` a block passes over the window's keys only, so the chain is at most `window` keys
    (without it, few heads at 32K tokens were priced 5x the window kernel: docs/benchmarks.md, 06d sweep)."""
    per = heads * (dqk + dv)
    work = flops / (_f(c, "tflops") * 1e12)
    if "sm_tflops" in c:
        keys = tokens + context if window is None else min(tokens + context, window)
        chain = 2.0 * ATTN_Q_BLOCK * keys * (dqk + dv) / (_f(c, "sm_tflops") * 1e12)
        work = smoothmax(work, chain, _f(c, "p"))
    return _f(c, "a_s") + _f(c, "b_s") * per * tokens + _f(c, "c_s", 0.0) * per * context + work


def recurrence_s(c: Consts, heads: int, tokens: int) -> float:
    """smoothmax(c0 + c1*T, b*heads*T) (see the module docstring)."""
    floor = _f(c, "c0_s") + _f(c, "c1_s") * tokens
    work = _f(c, "b_s") * heads * tokens
    return smoothmax(floor, work, _f(c, "p"))


def experts_s(
    c: Consts, active: int, width: int, inter: int, compute_s: float, weight_bytes: float = 2.0, rows: float = 0.0
) -> float:
    """c0 + smoothmax(bytes / BW, compute_s) for gate, up and down of `active` experts. bytes: the weights,
    plus (a set with `memory` = "weights+rows") the routed rows' bf16 traffic through both GEMMs
    (read W, write 2I; read I, write W): at a TP32 slice (I = 96) the rows, not the weights, bound it."""
    nbytes = active * 3.0 * width * inter * weight_bytes
    if c.get("memory") == "weights+rows":
        nbytes += rows * (2.0 * width + 3.0 * inter) * 2.0
    return _f(c, "c0_s") + smoothmax(nbytes / (_f(c, "TBps") * 1e12), compute_s, _f(c, "p"))


# Routing traffic per routed row and per token, in units of `width` elements (bytes):
# FP32_COMBINE: rows gathered in bf16 (read + write 4), outputs upcast and weighted in fp32 (2 + 4 + 4 + 4
# + 4 for the scatter-add's read) ... 22 per row; the [T, W] fp32 result zeroed, read and cast (14 per token).
# WEIGHTED_SUM (the bench's serving combine): gather (4), back to token order (4), the weighted sum's
# read (2) per row; the bf16 result (2) per token.
# FUSED_MOE (the engines' fused MoE, vLLM 0.34.0 `fused_moe.fused_experts_impl`): the gather rides in the first
# GEMM's A loads (`offs_token // top_k`) and the second GEMM writes each row weighted in token order, so what is
# left is `ops.moe_sum` over [T, top_k, W]: each row read (2) per row, the bf16 result (2) per token.
FP32_COMBINE = (22.0, 14.0)
WEIGHTED_SUM = (10.0, 2.0)
FUSED_MOE = (2.0, 2.0)


def routing_bytes(rows: int, tokens: int, width: int, per: tuple[float, float]) -> float:
    return (rows * per[0] + tokens * per[1]) * width


def attn_res_bytes(tokens: int, hidden: int, snapshots: float) -> float:
    """The fp32 rows the torch path builds over `snapshots` stored rows plus the prefix:
    [T, snapshots + 1, hidden] x 4 bytes."""
    return 4.0 * tokens * (snapshots + 1.0) * hidden


def attn_res_s(c: Consts, tokens: int, hidden: int, snapshots: float, impl: str | None = None) -> float:
    """a + bytes / BW for the implementation the set was fitted on. fla's fused kernel: every row read
    once in bf16 and the output written (2 x (snapshots + 2) x T x hidden bytes) at BW, plus a bf16 copy
    (read + write) of each snapshot when there are two or more (the bank is token-major) at the copy
    rate `copy_TBps` (strided reads; the kernel streams). The torch path: `attn_res_bytes` at BW."""
    if impl is None or not impl.startswith("fla"):
        return stream_s(c, attn_res_bytes(tokens, hidden, snapshots))
    copies = snapshots if snapshots > 1 else 0.0
    kernel = 2.0 * tokens * hidden * (snapshots + 2.0)
    return stream_s(c, kernel) + 4.0 * tokens * hidden * copies / (_f(c, "copy_TBps") * 1e12)


def decode_s(c: Consts, nbytes: float, flops: float) -> float:
    """a + bytes / BW + flops / R: a decode step's attention (a rate of 0 or absent: no such term)."""
    bw, rate = _f(c, "TBps", 0.0), _f(c, "tflops", 0.0)
    return _f(c, "a_s") + (nbytes / (bw * 1e12) if bw else 0.0) + (flops / (rate * 1e12) if rate else 0.0)


def clock(c: Consts) -> float:
    """The set's power-capped slowdown (`clock_factor`; 1 for a set fitted at boost clocks)."""
    return _f(c, "clock_factor", 1.0)


def stream_s(c: Consts, nbytes: float) -> float:
    """a + bytes / BW: a memory-bound kernel (short conv, attention residual)."""
    return _f(c, "a_s") + nbytes / (_f(c, "TBps") * 1e12)


# Kernel family (tpplan.bench.config.impl_class) -> the implementation a set without `impl` was
# fitted on (`OpResult.impl` starts with it). A recorded run whose op ran something else keeps the roofline.
FITTED_ON = {
    "mla": "torch SDPA",
    "gqa": "torch SDPA",
    "kda": "fla.chunk_kda",
    "experts": "torch._grouped_mm",
    "short_conv": "torch conv1d",
    "attn_res": "torch, fp32 rows",
    "norm": "fla fused rms_norm",
    "gdn": "fla.chunk_gated_delta_rule",
}
# Kernel family -> the constant set that prices it.
MODEL_OF = {"mla": "attention_causal", "gqa": "attention_causal", "kda": "kda", "experts": "experts",
            "short_conv": "short_conv", "attn_res": "attn_res", "norm": "norm", "gdn": "gdn"}  # fmt: skip


class KernelModels:
    """The fitted constants of one GPU (`GpuSpec.kernel_models`): name -> constants."""

    NAMES = ("attention_causal", "attention_prefix", "kda", "gdn", "experts", "short_conv", "attn_res", "norm",
             "decode_gqa", "decode_mla", "gemm_small", "dsa_attention")  # fmt: skip

    def __init__(self, consts: Mapping[str, Consts], *, charge_host: bool = True) -> None:
        self.consts = consts
        self.charge_host = charge_host

    @property
    def clock_state(self) -> str:
        """The clock state: "power-capped" where any set carries a `clock_factor`, else "boost"."""
        return "power-capped" if any("clock_factor" in c for c in self.consts.values()) else "boost"

    def extrapolated(self, name: str, **dims: float) -> bool:
        """True when any given dimension lies outside the range model `name` was measured over."""
        c = self.consts.get(name)
        if c is None:
            return False
        for dim, v in dims.items():
            lo, hi = c.get(f"min_{dim}"), c.get(f"max_{dim}")
            if (isinstance(lo, int | float) and v < lo) or (isinstance(hi, int | float) and v > hi):
                return True
        return False

    def impl(self, name: str, family: str) -> str | None:
        """The implementation set `name` was fitted on (its `impl`, else `FITTED_ON[family]`; None without one)."""
        c = self.consts.get(name)
        if c is None:  # no constants for it: nothing was fitted
            return None
        v = c.get("impl")
        return str(v) if isinstance(v, str) else FITTED_ON.get(family)

    def fitted_for(self, family: str, impl: str | None) -> bool:
        """Whether the constants for `family` describe `impl` (None, unknown: no)."""
        name = MODEL_OF.get(family)
        want = None if name is None else self.impl(name, family)
        return want is not None and impl is not None and impl.startswith(want)

    def attention(
        self, heads: int, tokens: int, context: int, dqk: int, dv: int, flops: float, window: int | None = None
    ) -> float | None:  # fmt: skip
        c = self.consts.get("attention_prefix" if context > 0 else "attention_causal")
        if c is None:
            return None
        host = _f(c, "host_s", 0.0) if self.charge_host else 0.0
        return (attention_s(c, heads, tokens, dqk, dv, flops, context, window) + host) * clock(c)

    def decode(self, name: str, nbytes: float, flops: float) -> float | None:
        """A decode step's attention by set `name` ("decode_gqa" or "decode_mla"); None without it."""
        c = self.consts.get(name)
        return None if c is None else decode_s(c, nbytes, flops) * clock(c)

    def dsa_attention(self, gathered: float, flops: float) -> float | None:
        """DSA's sparse prefill attention in the absorbed form by set `dsa_attention` (the rank sweep's `sparse`
        family, `bench.rank_fit`): a + gathered latent bytes / BW + flops / R, `decode_s`'s form; None without it."""
        c = self.consts.get("dsa_attention")
        return None if c is None else decode_s(c, gathered, flops) * clock(c)

    def small_gemm(self, m: int, k: int, n: int) -> float | None:
        """A bf16 GEMM of at most `max_m` rows (a decode step's projections) by set `gemm_small`: the same
        form as decode attention over A, B and C once; None without the set or past its rows."""
        c = self.consts.get("gemm_small")
        if c is None or m > _f(c, "max_m", 512.0):
            return None
        return decode_s(c, 2.0 * (m * k + k * n + m * n), 2.0 * m * k * n) * clock(c)

    def recurrence(self, impl: str, heads: int, tokens: int) -> float | None:
        c = self.consts.get(impl)
        return None if c is None else recurrence_s(c, heads, tokens) * clock(c)

    def experts(
        self, active: int, width: int, inter: int, compute_s: float, weight_bytes: float, rows: float = 0.0
    ) -> float | None:
        c = self.consts.get("experts")
        return None if c is None else experts_s(c, active, width, inter, compute_s, weight_bytes, rows) * clock(c)

    def routing(self, rows: int, tokens: int, width: int, hbm_Bps: float, fused: bool = False) -> float:
        """The routing traffic around the grouped GEMMs. `fused` (a serving engine's fused MoE): only the
        combine of the rank's rows into its tokens (`FUSED_MOE`), at the set's measured `combine_TBps`,
        else at the HBM rate; it shrinks with the rows a rank computes (TP slices keep every row, EP and
        all-to-all divide them). Otherwise (tpplan's runtime, re-predicted) the bench's gather, un-permute
        and weighted sum at the fitted rate where the set was fitted on the whole op (`route_TBps`), else
        the fp32 combine at HBM rate."""
        c = self.consts.get("experts") or {}
        if fused:
            rate = _f(c, "combine_TBps") * 1e12 if "combine_TBps" in c else hbm_Bps
            return routing_bytes(rows, tokens, width, FUSED_MOE) / rate * clock(c)
        if "route_TBps" in c:
            return routing_bytes(rows, tokens, width, WEIGHTED_SUM) / (_f(c, "route_TBps") * 1e12) * clock(c)
        return routing_bytes(rows, tokens, width, FP32_COMBINE) / hbm_Bps

    def attn_res(self, rows: int, hidden: int, snapshots: float) -> float | None:
        c = self.consts.get("attn_res")
        impl = self.impl("attn_res", "attn_res")
        return None if c is None else attn_res_s(c, rows, hidden, snapshots, impl) * clock(c)

    def stream(self, nbytes: float) -> float | None:
        c = self.consts.get("short_conv")
        return None if c is None else stream_s(c, nbytes) * clock(c)

    def norm(self, nbytes: float) -> float | None:
        c = self.consts.get("norm")
        return None if c is None else stream_s(c, nbytes) * clock(c)


__all__ = [
    "ATTN_Q_BLOCK",
    "FITTED_ON",
    "FP32_COMBINE",
    "FUSED_MOE",
    "MODEL_OF",
    "WEIGHTED_SUM",
    "KernelModels",
    "attention_flops",
    "attention_s",
    "attn_res_bytes",
    "attn_res_s",
    "clock",
    "decode_s",
    "experts_s",
    "recurrence_s",
    "routing_bytes",
    "smoothmax",
    "stream_s",
]
