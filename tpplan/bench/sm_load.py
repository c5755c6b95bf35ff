"""A communication-like side load that holds a fixed number of SMs, for the overlap probe.

NCCL's ring channels and DeepEP's all-to-all kernels are persistent: each holds its CTAs (DeepEP: the
20 SMs SGLang and vLLM give it in prefill) for the whole call and moves bytes at the rate its link
allows. A stream of ordinary kernels does not behave so: beside a GEMM that fills every SM, its
kernels wait for SMs, which is why the probe's paced loads fell to 40-60% of their rate. This load
is one Triton kernel of `ctas` programs, each copying its own slice of a buffer in a loop and, when
paced, spinning on the GPU's global timer so that the whole kernel moves `rate` bytes/s of HBM
traffic (read + write); every program records the SM it ran on, so a run can check that the programs
held `ctas` distinct SMs.

Needs Triton (shipped with CUDA builds of torch); imported only by `tpplan.bench.overlap_probe`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import triton
import triton.language as tl

BLOCK = 65536  # bf16 elements per program per step (128 KiB read, 128 KiB written)
# 1,024 threads of 64 elements each need more than 32 registers a thread, so two programs never fit on
# one SM (65,536 registers) and a GEMM's CTAs cannot share it: each program holds an SM to itself.
WARPS = 32


@triton.jit
def _now() -> Any:
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _smid() -> Any:
    return tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _copy_loop(src, dst, sm_out, steps, slice_elems, ns_per_step, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    tl.store(sm_out + pid, _smid())
    base = pid.to(tl.int64) * slice_elems
    offs = tl.arange(0, BLOCK)
    start = _now()
    pos = 0
    for step in range(steps):
        x = tl.load(src + base + pos + offs)
        tl.store(dst + base + pos + offs, x)
        pos = pos + BLOCK
        if pos >= slice_elems:
            pos = 0
        if ns_per_step > 0:
            deadline = start + (step + 1) * ns_per_step
            while _now() < deadline:
                pass


def sm_load(
    torch: Any, ctas: int, rate_Bps: float | None, call_s: float = 0.004
) -> tuple[Callable[[], Any], float, Any]:
    """(one call, HBM bytes it moves, the tensor of SM ids its programs ran on).

    One call is one kernel of `ctas` programs lasting about `call_s` when paced (`rate_Bps` bytes/s
    of read + write over all programs); unpaced (None), each program copies as fast as its SM can,
    for the number of steps a 1 TB/s pace would take in `call_s`."""
    slice_elems = BLOCK * 32  # 4 MiB of bf16 per program, re-read in a loop
    src = torch.empty(ctas * slice_elems + BLOCK, device="cuda", dtype=torch.bfloat16).normal_()
    dst = torch.empty_like(src)
    sm_ids = torch.zeros(ctas, device="cuda", dtype=torch.int32)
    step_bytes = 2 * BLOCK * 2  # read + write, per program
    steps = max(1, round((rate_Bps or 1e12) * call_s / (step_bytes * ctas)))
    ns_per_step = round(1e9 * step_bytes * ctas / rate_Bps) if rate_Bps else 0

    def run() -> None:
        _copy_loop[(ctas,)](src, dst, sm_ids, steps, slice_elems, ns_per_step, BLOCK=BLOCK, num_warps=WARPS)

    return run, float(steps * step_bytes * ctas), sm_ids
