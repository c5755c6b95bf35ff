"""Readable in a terminal: every command's output fits 100 columns in a file or pipe (as under
pytest), no cell is cut with an ellipsis, no table line is cropped, and numbers stay whole."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from cli_helpers import run_cli

ROOT = Path(__file__).resolve().parents[1]
K3 = ("-m", "kimi-k3", "--tp", "32", "-t", "h200x8-ib400", "--nodes", "4", "-w", "seed-c8")
DSV3 = ("-m", "deepseek-v3", "--tp", "8", "-t", "h200x8-ib400", "-w", "seed-c8")
LLAMA = ("-m", "llama-3-70b", "--tp", "8", "-t", "h200x8-ib400", "-w", "seed-c8")
BENCH_FROM = tuple(
    x
    for p in ("baseline", "gate-aware", "sp-moe")
    for x in ("--from", f"docs/benchmarks/h200x2-2026-11-30-kernel-profiles/k3-{p}.json")
)
LEFT, RIGHT = set("┏┃┡│└┠┣╇┗"), set("┓┃┩│┘┨┫┤┛")


def _fits(text: str) -> None:
    lines = text.splitlines()
    assert lines
    for line in lines:
        assert len(line) <= 100, f"{len(line)} columns: {line}"
        assert "…" not in line, f"cut cell: {line}"
        if line[:1] in LEFT:  # a table line ends with its right border: not cropped
            assert line[-1] in RIGHT, f"cropped: {line}"


CASES = {
    "audit K3 TP32 topology+workload": ("audit", *K3),
    "audit deepseek-v3": ("audit", *DSV3),
    "audit llama-3-70b": ("audit", *LLAMA),
    "audit K3 PP4": ("audit", "-m", "kimi-k3", "--tp", "8", "--pp", "4", *K3[4:]),
    "audit K3 crossover": ("audit", *K3[:6], "-p", "sp-moe", "-p", "gate-aware", "--crossover"),
    "search K3": ("search", *K3),
    "search deepseek-v3": ("search", *DSV3),
    "search llama-3-70b": ("search", *LLAMA),
    "explain K3 gate-aware": ("explain", "-m", "kimi-k3", "--tp", "32", "-p", "gate-aware"),
    "explain deepseek-v3": ("explain", "-m", "deepseek-v3", "--tp", "8", "-p", "input-scattered"),
    "explain llama-3-70b": ("explain", "-m", "llama-3-70b", "--tp", "8", "-p", "sequence-parallel"),
    "models": ("models",),
    "bench summary": ("bench", *BENCH_FROM),
}


@pytest.mark.parametrize("case", list(CASES))
def test_output_fits_100_columns(monkeypatch, capsys, case):
    monkeypatch.chdir(ROOT)
    code, out, err = run_cli(monkeypatch, capsys, *CASES[case])
    assert code == 0, err
    _fits(out)


@pytest.mark.parametrize("preset", [K3, DSV3, LLAMA], ids=["kimi-k3", "deepseek-v3", "llama-3-70b"])
def test_audit_numbers_stay_whole(monkeypatch, capsys, preset):
    """Every plan's bytes per token and predicted forward time appear in one piece in the tables."""
    _, out, _ = run_cli(monkeypatch, capsys, "audit", *preset)
    _, js, _ = run_cli(monkeypatch, capsys, "audit", *preset, "--json")
    for p in json.loads(js)["plans"]:
        row = next(line for line in out.splitlines() if line.startswith(f"│ {p['name']} "))
        assert f"{p['comm_bytes_per_token_per_rank']:,.0f}" in row
        assert f"{p['prediction']['forward_s'] * 1e3:,.1f}" in out


@pytest.mark.slow
def test_report_verdicts_fit(tmp_path, monkeypatch, capsys):
    code, out, err = run_cli(monkeypatch, capsys, "report", *K3[:2], *K3[4:], "--out", str(tmp_path / "memo"))
    assert code == 0, err
    _fits(out)
    assert "baseline" in out and "reference" in out


def test_over_is_explained_once_and_wide_shows_every_column(monkeypatch, capsys):
    bf16 = ("--expert-dtype", "bf16")  # the preset's experts are mxfp4; in bf16 K3 at TP32 overflows an H200
    _, out, _ = run_cli(monkeypatch, capsys, "audit", *K3, *bf16)
    assert "(over)" in out
    assert out.count("(over): the predicted memory per rank exceeds one GPU's 140.0 GiB") == 1
    assert "--expert-dtype" in out and "--wide adds" in out and "p50 s" not in out
    _, wide, _ = run_cli(monkeypatch, capsys, "audit", *K3, *bf16, "--wide")
    assert all(c in wide for c in ("compute", "KV", "p50 s", "max s", "replicated", "collectives"))
    _, search, _ = run_cli(monkeypatch, capsys, "search", *K3, *bf16)
    assert search.count("(over): the predicted memory per rank") == 1 and "--memory-cap" in search
    _, fits, _ = run_cli(monkeypatch, capsys, "audit", *K3, "-p", "baseline")
    assert "(over)" not in fits  # nothing over: no note


def test_verify_tables_fit_and_progress_goes_to_stderr(tmp_path, monkeypatch, capsys):
    """One CPU rank runs in this process: the tables on stdout, a line per step on stderr."""
    pytest.importorskip("torch")
    out_json = tmp_path / "v.json"
    code, out, err = run_cli(monkeypatch, capsys, "verify", "-m", "tiny-kimi-k3", "--tp", "1", "-p", "baseline",
                          "--tokens", "8", "--json", str(out_json))  # fmt: skip
    assert code == 0, err
    _fits(out)
    assert "verify [1/1] baseline: reference forward" in err and "verify [1/1] baseline: PASS in" in err
    assert "verify [" not in out and json.loads(out_json.read_text())["passed"] is True
    _, _, quiet = run_cli(monkeypatch, capsys, "verify", "-m", "tiny-kimi-k3", "--tp", "1", "-p", "baseline",
                       "--tokens", "8", "--no-progress")  # fmt: skip
    assert "verify [" not in quiet


def test_readme_first_command_shows_plans_that_fit(monkeypatch, capsys):
    """The README's first command (after `pip install -e . &&`): every plan fits one H200."""
    readme = (ROOT / "README.md").read_text()
    first = next(line for line in readme.splitlines() if "pip install -e . && tpplan " in line)
    args = first.split("&& tpplan ", 1)[1].split()
    code, out, err = run_cli(monkeypatch, capsys, *args)
    assert code == 0, err
    _fits(out)
    assert "Predicted on" in out and "(over)" not in out and "GiB" in out


@pytest.mark.slow
def test_calibrate_progress_is_a_line_per_step_on_stderr(tmp_path):
    import subprocess

    out = tmp_path / "t.toml"
    r = subprocess.run(
        [sys.executable, "-m", "tpplan", "calibrate", "--backend", "gloo", "--nproc", "2", "--min-bytes", "65536",
         "--max-bytes", "8388608", "--steps", "3", "--iters", "3", "--warmup", "1", "--collectives", "all_reduce",
         "--no-gemm", "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    # The lines come before the fit (which a loaded machine can make fail: exit 2, its own line).
    steps = [line for line in r.stderr.splitlines() if line.startswith("all_reduce ")]
    assert len(steps) == 3 and steps[0].endswith("[1/3]") and steps[-1].endswith("[3/3]"), r.stderr
    assert "[1/3]" not in r.stdout
    if r.returncode == 0:
        assert "busbw" in r.stdout
        _fits(r.stdout)


def test_a_tp1_audit_says_its_plans_move_nothing(monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    """At TP1 the plans' collectives and illegal edges are about ranks that do not exist (gemma-3-4b-it at TP1
    listed input-scattered as illegal because 'gathering those slices would mix different ranks' heads'): the
    audit says so before the tables; at TP2 it does not."""
    from tests.cli_helpers import run_cli

    code, out, err = run_cli(monkeypatch, capsys, "audit", "-m", "tiny-llama", "--tp", "1")
    assert code == 0, err
    assert "TP1: one GPU holds every head and every token, so no TP collective runs" in " ".join(out.split())
    code, out, err = run_cli(monkeypatch, capsys, "audit", "-m", "tiny-llama", "--tp", "2")
    assert code == 0 and "TP1:" not in out, err
