"""tools/bench_engine.py: the "new question" case keeps only the tables' axes of a cache, and a result
line reports the median of its runs."""

from __future__ import annotations

import json
from pathlib import Path

from tools.bench_engine import keep_axes_only, line


def test_a_new_question_cache_keeps_the_axes_and_the_listing_only(tmp_path: Path) -> None:
    db = tmp_path / "h200_sxm-sglang-0.5.14.aic-0.12.0.abc.json"
    db.write_text(json.dumps({"header": {}, "fallbacks": {}, "answers": {"axes:gemm": {}, "gemm|x": [1.0, "a", 0]}}))
    listing = tmp_path / "databases.aic-0.12.0.abc.json"
    listing.write_text(json.dumps({"answers": {"supported": {}}}))
    keep_axes_only(tmp_path)
    assert json.loads(db.read_text())["answers"] == {"axes:gemm": {}}
    assert json.loads(listing.read_text())["answers"] == {"supported": {}}


def test_a_line_gives_each_run_and_the_medians() -> None:
    assert line("warm", "audit -m x", [(1.0, 0.5), (3.0, 0.7), (2.0, 0.6)]) == (
        "warm         tpplan audit -m x: 1.00 3.00 2.00; median 2.00 s wall, 0.60 s CPU"
    )
