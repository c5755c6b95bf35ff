"""The docs a newcomer starts from: self-contained, and the numbers docs/concepts.md quotes are the
ones tpplan computes today."""

import re
from pathlib import Path

import pytest

from tpplan.audit import audit, to_json

REPO = Path(__file__).resolve().parents[1]
CONCEPTS = (REPO / "docs" / "concepts.md").read_text()
DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_no_doc_points_outside_the_repository(path: Path) -> None:
    text = path.read_text()
    assert not re.search(r"/work/|shared/(anchors|seed)|DESIGN\.md", text), f"{path} leans on a file the repo lacks"


def test_readme_links_concepts() -> None:
    assert "docs/concepts.md" in (REPO / "README.md").read_text()


@pytest.mark.parametrize(("model", "n"), [("kimi-k3", 32), ("tiny-kimi-k3", 2), ("deepseek-v3", 8)])
def test_bytes_are_relative_units_times_ring_factor_and_dtype(model: str, n: int) -> None:
    """concepts.md: bytes per token per rank = units x (N-1)/N x bytes per element, for every plan."""
    data = to_json(audit(model, n, ["baseline", "input-scattered", "gate-aware", "sp-moe", "ep2"]))
    for p in data["plans"]:
        units, nbytes = p["comm_units_per_token"], p["comm_bytes_per_token_per_rank"]
        assert nbytes == pytest.approx(units * (n - 1) / n * 2, rel=1e-9), p["name"]


def test_concepts_quotes_the_audit() -> None:
    """The K3 example numbers in concepts.md, recomputed: the seed's table per MLA layer and the
    whole-model bytes = units x 31/32 x 2 example."""
    names = ["baseline", "input-scattered", "latent-scattered", "input-scattered+restore", "gate-aware"]
    plans = {p["name"]: p for p in to_json(audit("kimi-k3", 32, names))["plans"]}
    mla = {k: v["layer_kinds"]["mla+moe"]["attn_input_units"] for k, v in plans.items()}
    assert f"2H = {mla['baseline']:g}" in CONCEPTS
    assert f"H + L = {mla['input-scattered']:g}" in CONCEPTS
    assert mla["latent-scattered"] == mla["input-scattered+restore"]
    assert f"2H + L = {mla['latent-scattered']:g}" in CONCEPTS
    assert f"{mla['gate-aware']:g} in all" in CONCEPTS
    base = plans["baseline"]
    example = f"{base['comm_units_per_token']:,.0f} x 31/32 x 2 = {base['comm_bytes_per_token_per_rank']:,.0f}"
    assert example in CONCEPTS


def test_concepts_small_example_is_current() -> None:
    """The pasted tiny audit: each plan's whole-model bytes and delta appear in its table row."""
    data = to_json(audit("tiny-kimi-k3", 2, ["input-scattered", "gate-aware"]))
    for p in data["plans"]:
        row = next(line for line in CONCEPTS.splitlines() if re.match(rf"│ {re.escape(p['name'])} +│ (yes|NO)", line))
        assert f"{p['comm_bytes_per_token_per_rank']:,.0f}" in row and f"{p['comm_delta_pct']:+.1f}%" in row
