"""Out-of-sample validation of the serving loop: predict each complete public TTFT point of
docs/benchmarks/serving-public.toml and write the error per regime into docs/benchmarks.md.

Usage: `python -m tools.validate_serving [--write]` (without --write: print the section). Nothing is
fitted to these points: each is predicted with the presets, engine rules and fixed costs as they are,
and the section says so. A point is replayed as its page states it: model preset, GPU, TP x PP, the
arrival process (Poisson at its rate, every request at t = 0 for rate "inf", or a closed loop at its
concurrency), its request count, and prompt lengths (a ShareGPT run at its published mean prompt
length: the per-request lengths are in the run's JSON, not in the point). Where a point states its
output length the loop decodes it (the engine's KV pool and running-request cap at its defaults);
ShareGPT points without output lengths run the prefill steps only, so where decode shares the step
budget there they are under-predicted. The decode points (TPOT, ITL, output throughput) are replayed by
`tools.validate_decode`, whose section this command writes too.
"""

from __future__ import annotations

import argparse
import math
import statistics
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpplan.mesh import Mesh

if TYPE_CHECKING:
    from tpplan.cost.predictor import Predictor
    from tpplan.simulate.requests import Arrivals

ROOT = Path(__file__).resolve().parents[1]
POINTS = ROOT / "docs" / "benchmarks" / "serving-public.toml"
DOC = ROOT / "docs" / "benchmarks.md"
BEGIN, END = "<!-- validate_serving: begin -->", "<!-- validate_serving: end -->"
STAT = {"ttft_mean_ms": "mean", "ttft_p50_ms": "p50", "ttft_p99_ms": "p99"}
# the GPU each point names -> (cluster preset, GPU model preset): the nearest presets tpplan has
GPUS = {
    "NVIDIA A100 40GB": ("h100x8-ib400", "a100-sxm-datasheet"),
    "NVIDIA H200": ("h200x8-ib400", None),
    "NVIDIA H100 80GB": ("h100x8-ib400", None),
    "NVIDIA B200": ("h100x8-ib400", "b200-datasheet"),
    "NVIDIA GB300 NVL72": ("gb300-nvl72", None),
}
ENGINES = {"vllm": "vllm@0.33.0", "sglang": "sglang@0.5.23"}  # the engine versions whose rules tpplan read
CLOSED_LOOP_REQUESTS = 4  # requests per client where a closed-loop point does not state its count


@dataclass(frozen=True)
class Replay:
    """One point, predicted."""

    point: dict[str, Any]
    predicted_ms: float
    regime: str

    @property
    def error(self) -> float:
        return self.predicted_ms / float(self.point["value"]) - 1


def replayable(p: dict[str, Any]) -> bool:
    """Complete TTFT points on a GPU and model tpplan has presets for."""
    return bool(p.get("complete")) and p["metric"] in STAT and any(p["gpu"].startswith(g) for g in GPUS)


def regime(p: dict[str, Any]) -> str:
    shape = f"TP{p['tp']}" + (f"xPP{p['pp']}" if p["pp"] > 1 else "")
    load = f"C={p['concurrency']}" if p.get("concurrency") else f"rate {p['request_rate']}/s"
    prompt = "short prompts (ShareGPT)" if p["prompt_tokens"] == "sharegpt" else f"{p['prompt_tokens']}-token prompts"
    return f"{p['engine']} {p['model']} {shape}, {prompt}, {'saturated' if p.get('request_rate') == 'inf' else load}"


def lengths(p: dict[str, Any]) -> tuple[int, int]:
    """(prompt, output) tokens per request as the point states them, or their published means (ShareGPT);
    output 1 where neither is stated (the replay then runs the prefill steps only)."""
    prompt = round(p["prompt_tokens_mean"]) if "prompt_tokens_mean" in p else int(p["prompt_tokens"])
    if isinstance(p["output_tokens"], int):
        return prompt, p["output_tokens"]
    return prompt, round(p["output_tokens_mean"]) if "output_tokens_mean" in p else 1


def _arrivals(p: dict[str, Any], prompt: int | None = None) -> Arrivals:
    """The point's requests (`prompt` replaces its prompt length): a closed loop, Poisson at its rate, or
    every request at t = 0 for rate "inf"."""
    from tpplan.simulate.requests import Request, Shape, Timed, closed_loop, poisson

    stated, output = lengths(p)
    prompt = stated if prompt is None else prompt
    shape = Shape(prompt, output)
    if p.get("concurrency"):
        c = int(p["concurrency"])
        return closed_loop(c, [shape], int(p.get("num_requests") or CLOSED_LOOP_REQUESTS * c))
    n = int(p["num_requests"])
    if p["request_rate"] == "inf":
        return Timed(tuple(Request(i, 0.0, prompt, output) for i in range(n)))
    return poisson(float(p["request_rate"]), [shape], n, seed=0)


def model_path(p: dict[str, Any]) -> str:
    """A point's model: a tpplan preset, or a config.json path relative to the repository root."""
    return str(ROOT / p["model"]) if p["model"].endswith(".json") else p["model"]


def predictor_for(p: dict[str, Any], plan_name: str = "baseline") -> tuple[Predictor, int, int]:
    """The predictor of point `p` as its page states it (model, GPU, TP x PP, engine, the checkpoint's
    own weight formats), the engine's default step budget on that GPU, and the topology's GPUs per node."""
    from tpplan.cost.pipeline import pipeline_model
    from tpplan.cost.predictor import cached_predictor
    from tpplan.cost.topology import select_topology
    from tpplan.engines import scheduler_rules
    from tpplan.models.config import load_model
    from tpplan.models.graph import build_model_graph
    from tpplan.plans.named import make_dp_plan, make_plan

    cluster, gpu = next(v for g, v in GPUS.items() if p["gpu"].startswith(g))
    topo = select_topology(cluster, 1, gpu=gpu)
    assert topo is not None
    if int(p["gpus"]) > topo.gpus_per_node:
        topo = select_topology(cluster, math.ceil(int(p["gpus"]) / topo.gpus_per_node), gpu=gpu)
        assert topo is not None
    graph = build_model_graph(load_model(model_path(p)))
    tp, pp = int(p["tp"]), int(p["pp"])
    engine = ENGINES[p["engine"]]
    plan = make_dp_plan(plan_name, graph, tp) or make_plan(plan_name, graph, tp)
    pred = cached_predictor(graph, plan, topo, Mesh(tp, pp=pp), "bf16", None, pipeline=pipeline_model(engine))
    chunk = scheduler_rules(engine).budget.default_tokens(topo.gpu.memory_GiB, p["gpu"])
    return pred, chunk, topo.gpus_per_node


def predict(p: dict[str, Any]) -> Replay:
    """The loop's TTFT statistic for point `p` (ms); with decode (the engine's KV pool and running cap)
    where the point states its output length, prefill steps only where it does not (ShareGPT)."""
    from tpplan.simulate.engine import engine_loop, serve
    from tpplan.simulate.serving import decode_block

    pred, chunk, per_node = predictor_for(p)
    stat = STAT[p["metric"]]
    if lengths(p)[1] > 1:
        dec = decode_block(pred, _arrivals(p), chunk, per_node)
        assert dec is not None and dec["admitted"], dec
        ttft: dict[str, float] = dec["ttft_s"]  # type: ignore[assignment]
        return Replay(p, 1e3 * ttft[stat], regime(p))
    res = serve(pred, _arrivals(p), engine_loop(pred.pipeline, pred.deployment, chunk, per_node))
    value = res.mean_s if stat == "mean" else res.p(50 if stat == "p50" else 99)
    return Replay(p, 1e3 * value, regime(p))


def _gpu_text() -> str:
    return "; ".join(f"{g}: cluster {c}, GPU {m or 'the cluster' + chr(39) + 's'}" for g, (c, m) in GPUS.items())


def section(replays: list[Replay], skipped: int) -> str:
    """The markdown section: per regime the median and worst absolute error, then every point."""
    lines = [
        BEGIN,
        "## Serving loop against public TTFT measurements (issue 31): OUT-OF-SAMPLE",
        "",
        "Generated by `python -m tools.validate_serving --write` from docs/benchmarks/serving-public.toml (each",
        "point's source and quote are there). Nothing was fitted to these points: presets, engine rules and fixed",
        "costs as they are. Replayed as the pages state them; assumptions: GPUs tpplan has no preset for run on the",
        f"nearest one ({_gpu_text()}),",
        f"engine rules of {', '.join(sorted(set(ENGINES.values())))} for every version, ShareGPT prompts at their",
        "published mean length, the checkpoint's weight formats (bf16 elsewhere), the baseline plan, decode simulated",
        "where the point states its output length or its published mean, closed loops without a stated",
        f"request count at {CLOSED_LOOP_REQUESTS} requests per client. Error = predicted / measured - 1.",
        "Known gaps these rows show: a closed loop's pace and the load under a rate follow the decode the loop",
        "prices (see the decode section below for its TPOT and throughput errors); ShareGPT points replay every",
        "request at the published mean prompt and output lengths, so the spread of lengths (and the queueing it",
        "causes) is not replayed; saturated runs (rate inf) depend on the step budget, the engine's default.",
        f"{len(replays)} points replayed, {skipped} left out (incomplete, a TPOT metric, or no preset for the GPU).",
        "",
        "| regime | points | median abs error | worst error |",
        "|---|---|---|---|",
    ]
    by: dict[str, list[Replay]] = {}
    for r in replays:
        by.setdefault(r.regime, []).append(r)
    for name, rs in by.items():
        worst = max(rs, key=lambda r: abs(r.error)).error
        lines.append(f"| {name} | {len(rs)} | {statistics.median(abs(r.error) for r in rs):.0%} | {worst:+.0%} |")
    lines += ["", "| regime | metric | measured ms | predicted ms | error |", "|---|---|---|---|---|"]
    for r in replays:
        lines.append(f"| {r.regime} | {r.point['metric']} | {float(r.point['value']):,.1f} | {r.predicted_ms:,.1f} "
                     f"| {r.error:+.0%} |")  # fmt: skip
    return "\n".join([*lines, END])


def write(text: str, doc: Path = DOC, markers: tuple[str, str] = (BEGIN, END)) -> None:
    """Replace the generated section of `doc` between `markers` (or append it)."""
    begin, end = markers
    old = doc.read_text(encoding="utf-8")
    if begin in old and end in old:
        heading = text.split("\n")[1]  # the section's own heading follows its begin marker
        if not old[old.index(begin) + len(begin) :].lstrip("\n").startswith(heading.split(":")[0]):
            raise SystemExit(f"{doc}: the text after {begin} is not this tool's section (a merge put other text "
                             "inside the markers?); move that text out of the markers and run again")  # fmt: skip
        new = old[: old.index(begin)] + text + old[old.index(end) + len(end) :]
    else:
        new = old.rstrip("\n") + "\n\n" + text + "\n"
    doc.write_text(new, encoding="utf-8")


def ttft_section() -> str:
    """The TTFT section over every replayable point of serving-public.toml."""
    points = tomllib.loads(POINTS.read_text(encoding="utf-8"))["point"]
    chosen = [p for p in points if replayable(p)]
    return section([predict(p) for p in chosen], len(points) - len(chosen))


def main() -> None:
    from tools import validate_decode

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="write both sections into docs/benchmarks.md")
    args = ap.parse_args()
    ttft, decode = ttft_section(), validate_decode.run()
    if args.write:
        write(ttft)
        write(decode, markers=(validate_decode.BEGIN, validate_decode.END))
    print(ttft, decode, sep="\n\n")


if __name__ == "__main__":
    main()
