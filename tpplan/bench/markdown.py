"""The bench's markdown: measured vs predicted per batch, layer, op and collective, the summary and targets."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from tpplan.bench.checks import checks
from tpplan.bench.host_ahead import timing_line
from tpplan.bench.results import PlanBench
from tpplan.bench.ttft import TTFT_METHOD
from tpplan.bench_results import BenchResults, OpResult, error_summary
from tpplan.cost.bands import OWN_BAND_CLASSES
from tpplan.cost.provenance import run_provenance
from tpplan.text import plain


def markdown(benches: Sequence[PlanBench], results_files: dict[str, Path]) -> str:
    """Measured vs predicted per batch, layer, op (by layer kind and by category) and collective, per plan."""
    first = benches[0].results
    m = first.meta
    lines = [
        f"# tpplan bench: {first.model}, TP{first.tp}, {first.workload}",
        "",
        f"- slice: {first.model_slice.description}",
        f"- machine: {m.machine}, {m.gpus} x {m.gpu}; torch {m.torch_version}"
        + (f", NCCL {m.nccl_version}" if m.nccl_version else "")
        + (f", CUDA {m.cuda_version}" if m.cuda_version else ""),
        f"- date: {m.date.isoformat()}; command: `{m.command}`",
        f"- predictions: topology `{first.topology}`; kernels: {benches[0].kernels}",
        f"- provenance of the predictions: {_provenance(first)}",
        "- method: CUDA events after warm-up; ops/layers/batches = slowest rank, collectives = fastest rank "
        "(the others wait for it), median over passes; ops and layers are the mean over the workload's "
        "batches (the prediction likewise, at each batch's context); errors = (predicted - measured) / measured",
        "- files: " + ", ".join(f"`{p}`" for p in results_files.values()),
        "",
    ]
    for pb in benches:
        lines += _plan_markdown(pb)
    lines += _summary_markdown(benches)
    return plain("\n".join(lines) + "\n", keep_lines=True)  # names from inputs as text (issue 35)


def _provenance(r: BenchResults) -> str:
    """What priced the run's predictions and the band that applies, from its own rows (`run_provenance`)."""
    p = run_provenance(r)
    if p is None:
        return f"unknown (topology `{r.topology}` is not in this build)"
    own = [x for x in p.parts if x.klass in OWN_BAND_CLASSES and x.share > 0]
    told = "; ".join(
        f"{OWN_BAND_CLASSES[x.klass]} ({x.source}) {100 * x.share:.1f}% of the predicted time at ±{100 * x.error:.1f}%"
        f" ({x.basis})"
        for x in own
    )
    return f"{p.short()}: {p.basis}" + (f"; in it, ops with bands of their own (`band`): {told}" if own else "")


def _plan_markdown(pb: PlanBench) -> list[str]:
    """One plan's section: batches, layers, ops by category, ops, collectives and the extrapolated TTFT."""
    r = pb.results
    out = [f"## {pb.plan}", "", f"Timing: {timing_line(r.timing)}.", ""]
    if pb.fallbacks:
        out += [f"Fallbacks: {len(pb.fallbacks)} chunk(s) ran the baseline plan ({pb.fallbacks[0]}).", ""]
    out += _batches_markdown(pb)
    # Profiled predictions are calibrated on measured ops (in-sample where the profile was fitted on
    # this slice): the physical model alone stands beside them.
    cal = any(o.profiled for o in r.ops)
    out += _layers_markdown(r, cal)
    out += _ops_markdown(r, cal)
    out += _collectives_markdown(pb)
    for t in r.ttft:
        out += [
            "",
            f"TTFT extrapolated to {t.topology}, {t.workload}: mean {t.mean_s:.3f} s, p50 {t.p50_s:.3f} s, "
            f"max {t.max_s:.3f} s (unscaled prediction: mean {t.predicted_mean_s or 0:.3f} s). Method: {TTFT_METHOD}.",
        ]
    out.append("")
    return out


def _predicted_head(cal: bool) -> tuple[str, str]:
    """The prediction's columns (calibrated, and the model alone beside it, when profiles priced the ops)
    and their alignment row."""
    pred_h = "calibrated ms | error | model alone ms | error" if cal else "predicted ms | error"
    return pred_h, "---:|---:|" + ("---:|---:|" if cal else "")


def _batches_markdown(pb: PlanBench) -> list[str]:
    """Each batch measured against predicted, and all of them together."""
    r = pb.results
    out = [
        "### Batches",
        "",
        "| batch | tokens | requests | context | measured ms | predicted ms | error |",
        "|---:|---:|---|---|---:|---:|---:|",
    ]
    for b in r.batches:
        out.append(
            f"| {b.index} | {b.tokens} | {','.join(map(str, b.requests))} | {pb.batch_contexts.get(b.index, '')}"
            f" | {ms(b.measured_s)} | {ms(b.predicted_s)} | {err(b.measured_s, b.predicted_s)} |"
        )
    tm = sum(b.measured_s for b in r.batches)
    tp = sum(b.predicted_s or 0 for b in r.batches)
    return [*out, f"| all | | | | {ms(tm)} | {ms(tp)} | {err(tm, tp)} |", ""]


def _layers_markdown(r: BenchResults, cal: bool) -> list[str]:
    """Each layer kind's time (mean over batches), split into communication and compute."""
    pred_h, sep = _predicted_head(cal)
    out = [
        "### Layers (mean over batches)",
        "",
        f"| layer kind | tokens | measured ms | comm ms | compute ms | {pred_h} |",
        f"|---|---:|---:|---:|---:|{sep}",
    ]
    for x in r.layers:
        ops = [o for o in r.ops if o.layer_kind == x.layer_kind and o.tokens == x.tokens]
        alone = None if x.predicted_s is None else x.predicted_s - sum(
            (o.predicted_s or 0.0) - (o.estimate_s or 0.0) for o in ops)  # fmt: skip
        out.append(
            f"| {x.layer_kind} | {x.tokens} | {ms(x.measured_s)} | {ms(x.comm_measured_s)} | "
            f"{ms(x.compute_measured_s)} | {ms(x.predicted_s)} | {err(x.measured_s, x.predicted_s)} |"
            + (f" {ms(alone)} | {err(x.measured_s, alone)} |" if cal else "")
        )
    return out


def _ops_markdown(r: BenchResults, cal: bool) -> list[str]:
    """The ops summed per layer kind and category, then each op."""
    pred_h, sep = _predicted_head(cal)
    out = [
        "",
        "### Ops by category (sum over the layer's ops, mean over batches)",
        "",
        f"| layer kind | category | ops | measured ms | {pred_h} |",
        f"|---|---|---:|---:|{sep}",
    ]
    cats: dict[tuple[str, str], list[OpResult]] = defaultdict(list)
    for o in r.ops:
        cats[(o.layer_kind, o.category or "other")].append(o)
    for (lk, cat), os_ in sorted(cats.items()):
        mm = sum(o.measured_s for o in os_)
        pp = sum(o.predicted_s or 0 for o in os_)
        aa = sum(o.estimate_s or 0 for o in os_)
        out.append(f"| {lk} | {cat} | {len(os_)} | {ms(mm)} | {ms(pp)} | {err(mm, pp)} |"
                   + (f" {ms(aa)} | {err(mm, aa)} |" if cal else ""))  # fmt: skip
    out += [
        "",
        "### Ops",
        "",
        f"| layer kind | op | category | impl | tokens | measured ms | {pred_h} |",
        f"|---|---|---|---|---:|---:|{sep}",
    ]
    for o in r.ops:
        out.append(
            f"| {o.layer_kind} | {o.op} | {o.category} | {o.impl or ''} | {o.tokens} | {ms(o.measured_s)} | "
            f"{ms(o.predicted_s)} | {err(o.measured_s, o.predicted_s)} |"
            + (f" {ms(o.estimate_s)} | {err(o.measured_s, o.estimate_s)} |" if cal else "")
        )
    return out


def _collectives_markdown(pb: PlanBench) -> list[str]:
    """Each collective measured against predicted, and the runtime's overhead over the same call issued
    directly."""
    out = [
        "",
        "### Collectives",
        "",
        "| layer kind | label | kind | shape | dtype | MB | calls | measured us | predicted us | error | "
        "runtime replay us | direct us | runtime overhead |",
        "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for i, c in enumerate(pb.results.collectives):
        rt = pb.runtime_s.get(i)
        ov = f"{rt / c.direct_s - 1:+.1%}" if rt and c.direct_s else ""
        out.append(
            f"| {c.layer_kind or ''} | {c.label} | {c.kind} | {'x'.join(map(str, c.shape))} | {c.dtype} | "
            f"{c.bytes / 1e6:.2f} | {c.iters} | {us(c.measured_s)} | {us(c.predicted_s)} | "
            f"{err(c.measured_s, c.predicted_s)} | {us(rt)} | {us(c.direct_s)} | {ov} |"
        )
    return out


def _summary_markdown(benches: Sequence[PlanBench]) -> list[str]:
    out = [
        "## Summary",
        "",
        "| plan | batches measured ms | predicted ms | error | rank measured | rank predicted | "
        "collective median err | layer worst err |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    tot = {pb.plan: (sum(b.measured_s for b in pb.results.batches),
                     sum(b.predicted_s or 0 for b in pb.results.batches)) for pb in benches}  # fmt: skip
    rank_m = {p: i + 1 for i, p in enumerate(sorted(tot, key=lambda p: tot[p][0]))}
    rank_p = {p: i + 1 for i, p in enumerate(sorted(tot, key=lambda p: tot[p][1]))}
    for pb in benches:
        r = pb.results
        tm, tp = tot[pb.plan]
        cs, ls = error_summary(list(r.collectives)), error_summary(list(r.layers))
        cmed, lmax = cs["median_abs_err"], ls["max_abs_err"]
        out.append(
            f"| {pb.plan} | {ms(tm)} | {ms(tp)} | {err(tm, tp)} | {rank_m[pb.plan]} | {rank_p[pb.plan]} | "
            f"{'' if cmed is None else f'{cmed:.1%}'} | {'' if lmax is None else f'{lmax:.1%}'} |"
        )
    out += ["", "## Targets", "", "| target | value | bar | result | detail |", "|---|---:|---|---|---|"]
    for c in checks(benches):
        res = "n/a" if c.ok is None else ("PASS" if c.ok else "FAIL")
        out.append(f"| {c.name} | {c.value} | {c.bar} | {res} | {c.detail} |")
    out.append("")
    return out


def anchor_rows(benches: Sequence[PlanBench], anchor: Path) -> list[str]:
    """Collectives whose size matches a row of the 2xH200 NCCL probe, measured beside the probe's time."""
    data = json.loads(anchor.read_text())
    probe = {
        ("all_reduce", 7168): "ar_hidden",
        ("reduce_scatter", 7168): "rs_hidden",
        ("all_gather", 7168): "ag_hidden",
        ("all_gather", 2112): "ag_latent",
    }
    out = [
        "## Against the NCCL probe (`" + anchor.name + "`)",
        "",
        "| plan | collective | tokens | measured us | direct us | probe us |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for pb in benches:
        for c in pb.results.collectives:
            if len(c.shape) != 2:
                continue
            key = probe.get((c.kind, c.shape[1]))
            row = next((r for r in data.get("rows", []) if r["T"] == c.shape[0]), None)
            if key and row and key in row:
                out.append(
                    f"| {pb.plan} | {c.label} | {c.shape[0]} | {us(c.measured_s)} | {us(c.direct_s)} | "
                    f"{row[key] * 1e3:.1f} |"
                )
    return [*out, ""]


def ms(x: float | None) -> str:
    return "" if x is None else f"{x * 1e3:.3f}"


def us(x: float | None) -> str:
    return "" if x is None else f"{x * 1e6:.1f}"


def err(meas: float, pred: float | None) -> str:
    return "" if not pred else f"{(pred - meas) / meas:+.1%}"
