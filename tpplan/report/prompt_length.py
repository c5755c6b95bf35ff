"""Thresholds in prompt length: from which prompt length CP (per CP size) beats the best CP-1
deployment, and where TP x PP overtakes TP alone.

Each deployment's plan (the deployment row's, `deployments.rank_deployments` at the first workload)
is priced by `predict_plan` at a grid of prompt lengths, the first workload's concurrency, chunk and
request count kept; at each length a deployment counts only while its predicted memory fits under
the cap (so a group "stops fitting" where its last deployment goes over). The best of a group at a
length is its fastest fitting deployment; crossings are interpolated in log(prompt length) as
`report/crossover.py` does for tokens per step.
"""

from __future__ import annotations

from collections.abc import Callable

from tpplan.cost.workload import Workload
from tpplan.report.results import Variant
from tpplan.report.rows import GroupRace, LengthPoint

PROMPT_LENGTHS = (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)


def at_length(w: Workload, length: int) -> Workload:
    """The workload with every prompt `length` tokens long (concurrency, chunk and requests kept)."""
    return w.with_overrides(f"prompt length {length}", name=f"{w.name}@{length}", input_len=length, input_lens=None)


def price_lengths(
    variants: list[Variant],
    workload: Workload,
    predict: Callable[[Variant, Workload], tuple[float, float] | None],
    limit: float,
    lengths: tuple[int, ...] = PROMPT_LENGTHS,
) -> dict[str, list[LengthPoint]]:
    """Each variant (by key) at every length: `predict` gives (mean TTFT s, memory bytes per rank)."""
    out: dict[str, list[LengthPoint]] = {}
    for v in variants:
        pts = []
        for t in lengths:
            got = predict(v, at_length(workload, t))
            if got is not None:
                pts.append(LengthPoint(v.key, v.deployment, t, got[0], got[1], got[1] <= limit))
        out[v.key] = pts
    return out


def _best(
    points: list[list[LengthPoint]], lengths: tuple[int, ...], fits_only: bool = True
) -> tuple[LengthPoint | None, ...]:
    out = []
    for t in lengths:
        here = [p for pts in points for p in pts if p.length == t and (p.fits or not fits_only)]
        out.append(min(here, key=lambda p: p.ttft_s) if here else None)
    return tuple(out)


def races(
    variants: list[Variant], points: dict[str, list[LengthPoint]], lengths: tuple[int, ...] = PROMPT_LENGTHS
) -> list[GroupRace]:
    """CP c (for each CP size priced) against the best CP-1 deployment; TP x PP against TP alone.
    Micro-batch overlap rows are left out: they are the same deployment with another schedule."""
    plain = [v for v in variants if v.plan.overlap is None and v.key in points]

    def group(pred: Callable[[Variant], bool]) -> list[list[LengthPoint]]:
        return [points[v.key] for v in plain if pred(v)]

    cp1 = _best(group(lambda v: v.cp == 1), lengths)
    out = []
    for c in sorted({v.cp for v in plain if v.cp > 1}):
        mine = [points[v.key] for v in plain if v.cp == c]
        out.append(GroupRace(f"CP{c}", "best CP-1 deployment", lengths, _best(mine, lengths), cp1,
                             _best(mine, lengths, fits_only=False)))  # fmt: skip
    if any(v.pp > 1 and v.cp == 1 for v in plain):
        tp_only = _best(group(lambda v: v.pp == 1 and v.cp == 1), lengths)
        out.append(GroupRace("TP x PP", "best TP-only deployment", lengths,
                             _best(group(lambda v: v.pp > 1 and v.cp == 1), lengths), tp_only))  # fmt: skip
    return out


__all__ = ["PROMPT_LENGTHS", "at_length", "price_lengths", "races"]
