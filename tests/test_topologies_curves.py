"""`tpplan topologies` says which presets price collectives from measured curves, and whose."""

from __future__ import annotations

from cli_helpers import run_cli

from tpplan.commands.models_cmd import curve_rows
from tpplan.cost.topology import load_topology


def _curve_lines(out: str) -> dict[str, list[str]]:
    """The second table's rows (preset -> its cells), after the title line that names it."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if "Measured collective curves" in line)
    rows: dict[str, list[str]] = {}
    for line in lines[start + 1 :]:
        cells = line.split()
        if cells and "-" in cells[0] and cells[0][0].isalnum():
            rows.setdefault(cells[0], []).append(line)
    return rows


def test_the_listing_names_each_presets_curve_sets_and_their_source(monkeypatch, capsys) -> None:
    code, out, _ = run_cli(monkeypatch, capsys, "topologies")
    assert code == 0 and all(len(line) <= 100 for line in out.splitlines())
    rows = _curve_lines(out)
    assert set(rows) == {"b300x8-ib800", "gb300-nvl72", "h100x8-ib400", "h200x8-ib400", "h200x8-ib400-nvls",
                         "pcie8-rtxpro6000"}  # fmt: skip
    assert "h200x2" not in rows and "h200x8-ib400-datasheet" not in rows  # link model (or fitted): not listed
    (nvls_one, nvls_across) = rows["h200x8-ib400-nvls"]
    assert "h200_sxm-nccl-2.29.2" in nvls_one and "AIC 0.12.0" in nvls_one and "no all_reduce" not in nvls_one
    assert "all_reduce 16/32, 8/node" in nvls_across and "nccl-tests#309" in nvls_across
    for preset, system in (("h100x8-ib400", "h100_sxm"), ("h200x8-ib400", "h200_sxm")):
        measured, derived = rows[preset]
        assert f"{system}-nccl-2.29.2 " in measured and "no all_reduce@8" in measured
        assert "all_reduce 8 GPUs (derived)" in derived and f"{system}-nccl-2.29.2-ring8" in derived


def test_rows_follow_the_loaded_curves_not_the_preset_name() -> None:
    topo = load_topology("h200x8-ib400")
    kept = topo.model_copy(update={"curves": [c for c in topo.curves if c.kind != "all_gather"]})
    row, ring = curve_rows("x", kept)
    assert row[1] == "2/4/8 GPUs, no all_gather@2, no all_gather@4, no all_gather@8, no all_reduce@8"
    assert ring[1:] == ("all_reduce 8 GPUs (derived)", "h200_sxm-nccl-2.29.2-ring8", "AIC 0.12.0")
    assert curve_rows("x", topo.model_copy(update={"curves": []})) == []
    own = topo.model_copy(update={"curves": [topo.curves[0].model_copy(update={"source": "my probe"})]})
    assert curve_rows("x", own) == [("x", f"{topo.curves[0].kind} 2 GPUs", "its own [[curves]]", "the topology file")]
