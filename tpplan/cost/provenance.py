"""How sure a predicted time is: its provenance and the error band that applies to it.

A decision rests on a predicted difference between two plans. Whether that difference means
anything depends on how the prediction was made: from a topology whose collectives and kernels
were calibrated on the machine it describes (in-sample), or from datasheet figures nobody has
checked on that machine. The bands below are the accuracy measured in `docs/benchmarks.md`, one
number per provenance, so every verdict and the bottom line apply the same rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tpplan.cost.bands import BandPart, collective_key, compose, op_band_class, prediction_band, source_key
from tpplan.cost.topology import Topology, load_topology
from tpplan.errors import TpplanError

if TYPE_CHECKING:
    from tpplan.bench_results import BenchResults


@dataclass(frozen=True)
class Provenance:
    """Where a predicted time comes from, and the relative error measured for such predictions."""

    key: str  # "measured" | "calibrated" | "datasheet"
    label: str
    band: float  # relative error of a predicted time (0.139 = 13.9%)
    basis: str  # what the band was measured on (in-sample or out-of-sample, which machine)
    parts: tuple[BandPart, ...] = ()  # a composed band's (class, source) parts, largest share first

    def to_json(self) -> dict[str, object]:
        """Plain data for the JSON outputs (`provenance` in audit, search and bench JSON)."""
        out: dict[str, object] = {"key": self.key, "label": self.label, "band": self.band, "basis": self.basis}
        if self.parts:
            out["parts"] = [p.to_json() for p in self.parts]
        return out

    def short(self) -> str:
        """One phrase for a table title: the label and the band, e.g. `extrapolated ... (±13.9%)`."""
        return f"{self.label} (±{self.band * 100:.1f}%)" if self.band else self.label


# One band per provenance, from docs/benchmarks.md:
# - "calibrated": section "Results with measured GEMMs and kernel profiles" (2 x H200, session 3):
#   worst per-layer-kind error over four plans 2.1% (baseline MLA), batch totals within 0.3%: in
#   sample (the profiles were fitted on the same slice and session; only the 8K token count was
#   held out). Out of sample (section "Serving kernels on one H200") the physical kernel models
#   missed layers by -21% to -46%; the band is the in-sample floor, the basis says so.
# - "datasheet": section "Collectives on 2xH200", run A': the uncalibrated `h200x2` preset against
#   60 measured collectives, median 13.9% (worst 45.0%). It is the only measured accuracy of a
#   datasheet preset; compute on datasheet rooflines has not been measured against serving kernels.
# - "modelled": section "Serving kernels, sweep 2": a topology whose compute comes from physical kernel
#   models fitted on ops timed as the model's run calls them (every constant set names its `impl`),
#   judged in three model runs none of the fitted points came from: median layer error 6.8% (worst
#   10.1%) at 4K-12K tokens with the boost-clock models, out of sample. Priced in the clock state
#   each run measured (section "Clock state"), K3, Llama-3-70B, DeepSeek-V3 and Qwen3.6-27B layers
#   came within 2.1% (worst 5.7%); the band stays the state-blind figure, because a forward prediction does not
#   know the state its deployment will run in (the wrong state costs 5.5-13.8%). Its collectives
#   keep datasheet rates.
# - "modelled-sweep1": section "Serving kernels on one H200": sweep 1's models (bare kernels timed back
#   to back), out of sample in the model's run: layers -21% to -46%, batches -22.5%/-23.8%.
# - "measured": a measured time has no model error; its spread is the run's own (bench section).
BANDS: dict[str, Provenance] = {
    "measured": Provenance("measured", "measured", 0.0, "measured on the GPU (run-to-run spread in the bench section)"),
    "calibrated": Provenance(
        "calibrated",
        "calibrated on this machine (in-sample)",
        0.021,
        "worst layer error 2.1% on 2 x H200 after GEMM and kernel calibration, in-sample "
        "(docs/benchmarks.md, 'Results with measured GEMMs and kernel profiles'); out of sample, at shapes "
        "the fit did not see, layers came out 21-46% too fast ('Serving kernels on one H200')",
    ),
    "modelled": Provenance(
        "modelled",
        "physical kernel models (out-of-sample)",
        0.068,
        "median layer error 6.8% (worst 10.1%) on one H200, Kimi-K3 and Kimi-Linear-48B at TP1 with 4K-12K "
        "tokens and boost-clock models, out of sample (docs/benchmarks.md, 'Serving kernels, sweep 2'); in "
        "the clock state each run measured, the GPU-bound models' layers within 2.1% (worst 5.7%, "
        "'Clock state'); batches of 2K tokens or fewer ran 18-47% slower than predicted (host-bound); "
        "collectives at datasheet rates",
    ),
    "modelled-sweep1": Provenance(
        "modelled-sweep1",
        "physical kernel models, sweep 1 (out-of-sample)",
        0.225,
        "layers 21-46% and batches 22.5-23.8% too fast in the model's run on one H200, out of sample "
        "(docs/benchmarks.md, 'Serving kernels on one H200'); superseded by sweep 2's models",
    ),
    "datasheet": Provenance(
        "datasheet",
        "extrapolated from datasheet figures",
        0.139,
        "median error 13.9% of the uncalibrated h200x2 preset against 60 measured collectives, out of "
        "sample (docs/benchmarks.md, 'Collectives on 2xH200', run A')",
    ),
}


def provenance(topology: Topology, gpus: int) -> Provenance:
    """The provenance of predictions on `topology` for a deployment of `gpus` GPUs.

    Calibrated in-sample only when the topology carries fitted collectives and kernel profiles
    (what `tpplan calibrate` writes) and the deployment stays inside the group it was fitted on;
    a topology with physical kernel models has their out-of-sample band; anything else is an
    extrapolation from datasheet figures.
    """
    fitted = topology.fitted
    if fitted and topology.gpu.kernel_profiles:
        group = max(f.group_size for f in fitted.values())
        if topology.nodes == 1 and gpus <= group:
            return BANDS["calibrated"]
    models = topology.gpu.kernel_models
    if models:
        sweep2 = all(isinstance(c.get("impl"), str) for c in models.values())
        return BANDS["modelled" if sweep2 else "modelled-sweep1"]
    return BANDS["datasheet"]


def composed_provenance(base: Provenance, prediction: object) -> Provenance:
    """`base` (the topology's provenance) with the band composed from the prediction's parts: each op
    class and collective's out-of-sample error weighted by its share of the predicted time
    (`cost.bands`). A measured or calibrated (in-sample) provenance keeps its own band; so does a
    prediction without per-op times (a stand-in predictor)."""
    if base.key in ("measured", "calibrated") or not getattr(prediction, "kinds", None):
        return base
    band, parts = prediction_band(prediction)
    if not parts:
        return base
    label = f"{base.label}, band composed per op class and source" + _kernel_tables(prediction)
    basis = "share-weighted out-of-sample errors of the classes and sources summed (cost/presets/bands/errors.toml)"
    notes = _aic_fallback_note(parts) + format_note(prediction) + _engine_collectives_note(parts)
    return Provenance(base.key, label, band, basis + notes, tuple(parts))


def _engine_collectives_note(parts: list[BandPart]) -> str:
    """Where an engine's tables priced collectives, one clause saying they only added what the cluster lacks
    (`cost.collective_pricer.cluster_states`): the cluster's own curves, fitted constants and declared
    algorithms win."""
    if not any(p.klass == "collectives" and p.source == "aic" for p in parts):
        return ""
    return (
        "; collectives the cluster has no measured curve, fitted constant or declared algorithm for were priced from "
        "the --engine tables (AIC); the cluster's own collective data priced the rest"
    )


def question_provenance(reference: object, topology: Topology, gpus: int) -> Provenance:
    """The one band of a question, whichever command asks: the composed band of its reference
    prediction (the current deployment's: baseline at the reference TP x PP unless the memo is told
    `--current`), which `predict_plan` composed; the topology's where there is none (a stand-in
    predictor's). Audit, search and the memo all state this figure (tests/test_one_band.py)."""
    held = getattr(reference, "provenance", None)
    return held if isinstance(held, Provenance) else provenance(topology, gpus)


def format_note(prediction: object) -> str:
    """Where an op's weight format (block-scaled fp8, mxfp4, ...) was not priced from rows of that
    format, one clause per format and op class saying what priced it (`OpTime.note`)."""
    notes = sorted({o.note for kt in getattr(prediction, "kinds", ()) for o in kt.ops if getattr(o, "note", None)})
    return "; weight formats priced from other rows: " + "; ".join(notes) if notes else ""


def _kernel_tables(prediction: object) -> str:
    """Where an engine's kernel tables priced ops, a clause naming them, so times from different
    kernel sources never carry the same label (`aic:h200_sxm/sglang@0.5.14`, its fitted models)."""
    names = sorted(
        {":".join(str(o.source).split(":", 2)[:2]) for kt in getattr(prediction, "kinds", ()) for o in kt.ops
         if str(o.source).startswith(("aic:", "aic-fit:"))}
    )  # fmt: skip
    return f", kernels from {' and '.join(names)} where they have rows" if names else ""


def _aic_fallback_note(parts: list[BandPart]) -> str:
    """Where a class priced from AIC's database came from a table AIC loaded low-fidelity fallback
    rows for (its warning, routed off stderr by `cost.sources.aic`), one clause saying which."""
    aic_classes = {p.klass for p in parts if p.source == "aic"}
    if not aic_classes:  # nothing priced from AIC: its module (and what it imports) is not needed
        return ""
    from tpplan.cost.sources.aic_log import TABLE_CLASS, fallback_tables

    used = sorted(t for t in fallback_tables() if TABLE_CLASS.get(t) in aic_classes)
    if not used:
        return ""
    tables = ", ".join(t.removesuffix("_perf.parquet") for t in used)
    return f"; AIC served low-fidelity fallback rows (framework-implicit, may differ from the engine) for {tables}"


# What priced an op, in words (`bands.source_key` names; a kernel source's adapter prefix for engine tables).
SOURCE_NAMES = {
    "kernel-model": "physical kernel models",
    "decode-model": "decode kernel models",
    "kernel-profile": "measured kernel profiles",
    "gemm-table": "the GEMM table",
    "gemm-analytic": "the analytic GEMM model",
    "roofline": "roofline estimates",
    "aic": "AIConfigurator's tables",
    "aic-fit": "models fitted on AIConfigurator's tables",
}


def sources_phrase(seconds: dict[tuple[str, str], float]) -> str:
    """Which sources priced a prediction's ops and their shares of its op time, largest first, e.g.
    `physical kernel models 61%, the GEMM table 39%`; empty when no op time was priced."""
    by_source: dict[str, float] = {}
    for (klass, key), s in seconds.items():
        if klass != "collectives" and s > 0:
            by_source[key] = by_source.get(key, 0.0) + s
    total = sum(by_source.values())
    ranked = sorted(by_source.items(), key=lambda kv: -kv[1])
    return ", ".join(f"{SOURCE_NAMES.get(k, k)} {100 * s / total:.0f}%" for k, s in ranked) if total > 0 else ""


def priced_provenance(base: Provenance, seconds: dict[tuple[str, str], float]) -> Provenance:
    """`base` (the topology's provenance) told by what really priced a prediction (`seconds`: predicted
    seconds per (class, source key), `bands.prediction_seconds`'s form): its label names the sources
    and their shares, and an out-of-sample band is composed from their errors (`bands.compose`), so a
    prediction priced by roofline estimates never carries the kernel models' band, nor the reverse.
    A measured or calibrated (in-sample) provenance keeps its own band."""
    sources = sources_phrase(seconds)
    if not sources:
        return base
    if base.key in ("measured", "calibrated"):
        return Provenance(base.key, f"{base.label}; ops priced by {sources}", base.band, base.basis, base.parts)
    band, parts = compose(seconds)
    label = f"ops priced by {sources} (out-of-sample band composed per op class and source)"
    basis = "share-weighted out-of-sample errors of the classes and sources summed (cost/presets/bands/errors.toml)"
    return Provenance(base.key, label, band, basis, tuple(parts))


def recorded_provenance(topology: str, gpus: int) -> Provenance | None:
    """The provenance of predictions a results file recorded on topology `topology` (a preset name
    or path) for `gpus` GPUs; None when this build cannot load that topology."""
    try:
        return provenance(load_topology(topology), gpus)
    except TpplanError:
        return None


def run_provenance(r: BenchResults) -> Provenance | None:
    """How a run's predictions were made, from its own rows: which sources priced its ops (each op row's
    `source`) and the band composed from their errors (`priced_provenance`), each op and collective row
    weighted once by its predicted time, as one layer of each kind; an op row counts in its own band
    class where it records one (`OpResult.band`: a window op's), else its category's (`bands.op_band_class`).
    A file whose ops record no source (before issue 34) keeps its topology's provenance and says the sources are not
    recorded; None when this build cannot load the run's topology."""
    base = recorded_provenance(r.topology, r.tp) if r.topology is not None else None
    if base is None:
        return None
    if not any(o.source for o in r.ops):
        kernels = {o.kernel for o in r.ops if o.profiled}
        known = (
            f"measured kernel profiles priced {len(kernels)} kernel classes, the other ops'" if kernels else "the ops'"
        )
        label = f"{base.label}; {known} sources are not recorded (re-predict: `bench --from FILE --repredict`)"
        return Provenance(base.key, label, base.band, base.basis, base.parts)
    seconds: dict[tuple[str, str], float] = {}
    for o in r.ops:
        key = (op_band_class(o), source_key(o.source))  # a window op row its own class (`OpResult.band`)
        seconds[key] = seconds.get(key, 0.0) + (o.predicted_s or 0.0)
    for c in r.collectives:
        key = ("collectives", collective_key(c.algorithm or "link-model"))
        seconds[key] = seconds.get(key, 0.0) + (c.predicted_s or 0.0)
    return priced_provenance(base, seconds)


def within_band(gain: float, band: float) -> bool:
    """True when a relative gain (or loss) is inside the prediction's error band: too close to call."""
    return abs(gain) <= band


__all__ = [
    "BANDS",
    "Provenance",
    "composed_provenance",
    "format_note",
    "priced_provenance",
    "provenance",
    "question_provenance",
    "recorded_provenance",
    "run_provenance",
    "sources_phrase",
    "within_band",
]
