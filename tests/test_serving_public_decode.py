"""docs/benchmarks/serving-public-decode.toml: public decode / P/D points kept out of every fit (issue 32).
Checks the file's form, that each value is the number its quote shows, the coverage the issue asks for,
and that nothing in the planner reads either public-points file (they stay out of sample)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from tpplan.models.config import list_presets

ROOT = Path(__file__).resolve().parents[1]
POINTS = ROOT / "docs" / "benchmarks" / "serving-public-decode.toml"
METRICS = {"tpot_mean_ms", "itl_mean_ms", "itl_p50_ms", "output_tok_s", "output_tok_s_per_gpu",
           "output_tok_s_per_user", "output_tok_s_per_node", "itl_slope_ms_per_token", "itl_intercept_ms"}  # fmt: skip
REQUIRED = ("engine", "engine_version", "model", "hf_model", "gpu", "gpus", "tp", "pp", "dp", "mode", "kv_dtype",
            "prompt_tokens", "output_tokens", "arrival", "metric", "source", "quote", "notes", "complete")  # fmt: skip


def _points() -> list[dict]:
    return tomllib.loads(POINTS.read_text(encoding="utf-8"))["point"]


def test_every_point_has_the_fields_a_model_and_a_source() -> None:
    presets = set(list_presets())
    for p in _points():
        assert all(k in p for k in REQUIRED), (p["quote"], [k for k in REQUIRED if k not in p])
        assert p["engine"] in ("sglang", "vllm") and p["metric"] in METRICS and p["mode"] in ("aggregated", "pd-decode")
        assert ("value" in p) != ("value_min" in p), p["quote"]
        assert p["model"] in presets or (ROOT / p["model"]).is_file(), p["model"]
        assert p["source"].startswith("https://") and p["quote"].strip()
        if p["complete"] and p["mode"] == "pd-decode":
            assert isinstance(p["batch_per_rank"], int) and isinstance(p["kv_tokens"], int)
        elif p["complete"]:
            assert isinstance(p["output_tokens"], int) or "output_tokens_mean" in p, p["quote"]
            assert isinstance(p.get("concurrency"), int) or "request_rate" in p, p["quote"]


def test_each_value_is_the_number_its_quote_shows() -> None:
    for p in _points():
        if "value_as_published" in p:
            assert p["value_as_published"] in p["quote"], p["quote"]
            continue
        for v in [p["value"]] if "value" in p else [p["value_min"], p["value_max"]]:
            shown = {f"{v:g}", f"{v:.2e}", f"{v:,}", f"{v:,.0f}" if v == int(v) else f"{v}"}
            assert any(s in p["quote"] for s in shown), (v, p["quote"])


def test_the_coverage_the_issue_asks_for() -> None:
    """At least four models on at least two GPU types, both engines, aggregated and P/D, complete."""
    done = [p for p in _points() if p["complete"]]
    assert len({p["model"] for p in done}) >= 4
    assert len({p["gpu"] for p in done}) >= 2
    assert {p["engine"] for p in done} == {"sglang", "vllm"}
    assert {p["mode"] for p in done} == {"aggregated", "pd-decode"}
    assert {"itl_slope_ms_per_token", "output_tok_s"} <= {p["metric"] for p in done}


def test_nothing_in_the_planner_reads_the_public_points() -> None:
    """Out of sample: no module, preset or data file under tpplan/ names either file, and under tools/ only
    the two validation tools do (no fitting tool: aic_fit, curve_check, ...)."""
    names = ("serving-public", "serving_public")
    for path in (ROOT / "tpplan").rglob("*"):
        if path.is_file() and path.suffix in (".py", ".toml", ".json", ".md", ".txt"):
            text = path.read_text(encoding="utf-8", errors="replace")
            assert not any(n in text for n in names), path
    readers = {p.name for p in (ROOT / "tools").glob("*.py") if any(n in p.read_text(encoding="utf-8") for n in names)}
    assert readers == {"validate_serving.py", "validate_decode.py"}
