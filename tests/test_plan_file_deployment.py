"""Issue 33, item 4: a plan saved by `tpplan search --save` carries its whole deployment (TP, PP, CP and its
layers, KV mode, replicas) into audit, explain and report; a flag that differs overrides the file with a note
naming both, and files of two deployments in one run are refused (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli_helpers import run_cli
from tpplan.cost.topology import load_topology
from tpplan.cost.workload import load_workload
from tpplan.report.analysis import analyse
from tpplan.report.memo_ask import MemoAsk

TOPO = ("--topology", "h200x8-ib400", "--nodes", "1")


@pytest.fixture
def saved(monkeypatch, capsys, tmp_path) -> tuple[Path, dict]:
    """tiny-kimi-k3's best plan at TP2 x PP4 (8 GPUs), saved with the search's JSON."""
    d = tmp_path / "found"
    code, out, err = run_cli(monkeypatch, capsys, "search", "--model", "tiny-kimi-k3", *TOPO, "--tp", "2", "--pp",
                             "4", "-w", "prompt16k-c8", "--top", "1", "--save", str(d), "--json", "-")  # fmt: skip
    assert code == 0, err
    return d / "plan-1.json", json.loads(out)


def test_the_file_holds_the_whole_deployment(saved):
    f, _ = saved
    dep = json.loads(f.read_text())["deployment"]
    assert (dep["tp"], dep["pp"], dep["cp"], dep["replicas"]) == (2, 4, 1, 1)
    assert (dep["cp_layers"], dep["cp_recurrence"], dep["cp_kv"]) == ("all", "scan", "engines")


def test_audit_prices_the_file_at_its_pp_as_the_search_did(saved, monkeypatch, capsys):
    """Before: audited at TP2 x PP1 with no note."""
    f, found = saved
    code, out, err = run_cli(monkeypatch, capsys, "audit", "--model", "tiny-kimi-k3", *TOPO, "-w", "prompt16k-c8",
                             "--plan", str(f), "--json", "-")  # fmt: skip
    assert code == 0, err
    data = json.loads(out)
    assert (data["tp"], data["pp"]) == (2, 4)
    best = found["plans"][0]
    got = next(p for p in data["plans"] if p["name"] == best["name"])
    assert got["prediction"]["pp"] == 4
    # search ranks by the engine's serving loop (its `ttft`); audit prints the loop beside the idealised
    # schedule (`serving`): the same loop TTFT and the same idealised mean at the file's TP x PP
    assert got["serving"]["ttft"]["mean_s"] == pytest.approx(best["ttft"]["mean_s"], rel=1e-9)
    assert got["prediction"]["ttft"]["mean_s"] == pytest.approx(best["serving"]["idealised_mean_s"], rel=1e-9)


def test_a_flag_that_differs_overrides_the_file_with_a_note(saved, monkeypatch, capsys):
    f, _ = saved
    code, out, err = run_cli(monkeypatch, capsys, "audit", "--model", "tiny-kimi-k3", *TOPO, "--pp", "2",
                             "--plan", str(f), "--json", "-")  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["pp"] == 2
    assert "--pp 2 overrides pp=4 of plan file" in " ".join(err.split())


def test_explain_takes_the_tp_from_the_file(saved, monkeypatch, capsys):
    """Before: `explain --plan FILE` demanded --tp."""
    f, _ = saved
    code, out, err = run_cli(monkeypatch, capsys, "explain", "--model", "tiny-kimi-k3", "--plan", str(f))
    assert code == 0, err
    assert "on tiny-kimi-k3, TP2:" in " ".join(out.split())
    assert "does not run --pp 4" in " ".join(err.split())  # what explain leaves out is said
    code, _, err = run_cli(monkeypatch, capsys, "explain", "--model", "tiny-kimi-k3")
    assert code == 2 and "--tp" in err  # no file, no TP: one line naming the flag


def test_report_prices_the_file_at_its_whole_deployment(saved):
    f, found = saved
    a = analyse(
        "tiny-kimi-k3",
        load_topology("h200x8-ib400", nodes=1),
        [load_workload("prompt16k-c8")],
        MemoAsk(plans=(str(f),), prompt_lengths=None),
    )
    v = next(v for v in a.variants if v.plan.extra.get("file") == str(f))
    assert (v.tp, v.pp, v.cp, v.replicas) == (2, 4, 1, 1)
    assert v.predictions["prompt16k-c8"].ttft.mean_s == pytest.approx(found["plans"][0]["ttft"]["mean_s"], rel=1e-9)


def test_files_of_two_deployments_in_one_run_are_refused(saved, monkeypatch, capsys, tmp_path):
    f, _ = saved
    other = json.loads(f.read_text())
    other["deployment"]["pp"] = 2
    g = tmp_path / "pp2.json"
    g.write_text(json.dumps(other))
    code, _, err = run_cli(monkeypatch, capsys, "audit", "--model", "tiny-kimi-k3", "--plan", str(f), "--plan", str(g))
    assert code == 2
    assert "TP2xPP4 and TP2xPP2" in " ".join(err.split())


@pytest.mark.slow
def test_verify_takes_the_tp_from_the_file(saved):
    """`verify --plan FILE` without --tp runs the file's TP group (2 gloo ranks) and says PP 4 is not run."""
    pytest.importorskip("torch")
    import subprocess
    import sys

    f, _ = saved
    r = subprocess.run([sys.executable, "-m", "tpplan", "verify", "--model", "tiny-kimi-k3", "--plan", str(f),
                        "--tokens", "32", "--chunk", "16"], capture_output=True, text=True, timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "all passed: 1/1 plans" in r.stdout and "does not run --pp 4" in " ".join(r.stderr.split())
