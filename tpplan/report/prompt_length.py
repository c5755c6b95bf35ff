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
from dataclasses import dataclass

from tpplan.cost.workload import Workload
from tpplan.report.crossover import log_crossing
from tpplan.report.deployments import fig
from tpplan.report.results import Variant

PROMPT_LENGTHS = (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)


@dataclass(frozen=True)
class LengthPoint:
    """One deployment's plan at one prompt length."""

    variant: str
    deployment: str
    length: int
    ttft_s: float
    memory_bytes: float
    fits: bool


@dataclass(frozen=True)
class Crossings:
    """Every interval of a length grid on which one series is faster than another, its ends
    interpolated in log(length) (None: the grid's own end). Unlike `crossover.Crossover` (the first
    interval), a race over prompt lengths may change order more than once."""

    tokens: tuple[int, ...]
    intervals: tuple[tuple[float | None, float | None], ...]

    def describe(self) -> str:
        lo, hi = self.tokens[0], self.tokens[-1]
        if not self.intervals:
            return f"never faster ({lo:,}-{hi:,} prompt tokens)"
        if self.intervals == ((None, None),):
            return f"always faster ({lo:,}-{hi:,} prompt tokens)"
        words = []
        for start, stop in self.intervals:
            if start is None:
                words.append(f"up to {stop:,.0f}")
            elif stop is None:
                words.append(f"from {start:,.0f}")
            else:
                words.append(f"from {start:,.0f} to {stop:,.0f}")
        return "faster " + " and ".join(words) + " prompt tokens"


def crossings(tokens: tuple[int, ...], mine: list[float], other: list[float]) -> Crossings:
    """The intervals on which `mine` is below `other` over `tokens`."""
    d = [o - m for m, o in zip(mine, other, strict=True)]  # > 0: mine faster
    out: list[tuple[float | None, float | None]] = []
    start: float | None = None
    inside = d[0] > 0
    for i in range(1, len(d)):
        if not inside and d[i - 1] <= 0 < d[i]:
            start, inside = log_crossing(tokens[i - 1], tokens[i], d[i - 1], d[i]), True
        elif inside and d[i - 1] > 0 >= d[i]:
            out.append((start, log_crossing(tokens[i - 1], tokens[i], d[i - 1], d[i])))
            inside = False
    if inside:
        out.append((start, None))
    return Crossings(tokens, tuple(out))


@dataclass(frozen=True)
class GroupRace:
    """A group of deployments (`name`, e.g. "CP4") against another (`against`, e.g. "best CP-1") over
    the prompt lengths: the best fitting member of each at every length (None: none fits)."""

    name: str
    against: str
    lengths: tuple[int, ...]
    mine: tuple[LengthPoint | None, ...]
    other: tuple[LengthPoint | None, ...]
    mine_uncapped: tuple[LengthPoint | None, ...] = ()  # the same, memory ignored (what the cap costs)

    @property
    def crossover(self) -> Crossings | None:
        """Where `name` is faster, over the longest run of lengths at which both groups fit."""
        return self._race(self.mine)

    @property
    def uncapped_crossover(self) -> Crossings | None:
        """Where `name` would be faster if its deployments' memory were not capped."""
        return self._race(self.mine_uncapped) if self.mine_uncapped else None

    def _race(self, mine_pts: tuple[LengthPoint | None, ...]) -> Crossings | None:
        run: list[int] = []
        best: list[int] = []
        for i, (m, o) in enumerate(zip(mine_pts, self.other, strict=True)):
            if m is not None and o is not None:
                run.append(i)
                if len(run) > len(best):
                    best = list(run)
            else:
                run = []
        if len(best) < 2:
            return None
        lengths = tuple(self.lengths[i] for i in best)
        mine = [mine_pts[i].ttft_s for i in best]  # type: ignore[union-attr]
        other = [self.other[i].ttft_s for i in best]  # type: ignore[union-attr]
        return crossings(lengths, mine, other)

    @property
    def fits_from_to(self) -> tuple[int, int] | None:
        """The shortest and longest length at which some member of the group fits (None: never)."""
        ok = [t for t, m in zip(self.lengths, self.mine, strict=True) if m is not None]
        return (ok[0], ok[-1]) if ok else None

    def sentence(self, cap_gib: float | None) -> str:
        """One sentence, every figure from the points above."""
        lo, hi = self.lengths[0], self.lengths[-1]
        cap = f"the memory cap of {cap_gib:,.1f} GiB" if cap_gib is not None else "GPU memory"
        span = self.fits_from_to
        if span is None:
            text = f"{self.name} fits under {cap} at no prompt length from {lo:,} to {hi:,} tokens"
            u = self.uncapped_crossover
            if u is not None:
                text += f"; with the memory not capped it would be {u.describe()} against the {self.against}"
            return text + "."
        c = self.crossover
        if c is None:
            both = sum(1 for m, o in zip(self.mine, self.other, strict=True) if m is not None and o is not None)
            return f"{self.name} and the {self.against} both fit at {both} prompt length(s): no threshold to draw."
        text = f"{self.name} against the {self.against}: {c.describe()}"
        m_at = {p.length: p for p in self.mine if p is not None}
        o_at = {p.length: p for p in self.other if p is not None}
        ends = [t for t in (c.tokens[0], c.tokens[-1]) if t in m_at and t in o_at]
        text += "".join(
            f"; at {t:,}: {fig(m_at[t].ttft_s)} s `{m_at[t].deployment}` vs {fig(o_at[t].ttft_s)} s "
            f"`{o_at[t].deployment}`"
            for t in dict.fromkeys(ends)
        )
        if span[1] < hi:
            nxt = self.lengths[self.lengths.index(span[1]) + 1]
            text += f"; from {nxt:,} prompt tokens no {self.name} deployment fits under {cap}"
        elif span[0] > lo:
            text += f"; below {span[0]:,} prompt tokens none fits"
        return text + "."


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
        mine = group(lambda v, c=c: v.cp == c)
        out.append(GroupRace(f"CP{c}", "best CP-1 deployment", lengths, _best(mine, lengths), cp1,
                             _best(mine, lengths, fits_only=False)))  # fmt: skip
    if any(v.pp > 1 and v.cp == 1 for v in plain):
        tp_only = _best(group(lambda v: v.pp == 1 and v.cp == 1), lengths)
        out.append(GroupRace("TP x PP", "best TP-only deployment", lengths,
                             _best(group(lambda v: v.pp > 1 and v.cp == 1), lengths), tp_only))  # fmt: skip
    return out


__all__ = ["PROMPT_LENGTHS", "GroupRace", "LengthPoint", "at_length", "price_lengths", "races"]
