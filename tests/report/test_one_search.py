"""`tpplan report` runs `tpplan search`'s own search (issue 21): for the same inputs both name the
same best plan at the same TP x PP, and the memo's deltas compare like with like."""

from __future__ import annotations

import pytest

from tpplan.cost.topology import load_topology
from tpplan.cost.workload import load_workload
from tpplan.report.analysis import analyse
from tpplan.report.memo_ask import MemoAsk
from tpplan.search import run_search
from tpplan.search.grid import MeshAsk


@pytest.mark.parametrize(("model", "tp"), [("tiny-deepseek-v3", None), ("tiny-deepseek-v3", 2), ("tiny-llama", None)])
def test_search_and_report_name_the_same_best_plan(model, tp):
    topo, wl = load_topology("h200x2"), load_workload("prompt16k-c8")
    best = run_search(model, topo, tp=tp, workload=wl, top=1)
    entry, plan = best.data["plans"][0], best.plans[0]
    a = analyse(model, topo, [wl], MemoAsk(deployment=MeshAsk(tp=tp)))
    assert a.next_steps, "the search's best beats baseline here, so the memo has a next step"
    top = a.variant(a.next_steps[0].key)
    assert top is not None
    assert (top.tp, top.pp) == (entry["tp"], entry["pp"])
    assert top.plan.describe() == plan.describe(), (top.key, entry["name"])
    assert top.predictions[wl.name].ttft.mean_s == pytest.approx(entry["score"], rel=1e-9)
    assert a.bottom is not None and a.bottom.target in (top.key, a.current.key)
    from tpplan.search.ranking import SERVING_SHARE

    assert a.memory_cap_bytes == pytest.approx(SERVING_SHARE * topo.gpu.memory_GiB * 2**30)  # search's own cap
    assert best.data["memory_cap_bytes"] == pytest.approx(a.memory_cap_bytes)


def test_a_plan_at_another_shape_is_split_into_deployment_and_plan_change():
    topo, wl = load_topology("h200x2"), load_workload("prompt16k-c8")
    a = analyse("tiny-deepseek-v3", topo, [wl], MemoAsk(plans=("sp-moe",), current="sp-moe TP1xPP2", search_top=0))
    ref = a.current
    assert (ref.tp, ref.pp) == (1, 2)
    same_shape = [v for v in a.variants if v.plan.name == "baseline" and (v.tp, v.pp) == (1, 2)]
    assert same_shape, "a baseline at the current deployment's shape is in the memo"
    other = a.verdict("sp-moe")
    assert other is not None and "of which the deployment change" in other.headline, other.headline


def test_the_memo_time_per_kind_sums_to_the_audit_forward_time():
    from tpplan.report.results import kind_times

    topo, wl = load_topology("h200x2"), load_workload("prompt16k-c8")
    a = analyse("tiny-kimi-k3", topo, [wl], MemoAsk(deployment=MeshAsk(tp=2), plans=("baseline",), search_top=0))
    v = a.baseline  # every layer of a kind sees the same input under baseline, so kinds x counts is exact
    pred = v.predictions[wl.name]
    assert pred.final_comm_s > 0  # the reduction before the final norm, which the table left out
    assert sum(kind_times(v).values()) == pytest.approx(pred.forward_s, rel=1e-12)


def test_search_deltas_are_against_baseline_at_the_same_shape():
    data = run_search("tiny-kimi-k3", "h200x8-ib400", nodes=1, workload="prompt16k-c8", top=4).data
    bases = {b["deployment"]: b for b in data["baselines"]}
    assert data["baselines"][0]["deployment"] == data["baseline"]["deployment"]
    assert any(p["deployment"] != data["baseline"]["deployment"] for p in data["plans"]), "the case needs PP plans"
    for p in data["plans"]:
        same = bases[p["deployment"]]
        assert p["baseline_score"] == same["score"]
        assert p["delta_vs_baseline_pct"] == pytest.approx(100 * (p["score"] - same["score"]) / same["score"], abs=0.01)
        ref = data["baseline"]["score"]
        assert p["deployment_delta_pct"] == pytest.approx(100 * (same["score"] - ref) / ref, abs=0.01)


def test_the_memo_band_is_the_current_predictions_own_band():
    """The memo reads the band `predict_plan` composed for today's deployment; without predictions
    (no predictor) it is the topology's provenance."""
    from tpplan.cost.provenance import provenance

    topo, wl = load_topology("h200x2"), load_workload("prompt16k-c8")
    a = analyse("tiny-kimi-k3", topo, [wl], MemoAsk(deployment=MeshAsk(tp=2), plans=("baseline",), search_top=0))
    own = a.current.predictions[wl.name].provenance
    assert own.parts and a.provenance is own  # composed per op class and source, not the topology's flat band
    bare = analyse(
        "tiny-kimi-k3",
        topo,
        [wl],
        MemoAsk(deployment=MeshAsk(tp=2), plans=("baseline",), search_top=0),
        use_default_predictor=False,
    )
    assert not bare.current.predictions and bare.provenance is provenance(topo, 2)
