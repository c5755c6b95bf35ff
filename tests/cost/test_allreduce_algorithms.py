"""Intra-node all-reduce algorithms a topology declares (NVLS, one-shot, ...) are priced with their
own constants; without a declaration the link model prices the ring exactly as before (measured
curves, where a preset carries them, come first: tests/cost/test_curve_presets.py)."""

from __future__ import annotations

import tomllib
from importlib import resources

import pytest

from tpplan.cost.collectives import collective_time
from tpplan.cost.topology import Topology, load_topology, topology_to_toml

MiB = 2**20


def _preset_text(name: str) -> str:
    """A preset's cluster file where the topology names one (presets/clusters/), else the topology file."""
    root = resources.files("tpplan.cost").joinpath("presets")
    cluster = root.joinpath("clusters", f"{name}.toml")
    return (cluster if cluster.is_file() else root.joinpath(f"{name}.toml")).read_text()


def _with_algos(topo: Topology, *algos: dict) -> Topology:
    data = topo.model_dump()
    data["intra"]["all_reduce"] = list(algos)
    return Topology.model_validate(data)


@pytest.mark.parametrize("name", ["h200x8-ib400", "h100x8-ib400", "h200x2", "pcie8-rtxpro6000"])
@pytest.mark.parametrize("size", [64 * 1024, 16 * MiB, 256 * MiB])
def test_datasheet_links_price_the_ring_formula(name: str, size: int) -> None:
    """Numbers from the preset file's own constants and the ring formula, not from the model: the
    link model that prices every group without a measured curve (all of them where a preset has none)."""
    raw = tomllib.loads(_preset_text(name))
    assert "all_reduce" not in raw["intra"]  # the link model assumes the NCCL ring only
    n = raw["gpus_per_node"]
    launch, a, b = raw["launch_us"] * 1e-6, raw["intra"]["latency_us"] * 1e-6, raw["intra"]["bandwidth_GBps"] * 1e9
    topo = load_topology(name, nodes=1).model_copy(update={"curves": []})
    ar = collective_time("all_reduce", size, n, topo)
    assert ar.algorithm == "ring" and set(ar.candidates) == {"ring"}
    assert ar.time_s == pytest.approx(launch + 2 * (n - 1) * a + 2 * (n - 1) / n * size / b, rel=1e-12)
    rs = collective_time("reduce_scatter", size, n, topo)
    assert rs.time_s == pytest.approx(launch + (n - 1) * a + (n - 1) / n * size / b, rel=1e-12)


def test_every_datasheet_preset_header_states_its_algorithm() -> None:
    for name in ("h200x8-ib400", "h100x8-ib400", "h200x2", "pcie8-rtxpro6000"):
        head = _preset_text(name).split("\nname")[0]
        assert "Collectives:" in head, name


def test_declared_nvls_prices_the_all_reduce_and_leaves_rs_ag_on_the_ring() -> None:
    base = load_topology("h200x8-ib400-datasheet", nodes=1)
    nvls = _with_algos(base, {"name": "nvls", "busbw_GBps": 480.0, "latency_us": 10.0})
    s = 32 * MiB
    ar = collective_time("all_reduce", s, 8, nvls)
    assert ar.algorithm == "nvls"
    assert ar.time_s == pytest.approx(20e-6 + 10e-6 + 2 * 7 / 8 * s / 480e9, rel=1e-12)
    assert ar.candidates["ring"] == pytest.approx(collective_time("all_reduce", s, 8, base).time_s, rel=1e-12)
    for kind in ("reduce_scatter", "all_gather"):
        assert collective_time(kind, s, 8, nvls) == collective_time(kind, s, 8, base)


def test_rs_plus_ag_beats_ring_ar_but_not_nvls_ar() -> None:
    """An input-scattered-like exchange: RS of the hidden, AG of a latent 0.3x as wide, against one
    AR of the hidden. Fewer bytes win on the ring; with NVLS's bandwidth the AR wins in time."""
    base = load_topology("h200x8-ib400-datasheet", nodes=1)
    nvls = _with_algos(base, {"name": "nvls", "busbw_GBps": 600.0, "latency_us": 10.0})
    h = 64 * MiB
    latent = 0.3 * h

    def rs_ag(t: Topology) -> float:
        return collective_time("reduce_scatter", h, 8, t).time_s + collective_time("all_gather", latent, 8, t).time_s

    assert rs_ag(base) < collective_time("all_reduce", h, 8, base).time_s
    assert collective_time("all_reduce", h, 8, nvls).time_s < rs_ag(nvls)


def test_size_and_group_limits_of_a_declared_algorithm() -> None:
    base = load_topology("h200x8-ib400-datasheet", nodes=1)
    one_shot = _with_algos(
        base, {"name": "one-shot", "busbw_GBps": 200.0, "latency_us": 2.0, "max_bytes": 1 * MiB, "max_ranks": 8}
    )
    small = collective_time("all_reduce", 256 * 1024, 8, one_shot)
    assert small.algorithm == "one-shot"  # 2 us beats the ring's 14 steps of 1 us at this size
    assert "one-shot" not in collective_time("all_reduce", 4 * MiB, 8, one_shot).candidates
    limited = _with_algos(base, {"name": "one-shot", "busbw_GBps": 200.0, "latency_us": 2.0, "max_ranks": 4})
    assert collective_time("all_reduce", 256 * 1024, 8, limited).algorithm == "ring"
    assert collective_time("all_reduce", 256 * 1024, 4, limited).algorithm == "one-shot"


def test_multi_node_groups_ignore_intra_node_declarations() -> None:
    base = load_topology("h200x8-ib400-datasheet", nodes=4)
    nvls = _with_algos(base, {"name": "nvls", "busbw_GBps": 600.0, "latency_us": 10.0})
    assert collective_time("all_reduce", 64 * MiB, 32, nvls) == collective_time("all_reduce", 64 * MiB, 32, base)


def test_toml_round_trip_with_and_without_declarations(tmp_path) -> None:
    base = load_topology("h200x8-ib400-datasheet")
    assert "all_reduce" not in topology_to_toml(base)
    nvls = _with_algos(base, {"name": "nvls", "busbw_GBps": 480.0, "latency_us": 10.0, "source": "test"})
    path = tmp_path / "t.toml"
    path.write_text(topology_to_toml(nvls))
    assert load_topology(str(path)) == nvls


def test_nvls_preset_prices_eight_rank_all_reduces_from_the_measured_nvls_curve() -> None:
    """h200x8-ib400-nvls: an 8-rank all-reduce inside a node is priced from NCCL's measured default
    on 8x H200 (NVLS; AIC's table: 319 us at 64 MiB, 565 us at 128 MiB), faster than the ring that
    h200x8-ib400 prices it with (NVLS off: a curve derived from the 4-GPU ring); everything else
    inside a node equals h200x8-ib400 (across nodes its 16- and 32-GPU all-reduce comes from
    published runs, tests/cost/test_multinode_curves.py)."""
    nvls, ring = load_topology("h200x8-ib400-nvls"), load_topology("h200x8-ib400")
    got = collective_time("all_reduce", 64 * MiB, 8, nvls)
    assert got.algorithm == "nccl-curve" and got.time_s == pytest.approx(320.0e-6, rel=0.01)
    assert collective_time("all_reduce", 128 * MiB, 8, nvls).time_s == pytest.approx(565.0e-6, rel=0.01)
    assert got.time_s < collective_time("all_reduce", 64 * MiB, 8, ring).time_s
    assert collective_time("all_reduce", 512 * MiB, 8, nvls).busbw_GBps == pytest.approx(460, rel=0.01)  # NVLS
    assert collective_time("all_reduce", 64 * MiB, 8, ring).algorithm == "ring-curve"  # derived NVLS-off ring
    size = 8192 * 7168 * 2  # one 8K-token hidden in bf16
    for kind, n in (("all_reduce", 4), ("reduce_scatter", 8), ("all_gather", 8), ("all_to_all", 8)):
        assert collective_time(kind, size, n, nvls) == collective_time(kind, size, n, ring), (kind, n)
    assert collective_time("reduce_scatter", size, 32, nvls) == collective_time("reduce_scatter", size, 32, ring)
    assert collective_time("all_reduce", size, 32, nvls).algorithm == "nccl-ib-curve"  # across nodes: nccl-tests#309
