"""Cluster presets price single-node collectives from the measured curves they name (curve sets
extracted from AIConfigurator's NCCL tables, tpplan/cost/presets/curves/README.md)."""

from __future__ import annotations

import importlib.util
import json
import statistics
from importlib import resources
from pathlib import Path

import pytest

from tpplan.cost.collectives import collective_time, curve_latency_s, curve_time
from tpplan.cost.curve_sets import curve_set, list_curve_sets
from tpplan.cost.topology import load_cluster, load_topology
from tpplan.errors import TpplanError

MiB = 2**20
KINDS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")
ANCHOR = Path(__file__).resolve().parents[1] / "data" / "anchors" / "h200x2_nccl_probe.json"

# Rows read from AIC 0.12.0's nccl_perf.parquet tables (NCCL 2.29.2), in microseconds, by hand:
# (preset, kind, GPUs, MiB, us).
MEASURED = [
    ("h200x8-ib400-nvls", "all_reduce", 8, 1, 26.14),
    ("h200x8-ib400-nvls", "all_reduce", 8, 512, 2040.31),
    ("h200x8-ib400", "reduce_scatter", 8, 32, 111.62),
    ("h200x8-ib400", "all_to_all", 8, 4, 26.62),
    ("h200x8-ib400", "all_reduce", 2, 4, 32.39),
    ("h100x8-ib400", "reduce_scatter", 8, 32, 111.29),
    ("h100x8-ib400", "all_gather", 8, 512, 1401.50),
    ("pcie8-rtxpro6000", "all_reduce", 8, 512, 38073.0),
    ("pcie8-rtxpro6000", "reduce_scatter", 8, 32, 1281.5),
    ("pcie8-rtxpro6000", "all_gather", 4, 1, 51.53),
    ("b300x8-ib800", "all_reduce", 8, 32, 166.86),
    ("gb300-nvl72", "all_gather", 4, 512, 704.32),
]


@pytest.mark.parametrize(
    ("preset", "count", "system"),
    [
        ("h200x8-ib400", 11, "h200_sxm"),  # all but the 8-rank all-reduce (NVLS off: the ring link model)
        ("h100x8-ib400", 11, "h100_sxm"),  # the same for H100
        ("h200x8-ib400-nvls", 12, "h200_sxm"),  # and two across nodes (tests/cost/test_multinode_curves.py)
        ("pcie8-rtxpro6000", 12, "rtx_pro_6000_server"),
        ("b300x8-ib800", 12, "b300_sxm"),
        ("gb300-nvl72", 8, "gb300"),  # AIC measured GB300 at 2 and 4 GPUs only
    ],
)
def test_presets_load_their_curves(preset: str, count: int, system: str) -> None:
    curves = [c for c in load_topology(preset).curves if c.ranks <= 8 and c.algorithm == "nccl"]  # one node's, measured
    assert len(curves) == count
    assert {c.kind for c in curves} == set(KINDS)
    assert all(c.source.startswith(f"aiconfigurator-core 0.12.0: {system} NCCL 2.29.2") for c in curves)
    assert [c for c in load_cluster(preset).curves if c in curves] == curves  # the cluster half carries them too
    assert "measured" in load_topology(preset).provenance


@pytest.mark.parametrize(("preset", "system"), [("h200x8-ib400", "h200_sxm"), ("h100x8-ib400", "h100_sxm")])
def test_the_nvls_off_presets_take_the_derived_ring_for_the_eight_rank_all_reduce(preset: str, system: str) -> None:
    held = {(c.kind, c.ranks, c.algorithm) for c in load_topology(preset).curves}
    assert ("all_reduce", 8, "nccl") not in held and ("all_reduce", 4, "nccl") in held
    assert ("all_reduce", 8, "ring") in held and ("reduce_scatter", 8, "nccl") in held
    est = collective_time("all_reduce", 64 * MiB, 8, load_topology(preset, nodes=1))
    assert est.algorithm == "ring-curve" and set(est.candidates) == {"ring-curve"}


@pytest.mark.parametrize("system", ["h200_sxm", "h100_sxm"])
def test_the_derived_ring_is_the_tables_eight_gpu_ring_then_the_four_gpu_curve_at_its_busbw(system: str) -> None:
    """Up to 1 MiB the measured 8-GPU points (NCCL's ring there); above, the 4-GPU all-reduce (a ring)
    at the same busbw, time x 7/6, plus the median extra time of 8 over 4 GPUs at 256 KiB-1 MiB."""
    table = {(c["kind"], c["ranks"]): dict(c["points"]) for c in curve_set(f"{system}-nccl-2.29.2")["curves"]}
    four, eight = table[("all_reduce", 4)], table[("all_reduce", 8)]
    (derived,) = curve_set(f"{system}-nccl-2.29.2-ring8")["curves"]
    delta = statistics.median(eight[x] - 7 / 6 * four[x] for x in (MiB / 4, MiB / 2, MiB))
    assert 3e-6 < delta < 6e-6  # four more ranks' ring steps: under 1 us each
    for x, t in derived["points"]:
        assert t == pytest.approx(eight[x] if x <= MiB else 7 / 6 * four[x] + delta, rel=1e-9)
    busbw = 2 * 7 / 8 * 512 * MiB / dict(derived["points"])[512 * MiB] / 1e9
    assert 340 < busbw < 355  # below NVLS's 445-460 in the same tables, near the 360 the link model assumed
    assert load_topology("h200x8-ib400-datasheet").curves == []  # the pre-curve figures stay reproducible


@pytest.mark.parametrize(("preset", "kind", "ranks", "mib", "us"), MEASURED)
def test_prices_at_measured_points_are_the_measurements(preset: str, kind: str, ranks: int, mib: int, us: float):
    est = collective_time(kind, mib * MiB, ranks, load_topology(preset, nodes=1))
    assert est.algorithm == "nccl-curve"
    assert est.time_s == pytest.approx(us * 1e-6, rel=1e-6)


def test_the_seed_cluster_is_priced_at_its_measured_pcie_bandwidth() -> None:
    """8 RTX PRO 6000 on PCIe: NCCL's all-reduce reaches ~25 GB/s busbw at 512 MiB, not the 40 GB/s
    the link model assumed (1.6x too fast); the link model that prices groups across nodes now uses
    the measured 8-GPU reduce-scatter busbw and lands within 5% of the measured all-reduce."""
    topo = load_topology("pcie8-rtxpro6000", nodes=1)
    measured = collective_time("all_reduce", 512 * MiB, 8, topo)
    assert measured.busbw_GBps == pytest.approx(2 * 7 / 8 * 512 * MiB / 38073.0e-6 / 1e9, rel=1e-6)
    links = topo.model_copy(update={"curves": []})
    assert collective_time("all_reduce", 512 * MiB, 8, links).time_s == pytest.approx(measured.time_s, rel=0.05)
    old = links.model_copy(update={"intra": links.intra.model_copy(update={"bandwidth_GBps": 40.0})})
    assert 1.5 < measured.time_s / collective_time("all_reduce", 512 * MiB, 8, old).time_s < 1.7


def test_latency_term_fits_the_one_to_four_mib_rows() -> None:
    """alpha is the intercept of the least-squares line through the 1, 2 and 4 MiB rows; that line
    stays within 6% of each of those rows for H200's 8-rank reduce-scatter and all-gather."""
    for kind in ("reduce_scatter", "all_gather"):
        curve = next(c for c in load_topology("h200x8-ib400").curves if c.kind == kind and c.ranks == 8)
        rows = [(x, t) for x, t in curve.points if MiB <= x <= 4 * MiB]
        assert len(rows) == 3
        mx, mt = statistics.fmean(x for x, _ in rows), statistics.fmean(t for _, t in rows)
        slope = sum((x - mx) * (t - mt) for x, t in rows) / sum((x - mx) ** 2 for x, _ in rows)
        alpha = curve_latency_s(curve)
        assert alpha == pytest.approx(mt - slope * mx, rel=1e-9)
        assert 2e-6 < alpha < 14e-6  # below the 1 MiB row (14-17 us): NCCL's per-call cost, not the 20 us assumed
        for x, t in rows:
            assert alpha + slope * x == pytest.approx(t, rel=0.06)


def test_outside_the_points_the_alpha_beta_line_takes_over() -> None:
    curve = next(c for c in load_topology("h200x8-ib400-nvls").curves if c.kind == "all_reduce" and c.ranks == 8)
    (x_lo, t_lo), (x_hi, t_hi) = curve.points[0], curve.points[-1]
    alpha = curve_latency_s(curve)
    assert curve_time(curve, 2 * x_hi) == pytest.approx(alpha + 2 * (t_hi - alpha), rel=1e-9)  # 1 GiB
    assert curve_time(curve, x_hi * (1 + 1e-9)) == pytest.approx(t_hi, rel=1e-6)  # continuous at the end
    big = collective_time("all_reduce", 4 * x_hi, 8, load_topology("h200x8-ib400-nvls", nodes=1))
    assert big.busbw_GBps == pytest.approx(2 * 7 / 8 * x_hi / (t_hi - alpha) / 1e9, rel=0.01)  # the tail's busbw
    tiny = curve_time(curve, x_lo / 2)
    assert min(alpha, t_lo) <= tiny <= t_lo


def test_groups_across_nodes_keep_the_link_model() -> None:
    topo = load_topology("h200x8-ib400")
    assert collective_time("all_reduce", 64 * MiB, 16, topo).algorithm in ("ring", "tree", "hierarchical")
    assert collective_time("reduce_scatter", 64 * MiB, 16, topo, ranks_per_node=8).algorithm == "ring"


def test_curves_agree_with_the_independent_two_gpu_probe() -> None:
    """Out of sample: NCCL on another 2 x H200 box (torch.distributed, NCCL 2.28.9, NVLS off) against
    the AIC-measured curves, at T = 4K-16K tokens (14-235 MB): within 10% each, 3% median."""
    topo = load_topology("h200x8-ib400", nodes=1)
    rows = json.loads(ANCHOR.read_text())["rows"]
    errs = []
    probes = (("ar_hidden", "all_reduce", 7168, 1), ("rs_hidden", "reduce_scatter", 7168, 1),
              ("ag_hidden", "all_gather", 7168, 1), ("a2a_gate", "all_to_all", 12288, 2))  # fmt: skip
    for row in rows[1:]:  # T = 1024 is 4-14 MB, where torch's own per-call overhead shows
        for key, kind, width, div in probes:
            size = row["T"] * width * 2 / div
            errs.append(collective_time(kind, size, 2, topo).time_s * 1e3 / row[key] - 1)
    assert max(abs(e) for e in errs) < 0.10, errs
    assert statistics.median(abs(e) for e in errs) < 0.03


def test_curve_set_names_and_skips_are_checked(tmp_path) -> None:
    assert {"h200_sxm-nccl-2.29.2", "rtx_pro_6000_server-nccl-2.29.2"} <= set(list_curve_sets())
    assert curve_set("h200_sxm-nccl-2.29.2")["aic_version"] == "0.12.0"
    body = 'name = "c"\nnodes = 1\ngpus_per_node = 8\n[intra]\nkind = "nvlink"\nbandwidth_GBps = 360\nlatency_us = 1\n'
    for refs, match in (('["h200-nccl"]', "no such preset"), ('[{ name = "h200_sxm-nccl-2.29.2", skip = ["ar@8"] }]',
                        "no such curve"), ('"h200_sxm-nccl-2.29.2"', "must be a list")):  # fmt: skip
        path = tmp_path / "c.toml"
        path.write_text(f"curve_sets = {refs}\n{body}")
        with pytest.raises(TpplanError, match=match):
            load_cluster(str(path))


def test_an_engine_all_reduce_set_adds_its_own_algorithm(tmp_path) -> None:
    """Opt-in: SGLang's CUDA-graph custom all-reduce on 8 H200 (13.05 us at 1 MiB in AIC's table)
    beats NCCL's 26.14 us there and is NCCL itself at 256 MiB (1.053 vs 1.053 ms)."""
    path = tmp_path / "c.toml"
    text = (resources.files("tpplan.cost") / "presets" / "clusters" / "h200x8-ib400-nvls.toml").read_text()
    both = 'curve_sets = ["h200_sxm-nccl-2.29.2", "h200_sxm-sglang-graph-0.5.14-allreduce"]'
    path.write_text(text.replace('curve_sets = ["h200_sxm-nccl-2.29.2", "h100x8-ndr400-nccl-2.26.2"]', both))
    topo = load_topology(str(path), nodes=1)
    small = collective_time("all_reduce", MiB, 8, topo)
    assert small.algorithm == "sglang-custom-graph-curve" and small.time_s == pytest.approx(13.051e-6, rel=1e-3)
    assert small.candidates["nccl-curve"] == pytest.approx(26.14e-6, rel=1e-3)
    big = collective_time("all_reduce", 256 * MiB, 8, topo)
    assert big.candidates["sglang-custom-graph-curve"] == pytest.approx(big.candidates["nccl-curve"], rel=0.01)
    assert collective_time("reduce_scatter", MiB, 8, topo).algorithm == "nccl-curve"


@pytest.mark.skipif(importlib.util.find_spec("aiconfigurator_core") is None, reason="needs aiconfigurator-core")
def test_shipped_sets_are_the_packaged_tables() -> None:
    """With the package installed: every shipped point is AIC's table row (bytes = 2 x half elements)."""
    from tpplan.cost.sources.aic_curves import engine_ar_points, nccl_points

    for name in list_curve_sets():
        data = curve_set(name)
        if "aic_version" not in data or "derived" in data:
            continue  # a published run (test_multinode_curves.py) or a derived curve (checked above)
        if "nccl" in data:
            table, key = nccl_points(data["system"], data["nccl"]), "kind"
        else:
            engine, version = data["engine"].split("@")
            table, key = engine_ar_points(data["system"], engine, version), "algorithm"
        for c in data["curves"]:
            want = table[(c[key], c["ranks"])]
            assert [x for x, _ in c["points"]] == [x for x, _ in want]
            assert [t for _, t in c["points"]] == pytest.approx([t for _, t in want], rel=1e-9)
        if "nccl" in data:
            assert {(c["kind"], c["ranks"]) for c in data["curves"]} == set(table)
