"""Physical models fitted on AIConfigurator's rows, for the shapes its tables lack.

AIC measures MoE kernels only at the widths, expert counts, top-k and TP x EP splits of the models
it supports, and attention only at the head layouts those models have. Kimi-K3's latent MoE widths
or a head count it never ran get no row. This source prices them from a small linear model per
(GPU system, engine, kernel class) whose features are the physical work of the call, fitted with
non-negative coefficients on AIC's rows for that engine (`tools.aic_fit` fits them;
the constants ship in `presets/aic-fitted.json`, so pricing needs neither the package nor its
tables). Every answer is flagged `extrapolated=True`: it is a fit, judged leave-one-model-out
(errors in `docs/benchmarks.md` and in the file, per class).

MoE: one class per AIC quant x split (`moe_mode`: tp, ep, tp_ep), fitted on the rows of that
class's dominant kernel (`kernel` in the file: SGLang's fused Triton MoE, vLLM's FlashInfer CUTLASS
or Triton experts, TRT-LLM's CUTLASS MoE, ...). The model is the work one rank does for the experts
that get tokens (`ExpertLoads`): a per-call cost, a per-active-expert cost, the active experts'
weight read (what makes EP and TP differ: EP8 reads 1/8 of the experts at full width, TP8 all of
them at 1/8 width), useful FLOPs, the FLOPs wasted padding each expert's rows to a 64-row tile (the
efficiency that rises with tokens per expert), and per-row gather/scatter and activation costs.
Priced shapes assume balanced routing. AIC's rows do not always have it: its "balanced" logits
put every DeepSeek-V3 token's grouped top-k on tied scores, and SGLang's and vLLM's grouped top-k
then send 4 of its 8 pairs to experts 0-3 (`tools.aic_fit.collector_loads`, which
the fit uses to know what work each row measured; docs/benchmarks.md).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cache
from importlib import resources

from tpplan.cost.kernel_source import AttentionShape, CollectiveShape, GemmShape, KernelPrice, MoeShape, stand_in
from tpplan.errors import TpplanError

FIT_FILE = "aic-fitted.json"
FAR = 4.0  # no answer beyond this factor outside the token range the fit saw
MOE_TILE_M = 64  # rows of one expert-GEMM tile: tokens per expert are padded to it

MOE_FEATURES = (
    "call",
    "active_experts",
    "weights",
    "flops",
    "tile_waste_flops",
    "routed_rows",
    "all_rows",
    "intermediate_rows",
)
ATTENTION_FEATURES = ("call", "flops", "bytes", "query_rows")

# tpplan dtype -> the AIC MoE quant classes of that format, then classes that stand in where no fit
# of the format exists (the price names the stand-in: `kernel_source.stand_in`); as the AIC source.
MOE_CLASSES = {
    "bf16": (("bfloat16",), ()),
    "fp8": (("fp8",), ("fp8_block",)),
    "fp8_block": (("fp8_block",), ("fp8",)),
    "nvfp4": (("nvfp4", "w4a16_nvfp4", "nvfp4_wo"), ()),
    "mxfp4": (("w4a8_mxfp4_mxfp8", "w4a16_mxfp4"), ()),
    "int4": (("int4_wo",), ()),
}


def moe_mode(shape: MoeShape) -> str:
    """The MoE kernel class of the query's TP x EP split: "tp" (experts sliced by width on every rank),
    "ep" (whole experts spread over ranks) or "tp_ep" (both)."""
    if shape.ep == 1:
        return "tp"
    return "ep" if shape.tp == 1 else "tp_ep"


ExpertLoads = tuple[tuple[int, float], ...]  # (how many local experts, rows each), experts with rows only


def balanced_loads(shape: MoeShape) -> ExpertLoads:
    """One rank's expert loads under balanced routing: its tokens x top_k / ep routed pairs spread
    over min(local experts, pairs) experts."""
    ep = shape.ep
    pairs_r = shape.tokens * shape.top_k / ep
    active = min(shape.experts // ep, math.ceil(pairs_r)) if pairs_r > 0 else 0
    return ((active, pairs_r / active),) if active else ()


def moe_features(shape: MoeShape, loads: ExpertLoads | None = None) -> list[float]:
    """Work of one MoE layer on one rank (gated experts: 3 H x I/tp GEMMs per expert) for the query
    `shape` (its dtype aside), in the order of `MOE_FEATURES`; `loads` default `balanced_loads`.

    call: fixed per-call cost; active_experts: experts with rows (per-expert scheduling); weights:
    weight elements those experts read; flops: useful MACs x2; tile_waste_flops: the extra work of
    padding each active expert's rows to a `MOE_TILE_M` tile; routed_rows: activation elements of
    the rank's routed rows (gather, scatter); all_rows: activation elements of every routed pair of
    the batch (kernels that scan all pairs whatever the EP); intermediate_rows: the rank's rows x
    I/tp (activation and its quantisation)."""
    if loads is None:
        loads = balanced_loads(shape)
    tokens, hidden, top_k = shape.tokens, shape.hidden, shape.top_k
    inter_r = shape.intermediate / shape.tp
    active = sum(n for n, _ in loads)
    rows = sum(n * r for n, r in loads)
    padding = sum(n * (math.ceil(r / MOE_TILE_M) * MOE_TILE_M - r) for n, r in loads if r > 0)
    gemm = 6.0 * hidden * inter_r
    return [
        1.0,
        float(active),
        3.0 * active * hidden * inter_r,
        gemm * rows,
        gemm * padding,
        rows * hidden,
        tokens * top_k * hidden,
        rows * inter_r,
    ]


def attention_features(shape: AttentionShape) -> list[float]:
    """Work of one prefill attention call: causal (or windowed) q.k and p.v MACs x2, bytes of q, k, v
    and o, and query rows (softmax and per-row overhead)."""
    s, ctx, w = shape.tokens, shape.context, shape.window
    pairs = s * ctx + s * (s + 1) / 2.0  # query i sees ctx + i + 1 keys
    if w:  # the first r queries see fewer than w keys, the rest exactly w
        r = min(max(w - ctx, 0), s)
        pairs = r * ctx + r * (r + 1) / 2.0 + (s - r) * w
    flops = 2.0 * shape.batch * shape.heads * pairs * (shape.head_dim_qk + shape.head_dim_v)
    kv_rows = shape.batch * (s + ctx)
    q_rows = shape.batch * s
    nbytes = 2.0 * (
        q_rows * shape.heads * (shape.head_dim_qk + shape.head_dim_v)
        + kv_rows * shape.kv_heads * (shape.head_dim_qk + shape.head_dim_v)
    )
    return [1.0, flops, nbytes, float(q_rows * shape.heads)]


@dataclass(frozen=True)
class FittedClass:
    """One fitted kernel class: coefficients over its features and the errors it was judged by."""

    features: tuple[str, ...]
    coef: tuple[float, ...]
    max_tokens: float
    rows: int
    in_sample: dict[str, float]
    out_of_sample: dict[str, float]
    kernel: str = ""

    def seconds(self, x: list[float]) -> float:
        return sum(c * v for c, v in zip(self.coef, x, strict=True)) * 1e-3


@cache
def load_fits() -> dict:
    """The packaged fit file (fitted on AIC rows by `python -m tools.aic_fit`)."""
    text = resources.files("tpplan.cost").joinpath("presets", FIT_FILE).read_text(encoding="utf-8")
    return json.loads(text)


def routing_groups() -> dict[tuple[int, int, int, int], tuple[int, int]]:
    """{(hidden, intermediate, experts, top-k): (groups, top groups)}: the grouped-top-k MoE models of
    the AIC version the fit file was made from (whose collector routing the fit replayed)."""
    rows = load_fits().get("moe_routing", {}).get("grouped_configs", [])
    return {(r[0], r[1], r[2], r[3]): (r[4], r[5]) for r in rows}


def _classes(entry: dict) -> dict[str, FittedClass]:
    return {
        name: FittedClass(
            tuple(c["features"]),
            tuple(c["coef"]),
            c["max_tokens"],
            c["rows"],
            c["in_sample"],
            c["out_of_sample"],
            c.get("kernel", ""),
        )
        for name, c in entry.items()
    }


class AicFittedSource:
    """Prices MoE and attention for one (system, engine) from models fitted on AIC's rows.

    `system`/`engine` as for `AicSource` (`h200_sxm`, `sglang`, ...); `version`: default the one the
    fit file was made from. Needs no AIConfigurator install. GEMMs and collectives: None (AIC's
    GEMM grid and single-node comm tables leave nothing to fit that the roofline does not cover).
    """

    def __init__(self, system: str = "h200_sxm", engine: str = "sglang", version: str | None = None) -> None:
        from tpplan.cost.sources.aic import resolve_system

        fits = load_fits()["fits"]
        self.system = resolve_system(system)
        keys = [k for k in fits if k.startswith(f"{self.system}/{engine}@")]
        if version is not None:
            keys = [k for k in keys if k.endswith(f"@{version}")]
        if not keys:
            raise TpplanError(
                f"AIC fit {self.system}/{engine}" + (f"@{version}" if version else ""),
                f"{FIT_FILE} holds no fit for it",
                f"use one of {', '.join(sorted(fits))}, or refit with python -m tools.aic_fit (from a tpplan checkout)",
            )
        self.key = keys[0]
        self.engine = engine
        self.version = self.key.split("@", 1)[1]
        self.name = f"aic-fit:{self.key}"
        entry = fits[self.key]
        # a class fitted on other features than this code computes (an older file) is not used
        self.moe_classes = {k: c for k, c in _classes(entry.get("moe", {})).items() if c.features == MOE_FEATURES}
        self.attention_classes = {
            k: c for k, c in _classes(entry.get("attention", {})).items() if c.features == ATTENTION_FEATURES
        }

    def gemm(self, shape: GemmShape) -> KernelPrice | None:
        return None

    def collective(self, shape: CollectiveShape) -> KernelPrice | None:
        return None

    def moe(self, shape: MoeShape) -> KernelPrice | None:
        mode = moe_mode(shape)
        fitted = next(
            (
                self.moe_classes[f"{q}/{mode}"]
                for q in sum(MOE_CLASSES.get(shape.dtype, ((), ())), ())
                if f"{q}/{mode}" in self.moe_classes
            ),
            None,
        )
        if fitted is None or shape.tokens < 1 or shape.tokens > fitted.max_tokens * FAR:
            return None
        x = moe_features(shape)
        name = fitted_name(self.moe_classes, fitted)
        other = stand_in(name.split("/", 1)[0], shape.dtype, MOE_CLASSES[shape.dtype][0])
        return KernelPrice(fitted.seconds(x), f"{self.name}:moe-{name}{other}", True)

    def attention(self, shape: AttentionShape) -> KernelPrice | None:
        fitted = self.attention_classes.get(shape.kind)
        if fitted is None or shape.tokens < 1 or shape.tokens + shape.context > fitted.max_tokens * FAR:
            return None
        return KernelPrice(fitted.seconds(attention_features(shape)), f"{self.name}:{shape.kind}", True)


def fitted_name(classes: dict[str, FittedClass], fitted: FittedClass) -> str:
    return next(k for k, v in classes.items() if v is fitted)


__all__ = [
    "ATTENTION_FEATURES",
    "FIT_FILE",
    "MOE_FEATURES",
    "AicFittedSource",
    "ExpertLoads",
    "FittedClass",
    "attention_features",
    "balanced_loads",
    "load_fits",
    "moe_features",
    "moe_mode",
    "routing_groups",
]
