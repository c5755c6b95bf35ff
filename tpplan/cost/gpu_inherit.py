"""A GPU model with no kernel models of its own inherits the nearest measured chip's, scaled by what differs.

Why: a GPU tpplan never measured was priced from its datasheet roofline, which was 36% off per layer on
an H100 (issue 34), while the kernel models fitted on an H200, the same GH100 die, landed within ~7%.
So a GPU model names the measured model of its die (`kernel_models_from`), and its kernel models are
that model's constants with the memory-bound rates scaled by the HBM bandwidth ratio, the compute
rates by the dense-bf16 ratio (clock x SMs, as the datasheet gives it) and the per-SM rate by the
per-SM compute ratio; fixed costs (launches, the chunk chain) stay. Only where no measured model of
the die exists does the datasheet roofline price it. The rule's out-of-sample error (the H200's models
scaled to an H100 against the H100 per-rank sweep) is in docs/benchmarks.md, "Per-rank kernel sweep".
"""

from __future__ import annotations

from typing import Any

# Constants that are rates through memory (scale with HBM bandwidth) or times of memory-bound work
# (scale inversely); rates of the tensor cores (scale with the bf16 peak) and per SM.
MEMORY_RATES = ("TBps", "route_TBps", "combine_TBps", "copy_TBps")
MEMORY_TIMES = {"kda": ("b_s",), "gdn": ("b_s",)}  # the per-(head x token) work of the chunked scan
COMPUTE_RATES = ("tflops",)
SM_RATES = ("sm_tflops",)


def scaled_kernel_models(src: Any, dst: Any) -> dict[str, dict[str, float | str]]:
    """`src`'s kernel models (a GpuSpec with them) carried to `dst` (a GpuSpec without): see the module doc."""
    mem = dst.hbm_TBps / src.hbm_TBps
    comp = dst.bf16_tflops / src.bf16_tflops
    per_sm = comp * src.sm_count / dst.sm_count
    out: dict[str, dict[str, float | str]] = {}
    for name, consts in src.kernel_models.items():
        c = dict(consts)
        for k, v in consts.items():
            if isinstance(v, str):
                continue
            if k in MEMORY_RATES:
                c[k] = v * mem
            elif k in MEMORY_TIMES.get(name, ()):
                c[k] = v / mem
            elif k in COMPUTE_RATES:
                c[k] = v * comp
            elif k in SM_RATES:
                c[k] = v * per_sm
        out[name] = c
    return out


__all__ = ["COMPUTE_RATES", "MEMORY_RATES", "MEMORY_TIMES", "SM_RATES", "scaled_kernel_models"]
