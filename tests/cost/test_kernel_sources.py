"""The compute pricer asks the GPU model's kernel sources first; `--engine` adds an engine's database."""

from __future__ import annotations

import pytest

from tpplan.cost import compute
from tpplan.cost.kernel_source import KernelPrice
from tpplan.cost.predict import predict_plan
from tpplan.cost.topology import select_topology
from tpplan.errors import TpplanError
from tpplan.mesh import Mesh
from tpplan.models.config import load_model
from tpplan.models.graph import build_model_graph
from tpplan.plans.named import make_plan


class FakeDatabase:
    """Answers GEMMs with N >= 20 and every MoE at fixed times; nothing else."""

    def __init__(self, system: str, engine: str, version: str | None) -> None:
        self.name = f"fake:{system}/{engine}@{version}"

    def gemm(self, shape):
        return KernelPrice(1e-3, self.name) if shape.n >= 20 else None

    def attention(self, shape):
        return None

    def moe(self, shape):
        return KernelPrice(2e-3, self.name, extrapolated=True)

    def collective(self, shape):
        return None


@pytest.fixture
def fake_aic(monkeypatch):
    monkeypatch.setitem(compute.SOURCE_ADAPTERS, "aic", (__name__, "FakeDatabase"))
    monkeypatch.setitem(compute.SOURCE_ADAPTERS, "aic-fitted", ("tpplan.no_such_module", "X"))
    compute._SOURCES.clear()
    yield
    compute._SOURCES.clear()


def test_engine_sources_price_first_and_fall_back_to_the_formulas(fake_aic) -> None:
    graph = build_model_graph(load_model("tiny-kimi-k3"))
    plan = make_plan("baseline", graph, 4)
    plain_topo = select_topology("h200x8-ib400", 1)
    engine_topo = select_topology("h200x8-ib400", 1, engine="sglang@0.5.14")
    assert plain_topo is not None and engine_topo is not None
    assert engine_topo.gpu.sources[0].engine == "sglang" and "sglang" in engine_topo.gpu.software
    plain = predict_plan(graph, plan, plain_topo, mesh=Mesh(4), tokens=2048)
    eng = predict_plan(graph, plan, engine_topo, mesh=Mesh(4), tokens=2048)
    ops = {(kt.kind, o.op): o for kt in eng.kinds for o in kt.ops}
    base = {(kt.kind, o.op): o for kt in plain.kinds for o in kt.ops}
    moe = [o for o in ops.values() if o.category == "moe"]
    assert moe and all(o.seconds == 2e-3 and o.source == "fake:h200_sxm/sglang@0.5.14" and o.extrapolated for o in moe)
    gemms = [o for o in ops.values() if o.category == "gemm"]
    wide = [o for o in gemms if o.shape and o.shape[2] >= 20]
    narrow = [o for o in gemms if o.shape and o.shape[2] < 20]
    assert wide and all(o.seconds == 1e-3 and o.source.startswith("fake:") for o in wide)
    assert narrow and all(o.source == "gemm-table" and o.seconds == base[(o.layer_kind, o.op)].seconds for o in narrow)
    # the same through the keyword: the GPU model of the plain topology, the engine named per call
    kw = predict_plan(graph, plan, plain_topo, mesh=Mesh(4), tokens=2048, engine="sglang@0.5.14")
    assert kw.forward_s == pytest.approx(eng.forward_s)


def test_engine_needs_a_known_name_and_a_cluster() -> None:
    with pytest.raises(TpplanError, match="unknown serving engine"):
        select_topology("h200x8-ib400", engine="tgi")
    with pytest.raises(TpplanError, match="needs a cluster"):
        select_topology(None, engine="vllm")
