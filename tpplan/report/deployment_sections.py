"""The memo's deployment sections: TP, PP, CP and their mixes ranked per workload with their reasons
and engine flags (`deployments.py`), why CP deployments do not fit, and the prompt-length thresholds
(`prompt_length.py`). Every sentence is made from the values printed beside it."""

from __future__ import annotations

from itertools import pairwise
from types import ModuleType
from typing import Any

from tpplan.report.doc import Block, Bullets, Heading, Para, Table
from tpplan.report.results import Analysis
from tpplan.report.rows import fig, label_of
from tpplan.units import gib, pct_change, signed_pct

_Pngs = dict[str, Any]


def _ttft_cell(t: float | None) -> str:
    return "-" if t is None else fig(t)


def deployments_section(a: Analysis, command: str, plots: ModuleType, pngs: _Pngs) -> list[Block]:
    """TP, PP, CP and their mixes ranked per workload, each with its reason and engine flags."""
    if not a.deployments:
        return []
    cap = a.memory_cap_bytes
    cap_txt = f"the memory cap of {gib(cap)}" if cap != float("inf") else "no memory cap"
    ref = label_of((*a.grid[0], None)) if a.grid else "-"
    grid = ", ".join(f"`{label_of((*g, None))}`" for g in a.grid)
    b: list[Block] = [
        Heading("Deployments ranked: TP, PP, CP and their mixes"),
        Para(
            f"One row per deployment of `tpplan search`'s grid ({grid}"
            + (f"; micro-batch overlap `{a.overlap}` where a plan has all-to-all experts" if a.overlap else "")
            + f"): the fastest plan this memo priced there that fits under {cap_txt} (baseline at every deployment, "
            "the engines' MoE all-to-all plans and the search's best where they run). Each reason compares one chunk's "
            f"predicted parts with the reference deployment `{ref}` (the search's first, where it takes its baseline); "
            "a deployment where nothing fits is listed after the ranked ones with what puts it over the cap. "
            f"Predicted, {a.provenance.label} (band ±{100 * a.provenance.band:.1f}%)." + cp_kv_sentence(a)
        ),
    ]
    for w, rows in a.deployments.items():
        best = next((r.ttft_s for r in rows if r.rank == 1), None)
        b.append(Heading(f"At `{w}`", 3))
        b.append(Table(
            ("rank", "deployment", "plan", "mean TTFT s", "vs best", "memory/rank", "fits"),
            tuple(
                (
                    str(r.rank) if r.rank else "-",
                    f"`{r.label}`",
                    f"`{r.variant}`",
                    _ttft_cell(r.ttft_s),
                    signed_pct(pct_change(r.ttft_s, best)) if r.ttft_s is not None and best else "-",
                    gib(r.memory_bytes) if r.memory_bytes is not None else "-",
                    "yes" if r.fits else "NO",
                )
                for r in rows
            ),
            (0, 3, 4, 5),
        ))  # fmt: skip
        b.append(Bullets(tuple(f"`{r.label}`: {r.reason}. Flags: " + "; ".join(r.flags) + "." for r in rows)))
    cp_note = _cp_memory_note(a)
    if cp_note:
        b.append(Para(cp_note))
    return b


def cp_kv_sentence(a: Analysis) -> str:
    """Which KV cache a CP rank is priced with (`--cp-kv`), where the grid has CP deployments."""
    from tpplan.engines.context_parallel import CP_KV_MODES

    if not any(g[2] > 1 for g in a.grid):
        return ""
    other = "sharded" if a.cp_kv == "engines" else "engines"
    return (
        f" CP memory is priced with `--cp-kv {a.cp_kv}`: {CP_KV_MODES[a.cp_kv]} (`--cp-kv {other}`: "
        f"{CP_KV_MODES[other].split(' (')[0].split(':')[0]})."
    )


def _cp_memory_note(a: Analysis) -> str | None:
    """Why the CP rows are over the cap, from their predicted memory, and how the engines' CP differs."""
    from tpplan.engines.launch import PREFILL_CP

    rows = next(iter(a.deployments.values()), [])
    over = [r for r in rows if r.key[2] > 1 and not r.fits]
    if not over:
        return None
    ref = next((r for r in rows if r.key[:4] == tuple(a.grid[0])), None) if a.grid else None
    parts = []
    weights_alone = True  # every over-cap CP row's weights exceed the cap by themselves
    for r in over:
        v = a.variant(r.variant)
        if v is None:
            continue
        m = next(iter(v.predictions.values())).memory
        weights_alone = weights_alone and m.weights > a.memory_cap_bytes
        parts.append(
            f"`{r.label}` holds {gib(m.weights)} of weights per rank, {gib(m.kv_cache)} of KV cache and "
            f"{gib(m.activations)} of activations"
        )
    ref_v = a.variant(ref.variant) if ref is not None else None
    ref_txt = ""
    if ref_v is not None and ref_v.predictions:
        rm = next(iter(ref_v.predictions.values())).memory
        ref_txt = f" (the reference `{ref.label}`: {gib(rm.weights)} of weights)"  # type: ignore[union-attr]
    diffs = "; ".join(f"{c.engine}: {c.path.differences[0]}" for c in PREFILL_CP.values())
    kv = "the whole sequence's KV cache on every CP rank, as the engines keep it" if a.cp_kv == "engines" else (
        "1/CP of the KV cache on each rank (`--cp-kv sharded`: tpplan's own accounting, no engine's)"
    )  # fmt: skip
    return (
        "Why the CP deployments do not fit: tpplan prices TP x CP as CP groups each holding a TP-wide share of "
        f"every layer, with {kv}"
        + (", so the weights alone exceed the cap: " if weights_alone else ": ") + "; ".join(parts)
        + ref_txt + f", against {gib(a.memory_cap_bytes)}. The engines' CP differs from that model: {diffs}."
    )  # fmt: skip


def prompt_length_section(a: Analysis, command: str, plots: ModuleType, pngs: _Pngs) -> list[Block]:
    """From which prompt length CP beats the best CP-1 deployment, and TP x PP beats TP alone."""
    if not a.length_points:
        return []
    keys = [k for k, pts in a.length_points.items() if pts]
    lengths = sorted({p.length for k in keys for p in a.length_points[k]})
    by = {k: {p.length: p for p in a.length_points[k]} for k in keys}
    heads = [next(iter(by[k].values())).deployment for k in keys]
    rows = tuple(
        (f"{t:,}", *(("-" if (p := by[k].get(t)) is None else fig(p.ttft_s) + ("" if p.fits else " (over)"))
                     for k in keys))
        for t in lengths
    )  # fmt: skip
    w = a.workloads[0]
    cap = a.memory_cap_bytes / 2**30 if a.memory_cap_bytes != float("inf") else None
    return [
        Heading("Prompt length: where CP and PP overtake"),
        Para(
            f"Each deployment's plan from the ranking at `{w.name}` (columns), priced at prompt lengths "
            f"{lengths[0]:,}-{lengths[-1]:,} tokens with `{w.name}`'s concurrency ({w.concurrency}), chunk "
            f"({w.chunk_size:,}) and requests kept: mean TTFT in seconds, `(over)` where the predicted memory per rank "
            "exceeds the cap at that length. Crossings between the best fitting deployment of each group are "
            "interpolated in log(prompt length)."
        ),
        Table(("prompt tokens", *(f"`{h}`" for h in heads)), rows, tuple(range(len(heads) + 1))),
        Bullets(tuple(r.sentence(cap) for r in a.length_races)),
        *([Para(stops)] if (stops := _where_fit_ends(a)) else []),
    ]


def _where_fit_ends(a: Analysis) -> str | None:
    """Each deployment whose plan fits at some prompt lengths and not at others: where that changes."""
    cap = a.memory_cap_bytes
    parts = []
    for pts in a.length_points.values():
        for p, q in pairwise(pts):
            if p.fits != q.fits:
                now, was = ("stops fitting", "fits") if p.fits else ("fits", "does not fit")
                parts.append(
                    f"`{q.deployment}` {now} from {q.length:,} prompt tokens ({gib(q.memory_bytes)} per rank; at "
                    f"{p.length:,} it {was}: {gib(p.memory_bytes)})"
                )
    if not parts:
        return None
    return f"Where the memory cap ({gib(cap)}) changes what fits: " + "; ".join(parts) + "."
