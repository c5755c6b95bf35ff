"""Kernel shapes priced: one op class at one per-rank shape on one GPU model -> seconds and their source
(`ShapePrices`, what the compute pricer, `cost.kernel_pricer.KernelPricer`, asks for a kernel step's shape).

A GPU model (`cost.gpu`) prices compute from an ordered list of kernel sources (`cost.kernel_source`:
an engine's measured database, models fitted on it) and then from tpplan's own formulas: the GEMM
table (or the analytic curve) with the fp8 shape factor, the fitted physical kernel models, the
roofline with the GPU's efficiencies. The first answer wins; every price says where it came from,
so a prediction can say which op class was priced from what, and its band can weigh each source's
measured error (`cost.bands`).

Sources come from the GPU model's `sources` (SourceRef: adapter kind and arguments) and, where a
command names an engine (`engine="sglang@0.5.14"`), from NVIDIA AIConfigurator's database for the
GPU's `system` and its fitted models (`tpplan.cost.sources.aic`, `aic_fitted`; the `tpplan[aic]`
extra). Without either, every price is tpplan's own formula, as before the sources existed.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

from tpplan.cost.gemm import Dtype as GemmDtype
from tpplan.cost.gemm import achieved_tflops, gemm_bytes, gemm_time, has_table
from tpplan.cost.gpu import ENGINES, GpuSpec, SourceRef, parse_engine
from tpplan.cost.kernel_source import AttentionShape, GemmShape, KernelPrice, KernelSource, MoeShape
from tpplan.errors import TpplanError

# Adapter kind -> (module, class). Imported only when a GPU model or a command asks for one.
SOURCE_ADAPTERS: dict[str, tuple[str, str]] = {
    "aic": ("tpplan.cost.sources.aic", "AicSource"),
    "aic-fitted": ("tpplan.cost.sources.aic_fitted", "AicFittedSource"),
}

# Names of tpplan's own pricing, as `KernelPrice.source` and `OpTime.source` carry them.
GEMM_TABLE = "gemm-table"
GEMM_ANALYTIC = "gemm-analytic"
KERNEL_MODEL = "kernel-model"
DECODE_MODEL = "decode-model"  # a decode step's attention by the decode sweep's models (`KernelModels.decode`)
ROOFLINE = "roofline"
PROFILE = "kernel-profile"

_GEMM_CACHE: dict[tuple[object, ...], float] = {}  # formula GEMM seconds per (GPU, shape, dtype, weight bytes)
_SOURCES: dict[tuple[object, ...], tuple[KernelSource, ...]] = {}


def build_source(ref: SourceRef) -> KernelSource:
    """The adapter `ref` names, constructed (a missing extra is the adapter's own one-line error)."""
    if ref.kind not in SOURCE_ADAPTERS:
        raise TpplanError(f"kernel source {ref.kind!r}", "unknown adapter", f"use one of {', '.join(SOURCE_ADAPTERS)}")
    module, cls = SOURCE_ADAPTERS[ref.kind]
    try:
        factory = getattr(importlib.import_module(module), cls)
    except ImportError as exc:
        raise TpplanError(f"kernel source {ref.kind}", f"this build cannot load it ({exc})",
                          'pip install "tpplan[aic]"') from None  # fmt: skip
    return factory(ref.system, ref.engine or "sglang", _held_version(ref))


def _held_version(ref: SourceRef) -> str | None:
    """The version `ref` asks for where the database holds it, else None (the database's default for
    the engine): `--engine sglang@0.5.23` names the engine the memo judges, and AIConfigurator's tables
    were measured on other releases (0.5.14); the source's name says which one priced the kernels."""
    if ref.kind != "aic" or not ref.version:
        return ref.version or None
    from tpplan.cost.sources.aic import aic_available, aic_databases, resolve_system

    if not aic_available():
        return ref.version  # the adapter's own one-line error names the missing extra
    held = aic_databases().get(resolve_system(ref.system), {}).get(ref.engine or "sglang", [])
    return ref.version if ref.version in held else None


def kernel_sources(gpu: GpuSpec, engine: str | None = None) -> tuple[KernelSource, ...]:
    """The sources asked before tpplan's formulas: the GPU model's own, then, for `engine`, the
    AIC database and its fitted models for the GPU's system (cached: loading a database is slow)."""
    key = (tuple(gpu.sources), gpu.system, engine)
    hit = _SOURCES.get(key)
    if hit is not None:
        return hit
    refs = list((gpu.with_engine(engine) if engine is not None else gpu).sources)
    built: list[KernelSource] = []
    for ref in refs:
        try:
            built.append(build_source(ref))
        except (TpplanError, OSError):
            if ref.kind == "aic-fitted" and built:  # the fitted models are optional next to the database
                continue
            raise
    out = tuple(built)
    _SOURCES[key] = out
    return out


class ShapePrices:
    """Prices per-rank kernel shapes (GEMM, routed experts, attention) on one GPU model: `sources` first,
    then tpplan's formulas."""

    def __init__(self, gpu: GpuSpec, sources: Sequence[KernelSource] = ()) -> None:
        self.gpu = gpu
        self.sources = tuple(sources)
        self.hbm = gpu.hbm_TBps * 1e12
        self._key = repr(gpu)
        # The formula's own name: the GEMM table where the GPU has one, else the analytic curve.
        self.gemm_source = GEMM_TABLE if has_table(gpu) else GEMM_ANALYTIC

    def _ask(self, method: str, shape: object) -> KernelPrice | None:
        for src in self.sources:
            price = getattr(src, method)(shape)
            if price is not None:
                return price
        return None

    def gemm(self, shape: GemmShape, weight_bytes: float | None = None) -> KernelPrice:
        """One GEMM: a source's price, else the GEMM table (or analytic curve) and HBM roofline.

        `weight_bytes`: a weight-only format (int4, mxfp4) computes at the activation dtype but reads
        its packed weight, so its memory bound uses those bytes (memory-bound at small M)."""
        asked = self._ask("gemm", shape) if self.sources else None
        if asked is not None:
            return asked
        return KernelPrice(self.formula_gemm(shape.m, shape.k, shape.n, shape.dtype, weight_bytes), self.gemm_source)

    def formula_gemm(self, m: int, k: int, n: int, dtype: str, weight_bytes: float | None = None) -> float:
        """tpplan's GEMM formula, memoised across pricers of the same GPU (plans share most shapes)."""
        dt: GemmDtype = "fp8" if dtype in ("fp8", "fp8_block") else "bf16"
        key = (self._key, m, k, n, dt, weight_bytes)
        hit = _GEMM_CACHE.get(key)
        if hit is None:
            if weight_bytes is None:
                hit = gemm_time(m, k, n, self.gpu, dt)
            else:
                rate = achieved_tflops(m, k, n, self.gpu, dt) * 1e12
                moved = gemm_bytes(m, k, n, dt) + k * n * (weight_bytes - (1 if dt == "fp8" else 2))
                hit = max(2.0 * m * k * n / rate, moved / self.hbm)
            if len(_GEMM_CACHE) < 200_000:
                _GEMM_CACHE[key] = hit
        return hit

    def moe(self, shape: MoeShape) -> KernelPrice | None:
        """The routed experts of one layer from a source; None: the caller's formulas price them."""
        return self._ask("moe", shape) if self.sources else None

    def attention(self, shape: AttentionShape) -> KernelPrice | None:
        """One prefill attention call from a source; None: the caller's formulas price it."""
        return self._ask("attention", shape) if self.sources else None


__all__ = [
    "ENGINES",
    "GEMM_ANALYTIC",
    "GEMM_TABLE",
    "KERNEL_MODEL",
    "PROFILE",
    "ROOFLINE",
    "SOURCE_ADAPTERS",
    "ShapePrices",
    "build_source",
    "kernel_sources",
    "parse_engine",
]
