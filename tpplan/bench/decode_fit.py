"""Fit the decode kernel models on half of a decode sweep (`decode_sweep`) and judge them on the other half.

Each decode class gets one form, t = a + bytes / BW + flops / R (non-negative constants, least squares on
relative error), because at one token per request the work is a read of the cache or the weights, some
arithmetic, and a fixed chain of launches:

- `decode_gqa`: bytes = the KV cache read (k and v of the rank's KV heads); no flops term (every shape
  swept has 8 query heads per KV head, so the flops are the bytes times one constant);
- `decode_mla`: bytes = the latent cache read once (576 wide), flops = 2 x heads x (576 + 512) per key;
- `gemm_small`: bytes = A, B and C once, flops = 2 m k n;
- `experts_small` (the routed-experts op at 1-512 tokens): bytes = the weights of the experts that got rows
  plus the rows in and out, flops = the three projections of every routed row.

The split is a checkerboard per shape over (batch, KV length) or (M, shape), so every batch and KV bucket
holds fitted and held-out points. `python -m tpplan.bench.decode_fit OUT.json SWEEP.json...` (here, no GPU).
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from typing import Any

from tpplan.bench.decode_sweep import BATCHES, EXPERT_TOKENS, KV_LENS, MLA_LATENT, MLA_ROPE, SMALL_M, kv_bytes

FITTED = ("decode_gqa", "decode_mla", "gemm_small", "experts_small")
# GQA's flops per key are h/hk times its bytes, one ratio over the sweep's shapes: bytes alone price it.
NO_FLOPS = ("decode_gqa",)


def features(p: dict[str, Any]) -> tuple[float, float]:
    """(bytes, flops) of a decode-sweep point."""
    fam = p["family"]
    if fam == "decode_gqa":
        return kv_bytes(p), 2.0 * p["heads"] * 2 * p["d"] * p["batch"] * p["kv"]
    if fam == "decode_mla":
        return kv_bytes(p), 2.0 * p["heads"] * (MLA_LATENT + MLA_ROPE + MLA_LATENT) * p["batch"] * p["kv"]
    if fam == "experts_small":
        w, i, rows = p["width"], p["inter"], p["rows"]
        return 2.0 * (3 * w * i * p["active"] + rows * (2 * w + 3 * i)), 6.0 * rows * w * i
    m, k, n = p["m"], p["k"], p["n"]
    return 2.0 * (m * k + k * n + m * n), 2.0 * m * k * n


def decode_s(c: dict[str, float], nbytes: float, flops: float) -> float:
    """t = a + bytes / BW + flops / R (`kernel_models.decode_s`, the constants `a_s`, `TBps`, `tflops`)."""
    from tpplan.cost.kernel_models import decode_s as form

    return form(c, nbytes, flops)


def checkerboard(points: list[dict[str, Any]]) -> list[bool]:
    """True = fitted. Attention: (batch, KV) index parity, shifted per shape; GEMMs: (M, shape) parity."""
    shapes: dict[tuple[Any, ...], int] = {}
    out = []
    for p in points:
        if p["family"] == "gemm_small":
            key: tuple[Any, ...] = (p["k"], p["n"])
            i = SMALL_M.index(p["m"]) if p["m"] in SMALL_M else p["m"]
        elif p["family"] == "experts_small":
            key = (p["experts"], p["local"], p["width"], p["inter"])
            i = EXPERT_TOKENS.index(p["tokens"]) if p["tokens"] in EXPERT_TOKENS else p["tokens"]
        else:
            key = (p["family"], p["heads"], p.get("kv_heads"), p.get("d"))
            i = BATCHES.index(p["batch"]) + KV_LENS.index(p["kv"])
        out.append((i + shapes.setdefault(key, len(shapes))) % 2 == 0)
    return out


def fit_form(points: list[dict[str, Any]], flops: bool = True) -> dict[str, float]:
    """Non-negative (a, 1/BW, 1/R) minimising the relative error over `points` (R infinite without `flops`)."""
    import numpy as np
    from scipy.optimize import nnls

    rows, ones = [], []
    for p in points:
        b, f = features(p)
        t = p["seconds"]
        rows.append([1.0 / t, b * 1e-12 / t, f * 1e-12 / t if flops else 0.0])
        ones.append(1.0)
    x, _ = nnls(np.array(rows), np.array(ones))
    return {"a_s": float(x[0]), "TBps": float(1.0 / x[1]) if x[1] > 0 else 0.0,
            "tflops": float(1.0 / x[2]) if x[2] > 0 else 0.0}  # fmt: skip


def merged(files: list[str]) -> list[dict[str, Any]]:
    """Every timed point of the sweep files, the median per case where a case ran more than once.
    `FILE@fam,fam` takes only those families of FILE."""
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for spec in files:
        f, _, only = spec.partition("@")
        keep = set(only.split(",")) if only else None
        with open(f) as fh:
            for p in json.load(fh)["points"]:
                if p.get("seconds", 0) > 0 and "skipped" not in p and (keep is None or p["family"] in keep):
                    key = json.dumps({k: v for k, v in p.items() if k in CASE_KEYS}, sort_keys=True)
                    by[key].append(p)
    return [{**ps[0], "seconds": statistics.median(p["seconds"] for p in ps)} for ps in by.values()]


CASE_KEYS = ("family", "heads", "kv_heads", "d", "batch", "kv", "m", "k", "n", "experts", "local", "top_k",
             "width", "inter", "split", "tokens")  # fmt: skip


def batch_bucket(n: int) -> str:
    return "1" if n == 1 else "2-16" if n <= 16 else "17-128" if n <= 128 else "129-512"


def kv_bucket(n: int) -> str:
    return f"{n // 1024}K"


def bucket(p: dict[str, Any]) -> tuple[str, str]:
    """(row bucket, column bucket): batch and KV length for attention, M and the N x K size for GEMMs,
    tokens and the split for experts."""
    if p["family"] in ("decode_gqa", "decode_mla"):
        return f"B {batch_bucket(p['batch'])}", kv_bucket(p["kv"])
    if p["family"] == "gemm_small":
        return f"M {batch_bucket(p['m'])}", "weights <= 4M" if p["k"] * p["n"] <= 4 << 20 else "weights > 4M"
    return f"T {batch_bucket(p['tokens'])}", str(p["split"])


def fit_decode(points: list[dict[str, Any]]) -> dict[str, Any]:
    """Constants per fitted family (from the checkerboard's fitted half) and every point's prediction."""
    fit_mask = checkerboard(points)
    consts = {}
    for fam in FITTED:
        train = [p for p, f in zip(points, fit_mask, strict=True) if f and p["family"] == fam]
        if len(train) >= 3:
            consts[fam] = fit_form(train, fam not in NO_FLOPS)
    judged = []
    for p, f in zip(points, fit_mask, strict=True):
        c = consts.get(p["family"])
        if c is None:
            continue
        pred = decode_s(c, *features(p))
        judged.append({**p, "fitted": f, "predicted_s": pred, "error": pred / p["seconds"] - 1.0})
    return {"constants": consts, "points": judged}


def error_table(points: list[dict[str, Any]], held_out: bool = True) -> list[dict[str, Any]]:
    """Median and worst |error| per (family, row bucket, column bucket), held-out (or fitted) points."""
    cells: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for p in points:
        if p["fitted"] != held_out:
            r, c = bucket(p)
            cells[(p["family"], r, c)].append(abs(p["error"]))
    return [{"family": f, "row": r, "col": c, "n": len(v), "median": statistics.median(v), "worst": max(v)}
            for (f, r, c), v in sorted(cells.items())]  # fmt: skip


def totals(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per family: points, median and worst |error| in sample (fitted) and out of sample (held out)."""
    out = []
    for fam in sorted({p["family"] for p in points}):
        row: dict[str, Any] = {"family": fam}
        for name, fitted in (("in", True), ("out", False)):
            errs = [abs(p["error"]) for p in points if p["family"] == fam and p["fitted"] == fitted]
            row[name] = {"n": len(errs), "median": statistics.median(errs) if errs else None,
                         "worst": max(errs) if errs else None}  # fmt: skip
        out.append(row)
    return out


def markdown(res: dict[str, Any]) -> str:
    """The tables docs/benchmarks.md shows: totals, then held-out median / worst per bucket."""
    lines = ["| class | fitted points | in-sample median / worst | held-out points | out-of-sample median / worst |",
             "|---|---:|---|---:|---|"]  # fmt: skip
    for t in res["totals"]:
        i, o = t["in"], t["out"]
        lines.append(f"| {t['family']} | {i['n']} | {_pct(i)} | {o['n']} | {_pct(o)} |")
    lines += ["", "| class | rows | columns | held-out points | median / worst |", "|---|---|---|---:|---|"]
    for r in res["buckets"]:
        lines.append(f"| {r['family']} | {r['row']} | {r['col']} | {r['n']} | {_pct(r)} |")
    return "\n".join(lines) + "\n"


def _pct(r: dict[str, Any]) -> str:
    return "" if r.get("median") is None else f"{100 * r['median']:.0f}% / {100 * r['worst']:.0f}%"


def signed_table(points: list[dict[str, Any]], regime: str) -> str:
    """Signed error (predicted / measured - 1) per regime of judged points: median and range. `regime` is
    "heads" (per rank), "batch" or "kv" (bucketed as in `bucket`); the sign says which way a price misses."""
    name = {"heads": lambda p: str(p["heads"]), "batch": lambda p: batch_bucket(p["batch"]),
            "kv": lambda p: kv_bucket(p["kv"])}[regime]  # fmt: skip
    cells: dict[str, list[float]] = defaultdict(list)
    for p in sorted(points, key=lambda p: p[regime]):
        cells[name(p)].append(p["error"])
    lines = [f"| {regime} | points | median error | lowest | highest |", "|---|---:|---:|---:|---:|"]
    for key, errs in cells.items():
        lines.append(f"| {key} | {len(errs)} | {100 * statistics.median(errs):+.0f}% | "
                     f"{100 * min(errs):+.0f}% | {100 * max(errs):+.0f}% |")  # fmt: skip
    return "\n".join(lines) + "\n"


def judge(consts: dict[str, dict[str, float]], points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every point of another sweep (another card) priced by `consts`: all of them held out."""
    out = []
    for p in points:
        c = consts.get(p["family"])
        if c is not None:
            pred = decode_s(c, *features(p))
            out.append({**p, "fitted": False, "predicted_s": pred, "error": pred / p["seconds"] - 1.0})
    return out


def gemm_formula_table(points: list[dict[str, Any]], gpu: str = "h100x8-ib400") -> str:
    """What the planner priced small-M GEMMs with before (`cost.gemm.gemm_time`: the GPU's GEMM table or its
    analytic curve) against the measured points: median signed and |error|, worst, per M bucket."""
    from tpplan.cost.gemm import gemm_time
    from tpplan.cost.topology import load_topology

    spec = load_topology(gpu).gpu
    cells: dict[str, list[float]] = defaultdict(list)
    for p in points:
        if p["family"] == "gemm_small":
            cells[bucket(p)[0]].append(gemm_time(p["m"], p["k"], p["n"], spec) / p["seconds"] - 1.0)
    lines = ["| rows | points | median error | median abs error | worst |", "|---|---:|---:|---:|---:|"]
    for name, errs in sorted(cells.items(), key=lambda kv: int(kv[0].split()[1].split("-")[0])):
        worst = max(errs, key=abs)
        lines.append(f"| {name} | {len(errs)} | {100 * statistics.median(errs):+.0f}% | "
                     f"{100 * statistics.median(abs(e) for e in errs):.0f}% | {100 * worst:+.0f}% |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    """`python -m tpplan.bench.decode_fit OUT.json SWEEP.json[@fam,...] ... [--other OTHER.json[@fam,...] ...]`:
    fit on the checkerboard half of the SWEEPs, judge on the other half and on every point of the OTHERs."""
    from pathlib import Path

    from tpplan.outputs import write_files

    args = sys.argv[1:] if argv is None else argv
    cut = args.index("--other") if "--other" in args else len(args)
    if cut < 2:
        sys.exit("error: OUT.json SWEEP.json... [--other SWEEP.json...]: give the output file and a decode sweep")
    res = fit_decode(merged(args[1:cut]))
    res["totals"] = totals(res["points"])
    res["buckets"] = error_table(res["points"])
    print(markdown(res))
    if args[cut + 1 :]:
        other = judge(res["constants"], merged(args[cut + 1 :]))
        res["other"] = {"files": args[cut + 1 :], "totals": totals(other), "buckets": error_table(other)}
        print(markdown({"totals": res["other"]["totals"], "buckets": res["other"]["buckets"]}))
    write_files({Path(args[0]): json.dumps(res, indent=1) + "\n"}, "OUT.json")


if __name__ == "__main__":
    main()


__all__ = [
    "checkerboard",
    "decode_s",
    "error_table",
    "features",
    "fit_decode",
    "gemm_formula_table",
    "judge",
    "markdown",
    "merged",
    "signed_table",
    "totals",
]
