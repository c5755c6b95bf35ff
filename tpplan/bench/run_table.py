"""Per-layer measured vs predicted over several recorded bench runs, as one markdown table (docs/benchmarks.md).

Every number comes from the results files (`bench_results`): the layer rows' mean measured and predicted
times, their error, the slice and what the card's memory cut (`ModelSlice.sized`), and the attention op's
own row, whose implementation (a window, a chunk, sinks, DSA's reference) explains most misses."""

from __future__ import annotations

from pathlib import Path

from tpplan.bench.host_ahead import timing_line
from tpplan.bench_results import load_bench_results


def layer_rows(paths: list[Path]) -> str:
    """One row per (run, layer kind, tokens): the card, the slice, measured and predicted ms, the error, and
    the layer's attention ops measured / predicted."""
    head = ("| run | card | slice (what the card's memory cut) | layer kind | tokens | measured ms | predicted ms | "
            "error | attention op: measured / predicted ms |")  # fmt: skip
    lines = [head, "|---|---|---|---|---:|---:|---:|---:|---|"]
    for path in paths:
        r = load_bench_results(path, "from_files=")
        cut = r.model_slice.sized or "nothing cut"
        slice_text = f"{r.model_slice.experts or 0} experts; {cut}"
        for layer in r.layers:
            att = [o for o in r.ops if o.layer_kind == layer.layer_kind and o.category == "attention"
                   and o.tokens == layer.tokens]  # fmt: skip
            att_text = ", ".join(f"{o.op} {1e3 * o.measured_s:.2f} / {1e3 * (o.predicted_s or 0):.2f}" for o in att)
            err = (layer.predicted_s or 0) / layer.measured_s - 1
            lines.append(f"| {path.parent.name}/{path.stem} | {r.meta.gpu} | {slice_text} | {layer.layer_kind} | "
                         f"{layer.tokens} | {1e3 * layer.measured_s:.3f} | {1e3 * (layer.predicted_s or 0):.3f} | "
                         f"{100 * err:+.1f}% | {att_text} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def timing_rows(issued: Path, ahead: Path) -> str:
    """Two runs of one command, as issued and with the host ahead (`bench --timing`): per op and layer, the
    measured ms of each, their ratio and the prediction; then each run's layers, batches and timing record.
    Where the ratio is far below 1 the as-issued span measured the host's issue, not the kernels."""
    a, b = (load_bench_results(p, "from_files=") for p in (issued, ahead))
    lines = [f"| op ({a.model}) | layer kind | as issued ms | host ahead ms | ahead / issued | predicted ms |",
             "|---|---|---:|---:|---:|---:|"]  # fmt: skip
    theirs = {(o.layer_kind, o.op, o.tokens): o for o in b.ops}
    for o in a.ops:
        other = theirs.get((o.layer_kind, o.op, o.tokens))
        if other is None:
            continue
        lines.append(f"| {o.op} | {o.layer_kind} | {1e3 * o.measured_s:.3f} | {1e3 * other.measured_s:.3f} | "
                     f"{other.measured_s / o.measured_s:.2f} | {1e3 * (o.predicted_s or 0):.3f} |")  # fmt: skip
    for la in a.layers:
        lb = next((x for x in b.layers if (x.layer_kind, x.tokens) == (la.layer_kind, la.tokens)), None)
        if lb is not None:
            lines.append(f"| **layer** | {la.layer_kind} | {1e3 * la.measured_s:.3f} | {1e3 * lb.measured_s:.3f} | "
                         f"{lb.measured_s / la.measured_s:.2f} | {1e3 * (la.predicted_s or 0):.3f} |")  # fmt: skip
    sums = [sum(x.measured_s for x in r.batches) for r in (a, b)]
    if all(sums):
        lines.append(f"| **{len(a.batches)} batches** | all | {1e3 * sums[0]:.3f} | {1e3 * sums[1]:.3f} | "
                     f"{sums[1] / sums[0]:.2f} | {1e3 * sum(x.predicted_s or 0 for x in a.batches):.3f} |")  # fmt: skip
    lines += ["", f"- as issued: {timing_line(a.timing)}", f"- host ahead: {timing_line(b.timing)}"]
    return "\n".join(lines) + "\n"


__all__ = ["layer_rows", "timing_rows"]
