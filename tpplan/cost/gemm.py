"""GEMM time: roofline with a shape-dependent efficiency, from measured shapes where we have them.

Peak TFLOP/s is a poor predictor for tensor-parallel shards: a [256, 3584] x [3584, 192] expert
shard reaches ~2% of an H200's peak. So the achieved rate comes from a measured table
(interpolated), and only GPUs without one fall back to an analytic tile-occupancy curve.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from functools import cache
from importlib import resources
from typing import Literal

from tpplan.cost.gpu import GemmPoint, GpuSpec
from tpplan.dtypes import DTYPE_BYTES
from tpplan.errors import TpplanError

Dtype = Literal["bf16", "fp8"]
_OUT_BYTES = 2  # outputs are written in bf16 for both input dtypes

# Analytic fallback, fitted once to the packaged H200 table (worst 1.8x, median 20% off):
# efficiency = E_MAX * occupancy**P * K / (K + K_HALF), occupancy = min(1, 128x128 tiles / SMs).
_E_MAX, _P, _K_HALF, _TILE = 0.88, 0.95, 256.0, 128
_NEIGHBOURS = 3

TableLike = Sequence[GemmPoint] | Sequence[tuple[int, int, int, float]]

# fp8 GEMMs priced from a bf16 efficiency: measured fp8 kernels do not reach twice the bf16 rate.
# Against engine fp8 GEMMs measured on H200 (issue 25, from NVIDIA AIConfigurator's H200 tables) the
# bf16 efficiency x the fp8 peak was 1.3-4x too fast: fp8 reached 0.85-0.92 of it at large shapes and
# about 0.4 at N or K = 512. Named anchors (the mid of that range at large shapes), log-linear between
# them in the smaller of K and N, until AIC's fp8 rows refit them.
FP8_FACTOR_SMALL = 0.40  # at min(K, N) <= FP8_SMALL_DIM
FP8_FACTOR_LARGE = 0.88  # at min(K, N) >= FP8_LARGE_DIM
FP8_SMALL_DIM, FP8_LARGE_DIM = 512, 4096


def fp8_factor(K: int, N: int) -> float:
    """Fraction of (bf16 efficiency x fp8 peak) an fp8 GEMM of this K and N reaches (see above)."""
    d = min(K, N)
    if d <= FP8_SMALL_DIM:
        return FP8_FACTOR_SMALL
    if d >= FP8_LARGE_DIM:
        return FP8_FACTOR_LARGE
    f = math.log(d / FP8_SMALL_DIM) / math.log(FP8_LARGE_DIM / FP8_SMALL_DIM)
    return FP8_FACTOR_SMALL + f * (FP8_FACTOR_LARGE - FP8_FACTOR_SMALL)


@cache
def default_gemm_table() -> tuple[str, tuple[GemmPoint, ...]]:
    """The packaged H200 table (an independent H200 measurement; tests/data/anchors/README.md): (gpu, points)."""
    text = resources.files("tpplan.cost").joinpath("presets", "h200_gemm_shapes.json").read_text()
    data = json.loads(text)
    pts = tuple(GemmPoint(M=r["M"], K=r["K"], N=r["N"], tflops=r["tflops"]) for r in data["rows"])
    return data["gpu"], pts


def gemm_flops(M: int, K: int, N: int) -> float:
    """Multiply-adds count twice."""
    return 2.0 * M * K * N


def gemm_bytes(M: int, K: int, N: int, dtype: Dtype = "bf16") -> float:
    """HBM traffic lower bound: read A and B once, write C once."""
    return float((M * K + K * N) * DTYPE_BYTES[dtype] + M * N * _OUT_BYTES)


def analytic_efficiency(M: int, K: int, N: int, sm_count: int = 132) -> float:
    """Fraction of peak from tile occupancy (too few output tiles leave SMs idle) and short K."""
    tiles = math.ceil(M / _TILE) * math.ceil(N / _TILE)
    occupancy = min(1.0, tiles / sm_count)
    return _E_MAX * occupancy**_P * K / (K + _K_HALF)


def _peak(gpu: GpuSpec, dtype: Dtype) -> float:
    return gpu.peak_tflops(dtype)


def _as_points(table: TableLike) -> list[GemmPoint]:
    pts = []
    for row in table:
        if isinstance(row, GemmPoint):
            pts.append(row)
        else:
            M, K, N, tf = row
            pts.append(GemmPoint(M=M, K=K, N=N, tflops=tf))
    if not pts:
        raise TpplanError("gemm table", "is empty", "give at least one (M, K, N, tflops) row")
    return pts


def _k_factor(k: float) -> float:
    return k / (k + _K_HALF)


def _rate_at_m(rows: list[GemmPoint], k: int, n: int) -> float:
    """Rate at (k, n) among rows of one M: nearest-3 inverse-distance in log2 space, on log-rate.

    Below the smallest measured N the kernel time stays near its floor, so the rate scales down in
    proportion (rate ~ n). Below the smallest measured K (row-parallel shards: K3's o_proj at TP32
    is K = 384) the output tiles stay as many, only each is shorter: the rate follows the analytic
    curve's K term, K / (K + 256), but the kernel never beats the shortest time measured at this M
    (its latency floor). Above the largest K or N, the rate is held.
    """
    k_min = min(r.K for r in rows)
    n_min = min(r.N for r in rows)
    k_max = max(r.K for r in rows)
    n_max = max(r.N for r in rows)
    kq = min(max(k, k_min), k_max)
    nq = min(max(n, n_min), n_max)
    scale = n / nq if n < n_min else 1.0
    if k < k_min:
        m = rows[0].M
        floor_s = min(2.0 * r.M * r.K * r.N / (r.tflops * 1e12) for r in rows)
        kscale = _k_factor(k) / _k_factor(kq)
        rate_at_kq = _rate_at_m(rows, kq, n)
        time_s = max(2.0 * m * k * n / (rate_at_kq * kscale * 1e12), floor_s)
        return 2.0 * m * k * n / time_s / 1e12
    dists = sorted((math.hypot(math.log2(r.K / kq), math.log2(r.N / nq)), math.log(r.tflops)) for r in rows)
    if dists[0][0] < 1e-9:
        return math.exp(dists[0][1]) * scale
    near = dists[:_NEIGHBOURS]
    w = [1.0 / d**2 for d, _ in near]
    return math.exp(sum(wi * lr for wi, (_, lr) in zip(w, near, strict=True)) / sum(w)) * scale


def table_tflops(m: int, k: int, n: int, table: TableLike) -> float:
    """Interpolate a measured table at (m, k, n): per measured m in (k, n), then linear in log m."""
    pts = _as_points(table)
    by_m: dict[int, list[GemmPoint]] = {}
    for p in pts:
        by_m.setdefault(p.M, []).append(p)
    ms = sorted(by_m)
    if m <= ms[0]:
        return _rate_at_m(by_m[ms[0]], k, n) * (m / ms[0] if m < ms[0] else 1.0)
    if m >= ms[-1]:
        return _rate_at_m(by_m[ms[-1]], k, n)
    hi = next(i for i, mi in enumerate(ms) if mi >= m)
    m0, m1 = ms[hi - 1], ms[hi]
    if m1 == m:
        return _rate_at_m(by_m[m1], k, n)
    f = math.log(m / m0) / math.log(m1 / m0)
    r0, r1 = _rate_at_m(by_m[m0], k, n), _rate_at_m(by_m[m1], k, n)
    return math.exp((1 - f) * math.log(r0) + f * math.log(r1))


def _pick_table(gpu: GpuSpec, table: TableLike | None) -> list[GemmPoint] | None:
    if table is not None:
        return _as_points(table)
    if gpu.gemm_table:
        return list(gpu.gemm_table)
    name, pts = default_gemm_table()
    return list(pts) if gpu.name == name else None


def measured_floor(gpu: GpuSpec) -> tuple[int, int, int] | None:
    """The smallest M, K and N of the measured table that prices `gpu`'s GEMMs (None: the analytic curve).
    Below any of them the table's rate is extrapolated (`_rate_at_m`): on one H100, small per-rank shapes
    (K = 96, N = 64) ran up to 2.7x the time the H200 table gives (docs/benchmarks.md, "Per-rank kernel sweep")."""
    pts = _pick_table(gpu, None)
    if pts is None:
        return None
    return min(p.M for p in pts), min(p.K for p in pts), min(p.N for p in pts)


def has_table(gpu: GpuSpec) -> bool:
    """Whether GEMMs on `gpu` come from a measured table (its own or the packaged one), not the curve."""
    return _pick_table(gpu, None) is not None


def achieved_tflops(
    M: int, K: int, N: int, gpu: GpuSpec, dtype: Dtype = "bf16", table: TableLike | None = None
) -> float:
    """Compute rate this GEMM shape reaches: table (GPU's own, given, or packaged) else analytic.

    A bf16 table (or the analytic curve) serves fp8 by its efficiency (rate / bf16 peak) times the
    fp8 peak times `fp8_factor` (measured fp8 kernels reach 0.4-0.9 of that, by shape). On a GPU
    without fp8 tensor cores (`GpuSpec.fp8_tflops` none) an fp8 GEMM is priced as a bf16 one.
    """
    if min(M, K, N) < 1:
        raise TpplanError("gemm shape", f"M, K, N must be >= 1, got {(M, K, N)}", "fix the shape")
    dtype = gpu.gemm_dtype(dtype)  # fp8 on a GPU without fp8 tensor cores runs as bf16
    pts = _pick_table(gpu, table)
    fp8 = fp8_factor(K, N) if dtype == "fp8" else 1.0
    if pts is None:
        return analytic_efficiency(M, K, N, gpu.sm_count) * _peak(gpu, dtype) * fp8
    same = [p for p in pts if p.dtype == dtype]
    scale = gpu.gemm_scale  # this machine against the table's (1 unless `calibrate --quick` measured it)
    if same:
        return min(table_tflops(M, K, N, same) * scale, _peak(gpu, dtype))
    src: Dtype = pts[0].dtype
    eff = table_tflops(M, K, N, [p for p in pts if p.dtype == src]) * scale / _peak(gpu, src)
    return min(eff, 1.0) * _peak(gpu, dtype) * (fp8 if src != dtype else 1.0)


def gemm_time(M: int, K: int, N: int, gpu: GpuSpec, dtype: Dtype = "bf16", table: TableLike | None = None) -> float:
    """Seconds for C[M,N] = A[M,K] @ B[K,N]: max(FLOPs / achieved rate, bytes / HBM bandwidth)."""
    rate = achieved_tflops(M, K, N, gpu, dtype, table) * 1e12
    return max(gemm_flops(M, K, N) / rate, gemm_bytes(M, K, N, dtype) / (gpu.hbm_TBps * 1e12))
