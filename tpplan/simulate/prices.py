"""The seam between the cost model and the serving loop: a step's price per stage, asked once.

The loop asks "what does a step of these segments cost on each stage?" for every step it forms;
the answer comes from the cost model's own pricing of a prefill batch (`Predictor.stage_times`:
each stage's compute and TP collectives, its send into the next stage, the last stage's final
reduction), never re-derived here. `CachedPrices` keeps each distinct step's answer, so a long
trace of alike requests prices each step shape once.
"""

from __future__ import annotations

from collections.abc import Sequence

from tpplan.cost.predictor import Predictor
from tpplan.cost.segments import Segments
from tpplan.simulate.loop import StagePrices


class CachedPrices:
    """`prices(segments)` with each distinct step priced once."""

    def __init__(self, prices: StagePrices) -> None:
        self._prices = prices
        self._cache: dict[Segments, tuple[float, ...]] = {}

    def __call__(self, segs: Segments) -> Sequence[float]:
        hit = self._cache.get(segs)
        if hit is None:
            hit = self._cache[segs] = tuple(float(t) for t in self._prices(segs))
        return hit

    @property
    def distinct_steps(self) -> int:
        """Step shapes priced so far."""
        return len(self._cache)


def predictor_prices(p: Predictor) -> CachedPrices:
    """Per-stage seconds of a prefill step on the predictor's deployment, its boundary send included
    (the stages `tpplan.cost.predict.pipeline_ttft` schedules; one stage without PP)."""

    def stages(segs: Segments) -> list[float]:
        stage_s, sends, _ = p.stage_times(segs)
        return [s + x for s, x in zip(stage_s, sends, strict=True)]

    return CachedPrices(stages)


__all__ = ["CachedPrices", "predictor_prices"]
