"""docs/benchmarks/serving-public.toml: the public TTFT/TPOT points kept out of every fit (issues 31/32).
Checks the file's form and that each value is the one its quote shows (a transcription check)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from tpplan.models.config import list_presets

POINTS = Path(__file__).resolve().parents[1] / "docs" / "benchmarks" / "serving-public.toml"
METRICS = {"ttft_mean_ms", "ttft_p50_ms", "ttft_p99_ms", "tpot_mean_ms", "tpot_p50_ms", "ttft_unstated_ms",
           "tpot_unstated_ms"}  # fmt: skip
REQUIRED = ("engine", "engine_version", "model", "hf_model", "gpu", "gpus", "tp", "pp", "dp", "prompt_tokens",
            "output_tokens", "arrival", "metric", "value", "source", "quote", "notes", "complete")  # fmt: skip


def _points() -> list[dict]:
    return tomllib.loads(POINTS.read_text())["point"]


def test_every_point_has_the_fields_and_a_source() -> None:
    presets = set(list_presets())
    for p in _points():
        assert all(k in p for k in REQUIRED), (p["source"], [k for k in REQUIRED if k not in p])
        assert p["engine"] in ("sglang", "vllm") and p["metric"] in METRICS and p["value"] > 0
        assert ("concurrency" in p) != ("request_rate" in p), p["quote"]
        assert p["model"] in presets or "/" in p["model"], p["model"]
        assert p["source"].startswith("https://") and p["quote"].strip()
        assert p["tp"] * p["pp"] * p["dp"] <= p["gpus"], p["quote"]


def test_each_value_is_the_number_its_quote_shows() -> None:
    """A value converted from another unit says so in value_as_published; every other value is in its quote."""
    for p in _points():
        shown = p.get("value_as_published") or p["quote"]
        number = p["value"] / 1000 if "value_as_published" in p else p["value"]
        assert f"{number:g}" in shown or f"{number}" in shown, (p["value"], shown)


def test_the_regimes_the_validation_needs_are_covered() -> None:
    ttft = [p for p in _points() if p["metric"].startswith("ttft")]
    assert len(ttft) >= 12 and {p["engine"] for p in ttft} == {"sglang", "vllm"}
    assert len({p["model"] for p in ttft}) >= 3
    assert any(p["pp"] > 1 for p in ttft) and any(p["tp"] > 1 and p["pp"] == 1 for p in ttft)
    long = [p for p in ttft if isinstance(p["prompt_tokens"], int) and p["prompt_tokens"] >= 8192]
    short = [p for p in ttft if p["prompt_tokens"] == "sharegpt" or (isinstance(p["prompt_tokens"], int)
                                                                      and p["prompt_tokens"] <= 1024)]  # fmt: skip
    assert long and short
