"""The memo's band for decode: how sure the Serving section's decode step is (`cost.decode_band`). Each op class
and source of one decode step of the chosen deployment, its share of the step and its out-of-sample decode
error; the band is the sum of share x error over the classes that have one, and the classes without one are
listed with their share and why, so the band says what it covers. Every figure printed is the band's own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpplan.report.doc import Block, Para, Table

if TYPE_CHECKING:
    from tpplan.cost.decode_band import DecodeBand


def decode_band_blocks(band: DecodeBand, label: str) -> list[Block]:
    """The paragraph, table and note of the decode band of deployment `label`."""
    from tpplan.cost.decode_band import MIN_POINTS, public_regimes

    rest = sum(u.share for u in band.uncovered)
    head = Para(
        f"How sure the decode figures are: one decode step of `{label}` ({band.batch} requests at {band.kv:,} "
        f"cached tokens, {1e3 * band.step_s:,.2f} ms predicted) has a band of ±{100 * band.band:.1f}%, the sum over "
        "its op classes that have an out-of-sample error measured at decode shapes (tpplan/cost/presets/bands/"
        f"errors.toml, `[decode.*]`; collectives: `[collectives]`) of share x error. They hold "
        f"{100 * band.covered:.1f}% of the step; the other {100 * rest:.1f}% has no such error and is not in the "
        "band (below, with why)."
    )
    rows = [(p.klass, p.source, f"{100 * p.share:.1f}%", f"±{100 * p.error:.1f}%", f"{100 * p.share * p.error:.2f}%")
            for p in band.parts]  # fmt: skip
    rows += [(u.klass, u.source, f"{100 * u.share:.1f}%", "-", f"not in the band: {u.why}") for u in band.uncovered]
    public = public_regimes()
    note = Para(
        f"The public decode measurements replayed in docs/benchmarks.md hold at most {public.max_points} points of "
        f"one metric in any regime, fewer than the {MIN_POINTS} an error needs to enter a band: they test the "
        "decode prices out of sample there, they do not set this band."
    )
    return [head, Table(("class", "priced by", "share of the step", "error", "adds"), tuple(rows), (2, 3, 4)), note]


__all__ = ["decode_band_blocks"]
