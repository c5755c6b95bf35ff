"""The power-capped clock state: one slowdown factor per kernel model, from paired sweep points.

Why: on one H200 the same calls ran 8-40% slower behind a GEMM load than behind an idle sleep
(`kernel_sweep`'s `*_loaded` families, docs/benchmarks.md "Clock state"): the load holds the GPU at
its 700 W power cap, where the SM clock falls from 1980 MHz to ~1450-1600 MHz, and a large model's
prefill (Kimi-K3 at 8K tokens: 686 W, 1545 MHz mean) runs there throughout. A lighter model's run
(Kimi-Linear-48B: 543 W, 1972 MHz) stays at boost. The shapes of the kernels do not change with the
clock, so a model keeps its boost-state constants and its power-capped time is that times a factor
(`clock_factor`, `cost.kernel_models`): the median measured loaded / idle ratio of the fit set's
pairs, judged on the held-out pairs like the constants themselves.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

KEY = ("family", "op", "heads", "tokens", "context", "width", "experts", "experts_local", "inter", "bank",
       "hidden", "channels")  # fmt: skip


def model_name(p: dict[str, Any]) -> str:
    """The kernel model a sweep point belongs to (`cost.kernel_models.KernelModels.NAMES`)."""
    if p["family"] == "attention":
        return "attention_prefix" if p["context"] > 0 else "attention_causal"
    return str(p["family"])


def pairs(points: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(idle, loaded) points of the same call: the plain family's point and its `*_loaded` twin."""
    idle = {tuple(p.get(k) for k in KEY): p for p in points if "preamble" not in p}
    out = []
    for p in points:
        twin = idle.get(tuple(p.get(k) for k in KEY))
        if "preamble" in p and twin is not None:
            out.append((twin, p))
    return out


def fit_clock_factors(
    points: list[dict[str, Any]],
    consts: dict[str, dict[str, Any]],
    fit_sets: dict[str, Callable[[dict[str, Any]], bool]],
    boost_s: Callable[[dict[str, Any], dict[str, Any]], float],
) -> dict[str, Any]:
    """`clock_factor` per model (median loaded / idle over the fit set's pairs) and every loaded
    point's error when priced as `boost_s(consts[model], point) x factor`, tagged fit / held-out."""
    by_model: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]] = {}
    for idle, loaded in pairs(points):
        name = model_name(idle)
        if name in consts:
            by_model.setdefault(name, []).append((idle, loaded))
    factors: dict[str, float] = {}
    rows: list[dict[str, Any]] = []
    for name, got in sorted(by_model.items()):
        in_fit = [fit_sets[idle["family"]](idle) for idle, _ in got]
        fit = [lo["seconds"] / idle["seconds"] for (idle, lo), f in zip(got, in_fit, strict=True) if f]
        if not fit:
            continue
        factors[name] = statistics.median(fit)
        for (idle, lo), f in zip(got, in_fit, strict=True):
            pred = boost_s(consts[name], lo) * factors[name]
            tag = "fit" if f else "held-out"
            rows.append({**lo, "model": name, "state": "power-capped", "set": tag, "idle_s": idle["seconds"],
                         "predicted_s": pred, "error": pred / lo["seconds"] - 1.0})  # fmt: skip
    return {"factors": factors, "points": rows}


__all__ = ["fit_clock_factors", "model_name", "pairs"]
