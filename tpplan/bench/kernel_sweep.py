"""Time the serving-class kernels the bench runs, op by op, over the shapes TP sizes produce (GPU only).

Why: the cost model's physical models (`tpplan.cost.kernel_models`) are fitted on isolated kernel
timings and must be checked where they were not fitted. One sweep covers, at the shapes a rank
of each TP size runs:

- `gemm`: the probe shapes of `tpplan calibrate --quick` (`gemm_probe`), measured/table;
- `attention`: `runtime.fast_kernels.causal_attention` (SDPA flash; MLA's v zero-padded to the
  q/k head dim, lower-right causal mask over a KV cache) by heads per rank, tokens, context, dims;
- `kda`: fla's chunked KDA (state carried, gates fused in the kernel) by heads per rank and tokens,
  down to one head: as h one-head sequences (`kda_batched_points`, one build) or through
  `runtime.fast_kernels.kda` in the runtime's layout (`kda_points`, one build per head count);
- `short_conv`, `attn_res`: the runtime's paths (`kernels.short_conv`, `kernels.attn_res`: fla's
  kernels on CUDA where fla has them, else torch);
- `experts`: `bench.serving_kernels.expert_ffn` (`torch._grouped_mm`) by experts per rank and tokens
  routed (top-k of the model's experts, random router logits).

Sweep 2 (`ops` mode) times the ops as the model's run calls them instead: the whole MLA op
(`mla_op_points`), the whole routed-experts op with its routing (`experts_op_points`), KDA in the
runtime's layout, conv, AttnRes and RMSNorm, each with the host ahead of the GPU (`sweep_timing.HOST_AHEAD`, see
`sweep_timing.timed`) and, where NVML is there, the SM clock each point ran at (`clocks.Sampler`).

Each point: a warm-up call (builds kernels; Triton's autotuning is cached in TRITON_CACHE_DIR),
then the median of `reps` event-timed calls, each on one of several input sets in turn when the
inputs are small enough to sit in L2. `run_sweep` keeps to a time budget and writes after every
family, so a run cut short still leaves what it measured.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from tpplan.bench.sweep_families import (
    attention_points,
    attn_res_points,
    conv_points,
    expert_points,
    experts_op_points,
    gdn_points,
    kda_batched_points,
    kda_points,
    mla_op_points,
    norm_points,
)
from tpplan.bench.sweep_timing import HOST_AHEAD, SAMPLER, loaded
from tpplan.outputs import write_files

SWEEP_VERSION = 1


def run_sweep(
    out: Path, budget_s: float, families: dict[str, Callable[[], list[dict[str, Any]]]], timing: str = "back to back"
) -> dict[str, Any]:
    """Run each family in order while the budget lasts; write `out` after each (partial runs keep data)."""
    import torch

    doc: dict[str, Any] = {
        "version": SWEEP_VERSION,
        "gpu": torch.cuda.get_device_name(),
        "gpu_uuid": str(getattr(torch.cuda.get_device_properties(0), "uuid", "")),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "timing": timing,
        "points": [],
        "skipped": [],
        "family_s": {},
    }
    start = time.perf_counter()
    for name, fn in families.items():
        if time.perf_counter() - start > budget_s:
            doc["skipped"].append(name)
            continue
        t0 = time.perf_counter()
        try:
            doc["points"] += fn()
        except Exception as exc:  # a family that fails (missing fla, OOM) is reported, the rest still run
            doc["skipped"].append(f"{name}: {type(exc).__name__}: {exc}")
        doc["family_s"][name] = round(time.perf_counter() - t0, 1)
        print(f"{name}: {doc['family_s'][name]} s, {len(doc['points'])} points", flush=True)
        write_files({out: json.dumps(doc, indent=1) + "\n"}, "OUT.json")  # recorded, so the next family may replace it
        torch.cuda.empty_cache()
    return doc


Families = dict[str, Callable[[], list[dict[str, Any]]]]  # family name -> its sweep's points
K3_HEADS = (96, 48, 24, 12, 6, 3)  # K3's KDA and MLA heads per rank at TP1..TP32
TOKENS = (1024, 2048, 4096, 8192)


def main(argv: list[str] | None = None) -> None:
    """`python -m tpplan.bench.kernel_sweep OUT.json BUDGET_S [MODE]`: the sweep of docs/benchmarks.md (K3
    shapes at TP1..TP32 per rank; heads per rank 96/TP for K3's KDA and MLA). MODE `in-model-shapes`:
    sweep 1's check at the TP1 bench's shapes; `ops [KDA_HEADS [FAMILIES]]`: sweep 2, the ops as the
    model's run calls them, timed with the host ahead (KDA_HEADS e.g. 96,12,3; FAMILIES e.g. kda_runtime)."""
    import sys

    from tpplan.errors import TpplanError
    from tpplan.outputs import check_file

    args = sys.argv[1:] if argv is None else argv
    try:
        out, budget = check_file("OUT.json", args[0]), float(args[1])  # before any GPU work
    except TpplanError as exc:
        sys.exit(f"error: {exc}")
    start = time.perf_counter()
    families = _sweep1_families(start, budget)
    if len(args) > 2 and args[2] == "ops":  # sweep 2: the ops as the model's run calls them (see the docstring)
        kda_heads = tuple(int(h) for h in args[3].split(",")) if len(args) > 3 else (96, 12, 3)
        HOST_AHEAD[0] = True
        families = _ops_families(kda_heads, start, budget)
    if len(args) > 2 and args[2] == "in-model-shapes":  # the shapes the TP1 bench runs, for the model's check
        families = _in_model_families()
    if len(args) > 4 and args[2] == "ops":  # a comma list of the families to run
        families = {k: families[k] for k in args[4].split(",") if k in families}  # in the order given
    from contextlib import nullcontext

    from tpplan.bench.clocks import sampling

    with sampling() if HOST_AHEAD[0] else nullcontext() as SAMPLER[0]:
        doc = run_sweep(out, budget, families, timing="host ahead" if HOST_AHEAD[0] else "back to back")
    SAMPLER[0] = None
    print(f"{len(doc['points'])} points; skipped: {doc['skipped']}")


def _sweep1_families(start: float, budget: float) -> Families:
    """Sweep 1: GEMMs, attention (flash and cascade), KDA, experts and the short convolution at K3's
    shapes per rank, timed back to back."""
    from tpplan.bench.gemm_probe import probe

    def gemm() -> list[dict[str, Any]]:
        return [{"family": "gemm", "m": p.m, "k": p.k, "n": p.n, "warm_tflops": p.warm_tflops,
                 "cold_tflops": p.cold_tflops, "table_tflops": p.table_tflops} for p in probe()]  # fmt: skip

    dims = ((192, 128), (128, 128))
    return {
        "gemm": gemm,
        "attention": lambda: attention_points(K3_HEADS, TOKENS, (0, 8192, 16384), dims),
        "attention_cascade": lambda: attention_points(K3_HEADS, TOKENS, (0, 8192, 16384), dims, impl="cascade"),
        "kda": lambda: kda_batched_points(
            (96, 48, 24, 12, 6, 3, 2, 1), (8192, 4096, 2048, 1024), deadline=start + budget * 0.8
        ),
        "experts": lambda: expert_points((448, 224, 112, 56, 28, 14), TOKENS, 896, 16, 3584, 3072),
        "short_conv": lambda: conv_points((12288, 3072, 768, 384), (1024, 4096, 8192)),
        "experts_tp": lambda: expert_points((896,), (1024, 4096, 8192), 896, 16, 3584, 384),
    }


def _ops_families(kda_heads: tuple[int, ...], start: float, budget: float) -> Families:
    """Sweep 2: the ops as the model's run calls them (K3's MLA, experts, conv, attn_res, norms, KDA at
    `kda_heads` per rank, Qwen3-Next's GDN), each also behind a GEMM load (`<name>_loaded`)."""
    k3 = (3584, 3072)
    families: Families = {
        "attention_op": lambda: mla_op_points(K3_HEADS, TOKENS, (0, 4096, 8192, 16384)),
        "experts_op": lambda: experts_op_points(
            [(e, e, 16, *k3) for e in (256, 128, 64, 32)]
            + [(896, e, 16, *k3) for e in (224, 112, 56)]
            + [(256, 256, 8, 2304, 1024), (256, 64, 8, 2304, 1024)],
            TOKENS,
        ),  # Kimi-Linear's experts
        "short_conv": lambda: conv_points((12288, 4096, 1536, 384), TOKENS),
        "attn_res": lambda: attn_res_points(TOKENS, (1, 2, 4, 8), 7168),
        "norm": lambda: norm_points((7168, 2304, 12288, 1536, 512), TOKENS),
        "kda_runtime": lambda: kda_points(kda_heads, (8192, 4096, 2048, 1024), reps=5, deadline=start + budget - 100),
    }
    # Qwen3-Next's GDN at 16 and 2 key heads per rank (TP1, TP8), two v heads each.
    families["gdn"] = lambda: gdn_points((16, 2), (8192, 4096, 2048, 1024), deadline=start + budget - 100)
    # The same calls behind a GEMM load instead of the sleep (`loaded`): power and clock as in a run.
    load = ("attention_op", "experts_op", "short_conv", "norm", "attn_res", "kda_runtime", "gdn")
    return families | {f"{name}_loaded": partial(loaded, families[name]) for name in load}


def _in_model_families() -> Families:
    """Sweep 1's check at the shapes the TP1 bench runs."""
    return {
        "experts_dense": lambda: (
            expert_points((128,), (1024, 4096, 8192), 128, 16, 3584, 3072)
            + expert_points((256,), (1024, 4096, 8192), 256, 16, 3584, 3072)
        ),
        "attn_res": lambda: attn_res_points((1024, 4096, 8192), (1, 2, 4), 7168),
        "kda_runtime": lambda: kda_points((96, 48, 24, 12, 6, 3), (8192, 2048), reps=5),
    }


if __name__ == "__main__":
    main()


__all__ = ["SWEEP_VERSION", "main", "run_sweep"]
