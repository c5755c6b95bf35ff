"""`audit --pd`: a P/D deployment beside the aggregated loop, in the JSON and the table; bad values exit 2
with one line naming the option."""

from __future__ import annotations

import json

import pytest

from tests.cli_helpers import run_cli

AUDIT = ("audit", "-m", "tiny-llama", "--tp", "2", "-t", "h200x8-ib400", "--plan", "baseline")


@pytest.fixture
def workload(tmp_path):  # type: ignore[no-untyped-def]
    wl = tmp_path / "wl.toml"
    wl.write_text('name = "pd"\ninput_len = 2048\noutput_len = 40\nconcurrency = 8\nchunk_size = 8192\n'
                  "num_requests = 24\n")  # fmt: skip
    return str(wl)


def test_audit_json_carries_the_p_d_deployment(monkeypatch, capsys, workload) -> None:  # type: ignore[no-untyped-def]
    code, out, err = run_cli(monkeypatch, capsys, *AUDIT, "-w", workload, "--pd", "tp1:tp2:2:1", "--json", "-")
    assert code == 0, err
    d = json.loads(out)["plans"][0]["serving"]["disaggregated"]
    assert d["admitted"] and d["ratio"] == "2:1" and d["gpus"] == 4
    assert d["prefill"]["mesh"]["tp"] == 1 and d["decode"]["mesh"]["tp"] == 2 and d["decode"]["instances"] == 1
    assert d["decode_summary"]["output_tokens"] == 24 * 40
    assert d["binding"] == min(d["bound_rps"], key=d["bound_rps"].get)
    assert d["ttft"]["mean_s"] > d["transfer"]["handoff_mean_s"] > 0
    assert d["decode"]["kv_capacity"].startswith("SGLang 0.5.23") and any("decode.py" in s for s in d["sources"])


def test_without_a_ratio_it_is_chosen_for_the_topology(monkeypatch, capsys, workload) -> None:  # type: ignore[no-untyped-def]
    args = (*AUDIT, "--nodes", "1", "-w", workload, "--pd", "tp1:tp1", "--json", "-")
    code, out, err = run_cli(monkeypatch, capsys, *args)
    assert code == 0, err
    d = json.loads(out)["plans"][0]["serving"]["disaggregated"]
    rc = d["ratio_choice"]
    assert rc["gpus"] == 8 and rc["count"] == 28 and d["gpus"] <= 8
    assert rc["ratios"][0]["bound_rps"] == max(r["bound_rps"] for r in rc["ratios"])


def test_the_table_fits_100_columns_and_says_what_binds(monkeypatch, capsys, workload) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("COLUMNS", "100")
    code, out, err = run_cli(monkeypatch, capsys, *AUDIT, "-w", workload, "--pd", "tp1:tp2:2:1")
    assert code == 0, err
    assert "P/D disaggregated" in out and "binds:" in out
    assert max(len(line) for line in out.splitlines()) <= 100


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("tp8", "1 field(s)"),
        ("tp2:xx", "'xx' is not a mesh"),
        ("tp2:tp2:0:1", "instance counts"),
        ("tp2:tp2:1", "3 field(s)"),
        ("tp3:tp2:1:1", "--pd tp3:tp2:1:1"),
    ],
)
def test_bad_pd_values_exit_2_with_one_line(monkeypatch, capsys, workload, value, says) -> None:  # type: ignore[no-untyped-def]
    code, _, err = run_cli(monkeypatch, capsys, *AUDIT, "-w", workload, "--pd", value)
    assert code == 2 and says in err and "--pd" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_pd_needs_requests(monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    code, _, err = run_cli(monkeypatch, capsys, *AUDIT, "--pd", "tp1:tp1:1:1")
    assert code == 2 and "--pd" in err and "--workload" in err


def test_an_engine_whose_hand_off_was_not_read_is_refused_before_any_work(monkeypatch, capsys, workload) -> None:  # type: ignore[no-untyped-def]
    code, _, err = run_cli(monkeypatch, capsys, *AUDIT, "-w", workload, "--engine", "trtllm", "--pd", "tp1:tp1")
    assert code == 2 and "only SGLang's and vLLM's P/D hand-off were read" in err and "pricing" not in err
