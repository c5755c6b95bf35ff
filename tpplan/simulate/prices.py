"""The seam between the cost model and the serving loop: a step's price per stage, asked once.

The loop asks "what does a step of these segments cost on each stage?" for every step it forms;
the answer comes from the cost model's own pricing of a prefill batch (`Predictor.stage_times`:
each stage's compute and TP collectives, its send into the next stage, the last stage's final
reduction), never re-derived here. `CachedPrices` keeps each distinct step's answer, so a long
trace of alike requests prices each step shape once, and a decode step is priced at its requests'
mean context (interpolated on a grid: `context_grid`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from tpplan.cost.draft import aggregated_draft_seconds, draft_pass, draft_step_seconds, prefill_draft_seconds
from tpplan.cost.predictor import Predictor
from tpplan.cost.segments import Segments
from tpplan.engines.speculative import Speculative
from tpplan.simulate.loop import StagePrices

EXACT_CONTEXT = 64  # decode steps whose mean context is at most this are priced at whole-token grid points
GRID_PER_OCTAVE = 16  # above it, the mean context's grid points: 16 per doubling (4.4% apart)


def context_grid(mean: float) -> tuple[int, int]:
    """The grid points (lo, hi), lo <= mean <= hi, between which a decode step's price is interpolated."""
    if mean <= EXACT_CONTEXT:
        lo = math.floor(mean)
        return lo, lo + 1
    k = math.floor(math.log2(mean) * GRID_PER_OCTAVE)
    lo, hi = round(2 ** (k / GRID_PER_OCTAVE)), round(2 ** ((k + 1) / GRID_PER_OCTAVE))
    return min(lo, math.floor(mean)), max(hi, math.ceil(mean), lo + 1)


def even_decode(batch: int, total_context: int, width: int = 1) -> Segments:
    """`batch` segments of `width` tokens (1: decode; k + 1: a speculative step's verify) whose contexts sum
    to `total_context`, as evenly as whole tokens allow."""
    q, r = divmod(total_context, batch)
    return ((width, q + 1),) * r + ((width, q),) * (batch - r)


DraftPrice = Callable[[int, int], float]
"""Seconds a speculative step's draft adds to the last stage for (decode batch, context per request)."""
StepDraft = Callable[[Segments, Segments, bool], float]
"""Seconds the draft adds to the last stage in a step of (prefill chunks, decode requests' verify segments,
whether a request of the step will verify drafts)."""


class CachedPrices:
    """`prices(segments)` with each distinct step priced once. A step's one-token segments (decode tokens)
    are priced at their mean context: the price is interpolated linearly between the two nearest points of
    `context_grid` (exact where the price is linear in the context read, as attention's bytes and pairs
    are), so a decode step whose contexts grow by one token each step reuses the prices of the last."""

    def __init__(self, prices: StagePrices, verify: int = 1, draft: StepDraft | None = None) -> None:
        """`verify` > 1: a decode token is a speculative step's `verify` tokens per request, and `draft` the
        step's draft seconds on the last stage, prefill chunks included (`step_draft`)."""
        self._prices = prices
        self._verify, self._draft = verify, draft
        self._cache: dict[Segments, tuple[float, ...]] = {}
        self._grid: dict[tuple[Segments, int, int, bool], tuple[float, ...]] = {}

    def _exact(self, segs: Segments) -> tuple[float, ...]:
        hit = self._cache.get(segs)
        if hit is None:
            hit = self._cache[segs] = tuple(float(t) for t in self._prices(segs))
        return hit

    def __call__(self, segs: Segments) -> Sequence[float]:
        decode = [c for n, c in segs if n == 1]
        return self.price_step(tuple(s for s in segs if s[0] > 1), len(decode), sum(decode))

    def price_step(self, prefill: Segments, batch: int, context_sum: float, samples: bool = True) -> Sequence[float]:
        """The price of `prefill`'s segments with `batch` one-token segments whose contexts sum to
        `context_sum` (what the loop passes instead of a segment per decode token); a one-token prefill
        segment counts as a decode token, as in `__call__`. `samples`: a request of the step will verify the
        draft's tokens (`StepDraft`)."""
        ones = [c for n, c in prefill if n == 1]
        if ones:
            prefill = tuple(s for s in prefill if s[0] > 1)
            batch, context_sum = batch + len(ones), context_sum + sum(ones)
        if batch == 0:
            return self._exact(prefill) if self._draft is None else self._at(prefill, 0, 0, samples)
        mean = context_sum / batch
        lo, hi = context_grid(mean)
        a, b = self._at(prefill, batch, lo, samples), self._at(prefill, batch, hi, samples)
        w = (mean - lo) / (hi - lo)
        return tuple(x + (y - x) * w for x, y in zip(a, b, strict=True))

    def _at(self, prefill: Segments, batch: int, context: int, samples: bool) -> tuple[float, ...]:
        """The exact price with `batch` decode tokens at one grid point, kept per (prefill, batch, point)."""
        key = (prefill, batch, context, samples)
        hit = self._grid.get(key)
        if hit is None:
            decode = even_decode(batch, context * batch, self._verify) if batch else ()
            hit = self._exact(prefill + decode)
            if self._draft is not None:
                hit = (*hit[:-1], hit[-1] + self._draft(prefill, decode, samples))
            self._grid[key] = hit
        return hit

    @property
    def distinct_steps(self) -> int:
        """Step shapes priced so far."""
        return len(self._cache)


def stage_prices(p: Predictor) -> StagePrices:
    """Per-stage seconds of a step of segments on `p`'s deployment, each stage's boundary send included."""

    def stages(segs: Segments) -> list[float]:
        stage_s, sends, _ = p.stage_times(segs)
        return [s + x for s, x in zip(stage_s, sends, strict=True)]

    return stages


def predictor_prices(p: Predictor, spec: Speculative | None = None) -> CachedPrices:
    """Per-stage seconds of a prefill step on the predictor's deployment, its boundary send included
    (the stages `tpplan.cost.predict.pipeline_ttft` schedules; one stage without PP); with `spec`, a decode
    token is a speculative step and every step runs the draft as the engine does (`step_draft`)."""
    if spec is None:
        return CachedPrices(stage_prices(p))
    return CachedPrices(stage_prices(p), spec.verify_tokens, step_draft(p, spec))


def prefill_server_prices(p: Predictor, spec: Speculative | None) -> CachedPrices:
    """A P/D prefill server's step prices: with `spec` (its decode pool's speculative decoding, whose flags the
    prefill server is launched with) each step also runs the draft on the last stage
    (`tpplan.cost.draft.prefill_draft_seconds`)."""
    if spec is None:
        return predictor_prices(p)
    plain, passes = stage_prices(p), draft_pass(p, spec)

    def stages(segs: Segments) -> list[float]:
        out = list(plain(segs))
        out[-1] += prefill_draft_seconds(p, spec, segs, passes)
        return out

    return CachedPrices(stages)


def draft_price(p: Predictor, spec: Speculative) -> DraftPrice:
    """A speculative step's draft on the last stage (`tpplan.cost.draft.draft_step_seconds`: per draft pass its
    decoder layers, its projection and the lm_head; one pass over the verify width per request, SGLang's draft
    extend and vLLM's draft prefill, and k - 1 over one token per request)."""
    passes = draft_pass(p, spec)

    def seconds(batch: int, context: int) -> float:
        return draft_step_seconds(p, spec, batch, context, passes)

    return seconds


def step_draft(p: Predictor, spec: Speculative) -> StepDraft:
    """An aggregated server's draft on the last stage per step, prefill chunks and decode requests
    (`tpplan.cost.draft.aggregated_draft_seconds`)."""
    passes = draft_pass(p, spec)

    def seconds(prefill: Segments, decode: Segments, samples: bool) -> float:
        return aggregated_draft_seconds(p, spec, prefill, decode, samples, passes)

    return seconds


__all__ = ["CachedPrices", "DraftPrice", "StepDraft", "context_grid", "draft_price", "even_decode", "predictor_prices",
           "prefill_server_prices", "stage_prices", "step_draft"]  # fmt: skip
