"""report.html renders in headless Chromium with no console errors, every plot decoded."""

from __future__ import annotations

from pathlib import Path

import pytest
from cdp import VIEWPORT, chromium_binary, load_page

from tpplan.bench_results import load_bench_results
from tpplan.cost.predict import predict_plan
from tpplan.cost.topology import load_topology
from tpplan.cost.workload import load_workload
from tpplan.report.analysis import analyse
from tpplan.report.bench_section import PNG_BENCH
from tpplan.report.memo import PNG_CROSS, PNG_TIME, PNG_TTFT, PNG_VOLUME, build_memo
from tpplan.report.memo_ask import MemoAsk
from tpplan.report.writer import write_memo

FIX = Path(__file__).parent / "fixtures"
BINARY = chromium_binary()
pytestmark = pytest.mark.skipif(
    BINARY is None, reason="no chromium binary on PATH (apt-get install chromium; .ci/run installs it)"
)


@pytest.mark.slow
def test_report_html_renders_without_console_errors(tmp_path):
    topo = load_topology("h200x8-ib400", nodes=4)
    wls = [load_workload("seed-c8"), load_workload("seed-c16")]
    a = analyse(
        "kimi-k3",
        topo,
        wls,
        MemoAsk(bench=load_bench_results(FIX / "bench_ok.json"), search_top=0),
        predictor=predict_plan,
    )
    memo = build_memo(a)
    out = write_memo(memo, tmp_path / "memo")
    page = load_page(BINARY, out / "report.html")
    assert page["errors"] == []
    # volume, time per layer kind, TTFT, crossover, and the bench plot (bench results are given)
    assert set(memo.pngs) == {PNG_VOLUME, PNG_TIME, PNG_TTFT, PNG_CROSS, PNG_BENCH}
    assert page["images"] == len(memo.pngs) and page["broken_images"] == 0
    assert page["h2"] >= 9 and page["scripts"] == 0
    assert page["title"].startswith("tpplan decision memo: kimi-k3")
    # issue 33: the answer and the plots on the first screens (the first plot was below 13,000 px, the
    # verdict table alone ~11,000 px tall), and no literal backticks in bold or headings
    assert 0 < page["first_image_top"] < 3 * VIEWPORT[1], page["first_image_top"]
    assert page["literal_backticks"] == []


@pytest.mark.slow
def test_the_checker_sees_errors(tmp_path):
    bad = tmp_path / "bad.html"
    bad.write_text('<!DOCTYPE html><html><body><script>console.error("boom")</script><img src="x.png"></body></html>')
    page = load_page(BINARY, bad)
    assert any("boom" in e for e in page["errors"]) and page["broken_images"] == 1
