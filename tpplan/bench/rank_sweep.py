"""The per-rank kernel sweep (issue 34): every op class the planner prices, at the shapes one rank of TP 1-32
and EP 4-32 runs for the project's model families (`rank_shapes`), 1K-32K tokens, on one GPU.

Why: the kernel models were fitted at whole-model shapes; the memo's deployments run TP8-32. This sweep
times the serving-class kernels the bench uses (SDPA flash, fla's chunk_kda / chunk_gated_delta_rule /
causal_conv1d / RMSNorm, `torch._grouped_mm` inside `grouped_routed_experts`, cuBLAS) per rank, and where
`TPPLAN_ENGINE_KERNELS` gives the engines' builds (`engine_kernels`) their FA3 for the masked family and FlashMLA
for DSA's sparse attention (`sparse`, the absorbed 576/512 form); each point of those records the kernel (`variant`).

How it times (`measure`): every case twice, (1) with the host ahead of the GPU (`sweep_timing`'s GPU
sleep first: the GPU's own time, as inside a run whose large kernels keep the GPU behind the host) and
(2) back to back (the host's launch chain included: what an op costs where nothing hides it, e.g. a
TP32 rank's small kernels). Each is the median of 3 batches of `reps` calls; the batch spread is
kept. One process keeps fla's Triton builds (`TRITON_CACHE_DIR` too) across shapes: the recurrences
run h heads as h one-head sequences, one build for every head count (`sweep_families.kda_batched_points`).
A time that falls as its work grows (more tokens or heads, all else equal) is timed twice more and the
median kept (`non_monotone`), before anything is fitted to it.

`python -m tpplan.bench.rank_sweep OUT.json BUDGET_S [FAMILIES]` (GPU). The CPU tests run the same
families on tiny cases on the CPU (`DEVICE`), without fla.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tpplan.bench.rank_shapes import MASKED_MODELS, rank_shapes
from tpplan.bench.rank_timing import Case, measure

RANK_SWEEP_VERSION = 1
TOKENS = (1024, 2048, 4096, 8192, 16384, 32768)
EXPERT_TOKENS = (1024, 4096, 16384)
CONTEXT = 8192  # the cached keys of the "prefix" attention cases (tokens <= 8K)
MAX_ATTN_FLOPS = 6e12  # one attention call above this is skipped (its regime is measured at other heads)
MAX_INDEX_SCORES = 2**36  # an indexer call's scores (heads x queries x keys), at most: DeepSeek-V3.2 at 32K (the
# reference takes ~1.2 s there, the fused kernel a few ms; 2026-12-06c's sweep stopped at 2^35 for the reference)


# -- cases ---------------------------------------------------------------------------------------------


def attention_cases(shapes: list[dict[str, Any]], tokens: Iterable[int] = TOKENS) -> list[Case]:
    """Every (heads, dims) at every token count, with no cache and (<= 8K tokens) over CONTEXT cached keys."""
    from tpplan.cost.kernel_models import attention_flops

    out = []
    for s in shapes:
        for t in tokens:
            for ctx in (0, CONTEXT) if t <= 8192 else (0,):
                f = attention_flops(s["heads"], t, ctx, s["dqk"], max(s["dqk"], s["dv"]))
                if f <= MAX_ATTN_FLOPS:
                    out.append({"family": "attention", "heads": s["heads"], "dqk": s["dqk"], "dv": s["dv"],
                                "tokens": t, "context": ctx})  # fmt: skip
    return out


def masked_cases(shapes: list[dict[str, Any]], tokens: Iterable[int] = TOKENS) -> list[Case]:
    """Windowed / chunked attention (`masked_attention`'s kernels) at each token count, with no cache and
    (<= 8K tokens) over CONTEXT cached keys, as `attention_cases`."""
    keys = ("heads", "d", "window", "chunk", "sinks")
    return [{"family": "masked", **{k: s[k] for k in keys}, "kv_heads": s.get("kv_heads", s["heads"]), "tokens": t,
             "context": ctx}
            for s in shapes for t in tokens for ctx in ((0, CONTEXT) if t <= 8192 else (0,))]  # fmt: skip


def indexer_cases(shapes: list[dict[str, Any]], tokens: Iterable[int] = TOKENS) -> list[Case]:
    """DSA's indexer (the bench's: `gpu_kernels.serving_indexer`, fused on CUDA) at each token count,
    with and without CONTEXT cached keys; calls over `MAX_INDEX_SCORES` scores are left out."""
    return [{"family": "indexer", "heads": s["heads"], "d": s["d"], "topk": s["topk"], "tokens": t, "context": ctx}
            for s in shapes for t in tokens for ctx in ((0, CONTEXT) if t <= 8192 else (0,))
            if s["heads"] * t * (t + ctx) <= MAX_INDEX_SCORES]  # fmt: skip


def sparse_cases(tokens: Iterable[int] = TOKENS) -> list[Case]:
    """DSA's sparse attention (absorbed form, `rank_runners.run_sparse`) at the DSA models' attention heads per
    rank, their indexer's top-k, each token count with and without CONTEXT cached keys."""
    s = rank_shapes(MASKED_MODELS)
    dsa = {m for r in s["indexer"] for m in r["models"]}
    topk = {m: r["topk"] for r in s["indexer"] for m in r["models"]}
    heads = sorted({(r["heads"], topk[m]) for r in s["attention"] for m in r["models"] if m in dsa})
    return [{"family": "sparse", "heads": h, "topk": k, "tokens": t, "context": ctx}
            for h, k in heads for t in tokens for ctx in ((0, CONTEXT) if t <= 8192 else (0,))]  # fmt: skip


def plain_cases(family: str, shapes: list[dict[str, Any]], keys: tuple[str, ...], tokens: Iterable[int]) -> list[Case]:
    """Each shape (its `keys`) at each token count."""
    return [{"family": family, **{k: s[k] for k in keys}, "tokens": t} for s in shapes for t in tokens]


def all_cases(tokens: Iterable[int] = TOKENS, expert_tokens: Iterable[int] = EXPERT_TOKENS) -> dict[str, list[Case]]:
    """The whole sweep, per family, in the order it runs (the recurrences first: the issue's first gap)."""
    tokens, expert_tokens = tuple(tokens), tuple(expert_tokens)
    s = rank_shapes()
    ew = sorted({r["width"] for r in s["experts"]})
    return {
        "kda": plain_cases("kda", s["kda"], ("heads", "d"), tokens),
        "gdn": plain_cases("gdn", s["gdn"], ("heads", "v_per_k", "d"), tokens),
        "experts": plain_cases(
            "experts", s["experts"], ("experts", "local", "top_k", "width", "inter", "split"), expert_tokens
        ),
        "attention": attention_cases(s["attention"], tokens),
        "norm": plain_cases("norm", s["norm"] + [{"width": w} for w in (512, 1536)], ("width",), tokens),
        "short_conv": plain_cases("short_conv", s["short_conv"], ("channels",), tokens),
        "elementwise": [
            {"family": "elementwise", "op": op, "width": w, "tokens": t}
            for op in ("add", "silu_mul")
            for w in (*ew, 12288)
            for t in tokens
        ],
        "attn_res": [{"family": "attn_res", "tokens": t, "bank": b, "hidden": 7168} for t in tokens for b in (1, 4)],
        "gemm": gemm_cases(),
        "masked": masked_cases(rank_shapes(MASKED_MODELS)["masked"], tokens),
        "indexer": indexer_cases(rank_shapes(MASKED_MODELS)["indexer"], tokens),
        "sparse": sparse_cases(tokens),
    }


def gemm_cases() -> list[Case]:
    """Small per-rank GEMMs: column-split projections (narrow N) and row-split ones (short K), 1K-16K rows."""
    col = [(k, n) for k in (2048, 4096, 7168) for n in (64, 128, 256, 512, 1024, 2048, 4096)]
    row = [(k, n) for k in (96, 192, 384, 768, 1536) for n in (2048, 4096, 7168)]
    return [{"family": "gemm", "m": m, "k": k, "n": n} for m in (1024, 4096, 16384) for k, n in col + row]


# -- re-measuring what is not monotone, and the run --------------------------------------------------

# The dimension along which each family's work grows, all else equal (tokens everywhere; heads too).
GROWS = {"attention": ("tokens", "heads"), "kda": ("tokens", "heads"), "gdn": ("tokens", "heads"),
         "experts": ("tokens",), "norm": ("tokens", "width"), "short_conv": ("tokens", "channels"),
         "elementwise": ("tokens", "width"), "attn_res": ("tokens",), "gemm": ("m",),
         "decode_gqa": ("kv", "batch"), "decode_mla": ("kv", "batch"), "gemm_small": ("m",),
         "experts_small": ("tokens",), "masked": ("tokens", "heads"), "indexer": ("tokens", "heads"),
         "sparse": ("tokens", "heads")}  # fmt: skip
TIMES = ("seconds", "b2b_s", "spread", "ffn_s", "combine_s", "rows", "active", "max_rows", "skipped", "grouped",
         "splits", "copies")  # fmt: skip
# Each family's share of the budget, in the order `all_cases` runs them.
SHARE = {"kda": 0.14, "gdn": 0.12, "experts": 0.22, "attention": 0.2, "norm": 0.06, "short_conv": 0.06,
         "elementwise": 0.06, "attn_res": 0.03, "gemm": 0.06, "masked": 0.1, "indexer": 0.1,
         "sparse": 0.1}  # fmt: skip
SLACK = 0.05  # a time that falls by more than this while the work grows is re-measured


def non_monotone(points: list[dict[str, Any]], slack: float = SLACK) -> list[int]:
    """Indexes of points whose time falls by more than `slack` where their work grows (the point and the
    smaller-work neighbour it undercuts), along each of the family's `GROWS` dimensions."""
    bad: set[int] = set()
    for i, p in enumerate(points):
        for dim in GROWS.get(p["family"], ()):
            key = {k: v for k, v in p.items() if k not in TIMES and k != dim and k != "remeasured"}
            for j, q in enumerate(points):
                same = all(q.get(k) == v for k, v in key.items()) and q["family"] == p["family"]
                if j != i and same and q[dim] > p[dim] and q["seconds"] < p["seconds"] * (1 - slack):
                    bad |= {i, j}
    return sorted(bad)


def _case(p: dict[str, Any]) -> Case:
    return {k: v for k, v in p.items() if k not in TIMES and k != "remeasured"}


def run_family(cases: list[Case], deadline: float, runners: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Time each case (until `deadline`), then time the non-monotone ones twice more and keep the median."""
    from tpplan.bench.rank_runners import RUNNERS as PREFILL

    RUNNERS = runners or PREFILL
    out = []
    for c in cases:
        if time.perf_counter() > deadline:
            break
        out.append({**c, **RUNNERS[c["family"]](c)})
    for i in non_monotone(out):
        if time.perf_counter() > deadline:
            break
        again = [out[i]] + [{**_case(out[i]), **RUNNERS[out[i]["family"]](_case(out[i]))} for _ in range(2)]
        merged: dict[str, Any] = {  # a repeat can differ in kind (random routing: no rows on this rank)
            k: statistics.median(r[k] for r in again) for k in ("seconds", "b2b_s") if all(k in r for r in again)
        }
        out[i] = {**out[i], **merged, "remeasured": [r["seconds"] for r in again]}
    return out


def gpu_state() -> dict[str, Any]:
    """The card's name, clocks, power and temperature as nvidia-smi reports them (empty where it is missing)."""
    import subprocess

    q = "name,clocks.sm,clocks.max.sm,clocks.mem,power.draw,power.limit,temperature.gpu,driver_version"
    try:
        line = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=20).stdout.strip().splitlines()[0]  # fmt: skip
    except (OSError, IndexError, subprocess.SubprocessError):
        return {}
    return dict(zip(q.split(","), (x.strip() for x in line.split(",")), strict=False))


def run(out_path: str, budget_s: float, families: list[str] | None = None, *,
        cases: dict[str, list[Case]] | None = None, shares: dict[str, float] | None = None,
        runners: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    """The sweep within `budget_s`, the JSON written after every family (a run cut short keeps its data).
    `cases`/`shares`/`runners`: another sweep's (`decode_sweep`); default this one's."""
    import torch

    from tpplan.outputs import write_files

    start = time.perf_counter()
    cases = cases if cases is not None else all_cases()
    share = shares or SHARE
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    doc: dict[str, Any] = {"version": RANK_SWEEP_VERSION, "gpu": gpu,
                           "torch": torch.__version__, "fla": _fla_version(),
                           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "gpu_state_start": gpu_state(),
                           "timing": "seconds: host ahead (GPU time); b2b_s: back to back", "points": [],
                           "skipped": [], "family_s": {}}  # fmt: skip
    names = families or list(cases)
    total = sum(share.get(n, 0.05) for n in names)
    used = 0.0
    for name in names:
        t0 = time.perf_counter()
        used += share.get(name, 0.05) / total
        try:  # each family ends by its cumulative share of the budget (time a family leaves passes on)
            pts = run_family(cases[name], start + budget_s * used, runners)
        except Exception as exc:  # a family that fails (missing fla, OOM) is reported; the rest still run
            doc["skipped"].append(f"{name}: {type(exc).__name__}: {exc}")
            pts = []
        doc["points"] += pts
        if len(pts) < len(cases[name]):
            doc["skipped"].append(f"{name}: {len(cases[name]) - len(pts)} of {len(cases[name])} cases not run")
        doc["family_s"][name] = round(time.perf_counter() - t0, 1)
        doc["gpu_state_end"] = gpu_state()
        print(f"{name}: {doc['family_s'][name]} s, {len(pts)} points", flush=True)
        write_files({Path(out_path): json.dumps(doc, indent=1) + "\n"}, "OUT.json")
        torch.cuda.empty_cache()
    return doc


def _fla_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("flash-linear-attention")
    except Exception:  # fla missing or unregistered: recorded as None
        return None


def _device_or_cpu() -> None:
    """Run on the CPU where no GPU is (a smoke run of the whole command before device time is spent)."""
    import torch

    from tpplan.bench.rank_timing import DEVICE

    if not torch.cuda.is_available():
        DEVICE[0] = "cpu"


def main(argv: list[str] | None = None) -> None:
    """`python -m tpplan.bench.rank_sweep OUT.json BUDGET_S [FAMILY,FAMILY]`."""
    from tpplan.errors import TpplanError
    from tpplan.outputs import check_file

    args = sys.argv[1:] if argv is None else argv
    try:
        out, budget = str(check_file("OUT.json", args[0])), float(args[1])
    except (TpplanError, IndexError, ValueError) as exc:
        sys.exit(f"error: OUT.json BUDGET_S [FAMILIES]: {exc}")
    _device_or_cpu()
    doc = run(out, budget, args[2].split(",") if len(args) > 2 else None)
    print(f"{len(doc['points'])} points; skipped: {doc['skipped']}")


if __name__ == "__main__":
    main()


__all__ = ["GROWS", "RANK_SWEEP_VERSION", "TOKENS", "all_cases", "attention_cases", "gemm_cases", "indexer_cases",
           "masked_cases", "measure", "non_monotone", "plain_cases", "run", "run_family", "sparse_cases"]  # fmt: skip
