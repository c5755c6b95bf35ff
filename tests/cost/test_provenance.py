"""Every predicted time says how it was made: audit and search JSON and tables carry the provenance
and band that `tpplan.cost.provenance` assigns, and it follows the topology, not a constant."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from tpplan.cli import app
from tpplan.cost.provenance import BANDS, provenance
from tpplan.cost.topology import load_topology

RUN = CliRunner()


def test_provenance_follows_the_topology() -> None:
    calibrated = load_topology("h200x2-runtime-kernels")
    assert provenance(calibrated, 2) is BANDS["calibrated"]
    assert provenance(calibrated, 4) is BANDS["datasheet"]  # beyond the group it was fitted on
    assert provenance(load_topology("h200x8-ib400", nodes=4), 32) is BANDS["datasheet"]


def test_audit_and_search_json_carry_it(tmp_path) -> None:
    audit = ["audit", "-m", "tiny-llama", "--tp", "2", "-t", "h200x2-runtime-kernels"]
    r = RUN.invoke(app, [*audit, "--json"])
    assert r.exit_code == 0, r.output
    preds = [p["prediction"] for p in json.loads(r.output)["plans"] if p.get("prediction")]
    assert preds and all(p["provenance"]["key"] == "calibrated" for p in preds)
    r = RUN.invoke(app, audit)
    assert "Times: calibrated on this machine (in-sample)" in " ".join(r.output.split())
    out2 = tmp_path / "s.json"
    r = RUN.invoke(app, ["search", "-m", "tiny-llama", "--tp", "2", "-t", "h200x8-ib400", "--json", str(out2)])
    assert r.exit_code == 0, r.output
    data = json.loads(out2.read_text())
    assert data["provenance"]["key"] == "datasheet" and data["provenance"]["band"] == BANDS["datasheet"].band
    assert "Times: extrapolated from datasheet figures" in " ".join(r.output.split())
    r = RUN.invoke(app, ["search", "-m", "tiny-llama", "--tp", "2", "--objective", "volume", "--json", str(out2)])
    assert r.exit_code == 0, r.output
    assert json.loads(out2.read_text())["provenance"] is None and "Times:" not in r.output


def test_ops_priced_outside_the_measured_shapes_are_marked_extrapolated() -> None:
    """With physical kernel models (h200-kernel-models) the ops priced outside their sweep's shapes
    are listed in the audit JSON and named under the table; a datasheet topology lists none."""

    base = ["audit", "-m", "kimi-k3", "--tp", "1", "-w", "seed-c8"]
    r = RUN.invoke(app, [*base, "-t", "h200-kernel-models", "--json"])
    assert r.exit_code == 0, r.output
    preds = [p["prediction"] for p in json.loads(r.output)["plans"] if p.get("prediction")]
    listed = preds[0]["extrapolated_ops"]
    flagged = [
        f"{kind}/{o['op']}" for kind, info in preds[0]["layer_kinds"].items() for o in info["ops"] if o["extrapolated"]
    ]
    assert listed and sorted(listed) == sorted(flagged)
    r = RUN.invoke(app, [*base, "-t", "h200-kernel-models"])
    assert f"kernel models priced {len(set(listed))} op(s) outside" in " ".join(r.output.split())
    r = RUN.invoke(app, [*base, "-t", "h200x8-ib400", "--json"])
    assert all(not p["prediction"]["extrapolated_ops"] for p in json.loads(r.output)["plans"] if p.get("prediction"))
