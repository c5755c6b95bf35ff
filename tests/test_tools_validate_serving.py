"""tools/validate_serving.py: one public point replayed by the serving loop, and the docs section it writes."""

from __future__ import annotations

import tomllib
from pathlib import Path

from tools import validate_serving as vs


def _point(metric: str, **match: object) -> dict[str, object]:
    points = tomllib.loads(vs.POINTS.read_text(encoding="utf-8"))["point"]
    return next(p for p in points if p["metric"] == metric and all(p.get(k) == v for k, v in match.items()))


def test_a_point_is_replayed_as_its_page_states_it_and_the_section_is_replaced(tmp_path: Path) -> None:
    p = _point("ttft_p50_ms", tp=8, pp=1, request_rate=1.0, model="llama-3-70b")
    assert vs.replayable(p)
    r = vs.predict(p)
    assert r.regime == "vllm llama-3-70b TP8, short prompts (ShareGPT), rate 1.0/s"
    from tpplan.simulate.overheads import REQUEST_ROUND_TRIP

    # above the fixed costs' floor, and at this light load within a factor of two of the measured median
    assert r.predicted_ms > 1e3 * REQUEST_ROUND_TRIP.value_s and abs(r.error) < 1
    text = vs.section([r], 3)
    assert text.startswith(vs.BEGIN) and text.endswith(vs.END) and "OUT-OF-SAMPLE" in text
    assert f"| {r.regime} | 1 | {abs(r.error):.0%} | {r.error:+.0%} |" in text
    doc = tmp_path / "b.md"
    doc.write_text("# Benchmarks\n\nbefore\n", encoding="utf-8")
    vs.write(text, doc)
    vs.write(text.replace("1 points replayed", "one point replayed"), doc)  # replaced, not appended again
    body = doc.read_text(encoding="utf-8")
    assert body.count(vs.BEGIN) == 1 and "one point replayed" in body and body.startswith("# Benchmarks\n\nbefore")


def test_incomplete_and_tpot_points_are_left_out() -> None:
    points = tomllib.loads(vs.POINTS.read_text(encoding="utf-8"))["point"]
    assert not any(vs.replayable(p) for p in points if not p.get("complete") or not p["metric"].startswith("ttft"))


def test_write_refuses_to_replace_text_that_is_not_its_section(tmp_path: Path) -> None:
    """A merge that lands another section between the markers: write stops instead of deleting it."""
    import pytest

    doc = tmp_path / "b.md"
    doc.write_text(f"# B\n\n{vs.BEGIN}\n## Someone else's section\n\nkept\n{vs.END}\n", encoding="utf-8")
    with pytest.raises(SystemExit, match="not this tool's section"):
        vs.write(f"{vs.BEGIN}\n## Serving loop against public TTFT measurements (issue 31): x\n{vs.END}", doc)
    assert "Someone else's section" in doc.read_text(encoding="utf-8")
