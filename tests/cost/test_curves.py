"""Collectives as measured curves in a cluster file: points per kind x algorithm x ranks."""

from __future__ import annotations

import math

import pytest

from tpplan.cost.bands import collective_key
from tpplan.cost.collective_pricer import price_collective
from tpplan.cost.collectives import collective_time, curve_latency_s
from tpplan.cost.kernel_source import KernelPrice
from tpplan.cost.topology import load_topology
from tpplan.errors import TpplanError

MiB = 2**20
CLUSTER = """name = "h200x8-curves"
nodes = 1
gpus_per_node = 8
gpu = "h200-datasheet"

[intra]
kind = "nvlink"
bandwidth_GBps = 360.0
latency_us = 1.0

[[curves]]
kind = "all_reduce"
algorithm = "nvls"
ranks = 8
points = [[1048576, 20e-6], [4194304, 35e-6], [67108864, 300e-6]]
source = "test points"

[[curves]]
kind = "all_reduce"
algorithm = "ring"
ranks = 8
points = [[1048576, 30e-6], [67108864, 400e-6]]
"""


@pytest.fixture
def topo(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text(CLUSTER)
    return load_topology(str(p))


def test_curves_interpolate_inside_and_follow_the_alpha_beta_line_outside(topo) -> None:
    at = collective_time("all_reduce", 2 * MiB, 8, topo)
    assert at.algorithm == "nvls-curve"  # the faster measured algorithm, as NCCL's tuner picks
    want = math.exp(math.log(20e-6) + 0.5 * (math.log(35e-6) - math.log(20e-6)))  # 2 MiB: halfway in log size
    assert at.time_s == pytest.approx(want, rel=1e-9)
    # The latency term: the line through the 1 and 4 MiB points, 20 us and 35 us, meets 0 bytes at 15 us.
    alpha = 20e-6 - (35e-6 - 20e-6) / 3
    assert curve_latency_s(topo.curves[0]) == pytest.approx(alpha, rel=1e-9)
    below = alpha + 4096 * (20e-6 - alpha) / MiB  # the line from alpha to the smallest point
    assert collective_time("all_reduce", 4096, 8, topo).time_s == pytest.approx(below, rel=1e-9)
    above = alpha + 128 * MiB * (300e-6 - alpha) / (64 * MiB)  # the line from alpha through the largest point
    assert collective_time("all_reduce", 128 * MiB, 8, topo).time_s == pytest.approx(above, rel=1e-9)
    ring = collective_time("all_reduce", 2 * MiB, 8, topo, algorithm="ring")
    assert ring.algorithm == "ring-curve" and ring.time_s > at.time_s
    assert collective_key(at.algorithm) == "curve" and collective_key("ring") == "link-model"


def test_kinds_and_groups_without_a_curve_keep_the_link_model(topo) -> None:
    rs = collective_time("reduce_scatter", 2 * MiB, 8, topo)
    assert rs.algorithm == "ring" and set(rs.candidates) == {"ring"}
    assert collective_time("all_reduce", 2 * MiB, 4, topo).algorithm == "ring"
    with pytest.raises(TpplanError, match="not available"):
        collective_time("all_reduce", 2 * MiB, 8, topo, algorithm="tree")


def test_bad_curves_are_refused(tmp_path) -> None:
    p = tmp_path / "bad.toml"
    p.write_text(CLUSTER.replace("[4194304, 35e-6], ", "[4194304, 35e-6], [2097152, 40e-6], "))
    with pytest.raises(TpplanError, match="rising bytes"):
        load_topology(str(p))


class _Nccl:
    """A stand-in kernel source that prices only 8-rank all-reduces."""

    name = "table"

    def collective(self, shape):
        return KernelPrice(1e-4, "table:nccl") if shape.kind == "all_reduce" and shape.ranks == 8 else None


class _Every:
    """A stand-in engine table that prices every collective (as AIC's NVLS-on NCCL tables would)."""

    name = "table"

    def collective(self, shape):
        return KernelPrice(1e-9, "table:nccl")


def test_a_kernel_source_adds_collectives_only_where_the_cluster_states_none(topo) -> None:
    """The cluster's measured 8-rank all-reduce keeps its price under an engine's table (an NVLS-off curve is
    not replaced by an NVLS-on table); where the cluster has only its link model, the table adds the price."""
    kept = price_collective("all_reduce", 2 * MiB, 8, topo, sources=(_Every(),))
    assert kept == collective_time("all_reduce", 2 * MiB, 8, topo) and kept.algorithm.endswith("-curve")
    added = price_collective("all_reduce", 2 * MiB, 4, topo, sources=(_Nccl(), _Every()))
    assert added.time_s == 1e-9 and added.algorithm == "table:nccl"
    assert price_collective("all_gather", 2 * MiB, 8, topo, sources=(_Nccl(),)) == collective_time(
        "all_gather", 2 * MiB, 8, topo
    )


def test_engine_tables_keep_an_nvls_off_clusters_all_reduce() -> None:
    """h200x8-ib400 (NVLS off: its 8-GPU all-reduce is the derived ring curve) prices the same 8-rank
    all-reduce with or without an engine's tables; h200x8-ib400-nvls keeps its NVLS-on curve."""
    for preset in ("h200x8-ib400", "h200x8-ib400-nvls"):
        t = load_topology(preset)
        for size in (256 * 1024, 32 * MiB):
            own = collective_time("all_reduce", size, 8, t)
            assert price_collective("all_reduce", size, 8, t, sources=(_Every(),)) == own, (preset, size)


def test_the_provenance_says_when_engine_tables_priced_collectives() -> None:
    from tpplan.cost.bands import BandPart
    from tpplan.cost.provenance import _engine_collectives_note

    aic = BandPart("collectives", "aic", 0.2, 0.1, "AIC NCCL table")
    curve = BandPart("collectives", "curve", 0.2, 0.1, "measured curve")
    assert "--engine tables" in _engine_collectives_note([curve, aic])
    assert _engine_collectives_note([curve, BandPart("gemm", "aic", 0.6, 0.1, "AIC GEMM")]) == ""
