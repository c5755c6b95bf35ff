"""`tpplan report --json FILE` (docs/report-json.md, issue 32): the keys it emits are the documented ones, the
decode figures of the chosen deployments and of the search under targets are there, `--json -` prints JSON
only, and a bad path is one line, exit 2, with nothing written."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.cli_helpers import run_cli

DOC = Path(__file__).resolve().parents[2] / "docs" / "report-json.md"
REPORT = ("report", "-m", "tiny-llama", "-t", "h200x2", "--tp", "2")


def _documented(section: str) -> set[str]:
    """The keys of the table under the `## section` heading of docs/report-json.md."""
    text = DOC.read_text(encoding="utf-8").split(f"## {section}", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([a-z_]+)` \|", text, flags=re.M))


def _report(monkeypatch, capsys, tmp_path: Path, *extra: str) -> dict:  # type: ignore[no-untyped-def]
    out = tmp_path / "report.json"
    code, _, err = run_cli(monkeypatch, capsys, *REPORT, "--out", str(tmp_path / "memo"), "--json", str(out), *extra)
    assert code == 0, err
    return json.loads(out.read_text())


def test_report_json_keys_are_the_documented_ones(monkeypatch, capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A workload with output tokens: each chosen deployment carries the serving block with decode."""
    d = _report(monkeypatch, capsys, tmp_path, "-w", "prompt4k-out512-c16", "--plan", "baseline")
    assert set(d) == _documented("Top level")
    assert d["chosen"] and d["chosen"][0]["key"] == d["current"] == "baseline"
    assert d["bottom_line"]["target"] in {c["key"] for c in d["chosen"]}
    for c in d["chosen"]:
        assert set(c) == _documented("Deployment (`chosen[]`)")
        decode = c["serving"]["decode"]
        for stat in ("decode_step_s", "tpot_s", "itl_s"):
            assert decode[stat]["p50"] <= decode[stat]["p90"] <= decode[stat]["p99"], stat
        assert decode["output_tok_s_per_gpu"] > 0 and decode["output_tok_s_per_user"] > 0
        assert c["predictions"]["prompt4k-out512-c16"]["kv_capacity"]  # KV tokens and admitted batch per engine
    assert d["serving_search"] is None and d["serving_launches"] == [] and d["decode_band"] is None
    assert (tmp_path / "memo" / "report.md").exists()


@pytest.mark.slow  # about 5 s: every deployment served under the target, P/D pairs too
def test_report_json_under_targets_carries_the_search_under_targets(monkeypatch, capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    d = _report(monkeypatch, capsys, tmp_path, "-w", "prompt4k-out512-c16", "--tpot-target", "50ms")
    s = d["serving_search"]
    assert s["targets"]["tpot"]["seconds"] == 0.05 and s["verdict"]
    kinds = {x["kind"] for x in s["deployments"]}
    assert kinds == {"aggregated", "disaggregated"}, kinds
    load = s["deployments"][0]["best"] or s["deployments"][0]["closest"]
    assert {"mean", "p50", "p90", "p99"} <= set(load["tpot_s"]) and load["output_tok_s_per_gpu"] > 0
    assert d["serving_launches"] and all(
        x["pool"] in ("aggregated", "prefill", "decode") for x in d["serving_launches"]
    )
    band = d["decode_band"]  # the memo's decode band: the sum of its covered parts' share x error
    assert band["parts"] and band["band"] == pytest.approx(sum(p["share"] * p["error"] for p in band["parts"]))
    assert sum(p["share"] for p in band["parts"]) + sum(u["share"] for u in band["uncovered"]) == pytest.approx(1)


def test_report_json_to_stdout_prints_only_json(monkeypatch, capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    code, out, err = run_cli(monkeypatch, capsys, *REPORT, "--out", str(tmp_path / "memo"), "--json", "-")
    assert code == 0, err
    assert json.loads(out)["model"] == "tiny-llama" and (tmp_path / "memo" / "report.md").exists()


def test_bad_json_paths_are_one_line_and_write_nothing(monkeypatch, capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    memo = tmp_path / "memo"
    foreign = tmp_path / "notes.json"
    foreign.write_text("mine")
    cases = [
        (tmp_path / "missing" / "r.json", "--json"),  # no such folder
        (memo / "r.json", "inside --out"),  # inside the folder tpplan replaces whole
        (foreign, "--json"),  # a file tpplan did not write
    ]
    for path, words in cases:
        code, _, err = run_cli(monkeypatch, capsys, *REPORT, "--out", str(memo), "--json", str(path))
        assert code == 2 and words in err and err.count("\n") == 1, (path, err)
        assert not memo.exists()  # refused before any work
    assert foreign.read_text() == "mine" and not (tmp_path / "missing").exists()


@pytest.mark.slow  # about 7 s: the search under targets with speculative decode steps
def test_report_spec_prices_decode_as_search_does_and_its_lines_carry_the_flags(monkeypatch, capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`--spec` on report as on search: the search under targets decodes speculatively, the aggregated and
    decode pools' launch lines carry the engine's speculative flags, and so does the P/D prefill pool's (both engines'
    prefill servers load and run the decode pool's draft: engines/speculative.PD_PREFILL_SOURCES), the memo says so."""
    wl = tmp_path / "short.toml"
    wl.write_text('name = "short"\ninput_len = 256\noutput_len = 64\nconcurrency = 8\nchunk_size = 1024\n')
    spec = ("-w", str(wl), "--tpot-target", "50ms", "--spec", "mtp:3:2.4")
    out = tmp_path / "r.json"
    argv = ("report", "-m", "tiny-deepseek-v3", "-t", "h200x2", "--out", str(tmp_path / "memo"), "--json", str(out))
    code, _, err = run_cli(monkeypatch, capsys, *argv, *spec)
    assert code == 0, err
    d = json.loads(out.read_text())
    assert d["serving_search"]["speculative"]["accepted_per_step"] == 2.4
    assert d["chosen"][0]["serving"]["decode"]["settings"]["speculative"]["draft_tokens"] == 3
    lines = [(x["pool"], x["command"]) for x in d["serving_launches"] if x["command"]]
    flag = {"SGLang": "--speculative-num-steps 3", "vLLM": '"num_speculative_tokens":3'}
    assert {p for p, _ in lines} == {"aggregated", "prefill", "decode"}
    for pool, cmd in lines:
        engine = "SGLang" if "sglang" in cmd else "vLLM"
        assert flag[engine] in cmd, (pool, cmd)
    assert (
        "Decode steps are speculative (`--spec`): mtp, 3 draft token(s)"
        in (tmp_path / "memo" / "report.md").read_text()
    )


def test_report_spec_without_targets_or_json_is_refused(monkeypatch, capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    code, _, err = run_cli(monkeypatch, capsys, *REPORT, "--out", str(tmp_path / "memo"), "--spec", "mtp:3:2.4")
    assert code == 2 and "--spec" in err and err.count("\n") == 1 and not (tmp_path / "memo").exists()
