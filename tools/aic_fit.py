"""Fit the physical models of `aic_fitted` on AIConfigurator's rows and judge them leave-one-model-out.

Needs `aiconfigurator-core` (with numpy, scipy, pandas and pyarrow, which it depends on). MoE rows
are read from the package's measured tables (`systems/data/<system>/moe/<engine>/<version>/
moe_perf.parquet`, the files `PerfDatabase` loads), because they name each row's kernel
(`kernel_source`); attention rows from the table views it binds (`_context_attention_data`,
`_context_mla_data`).

MoE: each class (quant x split) is fitted on its dominant kernel's rows with features computed from
the work each row measured: `collector_loads` replays AIC's synthetic "balanced" routing
(aiconfigurator `collector/helper.py` `balanced_logits`, commit
095f58a51c4ca8e61b66ec108d86f223f8d559ce). Its token i picks experts (i + j * ceil(E/k)) % E, one
per group of E/k. Under DeepSeek-V3's grouped top-k (8 groups, top 4, the only grouped MoE in
AIC's model configs) every group then ties, and SGLang's and vLLM's collectors, which route through
the engine's grouped top-k (SGLang `collector/sglang/collect_moe.py` `TopK(use_grouped_topk=...)`
at e23be5a79438356de7d8ff9cd4bec38ccb1f4670, the 0.5.14 collection; vLLM
`collector/vllm/collect_moe.py` `use_grouped_topk` at 095f58a5), are modelled as keeping groups
0-3 and filling the 4 picks beyond the token's own experts with the lowest-numbered ones (experts
0-3): at EP8 rank 0 then gets 5 of a token's 8 pairs, not 1. TRT-LLM's collector routes with
`RenormalizeMoeRoutingMethod` (plain top-k, `collector/trtllm/collect_moe.py` at 095f58a5). The tie
order is our assumption, checked by the fit: it takes DeepSeek-V3's leave-one-model-out error on
SGLang/vLLM from 0.3-0.4 to under 0.1 and makes TRT-LLM's worse (docs/benchmarks.md).

Loss: squared relative error, non-negative least squares (every row counts by its ratio, so 10 us
calls weigh as much as 10 ms ones). Least squares on log time was tried for MoE and lost on the
held-out medians (H200 TRT-LLM fp8 EP 0.27 vs 0.07, bf16 EP 0.22 vs 0.05, vLLM bf16 TP 0.13 vs
0.12: it trades the typical row for the worst ones). Judged leave-one-model-out: a MoE "model" is one (hidden,
intermediate, experts, top-k) configuration; for attention one per-rank head layout (heads, kv
heads, head_dim, window); for MLA one head count. Each is held out in turn, the rest fitted, the
held-out rows predicted; the pooled held-out errors are the out-of-sample figures. The final
constants are fitted on all rows.

    python -m tools.aic_fit [--systems h200_sxm,...] [--engines sglang,...] [--out FILE]

writes `tpplan/cost/presets/aic-fitted.json` by default and prints progress per system x engine.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from tpplan.cost.kernel_source import AttentionShape, MoeShape
from tpplan.cost.sources.aic import AIC_ENGINES, AIC_VERSION, AicSource, aic_databases
from tpplan.cost.sources.aic_fitted import (
    ATTENTION_FEATURES,
    FIT_FILE,
    MOE_FEATURES,
    ExpertLoads,
    attention_features,
    moe_features,
    moe_mode,
)
from tpplan.errors import TpplanError

DEFAULT_SYSTEMS = ("h100_sxm", "h200_sxm", "b200_sxm", "b300_sxm", "gb200", "gb300", "rtx_pro_6000_server")
MOE_DISTRIBUTION = "balanced"
GROUPED_TOPK_ENGINES = ("sglang", "vllm")  # collectors that route AIC's logits through grouped top-k
DEEPSEEK_V3 = (7168, 2048, 256, 8)  # hidden, intermediate, experts, top-k

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


@cache
def grouped_configs() -> dict[tuple[int, int, int, int], tuple[int, int]]:
    """{(hidden, moe intermediate, experts, top-k): (groups, top groups)} for the MoE models in AIC's
    packaged model configs that route by grouped top-k over more than one group."""
    import aiconfigurator_core

    out: dict[tuple[int, int, int, int], tuple[int, int]] = {}
    for path in sorted((Path(aiconfigurator_core.__file__).parent / "model_configs").glob("*_config.json")):
        cfg = json.loads(path.read_text(encoding="utf-8"))
        cfg = cfg.get("text_config", cfg)
        groups, top = cfg.get("n_group") or 1, cfg.get("topk_group") or 1
        dims = (cfg.get("hidden_size"), cfg.get("moe_intermediate_size"), cfg.get("n_routed_experts"))
        if groups > 1 and top < groups and all(dims) and cfg.get("num_experts_per_tok"):
            out[(*dims, cfg["num_experts_per_tok"])] = (groups, top)
    return out


@cache
def _selection(tokens: int, experts: int, top_k: int, groups: tuple[int, int] | None) -> np.ndarray:
    """[tokens, top_k] experts AIC's collector routes to (see the module docstring)."""
    stride = math.ceil(experts / top_k)
    i, j = np.arange(tokens)[:, None], np.arange(top_k)[None, :]
    if tokens >= stride:
        sel = (i + j * stride) % experts
    else:
        sel = np.floor((i * stride / tokens + j * stride) % experts).astype(int)
    if groups is None:
        return sel
    n_group, top_groups = groups
    kept = top_groups * (experts // n_group)  # groups 0..top_groups-1 win the tie
    out = np.empty_like(sel)
    for t in range(tokens):
        own = sorted(int(e) for e in sel[t] if e < kept)
        fill = [e for e in range(kept) if e not in own][: top_k - len(own)]
        out[t] = (own + fill)[:top_k]
    return out


def collector_loads(tokens: int, experts: int, top_k: int, ep: int, groups: tuple[int, int] | None) -> ExpertLoads:
    """Rank 0's expert loads in an AIC MoE row: the routed pairs that land on its experts
    [0, experts / ep), as (how many experts, rows each)."""
    sel = _selection(tokens, experts, top_k, groups)
    local = experts // ep
    counts = np.bincount(sel[sel < local].ravel(), minlength=local)
    values, howmany = np.unique(counts[counts > 0], return_counts=True)
    return tuple((int(n), float(v)) for v, n in zip(values, howmany, strict=True))


def _moe_table(src: AicSource) -> Any:
    import aiconfigurator_core
    import pandas as pd

    path = Path(aiconfigurator_core.__file__).parent / "systems" / "data" / src.system / "moe" / src.engine
    path = path / src.version / "moe_perf.parquet"
    if not path.exists():
        raise TpplanError(f"AIC MoE table {src.name}", f"{path} is missing", "reinstall aiconfigurator-core 0.12")
    df = pd.read_parquet(path)
    return df[(df["distribution"] == MOE_DISTRIBUTION) & (df["latency"] > 0)]


def moe_rows(src: AicSource, quants: tuple[str, ...] | None = None) -> dict[str, tuple[str, list[Row]]]:
    """{class "quant/mode": (kernel, rows)} at the balanced distribution: each class keeps the rows of
    the kernel that covers the most model configurations (`quants`: only those AIC quant names).
    Features are of the work each row measured (`collector_loads`)."""
    df = _moe_table(src)
    if quants is not None:
        df = df[df["moe_dtype"].isin(quants)]
    df = df[(df["num_experts"] % df["moe_ep_size"] == 0) & (df["inter_size"] % df["moe_tp_size"] == 0)]
    by_class: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    cols = ("moe_dtype", "kernel_source", "num_tokens", "hidden_size", "inter_size", "num_experts", "topk")
    for quant, kernel, tokens, hidden, inter, experts, topk, tp, ep, ms in zip(
        *(df[c] for c in (*cols, "moe_tp_size", "moe_ep_size", "latency")), strict=True
    ):
        model = (int(hidden), int(inter), int(experts), int(topk))
        tokens, tp, ep = int(tokens), int(tp), int(ep)
        loads = collector_routing(src.engine, model, tokens, ep)
        shape = MoeShape(tokens, *model, tp, ep)
        x = moe_features(shape, loads=loads)
        by_class[f"{quant}/{moe_mode(shape)}"][str(kernel)].append((model, x, float(ms), (tokens, tp, ep)))
    out = {}
    for name, kernels in by_class.items():
        kernel = max(kernels, key=lambda k: (len({r[0] for r in kernels[k]}), len(kernels[k])))
        out[name] = (kernel, kernels[kernel])
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


def fit_class(
    rows: list[Row],
    features: tuple[str, ...],
    fit: Callable[[np.ndarray, np.ndarray], np.ndarray] = fit_nnls,
    focus: tuple | None = None,
) -> dict[str, Any]:
    """Fit one kernel class on all its rows with `fit`; judge it by holding out each model group in
    turn (`focus`: also report that one group's held-out errors alone, as "focus_out_of_sample",
    with the group as "focus")."""
    groups = sorted({r[0] for r in rows})
    x = np.array([r[1] for r in rows], dtype=float)
    y = np.array([r[2] for r in rows], dtype=float)
    g = [r[0] for r in rows]
    coef = fit(x, y)
    held_pred, held_y = [], []
    focused = None
    if len(groups) > 1:
        for hold in groups:
            mask = np.array([gi == hold for gi in g])
            c = fit(x[~mask], y[~mask])
            held_pred.append(x[mask] @ c)
            held_y.append(y[mask])
            if hold == focus:
                focused = _errors(held_pred[-1], held_y[-1])
    oos = (
        _errors(np.concatenate(held_pred), np.concatenate(held_y)) if held_y else {"median": None, "p90": None, "n": 0}
    )
    fitted = {
        "features": list(features),
        "coef": [float(c) for c in coef],
        "rows": len(rows),
        "groups": len(groups),
        "in_sample": _errors(x @ coef, y),
        "out_of_sample": oos,
    }
    if focus is not None and focused is not None:
        fitted["focus"], fitted["focus_out_of_sample"] = list(focus), focused
    return fitted


def held_out_fit(rows: list[Row], hold: tuple) -> np.ndarray:
    """MoE coefficients fitted (as the packaged fits are) on every model but `hold`."""
    kept = [r for r in rows if r[0] != hold]
    return fit_nnls(np.array([r[1] for r in kept]), np.array([r[2] for r in kept]))


def collector_routing(
    engine: str,
    model: tuple[int, int, int, int],
    tokens: int,
    ep: int,
    grouped: dict[tuple[int, int, int, int], tuple[int, int]] | None = None,
) -> ExpertLoads:
    """Rank 0's loads in the AIC row of `engine` for `model` (hidden, intermediate, experts, top-k);
    `grouped`: the grouped-top-k models, default those of the installed AIC (`grouped_configs`; the
    fit file records them as `moe_routing`, `aic_fitted.routing_groups`)."""
    groups = (grouped_configs() if grouped is None else grouped).get(model)
    return collector_loads(tokens, model[2], model[3], ep, groups if engine in GROUPED_TOPK_ENGINES else None)


def fit_system(system: str, engine: str, say: Callable[[str], None]) -> tuple[str, dict[str, Any]]:
    """All fitted classes for one (system, engine) at AIC's default version."""
    t0 = time.perf_counter()
    src = AicSource(system, engine)
    entry: dict[str, Any] = {"moe": {}, "attention": {}}
    for name, (kernel, rows) in sorted(moe_rows(src).items()):
        if len(rows) >= 20:
            fitted = fit_class(rows, MOE_FEATURES, focus=DEEPSEEK_V3)
            entry["moe"][name] = {"kernel": kernel, **_with_tokens(fitted, rows)}
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
            f"Physical models fitted on AIConfigurator {AIC_VERSION} rows (balanced MoE routing as AIC's "
            "collectors produce it, bf16 attention), by tools.aic_fit. Prices from these "
            "are extrapolated and assume balanced routing: in_sample and out_of_sample "
            "(leave-one-model-out) are median / p90 relative errors on those rows."
        ),
        "aic_version": AIC_VERSION,
        "moe_distribution": MOE_DISTRIBUTION,
        "moe_routing": {
            "grouped_topk_engines": list(GROUPED_TOPK_ENGINES),
            "grouped_configs": [[*k, *v] for k, v in sorted(grouped_configs().items())],
        },
        "fitted": time.strftime("%Y-%m-%d"),
        "fits": fits,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.aic_fit", description=__doc__.split("\n")[0])
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
