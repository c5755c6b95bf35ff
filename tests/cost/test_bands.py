"""A prediction's band is composed from the errors of the classes and sources it sums."""

from __future__ import annotations

import pytest

from tpplan.cost.bands import COMPUTE_CLASSES, compose, error_table, prediction_band, source_key
from tpplan.cost.predict import predict_plan
from tpplan.cost.provenance import BANDS, composed_provenance, provenance
from tpplan.cost.topology import load_topology
from tpplan.mesh import Mesh
from tpplan.models.config import load_model
from tpplan.models.graph import build_model_graph
from tpplan.plans.named import make_plan


def test_every_error_has_a_basis_and_every_class_a_default() -> None:
    table = error_table()
    for klass in (*COMPUTE_CLASSES, "collectives"):
        assert "default" in table[klass], klass
        for key, (err, basis) in table[klass].items():
            assert 0 < err < 1 and basis, (klass, key)
            assert "in sample" in basis or "out of sample" in basis or "no " in basis or "issue 25" in basis


def test_compose_is_the_share_weighted_error() -> None:
    band, parts = compose({("gemm", "gemm-table"): 3.0, ("collectives", "link-model"): 1.0})
    assert band == pytest.approx(0.75 * error_table()["gemm"]["gemm-table"][0] + 0.25 * 0.139)
    assert [p.klass for p in parts] == ["gemm", "collectives"] and sum(p.share for p in parts) == pytest.approx(1)
    unknown, (part,) = compose({("moe", "aic"): 1.0})  # a source the table does not list: its class default
    assert unknown == error_table()["moe"]["default"][0] and part.source == "aic"
    assert source_key("aic:h200_sxm/sglang@0.5.14") == "aic" and source_key(None) == "roofline"


def test_measured_and_datasheet_gpus_compose_different_bands() -> None:
    graph = build_model_graph(load_model("tiny-kimi-k3"))
    plan = make_plan("baseline", graph, 4)
    for name in ("h200x8-ib400", "h200x8-ib400-datasheet"):
        topo = load_topology(name, nodes=1)
        pred = predict_plan(graph, plan, topo, mesh=Mesh(4), tokens=4096)
        band, parts = prediction_band(pred)
        shares = {(p.klass, p.source): p.share for p in parts}
        assert sum(shares.values()) == pytest.approx(1.0)
        assert min(p.error for p in parts) <= band <= max(p.error for p in parts)
        moe = [k for k in shares if k[0] == "moe"]
        assert moe == ([("moe", "kernel-model")] if name == "h200x8-ib400" else [("moe", "gemm-table")]), name
        comp = composed_provenance(provenance(topo, 4), pred)
        assert comp.band == pytest.approx(band) and comp.parts and comp.key == provenance(topo, 4).key
    calibrated = load_topology("h200x2-runtime-kernels")
    tiny = build_model_graph(load_model("tiny-llama"))
    pred = predict_plan(tiny, make_plan("baseline", tiny, 2), calibrated, mesh=Mesh(2), tokens=1024)
    assert composed_provenance(provenance(calibrated, 2), pred) is BANDS["calibrated"]  # in-sample keeps its own


def test_derived_and_cross_node_curves_carry_their_own_error() -> None:
    """The NVLS-off 8-GPU ring is derived, the 16/32-GPU curves come from another cluster's nccl-tests:
    neither is priced with the single-node measured curves' 3.3%."""
    from tpplan.cost.bands import collective_key
    from tpplan.cost.collectives import collective_time

    size = 8192 * 7168 * 2
    ring = collective_time("all_reduce", size, 8, load_topology("h200x8-ib400")).algorithm
    ib = collective_time("all_reduce", size, 16, load_topology("h200x8-ib400-nvls", nodes=2)).algorithm
    table = error_table()["collectives"]
    assert collective_key(ring) == "curve-derived-ring" and table["curve-derived-ring"][0] == 0.049
    assert collective_key(ib) == "curve-across-nodes" and table["curve-across-nodes"][0] == 0.126
    assert collective_key("nccl-curve") == "curve"
