"""The numbers the README and docs/concepts.md quote are what tpplan prints today (issue 33): each
quoted command output is re-run and compared line by line, the prose figures are recomputed, and the
README's test counts stay within 10% of what pytest collects."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import run_captured

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
CONCEPTS = (REPO / "docs" / "concepts.md").read_text()


def _quoted_runs(text: str) -> list[tuple[list[str], list[str]]]:
    """(command words, quoted output lines) for each ```text block that starts with `$ tpplan ...`."""
    runs = []
    for block in re.findall(r"```text\n(.*?)```", text, flags=re.S):
        lines = block.rstrip("\n").splitlines()
        if lines and lines[0].startswith("$ tpplan "):
            runs.append((lines[0].split()[2:], lines[1:]))
    return runs


def _elided(line: str) -> bool:
    """A line the doc shortened: `[... what was left out ...]` or an indented `...`."""
    s = line.strip()
    return s.startswith("[...") or s in ("...", "") or "..." in s


RUNS = _quoted_runs(CONCEPTS)


def test_concepts_quotes_commands():
    assert len(RUNS) >= 2  # the small audit and the K3 audit with a topology


@pytest.mark.parametrize("args,quoted", RUNS, ids=lambda v: " ".join(v[:6]) if isinstance(v[0], str) else "")
def test_each_quoted_output_line_is_what_the_command_prints(args, quoted):
    code, out, err = run_captured(*args)
    assert code == 0, err
    printed = {line.rstrip() for line in out.splitlines()}
    stale = [line for line in quoted if not _elided(line) and line.rstrip() not in printed]
    assert not stale, f"docs/concepts.md quotes lines `tpplan {' '.join(args)}` no longer prints: {stale[:5]}"


def test_readme_quoted_audit_numbers_are_current():
    """The README's "What it answers" block paraphrases an audit's lines: each number it quotes is printed."""
    ((args, quoted),) = _quoted_runs(README)
    code, out, err = run_captured(*args)
    assert code == 0, err
    numbers = re.findall(r"[-+]?\d[\d,.]*\d%?|\d", "\n".join(quoted))
    flat = " ".join(out.split())
    assert numbers and not [n for n in numbers if n not in flat], [n for n in numbers if n not in flat]


def test_concepts_read_together_figures_are_current():
    """The paragraph under the K3 audit: forward times and their change against baseline, recomputed."""
    import json

    args = ["audit", "--model", "kimi-k3", "--tp", "32", "--topology", "h200x8-ib400", "--nodes", "4",
            "--workload", "prompt16k-c8", "--expert-dtype", "bf16", "--plan", "input-scattered+restore",
            "--plan", "gate-aware", "--json"]  # fmt: skip
    code, out, err = run_captured(*args)
    assert code == 0, err
    plans = {p["name"]: p for p in json.loads(out)["plans"]}
    ms = {k: p["prediction"]["forward_s"] * 1e3 for k, p in plans.items()}
    para = CONCEPTS[CONCEPTS.index("Read together:") :].split("\n\n")[0]
    para = " ".join(para.split())
    for name in ("input-scattered+restore", "gate-aware"):
        change = 100 * (ms[name] / ms["baseline"] - 1)
        assert f"{ms[name]:,.1f} vs {ms['baseline']:,.1f} ms per batch, {change:+.1f}%" in para, (name, para)
    band = plans["baseline"]["prediction"]["provenance"]["band"]
    assert f"±{100 * band:.1f}%" in para
    inside = all(abs(ms[k] / ms["baseline"] - 1) < band for k in ("input-scattered+restore", "gate-aware"))
    assert ("both inside the" in para) == inside, para
    weights = plans["baseline"]["prediction"]["memory_bytes_per_rank"]["weights"] / 2**30
    assert f"bf16 experts take {weights:.0f} GiB per" in " ".join(CONCEPTS.split())
    gate = plans["gate-aware"]
    assert f"{gate['comm_delta_pct']:+.1f}%".lstrip("-+") in para  # "moves 14.4% fewer bytes"


def test_with_the_presets_mxfp4_experts_every_named_plan_fits():
    """concepts.md: without --expert-dtype the experts are priced as MXFP4 "and then every plan fits"."""
    import json

    code, out, err = run_captured("audit", "--model", "kimi-k3", "--tp", "32", "--topology", "h200x8-ib400",
                                  "--nodes", "4", "--workload", "prompt16k-c8", "--json")  # fmt: skip
    assert code == 0, err
    assert "and then every plan fits" in " ".join(CONCEPTS.split())
    assert all(p["prediction"]["memory_bytes_per_rank"]["fits"] for p in json.loads(out)["plans"])


@pytest.mark.slow
def test_readme_quotes_the_k3_search_as_it_ranks_today():
    """The README's K3 search paragraph: the best plan's deployment, mean TTFT and both deltas."""
    import json

    code, out, err = run_captured("search", "--model", "kimi-k3", "--topology", "h200x8-ib400", "--nodes", "4",
                                  "--workload", "prompt16k-c8", "--json")  # fmt: skip
    assert code == 0, err
    best = json.loads(out)["plans"][0]
    tp, pp = re.fullmatch(r"TP(\d+)xPP(\d+)", best["deployment"]).groups()  # type: ignore[union-attr]
    said = " ".join(README.split())
    assert f"puts a TP{tp} x PP{pp} plan first ({best['score']:.3f} s mean TTFT at prompt16k-c8" in said
    assert f"{best['delta_vs_baseline_pct']:+.1f}% against baseline at TP{tp} x PP{pp}" in said
    assert f"which itself is {best['deployment_delta_pct']:+.1f}% against baseline at TP32" in said


def _counted(text: str) -> tuple[int, int]:
    m = re.search(r"about ([\d,]+) tests, about ([\d,]+) of them in the quick lane", " ".join(text.split()))
    assert m, "the README states its test counts as 'about N tests, about M of them in the quick lane'"
    return int(m[1].replace(",", "")), int(m[2].replace(",", ""))


@pytest.mark.slow
def test_readme_test_counts_are_within_ten_percent_of_pytest():
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", "not slow"],
        capture_output=True, text=True, cwd=REPO, timeout=600,
    )  # fmt: skip
    m = re.search(r"(\d+)/(\d+) tests collected", run.stdout)
    assert m, run.stdout[-500:]
    quick, total = int(m[1]), int(m[2])
    said_total, said_quick = _counted(README)
    assert abs(said_total - total) <= 0.1 * total, (said_total, total)
    assert abs(said_quick - quick) <= 0.1 * quick, (said_quick, quick)
