"""Every real preset at every TP its heads allow, and every family through search and report
(issue 12: every popular serving model from its own config.json).

The commands run in this process through `tpplan.cli.main` (the console script's entry point), so
the exit codes are the ones a user sees: 0 on success, 2 with one `error:` line otherwise.
"""

from __future__ import annotations

import json

import pytest
from cli_helpers import run_cli

from tpplan.models.config import list_presets, load_model
from tpplan.models.families import families
from tpplan.models.spec import ModelSpec

TPS = (1, 2, 4, 8, 16, 32)
REAL = sorted(p for p in list_presets() if not p.startswith("tiny-"))
# Presets whose heads do not split over 8 ranks (so no TP8 audit); every other real preset must plan at TP8.
NOT_TP8 = {"qwen2-7b": "28 query heads"}
# One real preset per family, each planned at TP8 on one H200 node (k3-slice: K3's layer kinds, fast).
FAMILY_PRESET = {
    "gqa": "llama-3-70b",
    "deepseek_v3": "deepseek-v3",
    "kimi_k25": "kimi-k25",
    "deepseek_v2": "deepseek-v2-lite",
    "deepseek_v32": "glm-5.1",
    "kimi_linear": "kimi-linear-48b",
    "kimi_k3": "k3-slice",
    "qwen3_next": "qwen3-next-80b",
    "qwen3_5": "qwen3.5-35b-a3b",
    "gpt_oss": "gpt-oss-20b",
    "gemma3": "gemma-3-4b-it",
    "llama4": "llama-4-scout-17b-16e",
    "glm4_moe": "glm-4.5-air",
    "minimax_m2": "minimax-m2.7",
}
PREDICT = ("--topology", "h200x8-ib400", "--workload", "seed-c8")


def _split_heads(spec: ModelSpec) -> set[int]:
    """The head counts TP splits: each token mixer's query heads (Gated DeltaNet: its key heads).
    KV heads are replicated when TP exceeds them, and the DSA indexer is replicated."""
    return {getattr(layer.attn, "k_heads", None) or layer.attn.heads for layer in spec.layers}


def _allowed(preset: str) -> list[int]:
    heads = _split_heads(load_model(preset))
    return [tp for tp in TPS if all(h % tp == 0 for h in heads)]


def test_every_real_preset_plans_at_tp8_unless_its_heads_forbid_it():
    assert set(NOT_TP8) <= set(REAL)
    for preset in REAL:
        assert (8 in _allowed(preset)) == (preset not in NOT_TP8), preset


@pytest.mark.parametrize("preset", REAL)
def test_real_preset_audits_at_every_tp_its_heads_allow(preset, capsys, monkeypatch):
    allowed = _allowed(preset)
    for tp in TPS:
        rc, out, err = run_cli(monkeypatch, capsys, "audit", "--model", preset, "--tp", str(tp), "--json")
        if tp in allowed:
            assert rc == 0, (preset, tp, err)
            legal = {p["name"] for p in json.loads(out)["plans"] if p["legal"]}
            assert {"baseline", "sequence-parallel", "gate-aware"} <= legal, (preset, tp)
        else:  # one clear line: which heads, and the TP sizes that would work
            assert rc == 2 and not out, (preset, tp, rc)
            assert err.startswith("error:") and "cannot be split evenly" in err and "Fix:" in err, err
            assert "Traceback" not in err
    if 8 in allowed:
        rc, out, err = run_cli(monkeypatch, capsys, "audit", "--model", preset, "--tp", "8", "--json", *PREDICT)
        assert rc == 0, err
        assert json.loads(out)["plans"][0]["prediction"]["ttft"]["mean_s"] > 0


def test_family_presets_cover_every_family():
    assert set(FAMILY_PRESET) == set(families())
    for family, preset in FAMILY_PRESET.items():
        assert load_model(preset).family == family, preset


@pytest.mark.parametrize(("family", "preset"), sorted(FAMILY_PRESET.items()))
@pytest.mark.slow
def test_search_and_report_run_on_every_family(family, preset, capsys, monkeypatch, tmp_path):
    # no memory cap: GLM-5.1 in bf16 fits no 8-GPU plan, and the ranking is what is under test here
    rc, _, err = run_cli(monkeypatch, capsys, "search", "--model", preset, "--tp", "8", *PREDICT,
                      "--memory-cap", "none", "--json", str(tmp_path / "search.json"))  # fmt: skip
    assert rc == 0, err
    ranked = json.loads((tmp_path / "search.json").read_text())
    assert ranked["model"] == preset and ranked["tp"] == 8 and ranked["plans"], ranked.keys()
    rc, _, err = run_cli(monkeypatch, capsys, "report", "--model", preset, "--tp", "8", *PREDICT,
                      "--out", str(tmp_path / "report"))  # fmt: skip
    assert rc == 0, err
    md = (tmp_path / "report" / "report.md").read_text()
    assert preset in md and "TP8" in md
