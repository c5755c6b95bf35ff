"""Fit the kernel models on part of the per-rank sweep (`rank_sweep`) and judge them on the held-out rest,
by op class, heads-per-rank bucket and tokens bucket (issue 34).

Why a checkerboard: the held-out points must sit in every heads and tokens bucket, so the split
alternates over (shape, token count): a case whose shape index plus token index is even is fitted on,
the rest is held out, and every bucket from TP1 to TP32 holds both. Repeated sweeps of one shape are
merged first (median), so a shape is never both fitted and judged.

The constants are fitted on the GPU time (the host ahead of the GPU: `seconds`), as the planner's other
sets are; the back-to-back floors of the recurrences (the host's launch chain) are reported apart
(`launch_floors`). `python -m tpplan.bench.rank_fit OUT.json SWEEP.json...` writes the constants, the
errors of every point and the bucket table (docs/benchmarks/h100-2026-12-06/).
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tpplan.bench import model_fit as MF
from tpplan.bench.rank_shapes import heads_bucket, tokens_bucket
from tpplan.bench.rank_sweep import TIMES
from tpplan.cost import kernel_models as M
from tpplan.cost.sparse_attention import absorbed_mla_work
from tpplan.mesh import Mesh

ELEMENTWISE_PASSES = 3.0  # the planner's elementwise bytes: the inputs read and the output written


def _elementwise(c: dict[str, float], p: dict[str, Any]) -> float:
    return M.stream_s(c, ELEMENTWISE_PASSES * 2.0 * p["width"] * p["tokens"])


def _attention(c: dict[str, float], p: dict[str, Any]) -> float:
    return MF._attention({**c, "p": 1.0 + c["p1"]} if "p1" in c else c, p)  # sets without the chain: no p


def masked_work(p: dict[str, Any]) -> tuple[float, int]:
    """(FLOPs, cached keys read) of a windowed or chunked attention point as the planner counts them
    (`lower.batch.masked_pairs`: only the keys a query may see; 2 x heads x (dqk + dv) per pair)."""
    from tpplan.lower.batch import masked_pairs

    pairs, read = masked_pairs(((p["tokens"], p["context"]),), p["window"] or None, p["chunk"] or None)
    return 2.0 * p["heads"] * pairs * 2 * p["d"], read


def chain_keys(p: dict[str, Any]) -> int:
    """Keys one query block passes over, in turn: a window's (one call), or each chunk's keys summed over
    the chunks the queries touch (`masked_attention.chunked_attention` calls flash once per chunk)."""
    s, lo = p["tokens"] + p["context"], p["context"]
    if not p["chunk"]:
        return min(s, p["window"] or s)
    keys = 0
    while lo < s:
        c0 = lo // p["chunk"] * p["chunk"]
        hi = min(s, c0 + p["chunk"])
        keys, lo = keys + hi - c0, hi
    return keys


def _masked(c: dict[str, float], p: dict[str, Any]) -> float:
    """The attention form (`attention_s`'s terms) over the keys the mask lets through: a + b x rows +
    smoothmax(F / R, chain / R_sm, p), the chain one query block's pass over the keys one query may see
    (its chunk or window, at most every key): at few heads per rank it bounds the time."""
    flops, _ = masked_work(p)
    chain = 2.0 * M.ATTN_Q_BLOCK * chain_keys(p) * 2 * p["d"] / (c["sm_tflops"] * 1e12)
    work = M.smoothmax(flops / (c["tflops"] * 1e12), chain, 1.0 + c["p1"])
    return c["a_s"] + c["b_s"] * p["heads"] * 2 * p["d"] * p["tokens"] + work


def indexer_work(p: dict[str, Any]) -> tuple[float, float]:
    """(FLOPs, scores) of the bench's DSA indexer: every query against every key, future ones masked after
    (2 x heads x d per score for q.k, 2 x heads for the weighted sum), and the scores it sorts."""
    scores = float(p["tokens"]) * (p["tokens"] + p["context"])
    return scores * p["heads"] * (2.0 * p["d"] + 2.0), scores


def _indexer(c: dict[str, float], p: dict[str, Any]) -> float:
    """t = a + FLOPs / R + scores / S (S: scores masked and sorted per second, in G/s)."""
    flops, scores = indexer_work(p)
    return c["a_s"] + flops / (c["tflops"] * 1e12) + scores / (c["Gscores"] * 1e9)


def sparse_work(p: dict[str, Any]) -> tuple[float, float]:
    """(FLOPs, bytes gathered) of DSA's sparse attention in the absorbed form (`rank_runners.run_sparse`): each
    query's heads against its top-k latent rows, 576 wide for q.k and 512 for p.v; the rows gathered once per
    query (bf16). FlashMLA computes heads padded to a multiple of 64 (`engine_kernels.HEAD_PAD`). The FLOPs are
    the planner's (`cost.sparse_attention.absorbed_mla_work`)."""
    heads = -(-p["heads"] // 64) * 64 if "FlashMLA" in str(p.get("variant", "")) else p["heads"]
    pairs = float(p["tokens"]) * p["topk"]
    flops, _ = absorbed_mla_work(heads, p["tokens"], pairs, pairs, 512, 64, 2)
    return flops, pairs * 576 * 2


def _sparse(c: dict[str, float], p: dict[str, Any]) -> float:
    """t = a + FLOPs / R + bytes / B (B: gathered latent rows per second, in TB/s): the planner's
    `dsa_attention` form (`kernel_models.decode_s`)."""
    flops, gathered = sparse_work(p)
    return M.decode_s(c, gathered, flops)


# The families this sweep fits: the model_fit forms (attention with its few-heads chain, `attention_s`),
# the generic elementwise stream, the masked attention kernels and DSA's indexer as the bench runs them.
FAMILIES = dict(MF.FAMILIES) | {
    "attention": (_attention, ("a_s", "b_s", "tflops", "sm_tflops", "p1"), (2e-5, 1e-12, 600.0, 5.0, 2.0)),
    "elementwise": (_elementwise, ("a_s", "TBps"), (5e-6, 2.0)),
    "masked": (_masked, ("a_s", "b_s", "tflops", "sm_tflops", "p1"), (2e-5, 1e-12, 300.0, 5.0, 2.0)),
    "indexer": (_indexer, ("a_s", "tflops", "Gscores"), (1e-4, 30.0, 10.0)),
    "sparse": (_sparse, ("a_s", "tflops", "TBps"), (2e-5, 300.0, 2.0)),
}
RANGES = dict(MF.RANGES) | {
    "elementwise": lambda p: {"width": p["width"], "tokens": p["tokens"]},
    "masked": lambda p: {"heads": p["heads"], "tokens": p["tokens"], "context": p["context"]},
    "indexer": lambda p: {"heads": p["heads"], "tokens": p["tokens"], "context": p["context"]},
    "sparse": lambda p: {"heads": p["heads"], "tokens": p["tokens"], "context": p["context"]},
}
# Set name -> (family, which points), in the order the planner's sets are named (`KernelModels.NAMES`).
SETS: dict[str, tuple[str, Callable[[dict[str, Any]], bool]]] = {
    "attention_causal": ("attention", lambda p: p["context"] == 0),
    "attention_prefix": ("attention", lambda p: p["context"] > 0),
    "kda": ("kda", lambda p: True),
    "gdn": ("gdn", lambda p: True),
    "short_conv": ("short_conv", lambda p: True),
    "attn_res": ("attn_res", lambda p: True),
    "norm": ("norm", lambda p: True),
    "elementwise": ("elementwise", lambda p: p["op"] == "add"),
    "swiglu": ("elementwise", lambda p: p["op"] == "silu_mul"),
    "attention_window": ("masked", lambda p: p["window"] > 0),
    "attention_chunked": ("masked", lambda p: p["chunk"] > 0),
    "dsa_indexer": ("indexer", lambda p: True),
    "dsa_attention": ("sparse", lambda p: True),
}
EXTRA = {"attention_prefix": (("c_s",), (1e-13,)), "experts": (("route_TBps",), (2.0,)),
         "attn_res": (("copy_TBps",), (2.0,))}  # fmt: skip
IMPLS = dict(MF.IMPLS_OPS) | {
    "elementwise": "torch add",
    "swiglu": "torch silu(g) * u (unfused)",
    "attention_window": "window: SDPA per query block over its window's keys (band mask)",
    "attention_chunked": "chunk: SDPA flash per attention chunk",
    "dsa_indexer": "tpplan reference indexer (fp32 scores by query block, stable sort)",
    "dsa_attention": "top-k (DSA), absorbed form: the kernel each point records (variant)",
}


def merge_repeats(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One point per case: the median of every timing over the sweeps that measured it, `repeats` kept."""
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for p in points:
        if p.get("skipped") or (p["family"] == "experts" and "grouped" not in p):
            continue  # sweeps 1 and 3 ran every expert case after gpt-oss's refused 90-wide slice on the loop
        key = json.dumps({k: v for k, v in sorted(p.items()) if k not in TIMES and k != "remeasured"})
        groups[key].append(p)
    out = []
    for ps in groups.values():
        merged = dict(ps[0])
        for k in ("seconds", "b2b_s", "ffn_s", "combine_s"):
            vals = [p[k] for p in ps if k in p]
            if vals:
                merged[k] = statistics.median(vals)
        merged["repeats"] = [p["seconds"] for p in ps]
        out.append(merged)
    return out


def _shape_key(p: dict[str, Any]) -> tuple[Any, ...]:
    return tuple((k, str(v)) for k, v in sorted(p.items()) if k not in (*TIMES, "tokens", "repeats", "remeasured"))


def checkerboard(points: list[dict[str, Any]]) -> list[bool]:
    """Fit (True) or held out (False) per point: (shape index + token index) even, within each family."""
    out = []
    shapes: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
    tokens: dict[str, list[int]] = defaultdict(list)
    for p in points:
        fam = p["family"]
        shapes[fam].append(_shape_key(p))
        tokens[fam].append(p.get("tokens", p.get("m", 0)))
    rank = {f: {s: i for i, s in enumerate(sorted(set(v)))} for f, v in shapes.items()}
    trank = {f: {t: i for i, t in enumerate(sorted(set(v)))} for f, v in tokens.items()}
    for p in points:
        f = p["family"]
        out.append((rank[f][_shape_key(p)] + trank[f][p.get("tokens", p.get("m", 0))]) % 2 == 0)
    return out


def _ffn(c: dict[str, float], p: dict[str, Any]) -> float:
    cc: dict[str, float | str] = {**c, "p": 1.0 + c["p1"], "memory": "weights+rows"}
    return M.experts_s(cc, p["active"], p["width"], p["inter"], MF.experts_compute_s(p), rows=p["rows"])


def _route(c: dict[str, float], p: dict[str, Any]) -> float:
    return p["ffn_pred_s"] + M.routing_bytes(p["rows"], p["tokens"], p["width"], M.WEIGHTED_SUM) / (
        c["route_TBps"] * 1e12
    )


def _combine(c: dict[str, float], p: dict[str, Any]) -> float:
    """The combine the sweep timed: every token's top-k rows (the token owner's moe_sum)."""
    rows = p["tokens"] * p["top_k"]
    return M.routing_bytes(rows, p["tokens"], p["width"], M.FUSED_MOE) / (c["combine_TBps"] * 1e12)


def fit_experts(pts: list[dict[str, Any]], fit: list[bool]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The experts set in three steps, each on the fit part: the grouped GEMMs alone (`ffn_s`: c0, TBps, p),
    then the bench's routing around them (the whole op: `route_TBps`), then the fused-MoE engines'
    combine alone (`combine_s`: `combine_TBps`). Errors: `experts` (the op), `experts_ffn`, `experts_combine`."""
    sel = [(p, f) for p, f in zip(pts, fit, strict=True) if p["family"] == "experts" and p.get("grouped") is True]
    if not sel:
        return {}, []
    ffn_pts = [{**p, "seconds": p["ffn_s"]} for p, f in sel]
    c = MF._fit(
        [q for q, (_, f) in zip(ffn_pts, sel, strict=True) if f], _ffn, ("c0_s", "TBps", "p1"), (5e-5, 3.0, 2.0)
    )
    # The whole op only where the rank holds every expert: the bench's expert-parallel path waits for the
    # host (`torch.nonzero`) and takes an fp32 scatter-add, which no serving engine does (not modelled).
    op_pts = [{**p, "ffn_pred_s": _ffn(c, p)} for p, _ in sel]
    whole = [q for q, (_, f) in zip(op_pts, sel, strict=True) if f and q["local"] == q["experts"]]
    c |= MF._fit(whole, _route, ("route_TBps",), (1.0,))
    cmb_pts = [{**p, "seconds": p["combine_s"]} for p, _ in sel]
    c |= MF._fit([q for q, (_, f) in zip(cmb_pts, sel, strict=True) if f], _combine, ("combine_TBps",), (1.0,))
    consts = {k: v for k, v in c.items() if k != "p1"} | {"p": 1.0 + c["p1"], "memory": "weights+rows"}
    consts |= MF.measured_range("experts", [p for p, _ in sel]) | {"impl": IMPLS["experts"]}
    rows = []
    for name, fn, group in (
        ("experts", _route, op_pts),
        ("experts_ffn", _ffn, ffn_pts),
        ("experts_combine", _combine, cmb_pts),
    ):
        for p, (_, f) in zip(group, sel, strict=True):
            if name == "experts" and p["local"] != p["experts"]:
                continue
            pred = fn(c, p)
            rows.append({**p, "model": name, "set": "fit" if f else "held-out", "predicted_s": pred,
                         "error": pred / p["seconds"] - 1.0})  # fmt: skip
    return consts, rows


def fit_rank_sweep(points: list[dict[str, Any]]) -> dict[str, Any]:
    """Constants per set (fitted on the checkerboard's fit part) and every point's error, tagged."""
    pts = [{**p, "timing": "host ahead"} for p in merge_repeats(points)]
    fit = checkerboard(pts)
    consts: dict[str, dict[str, Any]] = {}
    consts["experts"], rows = fit_experts(pts, fit)
    for name, (fam, pick) in SETS.items():
        sel = [(p, f) for p, f in zip(pts, fit, strict=True) if p["family"] == fam and pick(p) and p["seconds"] > 0]
        if not sel:
            continue
        model, names, x0 = FAMILIES[fam]
        more, more_x0 = EXTRA.get(name, ((), ()))
        c = MF._fit([p for p, f in sel if f], model, (*names, *more), (*x0, *more_x0))
        if "p1" in c:
            c = {k: v for k, v in c.items() if k != "p1"} | {"p": 1.0 + c["p1"]}
        lo_hi = MF.measured_range(fam, [p for p, _ in sel]) if fam in MF.RANGES else _range(fam, [p for p, _ in sel])
        ran = sorted({p["variant"] for p, _ in sel if p.get("variant")})  # what the sweep recorded, else the default
        consts[name] = c | lo_hi | {"impl": "; ".join(ran) or IMPLS.get(name, "")}
        for p, f in sel:
            pred = predict(consts[name], p)
            rows.append({**p, "model": name, "set": "fit" if f else "held-out", "predicted_s": pred,
                         "error": pred / p["seconds"] - 1.0})  # fmt: skip
    return {"constants": consts, "points": rows, "launch_floors": launch_floors(pts)}


def _range(fam: str, pts: list[dict[str, Any]]) -> dict[str, float]:
    dims = [RANGES[fam](p) for p in pts]
    return {f"{m}_{k}": float(fn(d[k] for d in dims)) for k in dims[0] for m, fn in (("min", min), ("max", max))}


def predict(consts: dict[str, Any], p: dict[str, Any]) -> float:
    """A point's time by a fitted set (as `fit_rank_sweep` stores it)."""
    c = {k: v for k, v in consts.items() if not isinstance(v, str)}
    return FAMILIES[p["family"]][0](c if "p" not in c else {**c, "p1": c["p"] - 1.0}, p)


def bucket(p: dict[str, Any]) -> str:
    """The regime an error is reported by: heads per rank (attention, recurrences) or the expert split."""
    if p["family"] in ("attention", "kda", "gdn", "masked", "indexer", "sparse"):
        return f"h {heads_bucket(p['heads'])}"
    if p["family"] == "experts":
        return str(p["split"])[:2] + ("32" if str(p["split"]).endswith("32") else "")
    return ""


def bucket_table(rows: list[dict[str, Any]], held_out: bool = True) -> list[dict[str, Any]]:
    """Median and worst |error| per (set, heads bucket or split, tokens bucket), held-out points only."""
    groups: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for r in rows:
        if (r["set"] == "held-out") != held_out:
            continue
        groups[(r["model"], bucket(r), tokens_bucket(r["tokens"]))].append(abs(r["error"]))
    return [{"model": m, "bucket": b, "tokens": t, "n": len(v), "median": statistics.median(v), "worst": max(v)}
            for (m, b, t), v in sorted(groups.items())]  # fmt: skip


def launch_floors(pts: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per family, the back-to-back time of its smallest-work cases (the host's launch chain): median,
    min and max over the cases whose GPU time is under a third of it."""
    out = {}
    for fam in ("kda", "gdn", "norm", "short_conv"):
        floor = [p["b2b_s"] for p in pts if p["family"] == fam and "b2b_s" in p and p["seconds"] < p["b2b_s"] / 3]
        if floor:
            out[fam] = {"median_s": statistics.median(floor), "min_s": min(floor), "max_s": max(floor), "n": len(floor)}
    return out


def main(argv: list[str] | None = None) -> None:
    from tpplan.errors import TpplanError
    from tpplan.outputs import check_file, write_files

    args = sys.argv[1:] if argv is None else list(argv)
    cut = args.index("--other") if "--other" in args else len(args)
    try:
        out = check_file("OUT.json", args[0])
    except (TpplanError, IndexError) as exc:
        sys.exit(f"error: OUT.json SWEEP.json... [--other SWEEP.json...]: {exc}")
    docs = [json.loads(Path(a).read_text()) for a in args[1:cut]]
    res = fit_rank_sweep([p for d in docs for p in d["points"]])
    res["table"] = bucket_table(res["points"])
    res["source"] = {"sweeps": args[1:cut], "gpu": docs[0]["gpu"], "dates": [d["date"] for d in docs]}
    if args[cut + 1 :]:  # another card's sweep of the same cases: every point held out
        others = [json.loads(Path(a).read_text()) for a in args[cut + 1 :]]
        rows = other_card_rows([p for d in others for p in d["points"]])
        res["other"] = {"sweeps": args[cut + 1 :], "dates": [d["date"] for d in others],
                        "table": inherited_errors(rows, res["constants"])}  # fmt: skip
    if any(r["family"] in ("masked", "indexer", "sparse") for r in res["points"]):
        gpu = "h200-measured" if "H200" in docs[0]["gpu"] else "h100-measured"
        res["priced_today"] = {"gpu": gpu, "points": priced_today([p for d in docs for p in d["points"]], gpu)}
    write_files({out: json.dumps(res, indent=1) + "\n"}, "OUT.json")
    for r in res["table"]:
        print(f"{r['model']:<18} {r['bucket']:<8} {r['tokens']:>4} n={r['n']:<3} median {r['median']:6.1%} "
              f"worst {r['worst']:6.1%}")  # fmt: skip
    print(json.dumps(res["launch_floors"], indent=1))


__all__ = ["FAMILIES", "SETS", "bucket", "bucket_table", "checkerboard", "fit_rank_sweep", "launch_floors",
           "merge_repeats", "predict"]  # fmt: skip


def inherited_errors(rows: list[dict[str, Any]], consts: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Every swept point priced by other constants (e.g. the H200's scaled to this GPU by
    `cost.gpu_inherit`): median and worst |error| per set and bucket (all out of sample for them)."""
    groups: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in rows:
        name = r["model"]
        base = "experts" if name.startswith("experts") else name
        if base not in consts or name in ("experts", "experts_combine"):
            continue
        c = consts[base]
        if name == "experts_ffn":
            cc = {k: v for k, v in c.items() if not isinstance(v, str) or k == "memory"}
            pred = M.experts_s(cc, r["active"], r["width"], r["inter"], MF.experts_compute_s(r), rows=r["rows"])
        else:
            pred = predict(c, r)
        groups[(name, bucket(r))].append(abs(pred / r["seconds"] - 1.0))
    return [{"model": m, "bucket": b, "n": len(v), "median": statistics.median(v), "worst": max(v)}
            for (m, b), v in sorted(groups.items())]  # fmt: skip


def kernel_models_toml(consts: dict[str, dict[str, Any]]) -> str:
    """The `[kernel_models.*]` tables of a GPU model preset from fitted constants (as `fit_rank_sweep` gives)."""
    out = []
    for name, c in consts.items():
        out.append(f"[kernel_models.{name}]")
        out += [f"{k} = {json.dumps(v) if isinstance(v, str) else repr(float(v))}" for k, v in c.items()]
        out.append("")
    return "\n".join(out)


TOKEN_COLUMNS = ("1K", "2K", "4K", "8K", "16K", "32K")


def markdown_tables(fit: dict[str, Any]) -> str:
    """docs/benchmarks.md's tables of a fit (`fit_rank_sweep` + `bucket_table`): per set and heads bucket (or
    expert split), the held-out median / worst |error| in each tokens bucket; the fit part's errors apart."""
    cells: dict[tuple[str, str], dict[str, str]] = defaultdict(dict)
    for r in fit["table"]:
        cells[(r["model"], r["bucket"])][r["tokens"]] = f"{100 * r['median']:.0f} / {100 * r['worst']:.0f}"
    lines = ["| set | heads per rank / split | " + " | ".join(TOKEN_COLUMNS) + " |",
             "|---|---|" + "---:|" * len(TOKEN_COLUMNS)]  # fmt: skip
    for (model, b), row in sorted(cells.items()):
        lines.append(f"| {model} | {b or 'all'} | " + " | ".join(row.get(t, "") for t in TOKEN_COLUMNS) + " |")
    lines += ["", "| set | points fitted | fit median / worst | points held out | held-out median / worst |",
              "|---|---:|---|---:|---|"]  # fmt: skip
    sets: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for p in fit["points"]:
        sets[p["model"]][p["set"]].append(abs(p["error"]))
    for model, parts in sorted(sets.items()):
        f, h = parts.get("fit", [0.0]), parts.get("held-out", [0.0])
        lines.append(f"| {model} | {len(parts.get('fit', []))} | {100 * statistics.median(f):.1f}% / "
                     f"{100 * max(f):.1f}% | {len(parts.get('held-out', []))} | {100 * statistics.median(h):.1f}% / "
                     f"{100 * max(h):.1f}% |")  # fmt: skip
    return "\n".join(lines) + "\n"


def inherited_markdown(fit: dict[str, Any], src: str = "h200-measured", dst: str = "h100-datasheet") -> str:
    """The inheritance rule's out-of-sample table: `src`'s kernel models scaled to `dst`'s datasheet
    (`cost.gpu_inherit`), and unscaled, against every point of this GPU's sweep (median / worst |error|)."""
    from tpplan.cost.gpu_inherit import scaled_kernel_models
    from tpplan.cost.topology import load_gpu

    a, b = load_gpu(src), load_gpu(dst)
    scaled = {(r["model"], r["bucket"]): r for r in inherited_errors(fit["points"], scaled_kernel_models(a, b))}
    plain = {(r["model"], r["bucket"]): r for r in inherited_errors(fit["points"], a.kernel_models)}
    lines = [
        f"| set | heads per rank / split | points | {src} scaled to {dst} | {src} unscaled |",
        "|---|---|---:|---|---|",
    ]
    for key, r in sorted(scaled.items()):
        p = plain[key]
        lines.append(f"| {key[0]} | {key[1] or 'all'} | {r['n']} | {100 * r['median']:.1f}% / {100 * r['worst']:.0f}% "
                     f"| {100 * p['median']:.1f}% / {100 * p['worst']:.0f}% |")  # fmt: skip
    return "\n".join(lines) + "\n"


def other_card_rows(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Another sweep's points (repeats merged), each tagged with the set that prices it (`SETS`), for
    `inherited_errors` to price by a fit made elsewhere: all of them out of sample."""
    out = []
    for p in merge_repeats(points):
        for name, (fam, pick) in SETS.items():
            if p["family"] == fam and p["seconds"] > 0 and pick(p):
                out.append({**p, "model": name})
    return out


INDEXER_MODEL = {32: "glm-5.1", 64: "deepseek-v3.2"}  # the preset whose indexer has these index heads


def priced_today(points: list[dict[str, Any]], gpu: str = "h100-measured") -> list[dict[str, Any]]:
    """What the planner prices for each masked-attention and indexer point on `gpu` (nothing fitted to
    them): windows and chunks by the GPU's attention sets over the keys the mask lets through
    (`KernelPricer.price`'s call), the indexer as the planner prices GLM-5.1's / DeepSeek-V3.2's op
    (`Predictor.kind_time` at one request of `tokens` after `context`), DSA's sparse attention as it prices
    DeepSeek-V3.2's attention op at the TP that leaves the point's heads per rank."""
    from tpplan.cost.kernel_models import KernelModels
    from tpplan.cost.topology import load_gpu

    models = KernelModels(load_gpu(gpu).kernel_models or {}, charge_host=False)
    out = []
    for p in merge_repeats(points):
        if p["family"] == "masked":
            flops, read = masked_work(p)
            price = models.attention(p["heads"], p["tokens"], read, p["d"], p["d"], flops, p["window"] or None)
        elif p["family"] == "indexer" and p["heads"] in INDEXER_MODEL:
            price = _dsa_op_price(INDEXER_MODEL[p["heads"]], gpu, Mesh(8), "indexer", p["tokens"], p["context"])
        elif p["family"] == "sparse" and SPARSE_HEADS % p["heads"] == 0:
            mesh = Mesh(SPARSE_HEADS // p["heads"])
            price = _dsa_op_price(SPARSE_MODEL, gpu, mesh, "attention", p["tokens"], p["context"])
        else:
            continue
        if price:
            kind = {"indexer": "dsa_indexer", "sparse": "dsa_attention"}.get(p["family"])
            kind = kind or ("window" if p["window"] else "chunk")
            out.append({**p, "model": kind, "predicted_s": price, "error": price / p["seconds"] - 1.0})
    return out


SPARSE_MODEL, SPARSE_HEADS = "deepseek-v3.2", 128  # the preset whose DSA attention prices a sparse point (TP = 128 / h)


def _dsa_op_price(model: str, gpu: str, mesh: Mesh, op: str, tokens: int, context: int) -> float | None:
    """The planner's price of one op (`indexer`, `attention`) of a DSA model's layer on `mesh` (TP only), one
    request of `tokens` after `context` (`Predictor.kind_time`); None where the preset or the mesh does not price
    it."""
    from tpplan.cost.predictor import cached_predictor
    from tpplan.cost.topology import load_topology
    from tpplan.errors import TpplanError
    from tpplan.models.config import load_model
    from tpplan.models.graph import build_model_graph
    from tpplan.plans.named import make_plan

    graph = build_model_graph(load_model(model))
    topo = load_topology("h100x8-ib400" if gpu.startswith("h100") else "h200x8-ib400")
    try:
        p = cached_predictor(graph, make_plan("baseline", graph, mesh.tp), topo, mesh, "bf16", None)
    except TpplanError:  # a TP the topology or the model cannot take
        return None
    res = p.audit.layer_results[-1]
    ops = [o for o in p.kind_time(res, ((tokens, context),)).ops if o.op == op]
    return ops[0].seconds if ops else None


def priced_today_markdown(rows: list[dict[str, Any]]) -> str:
    """Signed median and worst error of today's price against the bench's kernel, per kind and heads bucket."""
    cells: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in rows:
        cells[(r["model"], bucket(r))].append(r["error"])
    lines = ["| kernel | heads per rank | points | median error | worst |", "|---|---|---:|---:|---:|"]
    for (m, b), errs in sorted(cells.items()):
        lines.append(f"| {m} | {b} | {len(errs)} | {100 * statistics.median(errs):+.0f}% | "
                     f"{100 * max(errs, key=abs):+.0f}% |")  # fmt: skip
    return "\n".join(lines) + "\n"


def engine_band_rows(rows: list[dict[str, Any]]) -> dict[str, dict[str, tuple[int, float]]]:
    """Today's price against an engine's kernel (`priced_today` points), per kind and heads bucket: (points,
    signed median error). A band's figure is the largest |median| of a kind's buckets. A sparse point with no
    cached keys and at most top-k tokens is left out: the engines run dense MHA there and the planner prices
    that, so the point's FlashMLA time is not what the price is of."""
    cells: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if r["family"] == "sparse" and not r["context"] and r["tokens"] <= r["topk"]:
            continue
        cells[r["model"]][bucket(r)].append(r["error"])
    return {m: {b: (len(v), statistics.median(v)) for b, v in sorted(by.items())} for m, by in sorted(cells.items())}


def engine_band_markdown(rows: list[dict[str, Any]]) -> str:
    """`engine_band_rows` as the docs' table: one row per kind, its buckets' medians and the band they give."""
    lines = ["| kernel | points | median error per heads-per-rank bucket | band (largest bucket median, unsigned) |",
             "|---|---:|---|---:|"]  # fmt: skip
    for m, by in engine_band_rows(rows).items():
        cells = ", ".join(f"{b} {100 * med:+.0f}% ({n})" for b, (n, med) in by.items())
        band = max(abs(med) for _, med in by.values())
        lines.append(f"| {m} | {sum(n for n, _ in by.values())} | {cells} | {100 * band:.1f}% |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()


def other_markdown(table: list[dict[str, Any]]) -> str:
    """The `other` table of a fit (another card's sweep, every point held out): median / worst |error| per set
    and heads bucket (or split)."""
    lines = ["| set | heads per rank / split | points | median / worst |", "|---|---|---:|---|"]
    for r in table:
        lines.append(f"| {r['model']} | {r['bucket'] or 'all'} | {r['n']} | {100 * r['median']:.1f}% / "
                     f"{100 * r['worst']:.0f}% |")  # fmt: skip
    return "\n".join(lines) + "\n"
