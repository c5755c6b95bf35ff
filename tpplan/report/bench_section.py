"""The memo's last section: a GPU benchmark's measurements beside the predictions.

Only present with `--bench results.json` (docs/bench-json.md). Measured times are labelled
measured; the extrapolated whole-model TTFT is labelled as an extrapolation from the slice.
"""

from __future__ import annotations

from types import ModuleType

from tpplan.bench_results import BenchResults, TTFTExtrapolation, error_summary
from tpplan.cost.provenance import run_provenance
from tpplan.cost.workload import canonical_workload
from tpplan.report.doc import Block, Heading, Image, Para, Table
from tpplan.report.results import Analysis, ttft_mean

PNG_BENCH = "predicted_vs_measured.png"


def _provenance(r: BenchResults) -> str:
    """What priced the bench's predictions and their band, from its own rows (`run_provenance`), when its
    topology is one this build knows."""
    p = run_provenance(r)
    return f"topology {r.topology} not in this build: provenance unknown" if p is None else "predictions: " + p.short()


def bench_section(a: Analysis, command: str, plots: ModuleType, pngs: dict[str, bytes]) -> list[Block]:
    """Measured against predicted: per level error, runtime overhead, worst collectives, TTFT."""
    if a.bench is None:
        return []
    br = a.bench
    b: list[Block] = [Heading("Measured against predicted")]
    b.append(
        Para(
            f"`{br.meta.command}` on {br.meta.machine} ({br.meta.gpus} x {br.meta.gpu}), {br.meta.date:%Y-%m-%d}, "
            f"torch {br.meta.torch_version}, NCCL {br.meta.nccl_version or '?'}; plan `{br.plan}` TP{br.tp}; "
            f"slice: {br.model_slice.description}; predictions on topology `{br.topology}` ({_provenance(br)}). "
            "Measured times are measured; the error columns are the prediction's."
        )
    )
    table, pts = _errors_by_level(br)
    b.append(table)
    b += _overheads(br)
    if pts:
        pngs[PNG_BENCH] = plots.predicted_vs_measured(pts, f"{br.plan} TP{br.tp}: predicted vs measured")
        b.append(Image(PNG_BENCH, "predicted against measured time per item", pngs[PNG_BENCH]))
    worst = _worst_collectives(br)
    if worst is not None:
        b.append(worst)
    for t in br.ttft:
        pred = f" (predicted {t.predicted_mean_s:.3f} s)" if t.predicted_mean_s is not None else ""
        b.append(
            Para(
                f"Whole-model TTFT on `{t.topology}` at `{t.workload}`, extrapolated from the slice's measured/"
                f"predicted ratios (tpplan's own runtime kernels, not a serving engine): mean {t.mean_s:.3f} s{pred}, "
                f"p50 {t.p50_s:.3f} s, max {t.max_s:.3f} s." + memo_vs_bench_ttft(a, t)
            )
        )
    return b


def _errors_by_level(br: BenchResults) -> tuple[Table, list[tuple[str, float, float]]]:
    """The prediction's error per level (collective, op, layer, batch) against the issue's targets, and
    every (level, predicted, measured) point for the plot."""
    rows: list[tuple[str, ...]] = []
    pts: list[tuple[str, float, float]] = []
    for name, items in (
        ("collective", br.collectives),
        ("op", br.ops),
        ("layer", br.layers),
        ("batch", br.batches),
    ):
        s = error_summary(list(items))
        med = "-" if s["median_abs_err"] is None else f"{100 * float(s['median_abs_err']):.1f}%"
        mx = "-" if s["max_abs_err"] is None else f"{100 * float(s['max_abs_err']):.1f}%"
        rows.append((name, str(len(items)), str(s["n"]), med, mx))
        pts += [(name, i.predicted_s, i.measured_s) for i in items if i.predicted_s is not None]
    targets = {"collective": "median <= 5%", "layer": "<= 10%"}
    rows = [(*r, targets.get(r[0], "")) for r in rows]
    head = ("level", "measured", "with prediction", "median abs error", "worst", "issue target")
    return Table(head, tuple(rows), (1, 2, 3, 4)), pts


def _overheads(br: BenchResults) -> list[Block]:
    """The runtime's overhead: its collectives against the same calls issued directly, and the GPU's idle
    share of the plan's own pass."""
    b: list[Block] = []
    over = [c.measured_s / c.direct_s - 1.0 for c in br.collectives if c.direct_s]
    if over:
        over.sort()
        mid = over[len(over) // 2] if len(over) % 2 else (over[len(over) // 2 - 1] + over[len(over) // 2]) / 2
        b.append(
            Para(
                f"Runtime overhead of the plan's collectives over the same calls issued directly with "
                f"torch.distributed ({len(over)} measured): median {100 * mid:+.1f}%, worst {100 * over[-1]:+.1f}% "
                "(target: at most +3%)."
            )
        )
    ro = br.runtime_overhead
    if ro is not None:
        b.append(
            Para(
                f"Inside the plan's own run the GPU sat idle {100 * ro.overhead:.1f}% of a pass without probe "
                f"events ({1e3 * ro.pass_s:.1f} ms pass, {1e3 * ro.busy_s:.1f} ms busy over {ro.kernels} kernels, "
                f"profiled; target: at most 3%): {'within' if ro.overhead <= 0.03 else 'over'} the target."
            )
        )
    return b


def _worst_collectives(br: BenchResults) -> Table | None:
    """The eight collectives the prediction missed most (None: none has a prediction)."""
    with_err = [c for c in br.collectives if c.rel_error is not None]
    worst = sorted(with_err, key=lambda c: -abs(c.rel_error or 0.0))[:8]
    if not worst:
        return None
    return Table(
        ("collective", "shape", "bytes", "measured ms", "predicted ms", "error"),
        tuple(
            (
                c.label or c.kind,
                "x".join(map(str, c.shape)),
                f"{c.bytes:,}",
                f"{c.measured_s * 1e3:.3f}",
                f"{(c.predicted_s or 0.0) * 1e3:.3f}",
                f"{100 * (c.rel_error or 0.0):+.1f}%",
            )
            for c in worst
        ),
        (2, 3, 4, 5),
    )


def memo_vs_bench_ttft(a: Analysis, t: TTFTExtrapolation) -> str:
    """Whether the bench's extrapolated TTFT and the memo's prediction for the same target (plan,
    topology, TP, workload) agree within the memo's band, and why not when they do not; empty when
    the bench's target is not one the memo predicts."""
    br = a.bench
    assert br is not None
    if t.target is not None and t.tp is not None:  # the structured target (files since 2026-12-01)
        same_topology = (t.target, t.nodes, t.tp) == (a.topology.name, a.topology.nodes, a.tp)
    else:  # older files name the target in text only: "<topology>[ xN nodes] (TP<n>)"
        same_topology = t.topology.startswith(f"{a.topology.name} ") and t.topology.endswith(f"(TP{a.tp})")
    v = next((v for v in a.variants if v.plan.name == br.plan and v.shape == (a.tp, 1, 1, 1)), None)
    memo_s = ttft_mean(v, canonical_workload(t.workload)) if v is not None and same_topology else None
    if memo_s is None or memo_s <= 0:
        return ""
    gap = t.mean_s / memo_s - 1.0
    band = a.provenance.band
    head = (
        f" The memo predicts {memo_s:.3f} s for `{br.plan}` on this target; the extrapolation is "
        f"{100 * gap:+.1f}% from it"
    )
    if abs(gap) <= band:
        return head + f", inside the memo's ±{100 * band:.1f}% band: they agree."
    why = ""
    if t.predicted_mean_s:
        scale = t.mean_s / t.predicted_mean_s
        why = (
            f" The extrapolation multiplies the prediction by the slice's measured/predicted ratios (together "
            f"x{scale:.2f} here): it carries the error of the cost model on the bench's kernels on "
            f"{br.meta.gpu}, which the memo's prediction does not"
        )
    return head + f", outside the memo's ±{100 * band:.1f}% band: they differ.{why}."
