"""One memory figure everywhere (issue 21): the weight and replication bytes per rank that audit
JSON, search JSON and the memo state for a plan are the same number, in the stored dtype
(quantization read) and for the fullest pipeline stage, for quantized models and a PP plan."""

from __future__ import annotations

import pytest

from tpplan.audit import audit, to_json
from tpplan.cost.predict import predict_audit
from tpplan.cost.topology import load_topology
from tpplan.cost.workload import load_workload
from tpplan.mesh import Mesh
from tpplan.plans.files import save_plan_dir
from tpplan.report.memo_ask import MemoAsk
from tpplan.search import run_search

GIB = 2**30

CASES = [
    # model, nodes, tp, pp, most a rank's weights may be if the stored dtype was read (bf16 is ~2x)
    ("deepseek-v3", 1, 8, 1, 100 * GIB),  # FP8 block-wise: ~79 GiB, bf16 would be ~157
    ("gpt-oss-120b", 1, 4, 1, 20 * GIB),  # MXFP4 experts: ~15 GiB, bf16 would be ~56
    ("kimi-k3", 4, 8, 4, 80 * GIB),  # one of four stages: ~50 GiB, the whole model at TP8 ~191
]


@pytest.mark.parametrize(("model", "nodes", "tp", "pp", "most"), CASES, ids=[c[0] for c in CASES])
def test_audit_search_and_memo_state_one_memory_figure(tmp_path, model, nodes, tp, pp, most):
    from tpplan.report.analysis import analyse
    from tpplan.report.memo import build_memo

    topo = load_topology("h200x8-ib400", nodes=nodes)
    wl = load_workload("prompt16k-c8")
    found = run_search(model, topo, tp=tp, pp=pp, workload=wl, top=1)
    entry = found.data["plans"][0]
    (plan_path,) = save_plan_dir(tmp_path / "plans", found.plan_files[:1])
    weights, extra = entry["weight_bytes_per_rank"], entry["replicated_extra_bytes_per_rank"]
    assert entry["memory_bytes_per_rank"]["weights"] == weights
    assert entry["memory_bytes_per_rank"]["replicated_extra"] == extra
    assert extra > 0, "the case needs a plan that replicates something"
    assert weights < most, f"{weights / GIB:.1f} GiB per rank: quantization or PP stages were not read"

    a = audit(model, tp, [str(plan_path)])
    data = to_json(a, predict_audit(a, topo, mesh=Mesh(tp, pp=pp), workload=wl))
    got = data["plans"][-1]
    assert got["weight_bytes_per_rank"] == pytest.approx(weights, rel=1e-12)
    assert got["replicated_extra_bytes_per_rank"] == pytest.approx(extra, rel=1e-12)
    assert got["prediction"]["memory_bytes_per_rank"]["weights"] == pytest.approx(weights, rel=1e-12)

    memo = analyse(model, topo, [wl], MemoAsk(plans=(str(plan_path),), search_top=0))
    v = next(x for x in memo.variants if x.plan.name == entry["name"])
    assert (v.tp, v.pp) == (tp, pp), "a saved plan is priced at the TP x PP it was found at"
    md = build_memo(memo, "test").markdown
    verdicts = md.split("## Verdict per plan", 1)[1]  # the plots' tables come first and start with the key too
    row = next(line for line in verdicts.splitlines() if line.startswith(f"| `{v.key}`"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[5] == f"{extra / GIB:,.1f} GiB", row  # the verdict table's replicated column
    assert f"replicates weights: +{extra / GIB:,.1f} GiB per rank" in md
