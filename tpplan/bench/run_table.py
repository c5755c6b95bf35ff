"""Per-layer measured vs predicted over several recorded bench runs, as one markdown table (docs/benchmarks.md).

Every number comes from the results files (`bench_results`): the layer rows' mean measured and predicted
times, their error, the slice and what the card's memory cut (`ModelSlice.sized`), and the attention op's
own row, whose implementation (a window, a chunk, sinks, DSA's reference) explains most misses."""

from __future__ import annotations

from pathlib import Path

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


__all__ = ["layer_rows"]
