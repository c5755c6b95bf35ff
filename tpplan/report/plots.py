"""The memo's plots as PNG bytes (matplotlib, Agg backend: no display, no torch).

Each function takes plain numbers and returns a PNG, so the plots are testable without the
report and the report never depends on a GUI backend.
"""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

# Labels and titles hold names from input files (plans, models): `$` in one is a dollar sign, not
# the start of math text that matplotlib would parse (and refuse, a traceback) (issue 35).
matplotlib.rcParams["text.parse_math"] = False

_DPI = 110


def _png(fig: object) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_DPI, bbox_inches="tight", metadata={"Software": None})  # type: ignore[attr-defined]
    plt.close(fig)  # type: ignore[arg-type]
    return buf.getvalue()


def volume_vs_tp(series: dict[str, list[tuple[int, float]]], title: str) -> bytes:
    """Communication bytes per token per rank against the TP size, one line per plan."""
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for name, pts in series.items():
        if not pts:
            continue
        xs, ys = zip(*sorted(pts), strict=True)
        ax.plot(xs, [y / 1e6 for y in ys], marker="o", label=name)
    ax.set_xscale("log", base=2)
    ticks = sorted({x for pts in series.values() for x, _ in pts})
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.set_xlabel("TP size N")
    ax.set_ylabel("MB per token per rank (ring)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _png(fig)


def stacked_time(data: dict[str, dict[str, float]], title: str, ylabel: str = "ms per batch") -> bytes:
    """One bar per plan, stacked by layer kind (values in seconds, drawn in ms)."""
    plans = list(data)
    kinds: list[str] = []
    for parts in data.values():
        kinds += [k for k in parts if k not in kinds]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(plans) + 2), 4.4))
    bottom = [0.0] * len(plans)
    for kind in kinds:
        vals = [data[p].get(kind, 0.0) * 1e3 for p in plans]
        ax.bar(plans, vals, bottom=bottom, label=kind)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.tick_params(axis="x", labelrotation=25)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return _png(fig)


def grouped_bars(data: dict[str, dict[str, float]], title: str, ylabel: str) -> bytes:
    """Bars grouped by plan, one bar per series (e.g. workload C=8 and C=16), values in seconds."""
    plans = list(data)
    series: list[str] = []
    for parts in data.values():
        series += [s for s in parts if s not in series]
    width = 0.8 / max(1, len(series))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(plans) + 2), 4.4))
    for i, s in enumerate(series):
        xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(plans))]
        ax.bar(xs, [data[p].get(s, 0.0) for p in plans], width=width, label=s)
    ax.set_xticks(range(len(plans)), plans, rotation=25)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return _png(fig)


def predicted_vs_measured(points: list[tuple[str, float, float]], title: str) -> bytes:
    """Scatter of (category, predicted s, measured s) on log axes with the y = x line."""
    fig, ax = plt.subplots(figsize=(5.8, 5.0))
    cats = list(dict.fromkeys(c for c, _, _ in points))
    for c in cats:
        xs = [m * 1e3 for cc, _, m in points if cc == c]
        ys = [p * 1e3 for cc, p, _ in points if cc == c]
        ax.scatter(xs, ys, label=c, s=18)
    vals = [v * 1e3 for _, p, m in points for v in (p, m) if v > 0]
    if vals:
        lo, hi = min(vals) / 1.5, max(vals) * 1.5
        ax.plot([lo, hi], [lo, hi], color="grey", lw=1, ls="--", label="predicted = measured")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured (ms)")
    ax.set_ylabel("predicted (ms)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    return _png(fig)


def crossover(series: dict[tuple[str, str], list[tuple[int, float]]], title: str) -> bytes:
    """Plan time / baseline time against tokens per step: one panel per layer kind, one line per
    plan; below the dashed line at 1 the plan is faster."""
    kinds = list(dict.fromkeys(k for k, _ in series))
    cols = min(3, max(1, len(kinds)))
    rows = -(-len(kinds) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False, sharey=True)
    for ax, kind in zip(axes.flat, kinds, strict=False):
        for (k, plan), pts in series.items():
            if k != kind or not pts:
                continue
            xs, ys = zip(*pts, strict=True)
            ax.plot(xs, ys, marker=".", label=plan)
        ax.axhline(1.0, color="grey", lw=1, ls="--")
        ax.set_xscale("log", base=2)
        ax.set_title(kind, fontsize=9)
        ax.set_xlabel("new tokens per step")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(kinds) :]:
        ax.axis("off")
    axes[0][0].set_ylabel("plan time / baseline time")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.suptitle(title)
    fig.tight_layout(h_pad=1.6)
    fig.legend(handles, labels, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=4)
    return _png(fig)
