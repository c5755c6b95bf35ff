"""Redundant experts (issue 32) count where the engines count them: the all-to-all dispatch carries routing
weights for the rank's physical experts, and an engine's MoE table is asked at the physical expert count
(`tpplan.engines.redundant_experts.DISPATCH`: SGLang 0.5.23 and vLLM 0.34.0 dispatch over physical ids)."""

from __future__ import annotations

import pytest

from tpplan.audit import audit_plan
from tpplan.cost import compute
from tpplan.cost.kernel_source import KernelPrice, MoeShape
from tpplan.cost.predict import predict_plan
from tpplan.cost.topology import select_topology
from tpplan.layout.propagate import moe_weight_columns
from tpplan.mesh import Mesh
from tpplan.models.config import load_model
from tpplan.models.graph import build_model_graph
from tpplan.plans.named import make_plan

ASKED: list[MoeShape] = []


class RecordingDatabase:
    """Prices every MoE at a fixed time and records the shape it was asked at; nothing else."""

    def __init__(self, system: str, engine: str, version: str | None) -> None:
        self.name = f"recording:{system}/{engine}@{version}"

    def gemm(self, shape):
        return None

    def attention(self, shape):
        return None

    def moe(self, shape):
        ASKED.append(shape)
        return KernelPrice(2e-3, self.name)

    def collective(self, shape):
        return None


@pytest.fixture
def recording_aic(monkeypatch):
    monkeypatch.setitem(compute.SOURCE_ADAPTERS, "aic", (__name__, "RecordingDatabase"))
    monkeypatch.setitem(compute.SOURCE_ADAPTERS, "aic-fitted", ("tpplan.no_such_module", "X"))
    compute._SOURCES.clear()
    ASKED.clear()
    yield
    compute._SOURCES.clear()


@pytest.mark.parametrize(("plan", "experts"), [("sp-moe", 8), ("sp-moe+redundant4", 12), ("ep2+redundant2", 10)])
def test_engine_moe_table_is_asked_at_the_physical_expert_count(recording_aic, plan, experts) -> None:
    graph = build_model_graph(load_model("tiny-kimi-k3"))  # 8 routed experts
    topo = select_topology("h200x8-ib400", 1, engine="sglang@0.5.14")
    assert topo is not None
    predict_plan(graph, make_plan(plan, graph, 2), topo, mesh=Mesh(2), tokens=2048)
    assert ASKED and {s.experts for s in ASKED} == {experts}


def test_dispatch_carries_routing_weights_for_the_physical_experts() -> None:
    graph = build_model_graph(load_model("tiny-kimi-k3"))
    widths = {}
    for name in ("sp-moe", "sp-moe+redundant4"):
        pa = audit_plan(graph, make_plan(name, graph, 2), 2)
        widths[name] = {c.width for r in pa.layer_results for c in r.comms if c.value.endswith(":dispatch")}
    (width,) = {op.int_attr("width") for lg in graph.kinds.values() for op in lg.ops if "experts" in op.attrs}
    assert widths["sp-moe"] == {width + moe_weight_columns(8 // 2, 2)}
    assert widths["sp-moe+redundant4"] == {width + moe_weight_columns(12 // 2, 2)}
