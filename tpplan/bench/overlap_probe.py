"""How much an op class slows down while a communication-like stream runs beside it, on one GPU.

Overlap plans (two-batch overlap, GEMM + collective fusion, shared/routed expert streams) hide a
collective behind compute only as far as the two share the GPU well: a collective's copy kernels take
SMs and HBM bandwidth from the compute it hides behind. Pricing overlap as perfect (time = max of the
two) overstates its gain; this probe measures, per op class, the compute's time alone and with a side
stream busy with each load, and the load's own throughput alone and while the compute runs:

- `sm20_full`, `sm20_300GBps`, `sm20_100GBps`, `sm32_full`: one persistent kernel holding 20 (or 32)
  SMs for the whole call, copying flat out or paced to a link's rate (`tpplan.bench.sm_load`): an
  all-to-all or ring collective as the engines run them, on SMs of its own,
- `copy_engine_full`: device-to-device copy of a 1 GiB buffer, back to back,
- `copy_kernel_full`: an elementwise add over 1 GiB, back to back (SM kernels, as NCCL's ring
  channels are, but on every SM the scheduler gives it),
- `paced_1000GBps`, `paced_500GBps`: an add over 64 MiB then an SM sleep, paced to a collective's
  HBM traffic (see `_loads`).

Ops: bf16 GEMMs at two K3 shapes, causal flash attention (SDPA), a memory-bound RMSNorm-like chain,
and batched expert GEMMs. Each timing is CUDA events around `reps` queued calls, median of 3, after
warm-up; the side stream is given enough queued work to cover the whole timed window.

Run on a GPU machine (torch only, no other dependency):
    python -m tpplan.bench.overlap_probe --out overlap.json
The JSON holds per (op, load): alone and concurrent seconds per call, the slowdown, and the load's
bytes/s alone and concurrent; `tpplan.cost.overlap.OverlapCosts` takes its defaults from the
held-SM rows (docs/benchmarks.md, "Compute beside a kernel that holds 20 SMs").
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

GIB = 1 << 30
SM_IDS: dict[str, Any] = {}  # load name -> the SM ids its programs last ran on (sm_load's loads)


def _ops(torch: Any) -> dict[str, Callable[[], Any]]:
    dev, bf = "cuda", torch.bfloat16
    r = torch.randn
    a1, b1 = r(8192, 7168, device=dev, dtype=bf), r(7168, 6144, device=dev, dtype=bf)
    a2, b2 = r(2048, 7168, device=dev, dtype=bf), r(7168, 2112, device=dev, dtype=bf)
    q = r(1, 32, 8192, 128, device=dev, dtype=bf)
    k, v = r(1, 32, 8192, 128, device=dev, dtype=bf), r(1, 32, 8192, 128, device=dev, dtype=bf)
    x, w = r(8192, 7168, device=dev, dtype=bf), r(7168, device=dev, dtype=bf)
    ea, eb = r(32, 512, 7168, device=dev, dtype=bf), r(32, 7168, 1024, device=dev, dtype=bf)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    f8 = torch.float8_e4m3fn
    fa, fb = a1.to(f8), r(6144, 7168, device=dev, dtype=bf).to(f8).t()  # _scaled_mm wants B column-major
    one = torch.tensor(1.0, device=dev)
    g_a = a1  # row slices of the 8192-row input: M = 1024 .. 8192 at K = 7168
    g_b = {2112: b2, 6144: b1}

    def norm() -> Any:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(bf) * w

    return {
        "gemm_8192x7168x6144": lambda: a1 @ b1,
        "gemm_2048x7168x2112": lambda: a2 @ b2,
        **{f"gemm_{m}x7168x{n}": partial(torch.matmul, g_a[:m], g_b[n]) for m in (1024, 4096) for n in (2112, 6144)},
        "gemm_2048x7168x6144": lambda: g_a[:2048] @ g_b[6144],
        "gemm_8192x7168x2112": lambda: g_a[:8192] @ g_b[2112],
        "gemm_fp8_8192x7168x6144": lambda: torch._scaled_mm(fa, fb, one, one, out_dtype=bf),
        "attention_causal_8k_h32_d128": lambda: sdpa(q, k, v, is_causal=True),
        "rmsnorm_8192x7168": norm,
        "experts_bmm_32x512x7168x1024": lambda: torch.bmm(ea, eb),
    }


def _loads(torch: Any) -> dict[str, tuple[Callable[[], Any], float]]:
    """Side-stream loads: (one call, bytes it moves through HBM, read + write).

    The full-rate loads bound the damage; the paced ones move HBM traffic at a collective's rate (a
    ring all-reduce at 360 GB/s of NVLink busbw reads and writes ~1 TB/s of HBM): one add over 64 MiB
    then an SM sleep, so the side stream holds SMs and bandwidth for part of each call only."""
    src = torch.empty(GIB // 2, device="cuda", dtype=torch.bfloat16).normal_()
    dst = torch.empty_like(src)
    chunk = [torch.empty(32 << 20, device="cuda", dtype=torch.bfloat16).normal_() for _ in range(2)]
    chunk_bytes = 3.0 * 64 * (1 << 20)

    def copy_paced(target_GBps: float) -> Callable[[], None]:
        """A copy-engine copy of 64 MiB, then an SM sleep: `target_GBps` of bytes moved on average, as
        torch's async-TP decomposition copies one peer's chunk at a time (copy_ over NVLink)."""
        piece_bytes = chunk[0].numel() * chunk[0].element_size()
        gap_cycles = int(max(0.0, piece_bytes / (target_GBps * 1e9) - piece_bytes / 2.0e12) * 1.9e9)

        def run() -> None:
            chunk[0].copy_(chunk[1])
            torch.cuda._sleep(gap_cycles)

        return run

    def paced(target_GBps: float) -> Callable[[], None]:
        gap_cycles = int(max(0.0, chunk_bytes / (target_GBps * 1e9) - chunk_bytes / 4.0e12) * 1.9e9)

        def run() -> None:
            chunk[0].add_(chunk[1])
            torch.cuda._sleep(gap_cycles)

        return run

    from tpplan.bench.sm_load import sm_load

    held = {f"sm{c}_{'full' if r is None else f'{r / 1e9:.0f}GBps'}": sm_load(torch, c, r)
            for c, r in ((20, None), (20, 300e9), (20, 100e9), (32, None))}  # fmt: skip
    SM_IDS.update({k: v[2] for k, v in held.items()})
    return {
        **{k: (v[0], v[1]) for k, v in held.items()},
        "copy_engine_full": (lambda: dst.copy_(src), 2.0 * GIB),
        "copy_engine_400GBps": (copy_paced(400.0), 64.0 * (1 << 20)),
        "copy_engine_200GBps": (copy_paced(200.0), 64.0 * (1 << 20)),
        "copy_kernel_full": (lambda: dst.add_(src), 3.0 * GIB),
        "paced_1000GBps": (paced(1000.0), chunk_bytes),
        "paced_500GBps": (paced(500.0), chunk_bytes),
    }


def time_calls(torch: Any, fn: Callable[[], Any], reps: int, stream: Any = None, batches: int = 3) -> float:
    """Seconds per call: events around `reps` queued calls on `stream`, median of `batches` batches."""
    stream = stream or torch.cuda.current_stream()
    out = []
    with torch.cuda.stream(stream):
        for _ in range(batches):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record(stream)
            for _ in range(reps):
                fn()
            e1.record(stream)
            e1.synchronize()
            out.append(e0.elapsed_time(e1) / 1e3 / reps)
    return statistics.median(out)


def time_beside(torch: Any, op: Callable[[], Any], reps: int, load: Callable[[], Any] | None, load_s: float,
                window_s: float) -> tuple[float, float]:  # fmt: skip
    """(op seconds per call, load seconds per call): `op` timed on the main stream while the side
    stream's queue of `load` (1.5x the window) covers the whole timed window; the load's figure runs
    past the window, so `main` times each side with the roles swapped. `load` None times `op` alone
    through the same steps: the ~10 ms idle sleep first lets the power controller raise the clock,
    so alone and concurrent must both follow it to compare in the same clock state."""
    side = torch.cuda.Stream()
    n_load = max(2, math.ceil(1.5 * window_s / load_s))
    torch.cuda.synchronize()
    s0, s1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    m0, m1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(20_000_000)  # ~10 ms: both queues are full before the GPU reaches them
    main = torch.cuda.current_stream()
    side.wait_stream(main)
    with torch.cuda.stream(side):
        s0.record(side)
        if load is not None:
            for _ in range(n_load):
                load()
        s1.record(side)
    m0.record(main)
    for _ in range(reps):
        op()
    m1.record(main)
    torch.cuda.synchronize()
    return m0.elapsed_time(m1) / 1e3 / reps, s0.elapsed_time(s1) / 1e3 / max(1, n_load)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--window-ms", type=float, default=60.0, help="timed window per point")
    ap.add_argument("--loads", nargs="*", help="only these loads (default: all)")
    args = ap.parse_args(argv)
    from tpplan.errors import TpplanError
    from tpplan.outputs import check_file, write_files

    try:
        out = check_file("--out", args.out)  # refused before any work: a file tpplan did not write
    except TpplanError as e:
        print(e, file=sys.stderr)
        return 2
    import torch

    if not torch.cuda.is_available():
        print("overlap_probe: no CUDA device; run it on a GPU machine", file=sys.stderr)
        return 2
    ops, loads = _ops(torch), _loads(torch)
    if args.loads:
        loads = {k: v for k, v in loads.items() if k in args.loads}
    rows = _probe(torch, ops, loads, args.window_ms)
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    held_sms = {k: len(set(v.tolist())) for k, v in SM_IDS.items() if k in loads}
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "date": date,
            "sm_count": torch.cuda.get_device_properties(0).multi_processor_count,
            "held_load_distinct_sms": held_sms}  # fmt: skip
    print(f"held loads ran on distinct SMs: {held_sms}", file=sys.stderr)
    write_files({out: json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n"}, "--out")
    return 0


def _probe(torch: Any, ops: dict[str, Any], loads: dict[str, Any], window_ms: float) -> list[dict[str, Any]]:
    """Every op beside every load, after ~2 s of GEMMs settle the clock and power: one row each, printed."""
    rows: list[dict[str, Any]] = []
    t_start = time.time()
    warm = ops["gemm_8192x7168x6144"]
    for _ in range(1500):  # ~2 s of GEMMs: the clock and power settle before anything is timed
        warm()
    torch.cuda.synchronize()
    load_alone = {}
    for name, (fn, _bytes) in loads.items():
        for _ in range(3):
            fn()
        load_alone[name] = time_calls(torch, fn, 5)
    for op_name, op in ops.items():
        for _ in range(5):
            op()
        reps = max(5, round(window_ms / 1e3 / time_calls(torch, op, 5)))
        for load_name, load in loads.items():
            r = _pair(torch, op_name, op, reps, load_name, load, load_alone, window_ms)
            rows.append(r)
            print(f"{op_name:32s} {load_name:13s} op x{r['op_slowdown']:.2f}  load "
                  f"{r['load_alone_GBps']:6.0f} -> {r['load_concurrent_GBps']:6.0f} GB/s "
                  f"sms {r['load_distinct_sms']} [{time.time() - t_start:5.1f} s]",
                  file=sys.stderr, flush=True)  # fmt: skip
    return rows


def _pair(
    torch: Any, op_name: str, op: Any, reps: int, load_name: str, load: tuple[Any, float],
    load_alone: dict[str, float], window_ms: float,
) -> dict[str, Any]:  # fmt: skip
    """One op beside one load, both ways: the op timed alone and under the load, then the load (its
    time alone re-measured into `load_alone`) over a window the op's queue covers whole."""
    fn, nbytes = load
    alone, _ = time_beside(torch, op, reps, None, 1.0, 0.0)  # again per load: the clock drifts
    both_op, _ = time_beside(torch, op, reps, fn, load_alone[load_name], alone * reps)
    # roles swapped: the load timed over a window the op's queue covers whole
    load_reps = max(3, round(window_ms / 1e3 / load_alone[load_name]))
    load_alone[load_name], _ = time_beside(torch, fn, load_reps, None, 1.0, 0.0)
    both_load, _ = time_beside(torch, fn, load_reps, op, alone, load_alone[load_name] * load_reps)
    distinct = len(set(SM_IDS[load_name].tolist())) if load_name in SM_IDS else None
    return {
        "op": op_name, "load": load_name, "reps": reps,
        "op_alone_s": alone, "op_concurrent_s": both_op, "op_slowdown": both_op / alone,
        "load_alone_GBps": nbytes / load_alone[load_name] / 1e9,
        "load_concurrent_GBps": nbytes / both_load / 1e9,
        "load_distinct_sms": distinct,
    }  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
