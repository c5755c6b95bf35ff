"""The bench's targets (docs/benchmarks.md) judged on results, and the analyses they rest on.

Per plan: collective median |error|, worst layer |error|, the runtime's overhead on collectives
and (with `bench --overhead`) inside the plan's own run, and against the baseline plan the
measured / predicted saving (skipped below the run's own noise) and each layer predicted with
the baseline's op speeds (`layers_calibrated_on`).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from tpplan.bench.clocks import clock_state
from tpplan.bench.config import TARGET_BATCH, TARGET_COLLECTIVE_MEDIAN, TARGET_LAYER, TARGET_OVERHEAD, TARGET_SAVING
from tpplan.bench.results import PlanBench
from tpplan.bench_results import BenchResults, CollectiveResult, LayerResult, OpResult, error_summary


@dataclass
class Check:
    """One target: its value, the bar, pass/fail (None: not applicable) and what it measured."""

    name: str
    value: str
    bar: str
    ok: bool | None
    detail: str = ""


def _at_most(name: str, value: float | None, bar: float, detail: str, fmt: str = ".1%") -> Check:
    """The target `value <= bar` (None: nothing measured, so not applicable)."""
    return Check(name, "" if value is None else format(value, fmt), f"<= {bar:.0%}",
                 None if value is None else value <= bar, detail)  # fmt: skip


def checks(benches: Sequence[PlanBench]) -> list[Check]:
    """Issue 5's targets on these results (see the module constants)."""
    out: list[Check] = []
    for pb in benches:
        out += _accuracy_checks(pb) + _overhead_checks(pb)
    base = next((pb for pb in benches if pb.plan == "baseline"), None)
    if base is not None:
        bm = sum(b.measured_s for b in base.results.batches)
        bp = sum(b.predicted_s or 0.0 for b in base.results.batches)
        for pb in benches:
            if pb is not base:
                out += _saving_checks(base, pb, bm, bp)
    for pb in benches:
        if base is not None and pb is not base:
            out += _calibrated_checks(base, pb)
    return out


def _accuracy_checks(pb: PlanBench) -> list[Check]:
    """Collective and layer errors of one plan's run (and the layers without a plain recurrence kernel)."""
    out: list[Check] = []
    r = pb.results
    cs = error_summary(list(r.collectives))
    med = cs["median_abs_err"]
    per_call = call_weighted_median_error(r.collectives)
    out.append(
        _at_most(
            f"{pb.plan}: collective median |error|",
            med,
            TARGET_COLLECTIVE_MEDIAN,
            f"{cs['n']} collectives, worst {cs['max_abs_err'] or 0:.1%}"
            + ("" if per_call is None else f"; median over every call issued {per_call:.1%}"),
        )
    )
    ls = error_summary(list(r.layers))
    worst = ls["max_abs_err"]
    out.append(
        _at_most(
            f"{pb.plan}: layer |error| (worst)",
            worst,
            TARGET_LAYER,
            ", ".join(f"{x.layer_kind} {x.rel_error:+.1%}" for x in r.layers if x.rel_error is not None),
        )
    )
    nore = _layers_without(r, "recurrence")
    plain_recurrence = any(o.category == "recurrence" and not (o.impl or "").startswith("fla") for o in r.ops)
    if nore and plain_recurrence and not any(o.profiled for o in r.ops):
        w2 = max(abs(e) for _, e in nore)
        out.append(
            _at_most(
                f"{pb.plan}: layer |error| without the recurrence kernel",
                w2,
                TARGET_LAYER,
                "the recurrence runs a plain-torch chunked kernel, the model prices an fla-class one; "
                + ", ".join(f"{k} {e:+.1%}" for k, e in nore),
            )
        )
    return out


def _overhead_checks(pb: PlanBench) -> list[Check]:
    """The runtime's overhead on collectives and in the plan's own run, and GPU time vs predicted."""
    out: list[Check] = []
    r = pb.results
    timed = [(i, c) for i, c in enumerate(r.collectives) if c.direct_s]
    direct_all = sum(c.direct_s * c.iters for _, c in timed if c.direct_s)
    inplan = sum(c.measured_s * c.iters for _, c in timed)
    if direct_all > 0 and pb.runtime_s:
        # weighted by how often the plan issues each collective
        rt = sum(pb.runtime_s[i] * c.iters for i, c in timed if i in pb.runtime_s)
        dr = sum(c.direct_s * c.iters for i, c in timed if i in pb.runtime_s and c.direct_s)
        ov = rt / dr - 1
        out.append(
            _at_most(
                f"{pb.plan}: runtime overhead on collectives",
                ov,
                TARGET_OVERHEAD,
                "same tensors in a tight loop, runtime's Comm vs bare torch.distributed; "
                f"in the plan's own run the collectives took {inplan / direct_all - 1:+.1%} vs direct",
                fmt="+.1%",
            )
        )
    elif direct_all > 0:  # from results files: only the in-plan times are kept
        ov = inplan / direct_all - 1
        out.append(
            _at_most(
                f"{pb.plan}: collectives in the plan's run vs direct",
                ov,
                TARGET_OVERHEAD,
                "measured_s vs direct_s, weighted by calls (includes the ranks' skew and launch gaps)",
                fmt="+.1%",
            )
        )
    ro = r.runtime_overhead
    if ro is not None:
        inst = sum(b.measured_s for b in r.batches)
        out.append(
            _at_most(
                f"{pb.plan}: runtime overhead in the plan's own run",
                ro.overhead,
                TARGET_OVERHEAD,
                f"GPU idle share of one pass without probe events: {ro.pass_s * 1e3:.1f} ms pass, "
                f"{ro.busy_s * 1e3:.1f} ms busy over {ro.kernels} kernels; the probed passes' batches "
                f"sum to {inst / ro.pass_s - 1:+.1%} of the pass{_clock_note(ro.clocks)}",
                fmt="+.1%",
            )
        )
        pred = sum(b.predicted_s or 0.0 for b in r.batches)
        if pred > 0:
            out.append(
                _at_most(
                    f"{pb.plan}: predicted GPU time vs busy time",
                    abs(pred / ro.busy_s - 1.0),
                    TARGET_BATCH,
                    f"the batches' predicted sum {pred * 1e3:.1f} ms vs the GPU's busy time in one pass "
                    f"{ro.busy_s * 1e3:.1f} ms ({pred / ro.busy_s - 1:+.1%}): the models price GPU time, the "
                    f"overhead row is the host's share{state_note(ro.clocks, r.topology)}",
                )
            )
    return out


def _saving_checks(base: PlanBench, pb: PlanBench, bm: float, bp: float) -> list[Check]:
    """The measured share of the saving predicted vs the baseline (`bm`, `bp`: its measured and
    predicted sums), or why it is not judged."""
    out: list[Check] = []
    m = sum(b.measured_s for b in pb.results.batches)
    p = sum(b.predicted_s or 0.0 for b in pb.results.batches)
    pred_saving, meas_saving = bp - p, bm - m
    if pred_saving <= 0:
        out.append(
            Check(
                f"{pb.plan}: saving vs baseline",
                f"predicted {pred_saving * 1e3:+.2f} ms",
                "n/a (not predicted to save)",
                None,
                f"measured saving {meas_saving * 1e3:+.2f} ms over the workload",
            )
        )
        return out
    noise = saving_noise(base.results, pb.results)
    if noise is not None and pred_saving < 2 * noise:
        out.append(
            Check(
                f"{pb.plan}: measured / predicted saving vs baseline",
                f"predicted {pred_saving * 1e3:+.2f} ms",
                "n/a (below the run's resolution)",
                None,
                f"predicted saving < 2 sigma of the measured difference ({2 * noise * 1e3:.2f} ms, from the "
                f"spread of identical batches); measured {meas_saving * 1e3:+.2f} ms",
            )
        )
        return out
    share = meas_saving / pred_saving
    out.append(
        Check(
            f"{pb.plan}: measured / predicted saving vs baseline",
            f"{share:.0%}",
            f">= {TARGET_SAVING:.0%}",
            share >= TARGET_SAVING,
            f"measured {meas_saving * 1e3:.2f} ms, predicted {pred_saving * 1e3:.2f} ms over the workload's batches",
        )
    )
    return out


def _calibrated_checks(ref: PlanBench, pb: PlanBench) -> list[Check]:
    """The layer error once each op's speed is calibrated on the baseline run (`ref`)."""
    out: list[Check] = []
    rows = layers_calibrated_on(ref.results, pb.results)
    if not rows:
        return out
    err = max(rows, key=lambda row: abs(row[3]))[3]
    out.append(
        _at_most(
            f"{pb.plan}: layer |error| with op speeds calibrated on baseline",
            abs(err),
            TARGET_LAYER,
            "each op's measured/predicted ratio on the baseline run scales the same op here; "
            + ", ".join(f"{k} {e:+.1%}" for k, _, _, e in rows),
        )
    )
    return out


def _clock_note(clocks: dict[str, float] | None) -> str:
    """'; SM clock ... MHz mean, ... min, ... W (state)' from a pass's NVML samples ('' without them)."""
    if not clocks:
        return ""
    state = clock_state(clocks)
    return (f"; SM clock {clocks['sm_mhz_mean']:.0f} MHz mean, {clocks['sm_mhz_min']:.0f} min, "
            f"{clocks['power_w_mean']:.0f} W" + ("" if state is None else f" ({state})"))  # fmt: skip


def topology_clock_state(topology: str | None) -> str | None:
    """The clock state a topology's kernel models price ("boost" / "power-capped"); None where it has
    none, no topology was recorded, or it cannot be loaded here (a recorded run's topology file elsewhere)."""
    from tpplan.cost.kernel_models import KernelModels
    from tpplan.cost.topology import load_topology
    from tpplan.errors import TpplanError

    if topology is None:
        return None
    try:
        models = load_topology(topology).gpu.kernel_models
    except (TpplanError, OSError):
        return None
    return KernelModels(models).clock_state if models else None


def state_note(clocks: dict[str, float] | None, topology: str | None) -> str:
    """Where the run's measured clock state and the one its topology prices differ, say so ('' else)."""
    ran, priced = clock_state(clocks), topology_clock_state(topology)
    if ran is None or priced is None or ran == priced:
        return ""
    return (f"; the run was {ran} but {topology}'s kernel models price {priced} clocks: re-predict with a "
            f"{ran} topology")  # fmt: skip


def call_weighted_median_error(colls: Sequence[CollectiveResult]) -> float | None:
    """Median |relative error| over every collective call the plan issued (each row counts `iters`
    times). The target is judged per distinct collective (row); this says how much of the plan's
    traffic that median stands for when a few odd-sized, rarely issued rows sit near the middle."""
    weighted = sorted((abs(c.rel_error), c.iters) for c in colls if c.rel_error is not None)
    total = sum(w for _, w in weighted)
    if not total:
        return None
    seen = 0
    for err, w in weighted:
        seen += w
        if seen * 2 >= total:
            return err
    return weighted[-1][0]


def saving_noise(a: BenchResults, b: BenchResults) -> float | None:
    """Standard deviation of (total of a's batches - total of b's), from each run's own spread.

    Batches with the same prediction have the same shape and context (the seed workload has two
    such groups of eight): their measured spread is run noise. Var(total) = sum over groups of
    n x var(group); the two runs are independent. None when no group has two batches.
    """
    var = 0.0
    found = False
    for r in (a, b):
        groups: dict[float, list[float]] = defaultdict(list)
        for x in r.batches:
            if x.predicted_s is not None:
                groups[round(x.predicted_s, 9)].append(x.measured_s)
        for vals in groups.values():
            if len(vals) > 1:
                found = True
                var += len(vals) * statistics.variance(vals)
    return math.sqrt(var) if found else None


def _layer_ops(r: BenchResults, layer: LayerResult) -> list[OpResult]:
    """The ops measured inside one layer entry (same layer kind, same token count)."""
    return [o for o in r.ops if o.layer_kind == layer.layer_kind and o.tokens == layer.tokens]


def op_speed_factors(ref: BenchResults) -> tuple[dict[tuple[str, str], float], dict[str, float]]:
    """measured / predicted per (layer kind, op) on a reference plan, and per op category.

    The factors say how fast the kernels that really ran are compared with the model's kernel
    assumptions (the runtime's plain-torch norms, convs and recurrence are far slower than serving
    kernels). Applied to another plan's predicted ops, they test what the model adds beyond
    kernel speed: how each plan changes every op's shape and share, and its collectives.
    """
    per_op = {(o.layer_kind, o.op): o.measured_s / o.predicted_s for o in ref.ops if o.predicted_s}
    sums: dict[str, list[float]] = {}
    for o in ref.ops:
        if o.predicted_s and o.category:
            acc = sums.setdefault(o.category, [0.0, 0.0])
            acc[0] += o.measured_s
            acc[1] += o.predicted_s
    return per_op, {c: m / p for c, (m, p) in sums.items() if p > 0}


def layers_calibrated_on(ref: BenchResults, run: BenchResults) -> list[tuple[str, float, float, float]]:
    """Per layer kind of `run`: (kind, measured s, predicted s with `ref`'s op speeds, relative error).

    Layer prediction = sum over the layer's ops of predicted x the reference's factor for that op
    (its category's factor for an op the reference lacks) + the layer's predicted collectives
    (layer predicted minus its ops, unscaled: collectives are calibrated by `tpplan calibrate`).
    """
    per_op, per_cat = op_speed_factors(ref)
    out = []
    for layer in run.layers:
        if layer.predicted_s is None:
            continue
        ops = [o for o in _layer_ops(run, layer) if o.predicted_s]
        raw = sum(o.predicted_s or 0.0 for o in ops)
        scaled = sum(
            (o.predicted_s or 0.0) * per_op.get((o.layer_kind, o.op), per_cat.get(o.category or "", 1.0)) for o in ops
        )
        pred = scaled + max(0.0, layer.predicted_s - raw)
        out.append((layer.layer_kind, layer.measured_s, pred, (pred - layer.measured_s) / layer.measured_s))
    return out


def _layers_without(r: BenchResults, category: str) -> list[tuple[str, float]]:
    """Per layer kind: error of (layer - ops of `category`), measured and predicted alike."""
    out = []
    for layer in r.layers:
        ops = _layer_ops(r, layer)
        cat = [o for o in ops if o.category == category]
        if not cat or layer.predicted_s is None:
            continue
        m = layer.measured_s - sum(o.measured_s for o in cat)
        p = layer.predicted_s - sum(o.predicted_s or 0.0 for o in cat)
        if m > 0:
            out.append((layer.layer_kind, (p - m) / m))
    return out


def checks_ok(benches: Sequence[PlanBench]) -> bool:
    """True when no applicable target fails."""
    return all(c.ok is not False for c in checks(benches))
