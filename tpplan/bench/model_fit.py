"""Fit the physical kernel models (`tpplan.cost.kernel_models`) on one part of a kernel sweep, judge the rest.

Why: a model is only worth its out-of-sample error. `fit_sweep` splits each kernel family's sweep
points into a fit set (a few heads per rank, token counts and contexts) and the held-out rest,
fits the constants on the fit set (least squares on relative error, Nelder-Mead; torch-free), and
returns the constants with the errors of both sets by regime. `python -m tpplan.bench.model_fit
SWEEP.json [SWEEP2.json ...] OUT.json` writes them (docs/benchmarks/h200-2026-12-01/).
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tpplan.cost import kernel_models as M

# Which points are fitted on: the rest are held out (other heads per rank, tokens, contexts, experts).
# Sweep 1 (kernels timed back to back, 2026-12-01 05:45 UTC):
FIT_SETS: dict[str, Callable[[dict[str, Any]], bool]] = {
    "attention": lambda p: p["heads"] in (96, 24, 6) and p["tokens"] in (2048, 8192) and p["context"] in (0, 16384),
    "kda": lambda p: p["heads"] in (96, 24, 6, 1) and p["tokens"] in (2048, 8192),
    "experts": lambda p: p["experts_local"] in (448, 112, 28) and p["tokens"] in (2048, 8192) and p["inter"] == 3072,
    "short_conv": lambda p: p["channels"] in (12288, 768),
    "attn_res": lambda p: p["bank"] in (1, 4),
    "norm": lambda p: p["width"] in (7168, 1536),
}
# Sweep 2 (the ops as the model's run calls them, timed with the host ahead of the GPU). Held out:
# heads per rank 48/12/3 (TP2/TP8/TP32) for attention and 12 (TP8) for KDA, 1K and 4K tokens, contexts
# 4K and 8K, experts per rank 128/32, the expert-parallel 224/56 and Kimi-Linear's experts (another
# width, intermediate and top-k), conv channels 4096/384, 2 and 8 snapshots.
FIT_SETS_OPS: dict[str, Callable[[dict[str, Any]], bool]] = {
    "attention": lambda p: p["heads"] in (96, 24, 6) and p["tokens"] in (2048, 8192) and p["context"] in (0, 16384),
    "kda": lambda p: p["heads"] in (96, 48, 3) and p["tokens"] in (2048, 8192),
    "experts": lambda p: (
        p["tokens"] in (2048, 8192)
        and p["width"] == 3584
        and (p["experts"], p["experts_local"]) in ((256, 256), (64, 64), (896, 112))
    ),
    "short_conv": lambda p: p["channels"] in (12288, 1536),
    "attn_res": lambda p: p["bank"] in (1, 4),
    "norm": lambda p: p["width"] in (7168, 1536),
    "gdn": lambda p: p["tokens"] in (2048, 8192),
}
# The implementation sweep 2 timed, per model (recorded in the preset: `KernelModels.impl`).
IMPLS_OPS = {"attention_causal": "torch SDPA", "attention_prefix": "torch SDPA", "kda": "fla.chunk_kda",
             "experts": "torch._grouped_mm", "short_conv": "fla.causal_conv1d",
             "attn_res": "fla.fused_attnres", "norm": "fla fused rms_norm",
             "gdn": "fla.chunk_gated_delta_rule"}  # fmt: skip


def nelder_mead(f: Callable[[list[float]], float], x0: Sequence[float], iters: int = 4000) -> list[float]:
    """Minimise f from x0 (a small, dependency-free simplex search; enough for 3-5 parameters)."""
    n = len(x0)
    pts = [list(x0)] + [[x + (0.25 if i == j else 0.0) for j, x in enumerate(x0)] for i in range(n)]
    vals = [f(p) for p in pts]
    for _ in range(iters):
        order = sorted(range(n + 1), key=lambda i: vals[i])
        pts, vals = [pts[i] for i in order], [vals[i] for i in order]
        if abs(vals[-1] - vals[0]) < 1e-12:
            break
        cen = [sum(p[j] for p in pts[:-1]) / n for j in range(n)]
        refl = [c + (c - w) for c, w in zip(cen, pts[-1], strict=True)]
        fr = f(refl)
        if fr < vals[0]:
            exp = [c + 2 * (c - w) for c, w in zip(cen, pts[-1], strict=True)]
            fe = f(exp)
            pts[-1], vals[-1] = (exp, fe) if fe < fr else (refl, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = refl, fr
        else:
            con = [c + 0.5 * (w - c) for c, w in zip(cen, pts[-1], strict=True)]
            fc = f(con)
            if fc < vals[-1]:
                pts[-1], vals[-1] = con, fc
            else:
                pts = [pts[0]] + [[b + 0.5 * (x - b) for b, x in zip(pts[0], p, strict=True)] for p in pts[1:]]
                vals = [vals[0]] + [f(p) for p in pts[1:]]
    return pts[min(range(n + 1), key=lambda i: vals[i])]


def _fit(
    points: list[dict[str, Any]], model: Callable[[dict[str, float], dict[str, Any]], float], names: Sequence[str],
    x0: Sequence[float],
) -> dict[str, float]:  # fmt: skip
    """Constants (searched in log space: all positive) minimising the squared relative error."""

    def loss(x: list[float]) -> float:
        c = {k: math.exp(v) for k, v in zip(names, x, strict=True)}
        return sum((model(c, p) / p["seconds"] - 1.0) ** 2 for p in points)

    best = nelder_mead(loss, [math.log(v) for v in x0])
    best = nelder_mead(loss, best)  # restart: the simplex shrinks early on ill-scaled problems
    return {k: math.exp(v) for k, v in zip(names, best, strict=True)}


def _attention(c: dict[str, float], p: dict[str, Any]) -> float:
    dv = max(p["dv"], p["dqk"])  # the runtime zero-pads a narrower v (MLA) for the flash kernels
    f = M.attention_flops(p["heads"], p["tokens"], p["context"], p["dqk"], dv)
    return M.attention_s(c, p["heads"], p["tokens"], p["dqk"], dv, f, p["context"])


def _kda(c: dict[str, float], p: dict[str, Any]) -> float:
    return M.recurrence_s({**c, "p": 1.0 + c["p1"]}, p["heads"], p["tokens"])


def _experts(c: dict[str, float], p: dict[str, Any]) -> float:
    t = M.experts_s({**c, "p": 1.0 + c["p1"]}, p["active"], p["width"], p["inter"], experts_compute_s(p))
    if "route_TBps" in c:  # the whole op: routing traffic too (sweep 2)
        t += M.routing_bytes(p["rows"], p["tokens"], p["width"], M.WEIGHTED_SUM) / (c["route_TBps"] * 1e12)
    return t


def experts_compute_s(p: dict[str, Any]) -> float:
    """The GEMM table's time for gate+up and down at the tile-padded per-expert rows (as `cost.predict`)."""
    from tpplan.cost.gemm import gemm_time
    from tpplan.cost.predict import EXPERT_M_TILE
    from tpplan.cost.topology import load_topology

    gpu = load_topology("h200x2").gpu
    a = p["active"]
    m_pad = a * EXPERT_M_TILE * math.ceil(p["rows"] / a / EXPERT_M_TILE)
    return gemm_time(m_pad, p["width"], 2 * p["inter"], gpu) + gemm_time(m_pad, p["inter"], p["width"], gpu)


def _conv(c: dict[str, float], p: dict[str, Any]) -> float:
    return M.stream_s(c, conv_bytes(p["channels"], p["tokens"]))


def _attn_res(c: dict[str, float], p: dict[str, Any]) -> float:
    impl = IMPLS_OPS["attn_res"] if p.get("timing") == "host ahead" else None  # sweep 2 timed fla's kernel
    return M.attn_res_s(c, p["tokens"], p["hidden"], p["bank"], impl)


def _norm(c: dict[str, float], p: dict[str, Any]) -> float:
    return M.stream_s(c, conv_bytes(p["width"], p["tokens"]))


def conv_bytes(channels: int, tokens: int) -> float:
    """bf16 [T, C] read and written (the K-1 carried rows aside)."""
    return 4.0 * channels * tokens


FAMILIES: dict[str, tuple[Callable[[dict[str, float], dict[str, Any]], float], tuple[str, ...], tuple[float, ...]]] = {
    "attention": (_attention, ("a_s", "b_s", "tflops"), (5e-5, 1e-12, 500.0)),
    "kda": (_kda, ("c0_s", "c1_s", "b_s", "p1"), (8e-4, 3e-8, 3e-9, 2.0)),
    "experts": (_experts, ("c0_s", "TBps", "p1"), (5e-5, 3.3, 2.0)),
    "short_conv": (_conv, ("a_s", "TBps"), (5e-5, 2.0)),
    "attn_res": (_attn_res, ("a_s", "TBps"), (5e-5, 1.0)),
    "norm": (_norm, ("a_s", "TBps"), (5e-6, 2.0)),
    "gdn": (_kda, ("c0_s", "c1_s", "b_s", "p1"), (8e-4, 3e-8, 3e-9, 2.0)),  # the same chunked-scan form
}


# The dimensions each model's measured range is recorded over (`KernelModels.extrapolated`).
RANGES: dict[str, Callable[[dict[str, Any]], dict[str, float]]] = {
    "attention": lambda p: {"heads": p["heads"], "tokens": p["tokens"], "context": p["context"]},
    "kda": lambda p: {"heads": p["heads"], "tokens": p["tokens"]},
    "experts": lambda p: {"experts": p["active"], "rows_per_expert": p["rows"] / p["active"]},
    "short_conv": lambda p: {"channels": p["channels"], "tokens": p["tokens"]},
    "attn_res": lambda p: {"tokens": p["tokens"], "snapshots": p["bank"]},
    "norm": lambda p: {"width": p["width"], "tokens": p["tokens"]},
    "gdn": lambda p: {"heads": p["heads"], "tokens": p["tokens"]},
}


def measured_range(fam: str, pts: list[dict[str, Any]]) -> dict[str, float]:
    """min_<dim> / max_<dim> over every measured point (fit and held out alike)."""
    dims = [RANGES[fam](p) for p in pts]
    out: dict[str, float] = {}
    for k in dims[0]:
        out[f"min_{k}"] = float(min(d[k] for d in dims))
        out[f"max_{k}"] = float(max(d[k] for d in dims))
    return out


# Extra constants a sweep-2 model has: the attention with a cache, the KV-cache copy; the experts op, the
# routing; fla's AttnRes, the snapshot copies.
EXTRA_OPS = {"attention_prefix": (("c_s",), (1e-13,)), "experts": (("route_TBps",), (2.0,)),
             "attn_res": (("copy_TBps",), (2.0,))}  # fmt: skip


def fit_sweep(points: list[dict[str, Any]]) -> dict[str, Any]:
    """Constants per model and the error of every point, tagged fit / held-out. Points of sweep 2
    (`timing` "host ahead") use its fit sets, extra constants and implementations."""
    points = [p for p in points if "preamble" not in p]  # loaded twins price the capped state (clock_fit)
    ops = bool(points) and all(p.get("timing") == "host ahead" for p in points)
    fit_sets = FIT_SETS_OPS if ops else FIT_SETS
    consts: dict[str, dict[str, Any]] = {}
    rows: list[dict[str, Any]] = []
    sdpa = [p for p in points if p["family"] == "attention" and p.get("impl", "sdpa") == "sdpa"]
    groups: dict[str, list[tuple[str, list[dict[str, Any]]]]] = {
        "attention": [("attention_causal", [p for p in sdpa if p["context"] == 0]),
                      ("attention_prefix", [p for p in sdpa if p["context"] > 0])],
        "kda": [("kda", [p for p in points if p["family"] == "kda"])],
        "experts": [("experts", [p for p in points if p["family"] == "experts"])],
        "short_conv": [("short_conv", [p for p in points if p["family"] == "short_conv"])],
        "attn_res": [("attn_res", [p for p in points if p["family"] == "attn_res"])],
        "norm": [("norm", [p for p in points if p["family"] == "norm"])],
        "gdn": [("gdn", [p for p in points if p["family"] == "gdn"])],
    }  # fmt: skip
    for fam, parts in groups.items():
        model, names, x0 = FAMILIES[fam]
        for name, pts in parts:
            if not pts:
                continue
            fit_set = [p for p in pts if fit_sets[fam](p)]
            more_names, more_x0 = EXTRA_OPS.get(name, ((), ())) if ops else ((), ())
            c = _fit(fit_set, model, (*names, *more_names), (*x0, *more_x0))
            if "p1" in c:
                c = {k: v for k, v in c.items() if k != "p1"} | {"p": 1.0 + c["p1"]}
            consts[name] = c | measured_range(fam, pts) | ({"impl": IMPLS_OPS[name]} if ops else {})
            for p in pts:
                pred = boost_s(consts[name], p)
                rows.append({**p, "model": name, "set": "fit" if fit_sets[fam](p) else "held-out",
                             "predicted_s": pred, "error": pred / p["seconds"] - 1.0})  # fmt: skip
    return {"constants": consts, "points": rows}


def boost_s(consts: dict[str, Any], p: dict[str, Any]) -> float:
    """A sweep point's time priced by a fitted constant set (as `fit_sweep` stores it)."""
    c = {k: v for k, v in consts.items() if not isinstance(v, str)}
    return FAMILIES[p["family"]][0](c if "p" not in c else {**c, "p1": c["p"] - 1.0}, p)


def error_table(
    rows: list[dict[str, Any]], regime: Callable[[dict[str, Any]], str]
) -> list[tuple[str, str, int, float, float]]:
    """(model and regime, set, points, median |error|, worst |error|) per group."""
    groups: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        groups.setdefault((f"{r['model']} {regime(r)}".strip(), r["set"]), []).append(abs(r["error"]))
    return [(k, s, len(v), statistics.median(v), max(v)) for (k, s), v in sorted(groups.items())]


def regime(r: dict[str, Any]) -> str:
    """Heads per rank for attention and recurrences, experts per rank for experts, channels for convs."""
    if r["family"] in ("attention", "kda", "gdn"):
        return f"h={r['heads']}"
    if r["family"] == "experts":
        return f"E/rank={r['experts_local']} I={r['inter']}"
    if r["family"] == "attn_res":
        return f"snapshots={r['bank']}"
    if r["family"] == "norm":
        return f"W={r['width']}"
    return f"C={r['channels']}"


def main(argv: list[str] | None = None) -> None:
    from tpplan.errors import TpplanError
    from tpplan.outputs import check_file, write_files

    args = sys.argv[1:] if argv is None else list(argv)
    pair_files: list[str] = []
    if "--clock-pairs" in args:  # the sweeps whose idle / loaded twins give the power-capped factors
        i = args.index("--clock-pairs")
        pair_files = args[i + 1].split(",")
        del args[i : i + 2]
    try:
        out = check_file("OUT.json", args[-1])
    except TpplanError as exc:
        sys.exit(f"error: {exc}")
    points, docs = [], []
    for arg in args[:-1]:  # SWEEP.json or SWEEP.json@family,family: only those families' points
        path, _, fams = arg.partition("@")
        d = json.loads(Path(path).read_text())
        docs.append(d)
        points += [{**p, "timing": d.get("timing", "back to back")} for p in d["points"]
                   if not fams or p["family"] in fams.split(",")]  # fmt: skip
    doc = docs[0]
    res = fit_sweep(points)
    res["source"] = {"sweeps": args[:-1], "gpu": doc.get("gpu"), "date": doc.get("date"), "torch": doc.get("torch")}
    if pair_files:
        from tpplan.bench.clock_fit import fit_clock_factors

        pts = [{**p, "timing": d.get("timing")} for f in pair_files for d in [json.loads(Path(f).read_text())]
               for p in d["points"]]  # fmt: skip
        capped = fit_clock_factors(pts, res["constants"], FIT_SETS_OPS, boost_s)
        for name, k in capped["factors"].items():
            res["constants"][name]["clock_factor"] = k
        res["clock_state"], res["source"]["clock_pairs"] = "power-capped", pair_files
        res["points"] += capped["points"]
    write_files({out: json.dumps(res, indent=1) + "\n"}, "OUT.json")
    for row in error_table(res["points"], lambda r: f"{regime(r)} {r.get('state', '')}".strip()):
        print(f"{row[0]:<50} {row[1]:<9} {row[2]:>4} median {row[3]:6.1%} worst {row[4]:6.1%}")
    print(json.dumps(res["constants"], indent=1))


if __name__ == "__main__":
    main()


__all__ = ["FIT_SETS", "FIT_SETS_OPS", "boost_s", "conv_bytes", "error_table", "fit_sweep", "nelder_mead", "regime"]
