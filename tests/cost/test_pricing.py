"""The search's pricing API (`cost.pricing.Pricer`) prices every op as `predict_plan` does, also the
ops whose price depends on the batch's layout (sliding-window and chunked attention)."""

from __future__ import annotations

import pytest

from tpplan.audit import audit_plan
from tpplan.cost.predict import predict_plan
from tpplan.cost.pricing import Pricer
from tpplan.cost.topology import load_topology
from tpplan.mesh import Mesh
from tpplan.models.config import load_model
from tpplan.models.graph import build_model_graph
from tpplan.plans.named import make_plan


@pytest.mark.parametrize("preset", ["gpt-oss-20b", "gemma-3-4b-it", "llama-4-scout-17b-16e"])
def test_windowed_attention_is_priced_by_the_pricer_as_by_predict(preset: str) -> None:
    graph = build_model_graph(load_model(preset))
    topo = load_topology("h200x8-ib400", nodes=1)
    pa = audit_plan(graph, make_plan("baseline", graph, 8), 8, "bf16")
    tokens = 8192
    pred = predict_plan(graph, pa.plan, topo, mesh=Mesh(8), tokens=tokens, audit=pa)
    pricer = Pricer(graph, topo, Mesh(8))
    checked = 0
    for kind, ks in pa.kinds.items():
        lg = graph.kinds[kind]
        kt = next(k for k in pred.kinds if k.kind == kind)
        by_name = {o.op: o.seconds for o in kt.ops}
        for d in ks.result.decisions:
            if d.op.attrs.get("window") or d.op.attrs.get("chunk"):
                got = pricer.op_time(lg, d, ((tokens, 0),)).seconds
                assert got > 0 and got == pytest.approx(by_name[d.op.name]), (kind, d.op.name)
                checked += 1
    assert checked, f"{preset} has no windowed or chunked attention op"
