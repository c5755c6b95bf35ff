"""Every predicted time says how it was made: audit and search JSON and tables carry the provenance
and band that `tpplan.cost.provenance` assigns, and it follows the topology, not a constant."""

from __future__ import annotations

import json

import pytest
from cli_helpers import run_cli

from tpplan.cost.provenance import BANDS, provenance
from tpplan.cost.topology import load_topology


def test_provenance_follows_the_topology() -> None:
    calibrated = load_topology("h200x2-runtime-kernels")
    assert provenance(calibrated, 2) is BANDS["calibrated"]
    assert provenance(calibrated, 4) is BANDS["datasheet"]  # beyond the group it was fitted on
    assert provenance(load_topology("h200x8-ib400-datasheet", nodes=4), 32) is BANDS["datasheet"]


def test_audit_and_search_json_carry_it(tmp_path, monkeypatch, capsys) -> None:
    audit = ["audit", "-m", "tiny-llama", "--tp", "2", "-t", "h200x2-runtime-kernels"]
    code, out, err = run_cli(monkeypatch, capsys, *audit, "--json")
    assert code == 0, err
    preds = [p["prediction"] for p in json.loads(out)["plans"] if p.get("prediction")]
    assert preds and all(p["provenance"]["key"] == "calibrated" for p in preds)
    code, out, err = run_cli(monkeypatch, capsys, *audit)
    assert "Times: calibrated on this machine (in-sample)" in " ".join(out.split())
    out2 = tmp_path / "s.json"
    search = ["search", "-m", "tiny-llama", "--tp", "2", "--json", str(out2)]
    code, out, err = run_cli(monkeypatch, capsys, *search, "-t", "h200x8-ib400-datasheet")
    assert code == 0, err
    data = json.loads(out2.read_text())
    prov = data["provenance"]
    assert prov["key"] == "datasheet" and prov["parts"]
    # composed per op class and source as the memo's band is: the question's band, the baseline's
    assert prov["band"] == pytest.approx(sum(p["share"] * p["error"] for p in prov["parts"]))
    assert prov["band"] == data["baseline"]["provenance"]["band"]
    assert prov["band"] != BANDS["datasheet"].band
    assert "Times: extrapolated from datasheet figures" in " ".join(out.split())
    code, out, err = run_cli(monkeypatch, capsys, *search, "--objective", "volume")
    assert code == 0, err
    assert json.loads(out2.read_text())["provenance"] is None and "Times:" not in out + err


def test_ops_priced_outside_the_measured_shapes_are_marked_extrapolated(monkeypatch, capsys) -> None:
    """With physical kernel models (h200-kernel-models) the ops priced outside their sweep's shapes
    are listed in the audit JSON and named under the table; a datasheet topology has no kernel models,
    so it lists only GEMMs the H200 table prices below its smallest measured K or N (K3's f_b_proj,
    K = 128), never q_proj (7168 x 12288, inside the table)."""
    base = ["audit", "-m", "kimi-k3", "--tp", "1", "-w", "seed-c8"]
    code, out, err = run_cli(monkeypatch, capsys, *base, "-t", "h200-kernel-models", "--json")
    assert code == 0, err
    preds = [p["prediction"] for p in json.loads(out)["plans"] if p.get("prediction")]
    listed = preds[0]["extrapolated_ops"]
    flagged = [
        f"{kind}/{o['op']}" for kind, info in preds[0]["layer_kinds"].items() for o in info["ops"] if o["extrapolated"]
    ]
    assert listed and sorted(listed) == sorted(flagged)
    code, out, err = run_cli(monkeypatch, capsys, *base, "-t", "h200-kernel-models")
    assert f"{len(set(listed))} op(s) priced outside" in " ".join(out.split())
    code, out, err = run_cli(monkeypatch, capsys, *base, "-t", "h200x8-ib400-datasheet", "--json")
    preds = [p["prediction"] for p in json.loads(out)["plans"] if p.get("prediction")]
    ops = [o for p in preds for info in p["layer_kinds"].values() for o in info["ops"] if o["extrapolated"]]
    assert ops and all(o["source"] == "gemm-table" for o in ops)
    assert {o["op"] for o in ops} >= {"f_b_proj"} and "q_proj" not in {o["op"] for o in ops}


def test_physical_kernel_models_carry_their_out_of_sample_band() -> None:
    """Sweep 2's presets (every set names its implementation), in either clock state, have the 6.8%
    band of docs/benchmarks.md; sweep 1's preset has its own, wider one; neither is called calibrated."""
    assert provenance(load_topology("h200-serving"), 1) is BANDS["modelled"]
    assert provenance(load_topology("h200-serving-capped"), 1) is BANDS["modelled"]
    assert provenance(load_topology("h200-kernel-models"), 1) is BANDS["modelled-sweep1"]
    assert BANDS["modelled"].band < BANDS["modelled-sweep1"].band
    assert "out of sample" in BANDS["modelled"].basis and "out-of-sample" in BANDS["modelled"].label
