"""Decode MoE against the engines' measured fused-MoE kernels: tpplan's price of one MoE layer's routed
experts at decode batch sizes (the serving set: no `--engine`, the engine's fused-MoE row tile, issue 32)
next to AIConfigurator's generation MoE tables for SGLang and vLLM on H100 and H200 (measured by NVIDIA on
the engines' own kernels; nothing in tpplan was fitted to them). Writes the section of docs/benchmarks.md
between its markers and prints it:

    python -m tools.decode_moe_check [--write]

Needs `aiconfigurator-core`. The tpplan side is the real predictor (`cached_predictor`, the baseline TP plan
at the table's TP, the checkpoint's weight formats), its experts op in one decode step of T requests.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tpplan.cost.predictor import Predictor
    from tpplan.models.graph import ModelGraph

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "benchmarks.md"
BEGIN, END = "<!-- decode_moe_check: begin -->", "<!-- decode_moe_check: end -->"
TOKENS = (1, 4, 8, 16, 32, 64, 128, 256)  # decode batch per rank
# (model preset, TP): MoE models whose expert shape AIC's tables hold at that TP (EP 1)
MODELS = (("deepseek-v3", 8), ("qwen3.5-35b-a3b", 1), ("mixtral-8x7b", 2), ("glm-4.5-air", 4))
# tpplan cluster, GPU preset -> AIC system
GPUS = (("h200x8-ib400", None, "h200_sxm"), ("h100x8-ib400", None, "h100_sxm"))
ENGINES = {"sglang": "sglang@0.5.23", "vllm": "vllm@0.34.0"}


@dataclass(frozen=True)
class Row:
    """One comparison: what tpplan prices and what AIC measured, in microseconds."""

    engine: str
    gpu: str
    model: str
    tp: int
    tokens: int
    tpplan_us: float
    priced_by: str  # tpplan's source of the price (fused-moe-decode, kernel-model, ...)
    aic_us: float
    aic_source: str
    weights_mb: float  # the experts' weights the batch reaches on one rank (uniform routing)
    hbm_TBps: float  # the GPU preset's HBM rate

    @property
    def aic_read_TBps(self) -> float:
        """The weight read AIC's time implies: above the HBM rate, the row cannot read every reached expert."""
        return self.weights_mb * 1e6 / (self.aic_us * 1e-6) / 1e12

    @property
    def error(self) -> float:
        return self.tpplan_us / self.aic_us - 1


def _experts_us(pred: Predictor, tokens: int) -> tuple[float, str]:
    """The routed experts' microseconds of one decode step of `tokens` requests (1,024 cached tokens each),
    and what priced them."""
    segs = ((1, 1024),) * tokens
    from tpplan.models.opkinds import op_kind

    res = next(r for r in pred.audit.layer_results if any(op_kind(d.op.kind).routed_experts for d in r.decisions))
    kt = pred.kind_time(res, segs)
    moe = [o for o in kt.ops if o.category == "moe"]
    return 1e6 * sum(o.seconds for o in moe), "+".join(sorted({str(o.source) for o in moe}))


def _moe_shape(graph: ModelGraph) -> tuple[int, int, int, int]:
    """(hidden, intermediate, experts, top_k) of the model's routed experts op."""
    from tpplan.models.opkinds import op_kind

    op = next(o for lg in graph.kinds.values() for o in lg.ops if op_kind(o.kind).routed_experts)
    return op.int_attr("width"), op.int_attr("intermediate"), op.int_attr("experts"), op.int_attr("top_k")


def _weights_mb(pred: Predictor, experts: int, top_k: int, tokens: int, hidden: int, inter: int) -> float:
    """MB of expert weights one TP rank reads for `tokens` tokens: the experts reached, gate, up and down."""
    from tpplan.cost.expert_rows import active_experts

    return active_experts(experts, experts, top_k, tokens) * 3 * hidden * inter * pred.kernels.expert_bytes / 1e6


def rows() -> list[Row]:
    """Every (engine, GPU, model, tokens) AIC has a measured row for."""
    from tpplan.cost.kernel_source import MoeShape
    from tpplan.cost.pipeline import pipeline_model
    from tpplan.cost.predictor import cached_predictor
    from tpplan.cost.sources.aic import engine_source
    from tpplan.cost.topology import select_topology
    from tpplan.mesh import Mesh
    from tpplan.models.config import load_model
    from tpplan.models.graph import build_model_graph
    from tpplan.plans.named import baseline

    out = []
    for cluster, gpu, system in GPUS:
        topo = select_topology(cluster, 1, gpu=gpu)
        assert topo is not None
        for name, engine in ENGINES.items():
            src = engine_source(system, name)
            for model, tp in MODELS:
                graph = build_model_graph(load_model(model))
                pipeline = pipeline_model(engine)
                pred = cached_predictor(graph, baseline(), topo, Mesh(tp), "bf16", None, pipeline=pipeline)
                hidden, inter, experts, top_k = _moe_shape(graph)
                fmt = pred.kernels.moe_dtype
                for t in TOKENS:
                    got = src.moe(MoeShape(t, hidden, inter, experts, top_k, tp, 1, fmt))
                    if got is None or got.extrapolated or "stand-in" in got.source:
                        continue
                    mb = _weights_mb(pred, experts, top_k, t, hidden, inter // tp)
                    out.append(Row(name, system, model, tp, t, *_experts_us(pred, t), 1e6 * got.seconds, got.source,
                                   mb, pred.kernels.hbm / 1e12))  # fmt: skip
                print(f"{system} {name} {model}: done", file=sys.stderr, flush=True)
    return out


def _summary(found: list[Row], key: Callable[[Row], tuple[str, ...]]) -> list[str]:
    """One table row per group: its keys, points, median abs error and worst error."""
    groups: dict[tuple[str, ...], list[Row]] = {}
    for r in found:
        groups.setdefault(key(r), []).append(r)
    out = []
    for k, rs in groups.items():
        worst = max(rs, key=lambda r: abs(r.error)).error
        med = statistics.median(abs(r.error) for r in rs)
        out.append(f"| {' | '.join(k)} | {len(rs)} | {med:.0%} | {worst:+.0%} |")
    return out


# DeepEP README (deepseek-ai/DeepEP README.md @ 0aaa6744, 'Low-latency kernels with pure RDMA'): H800 nodes of
# 8 GPUs, one CX7 400 Gb/s NIC each, 128 tokens per rank, hidden 7168, top-8, FP8 dispatch, BF16 combine.
# EP -> (dispatch us, combine us). EP8 was measured over RDMA before the kernels used NVLink (DeepEP #173).
DEEPEP_LL_US = {8: (77, 114), 16: (118, 195), 32: (155, 273), 64: (173, 314), 128: (192, 369), 256: (194, 360)}
LL_SETTING = (128, 7168, 8)  # tokens per rank, hidden, top-k


def deepep_rows() -> list[str]:
    """tpplan's low-latency dispatch and combine (`cost.ep_low_latency`: tokens x top-k messages, an all-to-all
    of that send buffer on the EP group) on `h100x8-ib400` (H100 nodes of 8, 8 x 400 Gb/s NICs) against the
    DeepEP README's measured latencies, as markdown rows."""
    from tpplan.cost.collective_pricer import price_collective
    from tpplan.cost.topology import select_topology
    from tpplan.engines.deepep import combine_message_bytes, dispatch_message_bytes

    tokens, hidden, top_k = LL_SETTING
    out = []
    for ep, (d_us, c_us) in DEEPEP_LL_US.items():
        topo = select_topology("h100x8-ib400", max(1, ep // 8))
        assert topo is not None
        cells = []
        for per, measured in ((dispatch_message_bytes(hidden), d_us), (combine_message_bytes(hidden), c_us)):
            nbytes = tokens * top_k * per
            t = 1e6 * price_collective("all_to_all", nbytes, ep, topo, ranks_per_node=min(ep, 8)).time_s
            cells.append(f"{nbytes / 1e6:.2f} | {t:,.0f} | {measured} | {t / measured - 1:+.0%}")
        out.append(f"| {ep} | " + " | ".join(cells) + " |")
    return out


def section(found: list[Row]) -> str:
    """The markdown section: per (engine, GPU) and per tpplan source the median and worst error, then every
    row."""
    errs = [abs(r.error) for r in found]
    lines = [
        BEGIN,
        "## Decode MoE against the engines' measured fused-MoE kernels (issue 32): OUT-OF-SAMPLE",
        "",
        "Generated by `python -m tools.decode_moe_check --write`. tpplan's price of one MoE layer's routed experts",
        "in a decode step of T requests (the serving set: no `--engine`; rows per active expert padded to the",
        "engine's fused-MoE row tile, `tpplan/engines/fused_moe.py`; below the GPU experts model's measured rows per",
        "expert, the larger of the padded GEMMs and the active experts' weights at the HBM rate) against",
        "AIConfigurator's generation MoE tables (balanced routing) for the same engine and GPU, measured on the",
        "engines' own kernels. Nothing in tpplan was fitted to these tables. Rows AIC extrapolates or stands in",
        "another format for are left out. Error = tpplan / AIC - 1.",
        f"{len(found)} rows; median abs error {statistics.median(errs):.0%}, worst "
        f"{max(found, key=lambda r: abs(r.error)).error:+.0%}.",
        "",
        "| engine | GPU | points | median abs error | worst error |",
        "|---|---|---|---|---|",
    ]
    lines += _summary(found, lambda r: (r.engine, r.gpu))
    lines += ["", "| priced by (tpplan) | points | median abs error | worst error |", "|---|---|---|---|"]
    lines += _summary(found, lambda r: (r.priced_by,))
    fast = [r for r in found if r.aic_read_TBps > r.hbm_TBps]
    lines += ["", f"{len(fast)} AIC rows take less time than reading the expert weights the batch reaches (uniform",
              "routing) at the GPU's HBM rate (column 'AIC read'): they cannot be a kernel that reads every reached",
              "expert once, so their errors measure AIC's table, not tpplan. The MoE band's figure",
              "(presets/bands/errors.toml `[decode.moe]`) keeps them: the worst median of the `fused-moe-decode` rows",
              "per engine and GPU:"]  # fmt: skip
    lines += [
        "",
        "| priced by (tpplan) | engine | GPU | points | median abs error | worst error |",
        "|---|---|---|---|---|---|",
    ]
    lines += _summary(found, lambda r: (r.priced_by, r.engine, r.gpu))
    cols = ("engine", "GPU", "model", "TP", "T", "tpplan us", "priced by", "AIC us", "error", "weights MB",
            "AIC read TB/s", "AIC table")  # fmt: skip
    lines += ["", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in found:
        lines.append(f"| {r.engine} | {r.gpu} | {r.model} | {r.tp} | {r.tokens} | {r.tpplan_us:,.1f} | {r.priced_by} "
                     f"| {r.aic_us:,.1f} | {r.error:+.0%} | {r.weights_mb:,.0f} | {r.aic_read_TBps:.2f} "
                     f"| {r.aic_source} |")  # fmt: skip
    lines += [
        "",
        "### DeepEP's low-latency all-to-all at decode (SGLang `--deepep-mode auto`, `cost/ep_low_latency.py`)",
        "",
        "tpplan's price of one low-latency dispatch and combine (each rank's 128 tokens x top-8 messages, the",
        "dispatch in FP8 with one fp32 scale per 128 elements and a 16-byte header, the combine in bf16; an",
        "all-to-all of that send buffer on the EP group, priced by `h100x8-ib400`'s collective model: H100 nodes",
        "of 8, 8 x 400 Gb/s NICs) against DeepEP's README (H800 nodes, one CX7 400 Gb/s NIC per GPU, hidden 7168;",
        "deepseek-ai/DeepEP README.md @ 0aaa6744). Nothing was fitted. EP8 was measured over RDMA before the",
        "kernels used NVLink inside a node; tpplan prices it over NVLink. Error = tpplan / measured - 1.",
        "",
        "| EP | dispatch MB/rank | tpplan us | measured us | error | combine MB/rank | tpplan us | measured us "
        "| error |",
        "|---|---|---|---|---|---|---|---|---|",
        *deepep_rows(),
    ]
    return "\n".join([*lines, END])


def main() -> None:
    from tools.validate_serving import write

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="write the section into docs/benchmarks.md")
    text = section(rows())
    if ap.parse_args().write:
        write(text, DOC, (BEGIN, END))
    print(text)


if __name__ == "__main__":
    main()
