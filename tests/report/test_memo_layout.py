"""How the memo reads (issue 33, item 8): code spans inside bold render as code, long tables and the
per-plan reasons fold in HTML (markdown keeps them open), the plots follow the answer, and time plots
leave illegal plans out (their predicted time is no price)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tpplan.cost.predict import predict_plan
from tpplan.cost.topology import load_topology
from tpplan.cost.workload import load_workload
from tpplan.report import memo as memo_module
from tpplan.report.analysis import analyse
from tpplan.report.doc import FOLD_ROWS, Fold, Heading, Para, Table, to_html, to_markdown
from tpplan.report.memo_ask import MemoAsk
from tpplan.search.grid import MeshAsk


def test_code_spans_inside_bold_render_as_code():
    html = to_html("t", [Para("**Switch from `ep4` to `search-1`**: now")])
    assert "<strong>Switch from <code>ep4</code> to <code>search-1</code></strong>" in html
    assert "`" not in html


def test_long_tables_fold_in_html_and_stay_open_in_markdown():
    rows = tuple((f"p{i}", str(i)) for i in range(FOLD_ROWS + 1))
    short = Table(("plan", "n"), rows[:FOLD_ROWS])
    long = Table(("plan", "n"), rows)
    html = to_html("t", [short, long])
    assert html.count("<details>") == 1 and f"Table: {FOLD_ROWS + 1} rows" in html
    md = to_markdown("t", [Fold("reasons", (Heading("x", 3), Para("why"))), long])
    assert "<details>" not in md and "### x\n\nwhy" in md and f"| p{FOLD_ROWS} |" in md


@pytest.fixture(scope="module")
def tiny_k3():
    topo = load_topology("h200x8-ib400")
    return analyse(
        "tiny-kimi-k3",
        topo,
        [load_workload("prompt16k-c8")],
        MemoAsk(deployment=MeshAsk(tp=2), search_top=0),
        predictor=predict_plan,
    )


def test_time_plots_leave_illegal_plans_out_and_say_so(tiny_k3, monkeypatch):
    drawn: dict[str, list[str]] = {}

    def record(name):
        def draw(series, *args, **kwargs):
            drawn[name] = list(series)
            return b"png"

        return draw

    fake = SimpleNamespace(**{n: record(n) for n in ("volume_vs_tp", "stacked_time", "grouped_bars", "crossover")})
    monkeypatch.setattr(memo_module, "load_plots", lambda: fake)
    illegal = [v.key for v in tiny_k3.variants if not v.legal]
    assert "input-scattered" in illegal
    built = memo_module.build_memo(tiny_k3)
    for plot in ("stacked_time", "grouped_bars"):
        assert drawn[plot] and not set(drawn[plot]) & set(illegal), plot
        assert "baseline" in drawn[plot]
    said = next(line for line in built.markdown.splitlines() if line.startswith("Not plotted: "))
    assert all(f"`{k}`" in said for k in illegal), said
    # the table keeps the illegal rows, marked
    ttft = built.markdown[built.markdown.index("## TTFT per plan") :]
    assert "| `input-scattered` | prompt16k-c8 |" in ttft


def test_plots_come_right_after_the_answer(tiny_k3):
    md = memo_module.build_memo(tiny_k3).markdown
    order = [md.index(f"\n## {t}\n") for t in ("Answer", "TTFT per plan", "How sure", "Verdict per plan")]
    assert order == sorted(order)
    html = memo_module.build_memo(tiny_k3).html
    assert html.index("<img") < html.index("<h2>Verdict per plan</h2>")
    assert "<details><summary>Each plan: what it does" in html
