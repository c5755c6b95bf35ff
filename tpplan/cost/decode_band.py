"""The band of a decode step: the step's predicted time split by op class and by what priced each part, each
part carrying an out-of-sample error measured at decode shapes, and the parts that have none named.

The prefill band (`cost.bands`) takes its errors from measurements at prefill shapes. A decode step runs other
kernels at other shapes (split-KV attention over a cache, GEMMs at M = the batch, fused MoE at a row or two per
expert), so only the `[decode.<class>]` entries of presets/bands/errors.toml price its compute classes: each
an out-of-sample error with the count of held-out points it rests on. An entry on fewer than `MIN_POINTS`
points, or a class and source with no entry, is left out of the band and named with the share of the step it
holds. Collectives keep the `[collectives]` entries whose basis is out of sample (measured across message
sizes). The public decode measurements (docs/benchmarks.md) are replayed per regime; `[decode_public]` says
how many points the largest regime has, too few for a regime's own band.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import resources
from types import SimpleNamespace
from typing import TYPE_CHECKING

from tpplan.cost.bands import BandPart, error_table, prediction_seconds

if TYPE_CHECKING:
    from tpplan.cost.predictor import Predictor

MIN_POINTS = 5  # held-out points an error must rest on to enter the band (fewer: no stable median)
OUT_OF_SAMPLE = "out of sample"  # how an errors.toml basis starts when its figure is out of sample


@dataclass(frozen=True)
class DecodeError:
    """One `[decode.<class>]` entry: its error, the held-out points it rests on, its basis."""

    error: float
    points: int
    basis: str


@dataclass(frozen=True)
class PublicRegimes:
    """`[decode_public]`: the most points any replayed public decode regime has, and where they are."""

    max_points: int
    basis: str


def _errors_toml() -> dict[str, object]:
    text = resources.files("tpplan.cost").joinpath("presets", "bands", "errors.toml").read_text(encoding="utf-8")
    return tomllib.loads(text)


@cache
def decode_errors() -> dict[tuple[str, str], DecodeError]:
    """(class, source key) -> its decode error, from errors.toml's `[decode.<class>]` tables."""
    raw = _errors_toml()["decode"]
    assert isinstance(raw, dict)
    return {(k, s): DecodeError(float(v["error"]), int(v["points"]), str(v["basis"]))
            for k, entries in raw.items() for s, v in entries.items()}  # fmt: skip


@cache
def public_regimes() -> PublicRegimes:
    raw = _errors_toml()["decode_public"]
    assert isinstance(raw, dict)
    return PublicRegimes(int(raw["max_points_per_regime"]), str(raw["basis"]))


@dataclass(frozen=True)
class Uncovered:
    """A part of the step with no out-of-sample decode error: its share and why."""

    klass: str
    source: str
    share: float
    why: str

    def to_json(self) -> dict[str, object]:
        return {"class": self.klass, "source": self.source, "share": self.share, "why": self.why}


@dataclass(frozen=True)
class DecodeBand:
    """The band of one decode step (`batch` requests at `kv` cached tokens): the sum over the covered parts of
    share x error, the share of the step they cover, and the parts left out."""

    band: float
    covered: float
    parts: tuple[BandPart, ...]
    uncovered: tuple[Uncovered, ...]
    step_s: float
    batch: int
    kv: int

    def to_json(self) -> dict[str, object]:
        return {"band": self.band, "covered_share": self.covered, "step_s": self.step_s, "batch": self.batch,
                "kv_tokens": self.kv, "parts": [p.to_json() for p in self.parts],
                "uncovered": [u.to_json() for u in self.uncovered]}  # fmt: skip


def _error_of(klass: str, key: str) -> DecodeError | str:
    """The decode error of (class, source key), or why it has none."""
    if klass == "collectives":
        got = error_table()["collectives"].get(key)
        if got is None or not got[1].startswith(OUT_OF_SAMPLE):
            return f"no out-of-sample error for collectives priced by {key}"
        return DecodeError(got[0], 0, got[1])
    entry = decode_errors().get((klass, key))
    if entry is None:
        return f"no out-of-sample error measured for {klass} priced by {key} at decode shapes"
    if entry.points < MIN_POINTS:
        return f"too few points ({entry.points} held out, fewer than {MIN_POINTS})"
    return entry


def compose_decode(seconds: dict[tuple[str, str], float]) -> tuple[float, tuple[BandPart, ...], tuple[Uncovered, ...]]:
    """(band, covered parts, uncovered parts) from a decode step's seconds per (class, source key)."""
    total = math.fsum(seconds.values())
    if total <= 0:
        return 0.0, (), ()
    parts, left = [], []
    for (klass, key), s in sorted(seconds.items(), key=lambda kv: -kv[1]):
        got = _error_of(klass, key)
        if isinstance(got, str):
            left.append(Uncovered(klass, key, s / total, got))
        else:
            parts.append(BandPart(klass, key, s / total, got.error, got.basis))
    return math.fsum(p.share * p.error for p in parts), tuple(parts), tuple(left)


def decode_step_band(pred: Predictor, batch: int, kv: int) -> DecodeBand:
    """The band of one decode step of `batch` requests each at `kv` cached tokens on `pred`'s deployment."""
    segs = ((1, kv),) * max(1, batch)
    stages, sends, final = pred.stage_times(segs)
    kinds = [pred.kind_time(res, segs) for res in {id(r): r for r in pred.audit.layer_results}.values()]
    seconds = prediction_seconds(SimpleNamespace(kinds=kinds, stage_comm_s=math.fsum(sends), final_comm_s=final))
    band, parts, left = compose_decode(seconds)
    covered = math.fsum(p.share for p in parts)
    return DecodeBand(band, covered, parts, left, math.fsum(stages) + math.fsum(sends), max(1, batch), kv)


__all__ = [
    "MIN_POINTS",
    "DecodeBand",
    "DecodeError",
    "PublicRegimes",
    "Uncovered",
    "compose_decode",
    "decode_errors",
    "decode_step_band",
    "public_regimes",
]
