"""A prediction's error band, composed from the errors of what it sums.

A predicted time is a sum of op prices and collective prices, each from one source (a kernel
source's table, the GEMM table, a fitted kernel model, a roofline, a calibrated curve). The
out-of-sample error of each (class, source) pair is in a data file (`presets/bands/errors.toml`, citing
docs/benchmarks.md and issue 25 for every figure; the AIC adapter's leave-one-model-out errors
replace entries as they come), and the band of a prediction is their mean weighted by each part's
share of the predicted time: the error if every part missed by its own error in the same direction,
so an upper bound of the sum's error for parts that miss independently.
"""

from __future__ import annotations

import tomllib
from collections import defaultdict
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from tpplan.cost.collectives import CURVE_SUFFIX
from tpplan.cost.compute import DECODE_MODEL, GEMM_ANALYTIC, GEMM_TABLE, KERNEL_MODEL, PROFILE, ROOFLINE

COMPUTE_CLASSES = ("gemm", "moe", "attention", "recurrence", "elementwise")
# Ops whose band comes from entries of their own, not their category's (`models.opkinds.band_class`): kernels
# the bench could not match to the engines' (docs/benchmarks.md, "Bands for the ops the bench could not match").
OWN_BAND_CLASSES = {
    "attention_window": "windowed attention",
    "attention_chunked": "chunked attention",
    "dsa_indexer": "DSA's indexer",
    "attention_sparse": "DSA's sparse attention",
}


@dataclass(frozen=True)
class BandPart:
    """One (class, source) pair of a prediction: its share of the predicted time and its error."""

    klass: str  # an op category (gemm, moe, ...) or "collectives"
    source: str  # what priced it (its error-table key)
    share: float  # of the predicted time
    error: float  # out-of-sample relative error of such prices
    basis: str

    def to_json(self) -> dict[str, object]:
        return {"class": self.klass, "source": self.source, "share": self.share, "error": self.error,
                "basis": self.basis}  # fmt: skip


@cache
def error_table() -> dict[str, dict[str, tuple[float, str]]]:
    """class -> source key -> (error, basis), from presets/bands/errors.toml."""
    text = resources.files("tpplan.cost").joinpath("presets", "bands", "errors.toml").read_text(encoding="utf-8")
    raw = tomllib.loads(text)
    out: dict[str, dict[str, tuple[float, str]]] = {}
    for klass, entries in raw["compute"].items():
        out[klass] = {k: (float(v["error"]), str(v["basis"])) for k, v in entries.items()}
    out["collectives"] = {k: (float(v["error"]), str(v["basis"])) for k, v in raw["collectives"].items()}
    return out


def source_key(source: str | None) -> str:
    """An op's source as the error table names it: tpplan's own names as they are, a kernel source
    by its adapter prefix (`aic:h200_sxm/sglang@0.5.14` -> `aic`, `aic-fit:...` -> `aic-fit`)."""
    if source is None:
        return ROOFLINE
    if source in (GEMM_TABLE, GEMM_ANALYTIC, KERNEL_MODEL, DECODE_MODEL, ROOFLINE, PROFILE):
        return source
    return source.split(":", 1)[0]


# Curves that are not single-node measured tables carry their own error (presets/curves/README.md).
CURVE_KEYS = {f"nccl-ib{CURVE_SUFFIX}": "curve-across-nodes", f"ring{CURVE_SUFFIX}": "curve-derived-ring"}


def collective_key(algorithm: str) -> str:
    """A collective's pricing as the error table names it."""
    if algorithm in FITTED_ALGORITHMS:
        return "fitted"
    if algorithm.endswith(CURVE_SUFFIX):
        return CURVE_KEYS.get(algorithm, "curve")
    if algorithm in LINK_ALGORITHMS or ":" not in algorithm:
        return "link-model"
    return algorithm.split(":", 1)[0]


def _lookup(klass: str, key: str) -> tuple[float, str]:
    table = error_table().get(klass) or error_table()["elementwise"]
    return table.get(key) or table["default"]


def compose(seconds: dict[tuple[str, str], float]) -> tuple[float, list[BandPart]]:
    """(band, parts) from predicted seconds per (class, source key)."""
    total = sum(seconds.values())
    if total <= 0:
        return 0.0, []
    parts = []
    for (klass, key), s in sorted(seconds.items(), key=lambda kv: -kv[1]):
        err, basis = _lookup(klass, key)
        parts.append(BandPart(klass, key, s / total, err, basis))
    return sum(p.share * p.error for p in parts), parts


def op_band_class(o: Any) -> str:
    """The error-table class an op's time takes: its own (`OpTime.band`) where it has one, else its category."""
    own = getattr(o, "band", None)
    if own in OWN_BAND_CLASSES:
        return str(own)
    return o.category if o.category in COMPUTE_CLASSES else "elementwise"


def own_bands_notes(parts: list[BandPart] | tuple[BandPart, ...]) -> list[str]:
    """One sentence naming the parts of a composed band that take their own error (`OWN_BAND_CLASSES`), with their
    shares, errors and what they add, computed from the parts; empty when the prediction has none of those ops."""
    own = [p for p in parts if p.klass in OWN_BAND_CLASSES and p.share > 0]
    if not own:
        return []
    named = "; ".join(
        f"{OWN_BAND_CLASSES[p.klass]} ({p.source}) {100 * p.share:.1f}% of the time at ±{100 * p.error:.1f}% "
        f"(adds {100 * p.share * p.error:.2f}%)"
        for p in own
    )
    return [
        "Ops whose prices the full-attention error does not cover take bands of their own: "
        f"{named}. Each basis below says what its error was measured against (an engine's kernel, or the bench's "
        "own where the engine's was not run) or that it is an assumption."
    ]


FITTED_ALGORITHMS = ("fitted", "measured-curve")  # collectives priced from `tpplan calibrate`'s constants
LINK_ALGORITHMS = ("ring", "tree", "hierarchical", "direct", "none")  # the link model's own


def prediction_seconds(pred: Any) -> dict[tuple[str, str], float]:
    """Predicted seconds of one batch per (class, source key), from a `PlanPrediction`: every layer
    kind's ops and collectives times its layer count, the stage sends and the final reduction."""
    out: dict[tuple[str, str], float] = defaultdict(float)
    for kt in pred.kinds:
        for o in kt.ops:
            if o.seconds > 0:
                klass = op_band_class(o)
                out[(klass, source_key(o.source))] += o.seconds * kt.count
        for c in kt.collectives:
            out[("collectives", collective_key(c.algorithm))] += c.seconds * kt.count
    extra = float(getattr(pred, "stage_comm_s", 0.0)) + float(getattr(pred, "final_comm_s", 0.0))
    if extra > 0:
        out[("collectives", "link-model")] += extra
    return dict(out)


def prediction_band(pred: Any) -> tuple[float, list[BandPart]]:
    """The composed band of one prediction and its parts (largest share first)."""
    return compose(prediction_seconds(pred))


__all__ = [
    "COMPUTE_CLASSES",
    "OWN_BAND_CLASSES",
    "BandPart",
    "collective_key",
    "compose",
    "error_table",
    "op_band_class",
    "own_bands_notes",
    "prediction_band",
    "prediction_seconds",
    "source_key",
]
