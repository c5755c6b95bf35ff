"""A prediction's band is composed from the errors of the classes and sources it sums."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from tpplan.cost.bands import (
    COMPUTE_CLASSES,
    OWN_BAND_CLASSES,
    compose,
    error_table,
    own_bands_notes,
    prediction_band,
    source_key,
)
from tpplan.cost.predict import predict_plan
from tpplan.cost.provenance import BANDS, composed_provenance, provenance
from tpplan.cost.topology import load_topology
from tpplan.mesh import Mesh
from tpplan.models.config import load_model
from tpplan.models.graph import build_model_graph
from tpplan.plans.named import make_plan


def test_every_error_has_a_basis_and_every_class_a_default() -> None:
    table = error_table()
    for klass in (*COMPUTE_CLASSES, *OWN_BAND_CLASSES, "collectives"):
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


def _band_without_own_classes(pred: object) -> float:
    """The band the same prediction had when every op took its category's error (before issue 34's own bands)."""
    kinds = [replace(kt, ops=[replace(o, band=None) for o in kt.ops]) for kt in pred.kinds]  # type: ignore[attr-defined]
    extra = {k: getattr(pred, k, 0.0) for k in ("stage_comm_s", "final_comm_s")}
    return prediction_band(SimpleNamespace(kinds=kinds, **extra))[0]


@pytest.mark.parametrize(
    ("model", "own"),
    [
        ("tiny-gpt-oss", {"attention_window"}),
        ("tiny-gemma3", {"attention_window"}),
        ("tiny-deepseek-v32", {"dsa_indexer", "attention_sparse"}),
        ("tiny-llama4", {"attention_chunked"}),  # chunked attention: its own band since 2026-12-06e (FA3)
        ("tiny-llama", set()),
    ],
)
def test_window_chunk_and_dsa_ops_widen_the_band_by_their_share(model: str, own: set[str]) -> None:
    """Windowed and chunked attention, DSA's indexer and its sparse attention take their own errors: the band grows
    by exactly each such part's share times (its error - the full-attention error of the same source); other models
    keep the band they had."""
    graph = build_model_graph(load_model(model))
    pred = predict_plan(graph, make_plan("baseline", graph, 2), load_topology("h200x8-ib400", nodes=1),
                        mesh=Mesh(2), tokens=4096)  # fmt: skip
    band, parts = prediction_band(pred)
    mine = [p for p in parts if p.klass in OWN_BAND_CLASSES]
    assert {p.klass for p in mine} == own and all(p.share > 0.01 for p in mine)
    attention = error_table()["attention"]
    widened = sum(p.share * (p.error - (attention.get(p.source) or attention["default"])[0]) for p in mine)
    assert band - _band_without_own_classes(pred) == pytest.approx(widened, abs=1e-12)
    assert (widened > 0) == bool(own)
    notes = own_bands_notes(parts)
    assert len(notes) == (1 if own else 0)
    for p in mine:
        assert f"{OWN_BAND_CLASSES[p.klass]} ({p.source}) {100 * p.share:.1f}% of the time" in notes[0]


def test_benchmarks_md_states_the_own_bands_of_the_table() -> None:
    """docs/benchmarks.md's table of the ops with bands of their own quotes errors.toml's figures, and its golden
    bands are the golden files' (tests/golden/)."""
    import json
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    doc = (repo / "docs" / "benchmarks.md").read_text()
    table = doc.split("<!-- own-bands:begin -->")[1].split("<!-- own-bands:end -->")[0]
    for klass in OWN_BAND_CLASSES:
        row = next(line for line in table.splitlines() if f"(`{klass}`)" in line)
        assert f"| ±{100 * error_table()[klass]['default'][0]:.0f}% |" in row, klass
    for name, sel in (("audit-glm-5.1-tp16-dsa", "plans"), ("audit-deepseek-v3.2-tbo", "plans"),
                      ("search-gpt-oss-120b-volume", "baseline")):  # fmt: skip
        out = json.loads((repo / "tests" / "golden" / f"{name}.json").read_text())["output"]
        prov = out["plans"][0]["prediction"]["provenance"] if sel == "plans" else out["baseline"]["provenance"]
        assert f"to ±{100 * prov['band']:.1f}%" in doc, name


def test_benchmarks_md_gemma_host_bound_figures_are_the_recorded_ones() -> None:
    """The figures docs/benchmarks.md quotes for Gemma 3's window op and norms (06d call 5) recomputed from its
    recorded results."""
    import json
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    doc = (repo / "docs" / "benchmarks.md").read_text()
    d = json.loads((repo / "docs/benchmarks/h100-2026-12-06d/call5/gemma-3-4b-it.json").read_text())
    ro, nb = d["runtime_overhead"], len(d["batches"])
    per_layer = nb * sum(d["model_slice"]["layer_kinds"].values())
    kern = {name: (n, s) for name, n, s in ro["by_kernel"]}
    n, s = kern["parallel_attn_fwd_kernel"]
    ops = {o["op"]: o["measured_s"] for o in d["ops"]}
    rows, row_s = kern["layer_norm_fwd_kernel_row"]
    quoted = [
        f"{n} calls, {s / n * 1e3:.3f} ms each, so {s / per_layer * 1e3:.3f} ms per window op",
        f"against {ops['attention'] * 1e3:.3f} ms event-timed",
        f"`layer_norm_fwd_kernel_row` {row_s / rows * 1e6:.0f} us",
        f"took {ro['pass_s'] / nb * 1e3:.1f} ms per batch with the GPU busy {ro['busy_s'] / nb * 1e3:.1f} ms of it "
        f"({100 * ro['busy_s'] / ro['pass_s']:.0f}%)",
        f"{ro['pass_s'] / per_layer * 1e3:.1f} ms per layer of\n  host against {ro['busy_s'] / per_layer * 1e3:.1f} ms",
        f"a batch is {sum(b['measured_s'] for b in d['batches']) / nb * 1e3:.1f} ms",
        f"is {ops['post_feedforward_layernorm'] * 1e3:.3f} ms after",
        f"{ops['post_attention_layernorm'] * 1e3:.3f} / {ops['mlp_norm'] * 1e3:.3f} ms in the two norms",
    ]
    for q in quoted:
        assert q in doc, q
