"""The memo's deployment, prompt-length and kernel-source rows, typed: what `deployments.py`,
`prompt_length.py` and `kernel_sources.py` compute and `results.Analysis` holds (below all of them, so
none imports another to reach a type), with the one number format their sentences and tables share
(`fig`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from tpplan.mesh import Mesh
from tpplan.report.crossover import log_crossing

DeploymentKey = tuple[int, int, int, int, str | None]  # (TP, PP, CP, replicas, overlap name)


def label_of(key: DeploymentKey) -> str:
    tp, pp, cp, replicas, overlap = key
    return Mesh(tp, pp=pp, cp=cp, replicas=replicas).label() + (f"+{overlap}" if overlap else "")


@dataclass(frozen=True)
class DeploymentRow:
    key: DeploymentKey
    variant: str  # the memo variant's key
    ttft_s: float | None
    memory_bytes: float | None
    fits: bool
    rank: int | None  # among the deployments that fit (1 = fastest); None: over the cap or not predicted
    reason: str
    flags: tuple[str, ...]  # one line per engine: its flags, or "no engine flag (why)"

    @property
    def label(self) -> str:
        return label_of(self.key)


def fig(x: float, sign: bool = False) -> str:
    """Four significant digits without an exponent (`21.92`, `0.001234`, `11,104`): the memo's
    deployment figures span tiny test models and Kimi-K3 at 128K."""
    digits = 0 if x == 0 else max(0, 3 - math.floor(math.log10(abs(x))))
    return f"{x:{'+' if sign else ''},.{digits}f}"


def rate(x: float) -> str:
    """Tokens per second: whole numbers from 100 up, three significant digits below, so that a served deployment's
    0.5 output tokens/s per GPU does not print as 0, nor 4.7 as 5 beside 4.4 as 4."""
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


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
        return _span(self.lengths, self.mine)

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
        for who, got in (
            (f"{self.name} deployment", span),
            (self.against.removeprefix("best "), _span(self.lengths, self.other)),
        ):
            if got is None:
                continue
            if got[1] < hi:
                nxt = self.lengths[self.lengths.index(got[1]) + 1]
                text += f"; from {nxt:,} prompt tokens no {who} fits under {cap}"
            elif got[0] > lo:
                text += f"; below {got[0]:,} prompt tokens no {who} fits under {cap}"
        return text + "."


def _span(lengths: tuple[int, ...], pts: tuple[LengthPoint | None, ...]) -> tuple[int, int] | None:
    ok = [t for t, p in zip(lengths, pts, strict=True) if p is not None]
    return (ok[0], ok[-1]) if ok else None


__all__ = ["Crossings", "DeploymentKey", "DeploymentRow", "GroupRace", "LengthPoint", "crossings", "fig", "label_of"]


@dataclass(frozen=True)
class SourceAnswer:
    """Today's deployment and one target plan priced from one kernel-price source."""

    name: str  # DEFAULT or an engine (sglang, vllm, trtllm)
    label: str  # what priced the kernels, in words
    target: str  # the target's variant key
    current_s: float
    target_s: float
    band: float  # the composed band of today's deployment under this source

    @property
    def change(self) -> float:
        """The target's change of mean TTFT against today's (negative: faster)."""
        return (self.target_s - self.current_s) / self.current_s


@dataclass(frozen=True)
class KernelSensitivity:
    """The answer under each source: the memo's target and each source's own best engine-run plan
    at today's deployment shape, each priced from every source."""

    current: str  # variant keys
    targets: tuple[str, ...]  # the memo's target first
    workload: str
    chosen: str  # the source the memo's times come from
    answers: tuple[SourceAnswer, ...]
    reason: str
    skipped: tuple[str, ...] = ()  # sources not compared, each with why

    @property
    def sources(self) -> list[str]:
        return list(dict.fromkeys(s.name for s in self.answers))

    def of(self, target: str, source: str) -> SourceAnswer | None:
        return next((s for s in self.answers if s.target == target and s.name == source), None)

    def disagreeing(self) -> list[SourceAnswer]:
        """The answers whose change differs from the chosen source's for the same target by more
        than both bands."""
        out = []
        for s in self.answers:
            c = self.of(s.target, self.chosen)
            if c is not None and s is not c and abs(s.change - c.change) > s.band + c.band:
                out.append(s)
        return out

    def sentence(self) -> str | None:
        """The answer's sentence where the sources disagree beyond their bands, else None: that they change the
        answer only where they disagree on the bottom line's plan (`targets[0]`), else which plan they decide."""
        off = self.disagreeing()
        if not off:
            return None
        parts = []
        for target in dict.fromkeys(s.target for s in off):
            c = self.of(target, self.chosen)
            assert c is not None
            others = "; ".join(
                f"from {s.label} {100 * s.change:+.1f}% ({s.target_s:.3f} vs {s.current_s:.3f} s, "
                f"band ±{100 * s.band:.1f}%)"
                for s in off
                if s.target == target
            )
            parts.append(
                f"`{target}` against `{self.current}` at {self.workload} is {100 * c.change:+.1f}% from {c.label} "
                f"(this memo's times, band ±{100 * c.band:.1f}%), but {others}"
            )
        if self.targets[0] in {s.target for s in off}:
            lead = "**The kernel-price source changes this answer**: "
        else:  # only another plan at today's shape is in dispute: the bottom line's plan is not
            lead = (
                f"**The kernel-price source does not change the bottom line** (`{self.targets[0]}`: no source's "
                "change differs from this memo's by more than the two bands), **but it decides which plan runs "
                "best at today's deployment**: "
            )
        return (
            lead + "; ".join(parts) + ". The differences are larger than the two bands together, so which kernels the "
            "engine really runs decides it (Kernel-price source, below)."
        )
