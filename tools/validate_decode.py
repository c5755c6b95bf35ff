"""Out-of-sample validation of the serving loop's decode: predict each complete public decode point
(TPOT, ITL, output throughput; docs/benchmarks/serving-public-decode.toml and the TPOT points of
serving-public.toml) and write the error per regime into docs/benchmarks.md.

Run through `python -m tools.validate_serving [--write]`, which writes this section beside the TTFT one.
Nothing is fitted to these points. A point is replayed as its page states it: model (preset or config),
GPU, TP, engine, a closed loop at its concurrency with its prompt and output lengths, decode admitted
under the engine's own KV pool and running-request cap at its defaults (`simulate.serving.decode_block`).
An ITL slope/intercept point (the page's linear fit of ITL against input length at concurrency 1) is
compared with the same fit over the loop's ITL at input lengths spread over the page's sweep. A P/D
decode-pool point is priced as one decode step of its stated batch per rank at its KV length.
"""

from __future__ import annotations

import math
import statistics
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from tools.validate_serving import CLOSED_LOOP_REQUESTS, ENGINES, GPUS, POINTS, ROOT, lengths, predictor_for
from tools.validate_serving import _arrivals as arrivals_of

DECODE_POINTS = ROOT / "docs" / "benchmarks" / "serving-public-decode.toml"
BEGIN, END = "<!-- validate_decode: begin -->", "<!-- validate_decode: end -->"
# metric -> (decode summary key, statistic, scale to the metric's unit)
SUMMARY = {
    "tpot_mean_ms": ("tpot_s", "mean", 1e3),
    "tpot_p50_ms": ("tpot_s", "p50", 1e3),
    "itl_mean_ms": ("itl_s", "mean", 1e3),
    "itl_p50_ms": ("itl_s", "p50", 1e3),
    "output_tok_s": ("output_tok_s", None, 1.0),
    "output_tok_s_per_gpu": ("output_tok_s_per_gpu", None, 1.0),
    "output_tok_s_per_user": ("output_tok_s_per_user", None, 1.0),
}
FIT = ("itl_slope_ms_per_token", "itl_intercept_ms")
SWEEP_POINTS = 7  # input lengths of the loop's own sweep, spread geometrically over the page's range
PD_PLAN = {"sglang": "dp-attention+a2a", "vllm": "vllm-dp-ep"}  # the decode pool's DP attention + EP plan


@dataclass(frozen=True)
class DecodeReplay:
    """One point, predicted (or why it could not be)."""

    point: dict[str, Any]
    predicted: float | None
    regime: str
    why_not: str = ""
    batch: float = 0.0  # the loop's mean decode batch (aggregated replays)

    @property
    def error(self) -> float:
        """predicted / measured - 1; against a published range, the distance to its nearer end."""
        assert self.predicted is not None
        if "value" in self.point:
            return self.predicted / float(self.point["value"]) - 1
        lo, hi = float(self.point["value_min"]), float(self.point["value_max"])
        return 0.0 if lo <= self.predicted <= hi else self.predicted / (lo if self.predicted < lo else hi) - 1


def points() -> list[dict[str, Any]]:
    """The decode file's points, then serving-public.toml's TPOT points."""
    own = tomllib.loads(DECODE_POINTS.read_text(encoding="utf-8"))["point"]
    ttft_file = tomllib.loads(POINTS.read_text(encoding="utf-8"))["point"]
    return own + [p for p in ttft_file if p["metric"].startswith("tpot")]


def replayable(p: dict[str, Any]) -> str:
    """Why `p` cannot be replayed ("" when it can)."""
    if not p.get("complete"):
        return "incomplete (see its notes)"
    if not any(p["gpu"].startswith(g) for g in GPUS):
        return f"no preset for {p['gpu']}"
    if p["metric"] not in SUMMARY and p["metric"] not in FIT and p["metric"] != "output_tok_s_per_node":
        return f"metric {p['metric']}"
    if p.get("mode", "aggregated") == "aggregated" and p["prompt_tokens"] != "swept" and lengths(p)[1] <= 1:
        return "no output length stated (ShareGPT outputs)"
    return ""


def _bucket(n: float, edges: tuple[tuple[float, str], ...], last: str) -> str:
    return next((name for edge, name in edges if n <= edge), last)


def regime(p: dict[str, Any]) -> str:
    """Engine, GPU, model, layout, aggregated or P/D, batch (concurrency) bucket and KV length bucket."""
    model = Path(p["model"]).stem if p["model"].endswith(".json") else p["model"]
    gpu = p["gpu"].removeprefix("NVIDIA ").split(" (")[0]
    mode = p.get("mode", "aggregated")
    if mode == "pd-decode":
        batch, kv = int(p["batch_per_rank"]), float(p["kv_tokens"])
        load = f"batch {batch}/rank"
    else:
        if isinstance(p.get("concurrency"), int):
            load = _bucket(p["concurrency"], ((1, "C=1"), (16, "C 2-16"), (64, "C 17-64")), "C > 64")
        else:
            load = "saturated" if p["request_rate"] == "inf" else f"rate {p['request_rate']}/s"
        kv = p["prompt_tokens_max"] if p["prompt_tokens"] == "swept" else lengths(p)[0] + lengths(p)[1] / 2
    span = "KV 256-125K (fit)" if p["prompt_tokens"] == "swept" else _bucket(
        kv, ((4096, "KV < 4K"), (32768, "KV 4K-32K")), "KV > 32K")  # fmt: skip
    shape = f"TP{p['tp']}" + (f"xPP{p['pp']}" if int(p.get("pp", 1)) > 1 else "")
    if mode == "pd-decode" and p.get("ep_num_redundant_experts"):  # the physical experts' EP, as replayed
        shape += f" EP{p['tp']} +{p['ep_num_redundant_experts']} redundant experts"
    if mode == "pd-decode" and p.get("overlap"):
        shape += f" {p['overlap'].upper()}"
    return f"{p['engine']} {gpu} {model} {shape} {mode}, {load}, {span}"


def _decode(p: dict[str, Any], prompt: int) -> dict[str, Any] | str:
    """The loop's decode summary of `p` at `prompt` tokens, or why the engine's pool refused it."""
    from tpplan.simulate.serving import decode_block

    pred, chunk, per_node = predictor_for(p)
    dec = decode_block(pred, arrivals_of(p, prompt), chunk, per_node)
    assert dec is not None
    return dec if dec["admitted"] else str(dec["reason"])


@cache
def _itl_fit(model: str, gpu: str, engine: str, tp: int, lo: int, hi: int, output: int) -> tuple[float, float]:
    """(slope ms/token, intercept ms) of the loop's mean ITL at concurrency 1 against the input length."""
    p = {"model": model, "gpu": gpu, "engine": engine, "tp": tp, "pp": 1, "gpus": tp, "concurrency": 1,
         "prompt_tokens": lo, "output_tokens": output, "num_requests": 1}  # fmt: skip
    lens = [round(lo * (hi / lo) ** (i / (SWEEP_POINTS - 1))) for i in range(SWEEP_POINTS)]
    itls = []
    for n in lens:
        dec = _decode(p, n)
        assert not isinstance(dec, str), dec
        itls.append(1e3 * float(dec["itl_s"]["mean"]))
    fit = statistics.linear_regression(lens, itls)
    return fit.slope, fit.intercept


def pd_plan(p: dict[str, Any]) -> str:
    """The decode pool's plan as the page states it: the engine's DP attention + EP plan, with its redundant
    experts (`+redundant<r>`, tpplan.engines.redundant_experts) and two-batch overlap (`+tbo`) where stated."""
    redundant = int(p.get("ep_num_redundant_experts", 0))
    return PD_PLAN[p["engine"]] + (f"+redundant{redundant}" if redundant else "") + (
        f"+{p['overlap']}" if p.get("overlap") else "")  # fmt: skip


def _pd_step(p: dict[str, Any]) -> float | str:
    """Output tokens/s per node of one decode step of the stated batch per rank at the stated KV length."""
    from tpplan.errors import TpplanError

    try:
        pred, _, per_node = predictor_for(p, pd_plan(p))
    except TpplanError as err:
        return f"tpplan cannot lay it out: {err}"
    batch = int(p["batch_per_rank"]) * int(p["tp"])
    stages, sends, _ = pred.stage_times(((1, int(p["kv_tokens"])),) * batch)
    return int(p["batch_per_rank"]) * min(per_node, int(p["gpus"])) / (math.fsum(stages) + math.fsum(sends))


def predict(p: dict[str, Any]) -> DecodeReplay:
    """Point `p` through the loop (or the decode step, for a P/D decode pool)."""
    name = regime(p)
    if p["metric"] == "output_tok_s_per_node":
        got = _pd_step(p)
        return DecodeReplay(p, None, name, got) if isinstance(got, str) else DecodeReplay(p, got, name)
    if p["metric"] in FIT:
        slope, intercept = _itl_fit(p["model"], p["gpu"], p["engine"], int(p["tp"]), int(p["prompt_tokens_min"]),
                                    int(p["prompt_tokens_max"]), int(p["output_tokens"]))  # fmt: skip
        return DecodeReplay(p, slope if p["metric"] == FIT[0] else intercept, name)
    dec = _decode(p, lengths(p)[0])
    if isinstance(dec, str):
        return DecodeReplay(p, None, name, f"the engine's KV pool refuses it: {dec}")
    key, stat, scale = SUMMARY[p["metric"]]
    value = dec[key][stat] if stat else dec[key]
    return DecodeReplay(p, scale * float(value), name, batch=float(dec["mean_decode_batch"]))


STEP_CLASSES = ("moe", "gemm", "collectives", "elementwise", "attention", "recurrence")


def step_shares(p: dict[str, Any], batch: int) -> tuple[float, dict[str, float], float, float]:
    """One decode step of an aggregated point as the loop prices it (`batch` requests, every one at the mean KV
    length prompt + output / 2): the step's seconds, each op class's share of it, and the decode band the memo
    composes for it with the share of the step that band covers (`tpplan.cost.decode_band`: each (class,
    source)'s out-of-sample decode error by its share)."""
    from types import SimpleNamespace

    from tpplan.cost.bands import prediction_seconds
    from tpplan.cost.decode_band import compose_decode

    pred, _, _ = predictor_for(p)
    prompt, output = lengths(p)
    segs = ((1, prompt + output // 2),) * batch
    stages, sends, final = pred.stage_times(segs)
    kinds = [pred.kind_time(res, segs) for res in {id(r): r for r in pred.audit.layer_results}.values()]
    by = dict.fromkeys(STEP_CLASSES, 0.0)
    for kt in kinds:
        for o in kt.ops:
            by[o.category] = by.get(o.category, 0.0) + kt.count * o.seconds
        by["collectives"] += kt.count * math.fsum(c.seconds for c in kt.collectives)
    total = math.fsum(stages) + math.fsum(sends)
    band, parts, _ = compose_decode(prediction_seconds(SimpleNamespace(kinds=kinds, stage_comm_s=math.fsum(sends),
                                                                       final_comm_s=final)))  # fmt: skip
    return total, {k: v / total for k, v in by.items()}, band, math.fsum(x.share for x in parts)


def _shares_table(done: list[DecodeReplay]) -> list[str]:
    """Where each replayed aggregated regime's decode step goes, as priced (one row per regime)."""
    rows, seen = [], set()
    for r in done:
        p = r.point
        if p.get("mode", "aggregated") != "aggregated" or p["prompt_tokens"] == "swept" or r.regime in seen:
            continue
        seen.add(r.regime)
        total, share, band, covered = step_shares(p, max(1, round(r.batch)))
        cells = " | ".join(f"{share[k]:.0%}" for k in STEP_CLASSES)
        errors = [x.error for x in done if x.regime == r.regime]
        inside = sum(abs(e) <= band for e in errors)
        rows.append(f"| {r.regime} | {1e3 * total:,.2f} | {cells} | ±{band:.0%} | {covered:.0%} "
                    f"| {inside} of {len(errors)} |")  # fmt: skip
    head = [
        "",
        "Where the priced decode step goes (batch = the replay's mean decode batch, KV at prompt + output / 2;",
        "shares of the step's time; the rest is the last stage's final reduction and sends), the decode band the",
        "memo prints for that step (`tpplan.cost.decode_band`: each op class and source's out-of-sample decode",
        "error, tpplan/cost/presets/bands/errors.toml `[decode.*]`, by its share), the share of the step that band",
        "covers (classes without such an error are not in it), and how many of the regime's replays fall inside:",
        "",
        "| regime | step ms | " + " | ".join(STEP_CLASSES) + " | decode band | covers | errors inside |",
        "|---|---|" + "---|" * len(STEP_CLASSES) + "---|---|---|",
    ]
    return head + rows


def _fmt(x: float) -> str:
    return f"{x:.3g}" if abs(x) < 0.01 else f"{x:,.2f}"


def section(replays: list[DecodeReplay], skipped: list[tuple[dict[str, Any], str]]) -> str:
    """The markdown section: per regime the points, median and worst error; every point; what was left out."""
    done = [r for r in replays if r.predicted is not None]
    lines = [
        BEGIN,
        "## Serving loop's decode against public TPOT / ITL / throughput measurements (issue 32): OUT-OF-SAMPLE",
        "",
        "Generated by `python -m tools.validate_serving --write` (tools/validate_decode.py) from",
        "docs/benchmarks/serving-public-decode.toml and the TPOT points of serving-public.toml (sources and quotes",
        "there). Nothing was fitted to these points. Replayed as the pages state them: a closed loop at the stated",
        "concurrency, prompt and output lengths, requests (else "
        f"{CLOSED_LOOP_REQUESTS} per client), decode admitted under the engine's KV pool and running-request cap at",
        "its defaults; ITL slope/intercept points against the same linear fit over the loop's mean ITL at",
        f"{SWEEP_POINTS} input lengths spread over the page's sweep (concurrency 1); a P/D decode-pool point as one",
        "decode step of its batch per rank at its KV length on the engine's DP-attention + EP plan (with the",
        "redundant experts and two-batch overlap the page states: `<plan>+redundant<r>+tbo`). Assumptions:",
        f"engine rules of {', '.join(sorted(set(ENGINES.values())))} for every version, KV priced in bf16, the",
        "checkpoint's weight formats, no speculative decoding; GPUs as in the TTFT section above. Error =",
        "predicted / measured - 1 (against a published range: the distance to its nearer end).",
        f"{len(done)} points replayed, {len(replays) - len(done) + len(skipped)} left out (listed below).",
        "",
        "| regime | metric | points | median abs error | worst error |",
        "|---|---|---|---|---|",
    ]
    by: dict[tuple[str, str], list[DecodeReplay]] = {}
    for r in done:
        by.setdefault((r.regime, r.point["metric"]), []).append(r)
    for (name, metric), rs in by.items():
        worst = max(rs, key=lambda r: abs(r.error)).error
        med = statistics.median(abs(r.error) for r in rs)
        lines.append(f"| {name} | {metric} | {len(rs)} | {med:.0%} | {worst:+.0%} |")
    lines += ["", "| regime | metric | measured | predicted | error |", "|---|---|---|---|---|"]
    for r in done:
        pt = r.point
        measured = _fmt(float(pt["value"])) if "value" in pt else f"{pt['value_min']}-{pt['value_max']}"
        lines.append(f"| {r.regime} | {pt['metric']} | {measured} | {_fmt(r.predicted or 0.0)} | {r.error:+.0%} |")
    lines += _shares_table(done)
    lines += ["", "Left out:", ""]
    for r in replays:
        if r.predicted is None:
            lines.append(f"- {r.regime}, {r.point['metric']}: {r.why_not}")
    for p, why in skipped:
        lines.append(f"- {p['engine']} {p['gpu']} {p['model']} TP{p['tp']}, {p['metric']} = {p.get('value')}: {why}")
    return "\n".join([*lines, END])


def run() -> str:
    """The section over every point."""
    replays, skipped = [], []
    for p in points():
        why = replayable(p)
        if why:
            skipped.append((p, why))
        else:
            replays.append(predict(p))
    return section(replays, skipped)


__all__ = [
    "BEGIN",
    "DECODE_POINTS",
    "END",
    "DecodeReplay",
    "pd_plan",
    "points",
    "predict",
    "regime",
    "replayable",
    "run",
    "section",
]  # fmt: skip
