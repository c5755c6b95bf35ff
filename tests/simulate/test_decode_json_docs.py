"""The decode fields audit and search JSON carry are the ones docs/audit-json.md and docs/search-json.md
document (issue 32): every key `serving.decode` emits is documented there, and every documented key is
emitted; the step figures are consistent with the loop's own steps."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.cli_helpers import run_cli

DOCS = Path(__file__).resolve().parents[2] / "docs"
SPECULATIVE = {"speculative", "method", "draft_tokens", "verify_tokens", "accepted_per_step", "draft_layers",
               "draft_model", "draft", "layers", "weights_bytes_per_rank", "flags", "sources"}  # fmt: skip
"""settings.speculative and its keys: only with --spec (tests/simulate/test_speculative.py)"""
AUDIT_ARGS = ("audit", "-m", "tiny-llama", "--tp", "2", "-t", "h200x8-ib400", "--plan", "baseline", "--json", "-")


def _block(text: str, opener: str) -> str:
    """The lines of the JSON sketch from `opener` to the brace that closes it (same indent)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith(opener))
    indent = len(lines[start]) - len(lines[start].lstrip())
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith(" " * indent + "}"))
    return "\n".join(lines[start + 1 : end])


def _documented(block: str) -> set[str]:
    """Quoted key names in the sketch's JSON part: a line's text up to its explanation (after three or more
    spaces); lines indented past the JSON (explanations continued) hold none."""
    keys: set[str] = set()
    for line in block.splitlines():
        text = line.lstrip()
        if len(line) - len(text) <= 30:
            keys |= set(re.findall(r'"([a-z][a-z0-9_]*)"', re.split(r"\s{3,}", text)[0]))
    return keys


def _emitted(d: dict[str, object]) -> set[str]:
    """The block's keys and the keys of the objects it holds."""
    return set(d).union(*(set(v) for v in d.values() if isinstance(v, dict)))


def _decode(monkeypatch, capsys, tmp_path, rows: str) -> dict[str, object]:  # type: ignore[no-untyped-def]
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n" + rows)
    code, out, err = run_cli(monkeypatch, capsys, *AUDIT_ARGS, "--trace", str(trace))
    assert code == 0, err
    return json.loads(out)["plans"][0]["serving"]["decode"]


def test_audit_decode_keys_are_the_documented_ones(monkeypatch, capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    doc = (DOCS / "audit-json.md").read_text(encoding="utf-8")
    documented = _documented(_block(doc, '"decode": {'))
    d = _decode(monkeypatch, capsys, tmp_path, "0,128,8\n0.001,256,6\n0.002,64,12\n")
    request_keys = _documented(doc[doc.index('"requests": [{"id"') :].split("\n\n")[0].split("]")[0])
    emitted = _emitted(d) - {"requests"}
    assert emitted <= documented, emitted - documented
    assert documented - {"reason", "requests"} - SPECULATIVE <= emitted, documented - emitted
    assert all(set(r) <= request_keys | {"id"} for r in d["requests"])  # type: ignore[union-attr]
    for stat in ("decode_step_s", "tpot_s", "itl_s", "latency_s", "ttft_s"):
        s = d[stat]
        assert s["p50"] <= s["p90"] <= s["p99"] and s["mean"] > 0, stat  # type: ignore[index]
    # three requests of 8, 6 and 12 tokens: every decode step runs 1 to 3 of them
    assert 1 <= d["mean_decode_batch"] <= d["max_decode_batch"] <= 3  # type: ignore[operator]
    assert d["decode_step_s"]["p99"] <= d["itl_s"]["p99"] + 1e-12  # type: ignore[index]
    assert d["output_tok_s_per_user"] == pytest.approx(1 / d["tpot_s"]["mean"])  # type: ignore[index]


def test_a_refused_deployment_carries_the_documented_keys(monkeypatch, capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import tpplan.simulate.serving as serving

    monkeypatch.setattr(serving, "replica_kv", lambda p, **_: ((4, 100), "a pool of 100 tokens"))
    d = _decode(monkeypatch, capsys, tmp_path, "0,128,8\n")
    assert set(d) == {"admitted", "reason", "settings"} and d["admitted"] is False
    assert d["settings"]["kv_tokens"] == 100  # type: ignore[index]


def test_search_json_documents_the_decode_block_it_carries() -> None:
    row = next(line for line in (DOCS / "search-json.md").read_text(encoding="utf-8").splitlines()
               if line.startswith("| `serving` |"))  # fmt: skip
    for key in ("`decode`", "decode step time", "TPOT", "per GPU and per user", "KV pool"):
        assert key in row, key
