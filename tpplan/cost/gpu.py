"""A GPU model: what one GPU computes, on which software stack, and from which kernel sources.

Everything that belongs to a GPU lives here, apart from the cluster it sits in (`cost.cluster`):
datasheet figures, a measured GEMM table, fitted physical kernel models, measured kernel profiles,
the efficiencies the roofline fallbacks use, and the kernel sources (`cost.kernel_source`) asked
first. Each figure's origin is in `provenance` (op class -> where its prices come from), so a memo
can say which op class was priced from what.

Every number is bounded and finite: a GPU model is user input (`--gpu FILE`), and a bandwidth of
1e-300 or a TFLOP/s of inf would make every later price meaningless.
"""

from __future__ import annotations

import itertools
import math
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tpplan.errors import TpplanError
from tpplan.inputs import NAME_CHARS

# Default roofline efficiencies (fractions of the dense peak) for GPUs whose model names none.
ATTN_EFFICIENCY = 0.55  # causal prefill attention (FlashAttention-3 class kernels, head dim 128-192)
# Chunked gated delta rule: fla_core 0.6.0 `chunk_kda` on one H200 (bf16, 48 heads x 128, 8192 tokens in
# two chunks with carried state) took 4.16 ms for 51.5 GFLOP of the graph's count, 1.25% of the dense peak
# (docs/benchmarks/h200x2-2026-11-30/fla-kda-check.json). The 0.25 assumed before was 20x too fast.
RECURRENCE_EFFICIENCY = 0.0125

# Bounds shared by the GPU and cluster types: far beyond any real part, tight enough to refuse nonsense.
MAX_TFLOPS = 1e5
MAX_TBPS = 1e3
MAX_GIB = 1e6
MIN_RATE = 1e-3  # below 1 GFLOP/s or 1 GB/s a figure is a typo, not a GPU

ENGINES = ("sglang", "vllm", "trtllm")  # engines whose kernels a measured database holds (`--engine`)


def parse_engine(engine: str) -> tuple[str, str | None]:
    """'sglang@0.5.14' -> ('sglang', '0.5.14'); 'vllm' -> ('vllm', None)."""
    name, _, version = engine.partition("@")
    if name not in ENGINES:
        raise TpplanError(f"--engine {engine}", "unknown serving engine", f"use one of {', '.join(ENGINES)}[@version]")
    return name, version or None


def engine_versions(name: str, system: str) -> list[str]:
    """The versions of engine `name` tpplan knows: those whose source it read (`tpplan.engines`) and
    those the kernel database holds for GPU `system` (where the aic extra is installed)."""
    from tpplan.engines import ENGINES as RECORDS

    known = [key.partition("@")[2] for key in RECORDS if key.partition("@")[0] == name]
    from tpplan.cost.sources.aic import aic_available, aic_databases, resolve_system

    if aic_available():
        known += aic_databases().get(resolve_system(system), {}).get(name, [])
    return sorted(set(known))


class Strict(BaseModel):
    """Frozen, no unknown fields, no inf/nan: the base of every hardware type."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class GemmPoint(Strict):
    """One measured GEMM: C[M,N] = A[M,K] @ B[K,N] reached `tflops` (dense, the GPU's own dtype)."""

    M: int = Field(ge=1, le=2**31)
    K: int = Field(ge=1, le=2**31)
    N: int = Field(ge=1, le=2**31)
    tflops: float = Field(gt=0, le=MAX_TFLOPS)
    dtype: Literal["bf16", "fp8"] = "bf16"


class KernelProfile(Strict):
    """Measured speed of one kernel class (norms, the recurrence, attention, ...) on this GPU.

    Written by `tpplan calibrate --kernels-from` from a bench run. `points` pairs the cost model's
    own estimate of an op (roofline seconds) with the time the kernel really took, sorted by the
    estimate; `apply` maps a new estimate through them. The estimate is the key because it already
    carries the op's shape, share and dtype, so one curve serves every plan and token count.
    """

    points: list[tuple[float, float]] = Field(min_length=1, description="(modelled s, measured s), ascending")
    samples: int = Field(default=0, ge=0, description="ops measured to build the curve")
    source: str = ""

    @model_validator(mode="after")
    def _ascending(self) -> Self:
        xs = [x for x, _ in self.points]
        if any(x <= 0 or y <= 0 for x, y in self.points) or xs != sorted(xs) or len(set(xs)) != len(xs):
            raise ValueError("points must be positive (modelled s, measured s) pairs with rising modelled s")
        return self

    def apply(self, modelled_s: float) -> float:
        """Measured-equivalent seconds for an op the model estimates at `modelled_s`.

        Inside the measured range: log-log interpolation between the neighbouring points. Outside:
        the nearest point's measured/modelled ratio (kernels settle to a constant fraction of the
        roofline at large sizes; at small ones the launch floor is in the estimate already).
        """
        if modelled_s <= 0:
            return 0.0
        pts = self.points
        if modelled_s <= pts[0][0]:
            return modelled_s * pts[0][1] / pts[0][0]
        if modelled_s >= pts[-1][0]:
            return modelled_s * pts[-1][1] / pts[-1][0]
        for (x0, y0), (x1, y1) in itertools.pairwise(pts):
            if x0 <= modelled_s <= x1:
                f = math.log(modelled_s / x0) / math.log(x1 / x0)
                return math.exp(math.log(y0) + f * math.log(y1 / y0))
        raise AssertionError("unreachable: points are ascending")


class SourceRef(Strict):
    """A kernel source a GPU model asks before its own formulas (`cost.sources`): `kind` names the
    adapter ("aic": NVIDIA AIConfigurator's database, needs `tpplan[aic]`), the rest its arguments."""

    kind: str = Field(min_length=1, description="adapter: 'aic'")
    system: str = Field(default="", description="the database's GPU system name, e.g. 'h200_sxm'")
    engine: str = Field(default="", description="serving engine whose kernels were measured: sglang, vllm, trtllm")
    version: str = Field(default="", description="engine version of the measured tables")


class GpuSpec(Strict):
    """One GPU model: roofline numbers (dense, no sparsity), the software stack its measurements ran
    on, optional measured GEMM and kernel tables, fitted kernel models and kernel sources, and where
    each came from (`provenance`, op class -> source)."""

    name: str = Field(min_length=1, max_length=NAME_CHARS)
    bf16_tflops: float = Field(ge=MIN_RATE, le=MAX_TFLOPS, description="peak dense bf16 TFLOP/s")
    fp8_tflops: float | None = Field(
        default=None,
        ge=MIN_RATE,
        le=MAX_TFLOPS,
        description="peak dense fp8 TFLOP/s; none (A100, A30): no fp8 tensor cores, fp8 GEMMs priced as bf16 ones",
    )
    hbm_TBps: float = Field(ge=MIN_RATE, le=MAX_TBPS, description="memory bandwidth, TB/s")
    memory_GiB: float = Field(ge=MIN_RATE, le=MAX_GIB)
    sm_count: int = Field(default=132, ge=1, le=100_000, description="SMs, for the analytic GEMM curve")
    gemm_table: list[GemmPoint] | None = Field(
        default=None, description="measured shapes; None = packaged table for its GPU or analytic"
    )
    kernel_profiles: dict[str, KernelProfile] = Field(
        default_factory=dict,
        description="measured kernel classes (key: op kind, or 'kind:op name'); none = roofline estimates",
    )
    gemm_scale: float = Field(
        default=1.0, ge=1e-3, le=1e3, description="this machine's GEMM rate / the table's (`tpplan calibrate --quick`)"
    )
    kernel_models: dict[str, dict[str, float | str]] = Field(
        default_factory=dict,
        description="fitted constants of the physical kernel models (cost.kernel_models; `impl`: what they "
        "were fitted on); none = roofline",
    )
    kernel_models_from: str = Field(
        default="",
        description="a measured GPU model of the same die whose kernel models this one inherits, scaled by "
        "HBM bandwidth and compute (`cost.gpu_inherit`), where it has none of its own",
    )
    attn_efficiency: float = Field(
        default=ATTN_EFFICIENCY, gt=0, le=1, description="attention roofline: fraction of the dense peak"
    )
    recurrence_efficiency: float = Field(
        default=RECURRENCE_EFFICIENCY, gt=0, le=1, description="chunked delta-rule roofline: fraction of the peak"
    )
    software: str = Field(default="", description="the stack its measured figures ran on (torch, fla, engine)")
    system: str = Field(default="", description="its name in kernel databases (AIC: h200_sxm, ...), for --engine")
    sources: list[SourceRef] = Field(default_factory=list, description="kernel sources asked first, in order")
    provenance: dict[str, str] = Field(
        default_factory=dict, description="op class (gemm, attention, moe, recurrence, elementwise) -> source"
    )

    @property
    def has_fp8(self) -> bool:
        """Whether the GPU has fp8 tensor cores (a datasheet fp8 figure)."""
        return self.fp8_tflops is not None

    def gemm_dtype(self, dtype: Literal["bf16", "fp8"]) -> Literal["bf16", "fp8"]:
        """The dtype a GEMM asked in `dtype` runs in here: without fp8 tensor cores an fp8 GEMM runs
        in bf16 (fp8 weights dequantized to bf16 before the multiply; their bytes stay fp8)."""
        return dtype if dtype != "fp8" or self.has_fp8 else "bf16"

    def peak_tflops(self, dtype: Literal["bf16", "fp8"]) -> float:
        """Dense peak of the tensor cores a GEMM in `dtype` runs on (`gemm_dtype`)."""
        return self.fp8_tflops if self.gemm_dtype(dtype) == "fp8" and self.fp8_tflops else self.bf16_tflops

    def with_engine(self, engine: str) -> GpuSpec:
        """This GPU model running `engine`'s kernels ("sglang@0.5.14"): NVIDIA AIConfigurator's measured
        tables for its `system` and the models fitted on them, asked before its own figures."""
        name, version = parse_engine(engine)
        if not self.system:
            raise TpplanError(f"--engine {engine}", f"GPU model {self.name!r} names no kernel-database system",
                              'add system = "h200_sxm" (its AIC name) to the GPU model')  # fmt: skip
        known = engine_versions(name, self.system)
        if version is not None and version not in known:  # else it would be priced as another version
            listed = ", ".join(f"{name}@{v}" for v in known) or "none"
            raise TpplanError(f"engine={engine}", f"tpplan knows no {name} version {version} (it knows {listed})",
                              f"pass one of those, or {name} alone for its current release")  # fmt: skip
        refs = [SourceRef(kind=k, system=self.system, engine=name, version=version or "")
                for k in ("aic", "aic-fitted")]  # fmt: skip
        stack = f"{engine} kernels (AIConfigurator database, {self.system}; in-node collectives from it only where "
        stack += "the cluster has no measured curve, fitted constant or declared algorithm)"
        stack += f" over {self.software}" if self.software else ""
        return self.model_copy(update={"sources": [*refs, *self.sources], "software": stack})

    @property
    def kernel_engine(self) -> str | None:
        """The engine ("vllm@0.34.0", "trtllm") whose measured kernels its first database source holds, None
        where none does: `--engine` as the GPU model carries it (`with_engine`), for `cost.pipeline.loop_engine`."""
        ref = next((r for r in self.sources if r.kind == "aic" and r.engine), None)
        if ref is None:
            return None
        return f"{ref.engine}@{ref.version}" if ref.version else ref.engine

    def source_of(self, op_class: str) -> str:
        """Where this GPU model's prices for `op_class` come from, in words."""
        if op_class in self.provenance:
            return self.provenance[op_class]
        if op_class == "gemm":
            return "GEMM table" if self.gemm_table else "packaged H200 GEMM table where the name matches, else analytic"
        return "physical kernel models" if self.kernel_models else "datasheet roofline"


def fp8_fallback_note(gpu: GpuSpec, dtype: str, expert_dtype: str | None, checkpoint_fp8: bool) -> str | None:
    """The sentence a table of predicted times carries when fp8 GEMMs (fp8 activations, fp8 experts,
    or a checkpoint stored in fp8 with fp8 compute: `checkpoint_fp8`) run on a GPU without fp8 tensor
    cores, which prices them as bf16 GEMMs (`gemm_dtype`); None when nothing asks for fp8 or it has it."""
    if gpu.has_fp8 or not (dtype == "fp8" or expert_dtype == "fp8" or checkpoint_fp8):
        return None
    return (
        f"fp8: {gpu.name} has no fp8 tensor cores; the fp8 GEMMs are priced as bf16 ones at its "
        f"{gpu.bf16_tflops:g} TFLOP/s peak (the fp8 weights dequantized; their bytes and memory as stored)."
    )


GpuModel = GpuSpec  # the name the issue uses; one type

# Fields a GPU file written before the split never had: left out of written files at their defaults.
NEW_FIELDS_DEFAULTS: dict[str, object] = {
    "kernel_models_from": "",
    "attn_efficiency": ATTN_EFFICIENCY,
    "recurrence_efficiency": RECURRENCE_EFFICIENCY,
    "software": "",
    "system": "",
    "sources": [],
    "provenance": {},
}


__all__ = [
    "ATTN_EFFICIENCY",
    "NEW_FIELDS_DEFAULTS",
    "RECURRENCE_EFFICIENCY",
    "GemmPoint",
    "GpuModel",
    "GpuSpec",
    "KernelProfile",
    "SourceRef",
    "Strict",
    "fp8_fallback_note",
]
