"""The memo's decode band (issue 32): the band it prints is the sum of the shares x errors it prints, over the
classes it says are in the band; the classes left out are printed with their share and why."""

from __future__ import annotations

import re

import pytest

from tpplan.cost.decode_band import decode_step_band
from tpplan.cost.predictor import cached_predictor
from tpplan.cost.topology import select_topology
from tpplan.mesh import Mesh
from tpplan.models.config import load_model
from tpplan.models.graph import build_model_graph
from tpplan.plans.named import baseline
from tpplan.report.decode_band_section import decode_band_blocks
from tpplan.report.doc import to_markdown


@pytest.mark.parametrize(("cluster", "batch"), [("h100x8-ib400", 16), ("h200x8-ib400", 64)])
def test_the_printed_band_is_the_sum_of_its_printed_parts(cluster: str, batch: int) -> None:
    graph = build_model_graph(load_model("tiny-mixtral"))
    topo = select_topology(cluster, 1)
    band = decode_step_band(cached_predictor(graph, baseline(), topo, Mesh(2), "bf16", None), batch, 4096)
    md = to_markdown("memo", decode_band_blocks(band, "TP2"))
    printed = float(re.search(r"has a band of ±([0-9.]+)%", md).group(1))  # type: ignore[union-attr]
    held = float(re.search(r"They hold ([0-9.]+)% of the step", md).group(1))  # type: ignore[union-attr]
    rows = [[c.strip() for c in ln.split("|")[1:-1]] for ln in md.splitlines() if ln.startswith("| ") and "%" in ln]
    inside = [r for r in rows if r[3] != "-"]
    outside = [r for r in rows if r[3] == "-"]
    assert len(inside) == len(band.parts) and len(outside) == len(band.uncovered)
    adds = [float(r[4].rstrip("%")) for r in inside]
    for r, add in zip(inside, adds, strict=True):  # each row's adds is its share x its error
        share, error = float(r[2].rstrip("%")), float(r[3].lstrip("±").rstrip("%"))
        assert add == pytest.approx(share * error / 100, abs=0.01 + 0.0006 * (share + error))
    assert printed == pytest.approx(sum(adds), abs=0.05 + 0.005 * len(adds))
    assert printed == round(100 * band.band, 1)
    assert held == pytest.approx(sum(float(r[2].rstrip("%")) for r in inside), abs=0.05 * max(1, len(inside)))
    assert all(r[4].startswith("not in the band: ") for r in outside)
    total = sum(float(r[2].rstrip("%")) for r in rows)
    assert total == pytest.approx(100.0, abs=0.05 * len(rows))
