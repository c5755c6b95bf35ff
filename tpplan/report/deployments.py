"""The deployments ranked: TP, PP, CP and their mixes (and micro-batch overlap where the memo prices
it), one row per deployment of the search's grid, each with a reason computed from its priced parts.

A row is the fastest plan the memo priced at that deployment (baseline is priced at every deployment
of the grid; the search's best and the memo's plans join where they run there) that fits under the
memory cap; a deployment where nothing fits is listed after the ranked ones with what puts it over
the cap. The reason compares the row with the reference deployment (the grid's first, the widest TP,
where the search takes its baseline): the workload's own prefill batches through every layer, split
into compute, TP collectives, CP exchanges and stage sends (`workload_parts`), and the mean TTFT the
workload's schedule makes of them.

Hook for replicas (R copies of a deployment serving the requests between them): a row is keyed by
`DeploymentKey` (TP, PP, CP, replicas, overlap). Today a replicas row is there where the search's
best is R copies of a deployment (so the ranking's first row is the search's best); rows for every R
of the search's grid are the hook for the replica work (`tpplan.search.grid.deployment_grid`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tpplan.report.results import Variant, ttft_mean
from tpplan.report.rows import DeploymentKey, DeploymentRow, fig
from tpplan.units import GIB

if TYPE_CHECKING:
    from tpplan.cost.predictor import Predictor
    from tpplan.cost.segments import Segments


def key_of(v: Variant) -> DeploymentKey:
    return (*v.shape, v.plan.overlap)


@dataclass(frozen=True)
class Parts:
    """A workload's prefill batches on one rank (one CP rank; with PP the mean stage; with replicas
    one replica's share), summed and split by what they are made of (seconds): what the TTFT schedule
    then overlaps."""

    batches: int
    compute_s: float
    tp_comm_s: float
    cp_comm_s: float
    stage_s: float
    replicas: int = 1
    stages: int = 1

    @property
    def total_s(self) -> float:
        return self.compute_s + self.tp_comm_s + self.cp_comm_s + self.stage_s


PartsFn = Callable[[Variant, str], "Parts | None"]


def workload_parts(predictor: Predictor, batches: list[Segments]) -> Parts:
    """`predictor`'s priced parts of every batch (`Predictor.kind_time` per layer; stage sends and the
    final reduction from `stage_times`), summed, per rank: over PP stages divided by their number (a
    rank runs its stage's layers), with the mesh's replicas over every replica's batches divided by their
    number (one replica's share when the requests split evenly)."""
    replicas = predictor.deployment.replicas
    comp = tp = cp = stage = 0.0
    results = predictor.audit.layer_results
    for segs in batches:
        for res in results:
            kt = predictor.kind_time(res, segs)
            comp += kt.compute_s
            for c in kt.collectives:
                if c.region == "cp":
                    cp += c.seconds
                else:
                    tp += c.seconds
        _, sends, final = predictor.stage_times(segs)
        stage += sum(sends)
        tp += final
    r = max(1, replicas) * max(1, len(predictor.stages))
    return Parts(len(batches), comp / r, tp / r, cp / r, stage / r, max(1, replicas), len(predictor.stages))


def _ms(x: float) -> str:
    return f"{fig(x * 1e3, sign=True)} ms"


def _over_cap(v: Variant, limit: float, workload: str) -> str:
    p = v.predictions[workload]
    m = p.memory
    over = (m.total - limit) / GIB
    text = (
        f"over the memory cap by {over:,.1f} GiB: {m.total / GIB:,.1f} GiB per rank against {limit / GIB:,.1f} GiB "
        f"(weights {m.weights / GIB:,.1f}, KV cache {m.kv_cache / GIB:,.1f}, recurrent state "
        f"{m.recurrent_state / GIB:,.2f}, activations {m.activations / GIB:,.1f} GiB)"
    )
    if m.weights > limit:
        copy = f"a TP{v.tp} share of every layer" + (f" on each of the {v.cp} CP groups" if v.cp > 1 else "")
        text += f"; the weights alone exceed it ({copy}" + (f", over {v.pp} stages" if v.pp > 1 else "") + ")"
    return text


def _reason(v: Variant, ref: Variant | None, workload: str, parts: PartsFn) -> str:
    mine = parts(v, workload)
    t = ttft_mean(v, workload)
    if t is None:
        return f"not predicted ({v.prediction_error})" if v.prediction_error else "not predicted"
    if mine is None:
        return f"mean TTFT {fig(t)} s (its parts were not priced)"
    if ref is None or ref is v:
        return (
            f"the reference deployment: its {mine.batches} prefill batches on one rank, every layer: "
            f"{fig(mine.total_s * 1e3)} ms (compute {fig(mine.compute_s * 1e3)}, TP collectives "
            f"{fig(mine.tp_comm_s * 1e3)} ms); mean TTFT {fig(t)} s"
        )
    base = parts(ref, workload)
    t0 = ttft_mean(ref, workload)
    if base is None or t0 is None:
        return f"mean TTFT {fig(t)} s (the reference `{ref.deployment}` was not priced)"
    terms = [
        f"compute {_ms(mine.compute_s - base.compute_s)}",
        f"TP collectives {_ms(mine.tp_comm_s - base.tp_comm_s)}",
    ]
    if mine.cp_comm_s or base.cp_comm_s:
        terms.append(f"CP exchanges {_ms(mine.cp_comm_s - base.cp_comm_s)}")
    if mine.stage_s or base.stage_s:
        terms.append(f"stage sends {_ms(mine.stage_s - base.stage_s)}")
    text = (
        f"vs `{ref.deployment}` (`{ref.key}`), the workload's prefill batches on one rank ("
        + ", ".join(x for x in (
            "one CP rank" if v.cp > 1 else "",
            f"the mean of the {mine.stages} stages" if mine.stages > 1 else "",
            f"a replica's share: every replica's batches over {mine.replicas}" if mine.replicas > 1 else "",
        ) if x) + ("" if v.cp > 1 or mine.stages > 1 or mine.replicas > 1 else "every layer")
        + "): " + ", ".join(terms)
        + f" ({fig(mine.total_s * 1e3)} vs {fig(base.total_s * 1e3)} ms); mean TTFT {fig(t)} vs {fig(t0)} s"
        + f" ({100 * (t - t0) / t0:+.1f}%)"
    )  # fmt: skip
    if v.pp > 1:
        text += f", the {v.pp} stages running those batches in a pipeline"
    return text


def _if_it_fit(v: Variant, ref: Variant | None, workload: str, parts: PartsFn) -> str:
    """An over-cap row's priced parts against the reference, as a ranked row's reason would read."""
    r = _reason(v, ref, workload, parts)
    return f"; were it to fit: {r}" if r.startswith("vs ") else ""


def rank_deployments(
    variants: list[Variant],
    grid: list[DeploymentKey],
    workload: str,
    limit: float,
    parts: PartsFn,
    searched: list[tuple[int, int, int, int]] | None = None,
) -> list[DeploymentRow]:
    """One row per deployment in `grid` (and per overlap priced there): the fastest legal variant that
    fits under `limit` bytes per rank at `workload`, ranked; then the deployments where none fits."""
    shapes = {k[:4] for k in grid} | set(searched or ())  # the search's deployments, replicas included
    keys = list(dict.fromkeys([*grid, *(key_of(v) for v in variants if v.legal and key_of(v)[:4] in shapes)]))
    chosen: dict[DeploymentKey, tuple[Variant, bool]] = {}
    for key in keys:
        here = [v for v in variants if key_of(v) == key and v.legal and ttft_mean(v, workload) is not None]
        if not here:
            continue
        fit = [v for v in here if v.predictions[workload].memory.total <= limit]
        if fit:
            chosen[key] = (min(fit, key=lambda v: ttft_mean(v, workload) or 0.0), True)
        else:
            chosen[key] = (min(here, key=lambda v: v.predictions[workload].memory.total), False)
    ref_key = grid[0] if grid else None
    ref = chosen.get(ref_key)[0] if ref_key in chosen else None  # type: ignore[index]
    ranked = sorted((k for k, (_, ok) in chosen.items() if ok), key=lambda k: ttft_mean(chosen[k][0], workload) or 0.0)
    rows: list[DeploymentRow] = []
    for i, key in enumerate(ranked, 1):
        v, _ = chosen[key]
        reason = _reason(v, ref, workload, parts)
        if v.plan.overlap is not None:  # the overlap's own effect: the same plan at the same shape without it
            bare = v.plan.name.removesuffix(f"+{v.plan.overlap}")
            w = next(
                (x for x in variants if x.shape == v.shape and x.plan.name == bare and x.plan.overlap is None), None
            )
            t, t0 = ttft_mean(v, workload), ttft_mean(w, workload) if w is not None else None
            if w is not None and t is not None and t0:
                reason += (
                    f" (the parts are the work before the overlap schedules it); against `{w.key}` without the "
                    f"overlap: {fig(t)} vs {fig(t0)} s ({100 * (t - t0) / t0:+.1f}%)"
                )
        rows.append(DeploymentRow(key, v.key, ttft_mean(v, workload), v.predictions[workload].memory.total, True, i,
                                  reason, tuple(v.flags)))  # fmt: skip
    for key, (v, ok) in chosen.items():
        if ok:
            continue
        rows.append(DeploymentRow(key, v.key, ttft_mean(v, workload), v.predictions[workload].memory.total, False,
                                  None, _over_cap(v, limit, workload) + _if_it_fit(v, ref, workload, parts),
                                  tuple(v.flags)))  # fmt: skip
    return rows


__all__ = ["Parts", "key_of", "rank_deployments", "workload_parts"]
