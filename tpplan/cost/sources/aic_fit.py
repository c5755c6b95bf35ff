"""Fit the physical models of `aic_fitted` on AIConfigurator's rows and judge them leave-one-model-out.

Needs `aiconfigurator-core` (and scipy, which it depends on). Rows come from the table views the
package binds on a loaded database (`PerfDatabase._moe_data`, `_context_attention_data`,
`_context_mla_data`: its raw measured data plane). Each kernel class is fitted by non-negative least
squares on relative error (every row counts by its ratio, so 10 us calls weigh as much as 10 ms
ones). Judged leave-one-model-out: for MoE a "model" is one (hidden, intermediate, experts, top-k)
configuration (DeepSeek-V3's 7168/2048/256/8, Qwen3's, GPT-OSS's, ...); for attention one per-rank
head layout (heads, kv heads, head_dim, window); for MLA one head count. Each is held out in turn,
the rest fitted, and the held-out rows predicted; the pooled held-out errors are the out-of-sample
figures. The final constants are fitted on all rows.

    python -m tpplan.cost.sources.aic_fit [--systems h200_sxm,...] [--engines sglang,...] [--out FILE]

writes `tpplan/cost/presets/aic-fitted.json` by default and prints progress per system x engine.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tpplan.cost.kernel_source import AttentionShape
from tpplan.cost.sources.aic import AIC_ENGINES, AIC_VERSION, AicSource, aic_databases
from tpplan.cost.sources.aic_fitted import (
    ATTENTION_FEATURES,
    FIT_FILE,
    MOE_FEATURES,
    attention_features,
    moe_features,
    moe_mode,
)

DEFAULT_SYSTEMS = ("h100_sxm", "h200_sxm", "b200_sxm", "b300_sxm", "gb200", "gb300", "rtx_pro_6000_server")
MOE_DISTRIBUTION = "balanced"

Row = tuple[tuple, list[float], float, tuple]  # (model group, features, measured ms, (tokens, tp|batch, ep|-))


def _leaves(node: Any, path: tuple = ()) -> Iterator[tuple[tuple, float]]:
    """(key path, latency ms) for every measured row of a nested table view."""
    if hasattr(node, "keys"):
        if "latency" in node:
            yield path, float(node["latency"])
            return
        for k in node:
            yield from _leaves(node[k], (*path, k))


def _name(key: Any) -> str:
    return getattr(key, "name", str(key))


def moe_rows(src: AicSource, quants: tuple[str, ...] | None = None) -> dict[str, list[Row]]:
    """Rows per class "quant/mode" (`moe_mode`) at the balanced distribution, grouped by model
    configuration; `quants` keeps only those AIC quant names."""
    from aiconfigurator_core.sdk.operations import MoE

    view = src._view(MoE, "_moe_data")
    out: dict[str, list[Row]] = defaultdict(list)
    picked = [q for q in view if quants is None or _name(q) in quants]
    for path, ms in (
        leaf
        for q in picked
        if MOE_DISTRIBUTION in view[q]
        for leaf in _leaves(view[q][MOE_DISTRIBUTION], (q, MOE_DISTRIBUTION))
    ):
        if len(path) != 9 or ms <= 0:
            continue
        quant, _, topk, experts, hidden, inter, tp, ep, tokens = path
        if experts % ep or inter % tp:
            continue
        x = moe_features(tokens, hidden, inter, experts, topk, tp, ep)
        out[f"{_name(quant)}/{moe_mode(tp, ep)}"].append(((hidden, inter, experts, topk), x, ms, (tokens, tp, ep)))
    return out


def attention_rows(src: AicSource) -> dict[str, list[Row]]:
    """bf16 context attention ("mha", grouped by per-rank head layout) and MLA ("mla", by heads)."""
    from aiconfigurator_core.sdk.operations import ContextAttention, ContextMLA

    out: dict[str, list[Row]] = defaultdict(list)
    view = src._view(ContextAttention, "_context_attention_data")
    for path, ms in _leaves(view):
        if len(path) != 8 or _name(path[0]) != "bfloat16" or _name(path[1]) != "bfloat16" or ms <= 0:
            continue
        _, _, kv_key, hd, window, heads, s, b = path
        kv = heads if kv_key == 0 else kv_key
        if heads % kv:
            continue
        shape = AttentionShape(s, 0, heads, kv, hd, hd, "mha", window or None, b)
        out["mha"].append(((heads, kv, hd, window), attention_features(shape), ms, (s, b, 0)))
    view = src._view(ContextMLA, "_context_mla_data")
    for path, ms in _leaves(view):
        if len(path) != 5 or _name(path[0]) != "bfloat16" or _name(path[1]) != "bfloat16" or ms <= 0:
            continue
        _, _, heads, s, b = path
        shape = AttentionShape(s, 0, heads, heads, 192, 128, "mla", None, b)
        out["mla"].append(((heads,), attention_features(shape), ms, (s, b, 0)))
    return out


def fit_nnls(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative coefficients minimising the sum of squared relative errors."""
    from scipy.optimize import nnls

    a = x / y[:, None]
    scale = np.maximum(np.abs(a).max(axis=0), 1e-30)
    coef, _ = nnls(a / scale, np.ones(len(y)), maxiter=50 * x.shape[1])
    return coef / scale


def _errors(pred: np.ndarray, y: np.ndarray) -> dict[str, float]:
    rel = np.abs(pred - y) / y
    return {"median": round(float(np.median(rel)), 4), "p90": round(float(np.quantile(rel, 0.9)), 4), "n": len(y)}


def fit_class(rows: list[Row], features: tuple[str, ...]) -> dict[str, Any]:
    """Fit one kernel class on all its rows; judge it by holding out each model group in turn."""
    groups = sorted({r[0] for r in rows})
    x = np.array([r[1] for r in rows], dtype=float)
    y = np.array([r[2] for r in rows], dtype=float)
    g = [r[0] for r in rows]
    coef = fit_nnls(x, y)
    held_pred, held_y = [], []
    if len(groups) > 1:
        for hold in groups:
            mask = np.array([gi == hold for gi in g])
            c = fit_nnls(x[~mask], y[~mask])
            held_pred.append(x[mask] @ c)
            held_y.append(y[mask])
    oos = (
        _errors(np.concatenate(held_pred), np.concatenate(held_y)) if held_y else {"median": None, "p90": None, "n": 0}
    )
    return {
        "features": list(features),
        "coef": [float(c) for c in coef],
        "rows": len(rows),
        "groups": len(groups),
        "in_sample": _errors(x @ coef, y),
        "out_of_sample": oos,
    }


def fit_system(system: str, engine: str, say: Callable[[str], None]) -> tuple[str, dict[str, Any]]:
    """All fitted classes for one (system, engine) at AIC's default version."""
    t0 = time.perf_counter()
    src = AicSource(system, engine)
    entry: dict[str, Any] = {"moe": {}, "attention": {}}
    for name, rows in sorted(moe_rows(src).items()):
        if len(rows) >= 20:
            entry["moe"][name] = _with_tokens(fit_class(rows, MOE_FEATURES), rows)
    for name, rows in sorted(attention_rows(src).items()):
        if len(rows) >= 20:
            entry["attention"][name] = _with_tokens(fit_class(rows, ATTENTION_FEATURES), rows)
    say(
        f"{src.name}: {len(entry['moe'])} MoE and {len(entry['attention'])} attention classes fitted "
        f"in {time.perf_counter() - t0:.1f} s"
    )
    return f"{src.system}/{src.engine}@{src.version}", entry


def _with_tokens(fitted: dict[str, Any], rows: list[Row]) -> dict[str, Any]:
    """The largest token count (one sequence's, for attention) the fit saw, which bounds where the
    fitted source answers."""
    fitted["max_tokens"] = float(max(r[3][0] for r in rows))
    return fitted


def build(systems: tuple[str, ...], engines: tuple[str, ...], say: Callable[[str], None]) -> dict[str, Any]:
    held = aic_databases()
    fits: dict[str, Any] = {}
    todo = [(s, e) for s in systems for e in engines if e in held.get(s, {})]
    for i, (system, engine) in enumerate(todo, 1):
        say(f"[{i}/{len(todo)}] fitting {system}/{engine} ...")
        key, entry = fit_system(system, engine, say)
        fits[key] = entry
    return {
        "about": (
            f"Physical models fitted on AIConfigurator {AIC_VERSION} rows (balanced MoE routing, bf16 "
            "attention), by tpplan.cost.sources.aic_fit. Prices from these are extrapolated: "
            "in_sample and out_of_sample (leave-one-model-out) are median / p90 relative errors "
            "on those rows."
        ),
        "aic_version": AIC_VERSION,
        "moe_distribution": MOE_DISTRIBUTION,
        "fitted": time.strftime("%Y-%m-%d"),
        "fits": fits,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tpplan.cost.sources.aic_fit", description=__doc__.split("\n")[0])
    parser.add_argument("--systems", default=",".join(DEFAULT_SYSTEMS))
    parser.add_argument("--engines", default=",".join(AIC_ENGINES))
    parser.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "presets" / FIT_FILE))
    args = parser.parse_args(argv)

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    data = build(tuple(args.systems.split(",")), tuple(args.engines.split(",")), say)
    Path(args.out).write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    say(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
