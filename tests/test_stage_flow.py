"""The stages hand objects on (issue 22): a search audits each plan once, the baseline of every
deployment exactly once, and the memo's search, predictions and crossovers reuse its audits."""

from __future__ import annotations

from collections import Counter

import pytest

import tpplan.audit
import tpplan.cost.plan_steps
from tpplan.audit import Audits, _decisions_only
from tpplan.cost.topology import load_topology
from tpplan.cost.workload import load_workload
from tpplan.mesh import Mesh
from tpplan.models.config import load_model
from tpplan.models.graph import build_model_graph
from tpplan.plans.named import baseline
from tpplan.report.memo_ask import MemoAsk
from tpplan.search.grid import MeshAsk


@pytest.fixture
def audits_counted(monkeypatch):
    """Every audit tpplan makes (through `Audits` or a predictor without one), counted per
    (plan decisions, TP, dtype); forked search workers are turned off so every audit is seen."""
    calls: Counter = Counter()
    real = tpplan.audit.audit_plan

    def counting(graph, plan, n, dtype="bf16"):
        calls[(_decisions_only(plan), n, dtype)] += 1
        return real(graph, plan, n, dtype)

    monkeypatch.setattr(tpplan.audit, "audit_plan", counting)
    monkeypatch.setattr(tpplan.cost.plan_steps, "audit_plan", counting)
    monkeypatch.setattr("os.sched_getaffinity", lambda _pid: {0}, raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 1)
    return calls


def test_a_search_audits_every_plan_once_and_each_baseline_exactly_once(audits_counted):
    from tpplan.search import search_plans

    graph = build_model_graph(load_model("tiny-deepseek-v3"))
    topo, wl = load_topology("h200x2"), load_workload("prompt16k-c8")
    audits = Audits(graph)
    out = search_plans(graph, topo, workload=wl, top=3, audits=audits, ask=MeshAsk(replicas="all"))
    assert len(out.stats.deployments) == 4, "the case needs a grid (TP2, TP1xPP2, TP1xCP2, 2x TP1)"
    for tp in (m.tp for m in out.grid):
        assert audits_counted[(_decisions_only(baseline()), tp, "bf16")] == 1, f"baseline at TP{tp}"
    assert audits_counted and max(audits_counted.values()) == 1, audits_counted.most_common(2)
    assert sum(audits_counted.values()) == len(audits)  # every audit made went into the one Audits
    # the ranked plans' audits are the ones handed on, under the plan each is shown as
    for r in out.ranked:
        assert (
            r.audit is audits.of(r.plan, Mesh(r.tp))
            or r.audit.layer_results is audits.of(r.plan, Mesh(r.tp)).layer_results
        )
        assert r.audit.plan == r.plan


def test_the_memo_reuses_its_searchs_audits(audits_counted):
    from tpplan.report.analysis import analyse

    graph = build_model_graph(load_model("tiny-deepseek-v3"))
    topo, wl = load_topology("h200x2"), load_workload("prompt16k-c8")
    a = analyse(graph, topo, [wl], MemoAsk(search_top=2))
    assert a.next_steps, "the search's best beats baseline here (tests/report/test_one_search.py)"
    assert audits_counted and max(audits_counted.values()) == 1, audits_counted.most_common(3)


def test_audits_relabel_a_plan_without_auditing_it_again(audits_counted):
    graph = build_model_graph(load_model("tiny-llama"))
    audits = Audits(graph)
    first = audits.of(baseline(), Mesh(2))
    renamed = baseline().with_(name="search-1", title="found by search", found_by="search")
    again = audits.of(renamed, Mesh(2))
    assert again.plan == renamed and first.plan == baseline()
    assert again.layer_results is first.layer_results
    assert sum(audits_counted.values()) == 1
    assert audits.of(baseline(), Mesh(1)) is not first and sum(audits_counted.values()) == 2  # another TP: its own


def test_the_library_example_in_the_design_notes_runs(capsys):
    """docs/design.md, "Library API": the example runs as printed, and says what it computed."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "design.md").read_text()
    section = text.split("## Library API", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    scope: dict[str, object] = {}
    exec(compile(code[1], "docs/design.md", "exec"), scope)
    best, found, pred = scope["best"], scope["found"], scope["pred"]
    assert best.rank == 1 and best.score <= found.baseline.score  # the search's best beats baseline TP2
    assert pred.ttft.mean_s == pytest.approx(found.baseline.score, rel=1e-12)  # the same prediction
    assert scope["data"]["plans"][0]["name"] == best.plan.name
    assert f"{best.plan.name} at {best.deployment}" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"objective": "fast"}, "objective=fast"),
        ({"top": 0}, "top=0"),
        ({"memory_cap_gib": -1.0}, "memory_cap_gib=-1.0"),
        ({"ask": MeshAsk(tp=3)}, "tp=3"),
        ({"ask": MeshAsk(pp=99)}, "pp=99"),
        ({"expert_dtype": "int3"}, "expert_dtype=int3"),
    ],
)
def test_library_errors_name_the_argument_and_the_cli_its_flag(options, field):
    """The library speaks of its arguments (`tp=3`), never of CLI flags; `cli.as_flags` turns them
    into the options the user typed (`--tp 3`)."""
    from tpplan.cli import FLAG_OF, as_flags
    from tpplan.errors import TpplanError
    from tpplan.search import search_plans

    graph = build_model_graph(load_model("tiny-llama"))
    with pytest.raises(TpplanError) as info:
        search_plans(graph, load_topology("h200x2"), **options)
    assert field in info.value.where and "--" not in str(info.value), str(info.value)
    name, _, value = field.partition("=")
    assert as_flags(info.value).where.startswith(f"{FLAG_OF[name]} {value}"), as_flags(info.value).where


@pytest.mark.slow  # writes a whole memo (plots included): about 10 s on one core
def test_search_and_report_call_the_one_search_with_objects(monkeypatch, capsys, tmp_path):
    """`tpplan search` and `tpplan report` both run `search_plans`, handed a graph and topology
    (the CLI resolved the names), and each runs it once."""
    from cli_helpers import run_cli

    import tpplan.search
    from tpplan.cost.topology import Topology
    from tpplan.models.graph import ModelGraph

    real, seen = tpplan.search.search_plans, []

    def spy(graph, topology, **options):
        seen.append((type(graph), type(topology), options.get("workload")))
        return real(graph, topology, **options)

    monkeypatch.setattr(tpplan.search, "search_plans", spy)
    common = ("--model", "tiny-deepseek-v3", "--topology", "h200x2")
    code, _, err = run_cli(monkeypatch, capsys, "search", *common, "--workload", "prompt16k-c8", "--top", "2")
    assert code == 0, err
    code, _, err = run_cli(monkeypatch, capsys, "report", *common, "--workload", "prompt16k-c8",
                           "--out", str(tmp_path / "memo"))  # fmt: skip
    assert code == 0, err
    assert len(seen) == 2 and all(g is ModelGraph and t is Topology for g, t, _ in seen), seen
    assert all(w is not None and w.name == "prompt16k-c8" for _, _, w in seen)
