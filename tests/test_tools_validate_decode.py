"""tools/validate_decode.py: public decode points replayed by the serving loop with decode, and the section
it writes into docs/benchmarks.md (through tools.validate_serving)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools import validate_decode as vd
from tools import validate_serving as vs


def _point(metric: str, **match: object) -> dict[str, object]:
    return next(p for p in vd.points() if p["metric"] == metric and all(p.get(k) == v for k, v in match.items()))


def test_a_throughput_point_is_replayed_at_its_stated_load_and_the_section_is_replaced(tmp_path: Path) -> None:
    p = _point("output_tok_s", engine="sglang", concurrency=4, model="gpt-oss-20b")
    assert vd.replayable(p) == ""
    r = vd.predict(p)
    assert r.regime == "sglang H100 80GB gpt-oss-20b TP1 aggregated, C 2-16, KV < 4K"
    assert r.predicted is not None and r.error == pytest.approx(r.predicted / 481.95 - 1)
    # four clients: no step decodes more than four tokens, and none is faster than a one-token decode step
    pred, _, _ = vs.predictor_for(p)
    one_step = sum(pred.stage_times(((1, 512),))[0])
    assert 0 < r.predicted < 4 / one_step
    text = vd.section([r], [])
    assert text.startswith(vd.BEGIN) and text.endswith(vd.END) and "OUT-OF-SAMPLE" in text
    assert f"| {r.regime} | output_tok_s | 1 | {abs(r.error):.0%} | {r.error:+.0%} |" in text
    doc = tmp_path / "b.md"
    doc.write_text("# Benchmarks\n\nbefore\n", encoding="utf-8")
    vs.write(text, doc, (vd.BEGIN, vd.END))
    vs.write(text.replace("1 points replayed", "one point replayed"), doc, (vd.BEGIN, vd.END))
    body = doc.read_text(encoding="utf-8")
    assert body.count(vd.BEGIN) == 1 and "one point replayed" in body


def test_a_range_is_met_inside_and_missed_by_the_distance_to_its_nearer_end() -> None:
    p = {"value_min": 4.0, "value_max": 5.0}
    assert vd.DecodeReplay(p, 4.5, "r").error == 0
    assert vd.DecodeReplay(p, 2.0, "r").error == pytest.approx(-0.5)
    assert vd.DecodeReplay(p, 6.0, "r").error == pytest.approx(0.2)


def test_incomplete_points_are_left_out_and_sharegpt_outputs_need_their_published_mean() -> None:
    pts = vd.points()
    assert all(vd.replayable(p) for p in pts if not p.get("complete"))
    sharegpt = [p for p in pts if p.get("complete") and p["output_tokens"] == "sharegpt"]
    assert sharegpt and all(vd.replayable(p) == "" for p in sharegpt)  # each carries output_tokens_mean
    assert vs.lengths(sharegpt[0]) == (
        round(sharegpt[0]["prompt_tokens_mean"]),
        round(sharegpt[0]["output_tokens_mean"]),
    )
    bare = {k: v for k, v in sharegpt[0].items() if k != "output_tokens_mean"}
    assert "output length" in vd.replayable(bare)


def test_a_pd_point_is_replayed_with_the_redundant_experts_its_page_states() -> None:
    p = _point("output_tok_s_per_node", complete=True)
    assert p["ep_num_redundant_experts"] == 32 and "288 experts" in p["ep_quote"] and "256" in p["ep_quote"]
    assert vd.pd_plan(p) == "dp-attention+a2a+redundant32+tbo"
    r = vd.predict(p)
    assert r.predicted is not None and r.predicted > 0 and "EP72 +32 redundant experts TBO" in r.regime
    # without the redundant copies, 256 experts do not divide over 72 ranks: the replay says so, and the fix
    bare = {k: v for k, v in p.items() if k != "ep_num_redundant_experts"}
    r = vd.predict(bare)
    assert r.predicted is None and "cannot lay it out" in r.why_not and "+redundant32" in r.why_not


@pytest.mark.slow
def test_the_docs_sections_are_current() -> None:
    """docs/benchmarks.md holds what `python -m tools.validate_serving --write` writes today."""
    doc = vs.DOC.read_text(encoding="utf-8")
    for text, (begin, end) in ((vs.ttft_section(), (vs.BEGIN, vs.END)), (vd.run(), (vd.BEGIN, vd.END))):
        assert doc[doc.index(begin) : doc.index(end) + len(end)] == text, "run python -m tools.validate_serving --write"
