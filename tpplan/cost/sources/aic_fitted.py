"""Physical models fitted on AIConfigurator's rows, for the shapes its tables lack.

AIC measures MoE kernels only at the widths, expert counts, top-k and TP x EP splits of the models
it supports, and attention only at the head layouts those models have. Kimi-K3's latent MoE widths
or a head count it never ran get no row. This source prices them from a small linear model per
(GPU system, engine, kernel class) whose features are the physical work of the call, fitted with
non-negative coefficients on AIC's rows for that engine (`tpplan.cost.sources.aic_fit` fits them;
the constants ship in `presets/aic-fitted.json`, so pricing needs neither the package nor its
tables). Every answer is flagged `extrapolated=True`: it is a fit, judged leave-one-model-out
(errors in `docs/benchmarks.md` and in the file, per class).

MoE kernel classes are split by TP-only (ep = 1) and EP (ep > 1), because the engines' kernels
rank the two differently (SGLang/vLLM's fused Triton MoE is 2.5-2.7x slower at EP8 than TP8 on
DeepSeek-V3 fp8 at 8K tokens, TRT-LLM's 3.9x faster), which no single shape-only model reproduces.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cache
from importlib import resources

from tpplan.cost.kernel_source import AttentionShape, CollectiveShape, GemmShape, KernelPrice, MoeShape
from tpplan.errors import TpplanError

FIT_FILE = "aic-fitted.json"
FAR = 4.0  # no answer beyond this factor outside the token range the fit saw
MOE_TILE_M = 64  # rows of one expert-GEMM tile: tokens per expert are padded to it

MOE_FEATURES = (
    "call",
    "experts_per_rank",
    "active_experts",
    "flops",
    "tile_waste_flops",
    "weights",
    "routed_rows",
    "all_rows",
)
ATTENTION_FEATURES = ("call", "flops", "bytes", "query_rows")

# tpplan dtype -> the AIC MoE quant classes a fit may exist for, in order (same as the AIC source).
MOE_CLASSES = {
    "bf16": ("bfloat16",),
    "fp8": ("fp8", "fp8_block"),
    "fp8_block": ("fp8_block",),
    "nvfp4": ("nvfp4",),
    "mxfp4": ("w4a8_mxfp4_mxfp8", "w4a16_mxfp4"),
    "int4": ("int4_wo",),
}


def moe_mode(tp: int, ep: int) -> str:
    """The MoE kernel class of a TP x EP split: "tp" (experts sliced by width on every rank), "ep"
    (whole experts spread over ranks) or "tp_ep" (both)."""
    if ep == 1:
        return "tp"
    return "ep" if tp == 1 else "tp_ep"


def moe_features(tokens: float, hidden: int, inter: int, experts: int, top_k: int, tp: int, ep: int) -> list[float]:
    """Work of one MoE layer on one rank under balanced routing (gated experts: 3 H x I/tp GEMMs).

    call: fixed per-call cost; experts_per_rank: per-local-expert scheduling; active_experts: experts
    that get tokens (balanced routing spreads the rank's routed pairs over min(experts, pairs) of
    them); flops: useful MACs x2; tile_waste_flops: the extra work of padding each active expert's
    tokens to a tile; weights: weight elements the active experts read; routed_rows/all_rows:
    activation rows gathered and scattered for this rank's routed pairs / for every routed pair
    (kernels that scan all pairs regardless of EP)."""
    experts_r = experts / ep
    inter_r = inter / tp
    pairs_r = tokens * top_k / ep
    active = min(experts_r, pairs_r)
    per_active = pairs_r / active if active > 0 else 0.0
    padded = math.ceil(per_active / MOE_TILE_M) * MOE_TILE_M if per_active > 0 else 0
    flops = 6.0 * pairs_r * hidden * inter_r
    waste = 6.0 * active * max(0.0, padded - per_active) * hidden * inter_r
    return [
        1.0,
        experts_r,
        active,
        flops,
        waste,
        3.0 * active * hidden * inter_r,
        pairs_r * hidden,
        tokens * top_k * hidden,
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

    def seconds(self, x: list[float]) -> float:
        return sum(c * v for c, v in zip(self.coef, x, strict=True)) * 1e-3


@cache
def load_fits() -> dict:
    """The packaged fit file (fitted on AIC rows by `python -m tpplan.cost.sources.aic_fit`)."""
    text = resources.files("tpplan.cost").joinpath("presets", FIT_FILE).read_text(encoding="utf-8")
    return json.loads(text)


def _classes(entry: dict) -> dict[str, FittedClass]:
    return {
        name: FittedClass(
            tuple(c["features"]), tuple(c["coef"]), c["max_tokens"], c["rows"], c["in_sample"], c["out_of_sample"]
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
                f"use one of {', '.join(sorted(fits))}, or refit with python -m tpplan.cost.sources.aic_fit",
            )
        self.key = keys[0]
        self.engine = engine
        self.version = self.key.split("@", 1)[1]
        self.name = f"aic-fit:{self.key}"
        entry = fits[self.key]
        self.moe_classes = _classes(entry.get("moe", {}))
        self.attention_classes = _classes(entry.get("attention", {}))

    def gemm(self, shape: GemmShape) -> KernelPrice | None:
        return None

    def collective(self, shape: CollectiveShape) -> KernelPrice | None:
        return None

    def moe(self, shape: MoeShape) -> KernelPrice | None:
        mode = moe_mode(shape.tp, shape.ep)
        fitted = next(
            (
                self.moe_classes[f"{q}/{mode}"]
                for q in MOE_CLASSES.get(shape.dtype, ())
                if f"{q}/{mode}" in self.moe_classes
            ),
            None,
        )
        if fitted is None or shape.tokens < 1 or shape.tokens > fitted.max_tokens * FAR:
            return None
        x = moe_features(shape.tokens, shape.hidden, shape.intermediate, shape.experts, shape.top_k, shape.tp, shape.ep)
        return KernelPrice(fitted.seconds(x), f"{self.name}:moe-{fitted_name(self.moe_classes, fitted)}", True)

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
    "FittedClass",
    "attention_features",
    "load_fits",
    "moe_features",
    "moe_mode",
]
