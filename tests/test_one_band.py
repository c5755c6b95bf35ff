"""One band and one per-deployment time per question, whichever command asks (issue 33, item 5):
`tpplan audit`, `tpplan search` and the memo state the same error band (the reference deployment's
baseline prediction, composed per op class and source), and the memo's deployment rows carry the
search's best time at each deployment, on several models."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest
from cli_helpers import run_cli

from tpplan.cost.topology import load_topology
from tpplan.cost.workload import load_workload
from tpplan.report.analysis import analyse
from tpplan.report.memo_ask import MemoAsk
from tpplan.search import run_search

TOPOLOGY = "h200x2"
WORKLOAD = str(Path(__file__).parent / "data" / "workload-prompt448-c8.toml")  # inside tiny contexts
MODELS = ("tiny-deepseek-v3", "tiny-llama", "tiny-qwen3-moe")


@cache
def _answers(model: str):
    topo, wl = load_topology(TOPOLOGY), load_workload(WORKLOAD)
    return run_search(model, topo, workload=wl, top=1), analyse(model, topo, [wl], MemoAsk(prompt_lengths=None))


@pytest.mark.parametrize("model", MODELS)
def test_audit_search_and_memo_state_one_band(model: str, monkeypatch, capsys) -> None:
    searched, memo = _answers(model)
    band = searched.data["provenance"]["band"]  # type: ignore[index]
    assert memo.provenance.band == pytest.approx(band, rel=1e-12)
    code, out, _ = run_cli(monkeypatch, capsys, "audit", "--model", model, "--topology", TOPOLOGY, "-w", WORKLOAD,
                           "--tp", "2")  # fmt: skip
    assert code == 0
    (printed,) = re.findall(r"error band\s+±(\d+\.\d)%", " ".join(out.split()))
    assert float(printed) == pytest.approx(100 * band, abs=0.051)


@pytest.mark.parametrize("model", MODELS)
def test_the_memos_deployment_rows_are_the_searchs_per_deployment_best(model: str) -> None:
    searched, memo = _answers(model)
    every = run_search(model, load_topology(TOPOLOGY), workload=load_workload(WORKLOAD), top=10_000).ranked
    best: dict[str, float] = {}
    for r in every:  # the search's own ranking, best first: each deployment's first row is its best
        best.setdefault(r.deployment, r.score)
    assert {r.deployment: r.score for r in searched.deployment_best} == best
    rows = {r.label: r.ttft_s for r in memo.deployments["prompt448-c8"] if r.fits}
    assert len(rows) >= 2
    for label, ttft in rows.items():
        assert ttft == pytest.approx(best[label], rel=1e-9), label
    assert set(rows) <= {m.label() for m in searched.grid}
