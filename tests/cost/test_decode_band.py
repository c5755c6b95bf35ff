"""The decode step's band (issue 32): only out-of-sample decode errors enter it, an error on too few points
is named and left out, and the band is the sum of each covered part's share x error."""

from __future__ import annotations

import math

import pytest

from tpplan.cost.bands import error_table
from tpplan.cost.decode_band import MIN_POINTS, compose_decode, decode_errors, decode_step_band, public_regimes
from tpplan.cost.predictor import cached_predictor
from tpplan.cost.topology import select_topology
from tpplan.mesh import Mesh
from tpplan.models.config import load_model
from tpplan.models.graph import build_model_graph
from tpplan.plans.named import baseline


def test_every_decode_entry_is_out_of_sample_and_counts_its_points() -> None:
    table = decode_errors()
    assert {k for k, _ in table} >= {"attention", "gemm", "moe"}
    for (klass, key), e in table.items():
        assert e.basis.startswith("out of sample"), (klass, key)
        assert 0 < e.error < 1 and e.points > 0
    assert public_regimes().max_points < MIN_POINTS  # the public regimes are too few for a band of their own


def test_compose_covers_decode_entries_and_names_the_rest() -> None:
    seconds = {("attention", "decode-model"): 3.0, ("gemm", "gemm-table"): 1.0, ("moe", "fused-moe-decode"): 4.0,
               ("collectives", "link-model"): 2.0}  # fmt: skip
    band, parts, left = compose_decode(seconds)
    by = {(p.klass, p.source): p for p in parts}
    assert set(by) == {("attention", "decode-model"), ("moe", "fused-moe-decode"), ("collectives", "link-model")}
    assert by[("attention", "decode-model")].error == decode_errors()[("attention", "decode-model")].error
    assert by[("collectives", "link-model")].error == error_table()["collectives"]["link-model"][0]
    assert [(u.klass, u.source, u.share) for u in left] == [("gemm", "gemm-table", 0.1)]  # prefill-measured only
    assert band == pytest.approx(sum(p.share * p.error for p in parts))


def test_an_entry_on_too_few_points_is_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    from tpplan.cost import decode_band

    few = {k: decode_band.DecodeError(v.error, MIN_POINTS - 1, v.basis) for k, v in decode_errors().items()}
    monkeypatch.setattr(decode_band, "decode_errors", lambda: few)
    band, parts, left = compose_decode({("attention", "decode-model"): 1.0})
    assert band == 0.0 and not parts and "too few points" in left[0].why


def test_a_decode_step_band_from_the_predictor_sums_its_parts() -> None:
    graph = build_model_graph(load_model("tiny-mixtral"))
    topo = select_topology("h100x8-ib400", 1)  # h100-measured: decode models price attention and GEMMs
    pred = cached_predictor(graph, baseline(), topo, Mesh(2), "bf16", None)
    b = decode_step_band(pred, 16, 2048)
    assert b.parts and b.step_s > 0 and (b.batch, b.kv) == (16, 2048)
    assert math.fsum(p.share for p in b.parts) + math.fsum(u.share for u in b.uncovered) == pytest.approx(1.0)
    assert b.covered == pytest.approx(math.fsum(p.share for p in b.parts))
    assert b.band == pytest.approx(math.fsum(p.share * p.error for p in b.parts))
    assert {p.source for p in b.parts if p.klass == "attention"} == {"decode-model"}


def _doc_section(begin: str) -> list[list[str]]:
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    text = doc[doc.index(f"<!-- {begin}: begin -->") : doc.index(f"<!-- {begin}: end -->")]
    return [[c.strip() for c in ln.split("|")[1:-1]] for ln in text.splitlines() if ln.startswith("| ")]


def test_the_decode_errors_are_the_generated_tables_figures() -> None:
    """errors.toml's `[decode.moe]` entry is the worst per-engine-and-GPU median of the `fused-moe-decode` rows
    docs/benchmarks.md's generated table lists, on that many rows; `[decode_public]` the most points of any
    regime in the generated decode validation table."""
    import statistics

    rows = [r for r in _doc_section("decode_moe_check") if len(r) == 12 and r[6] == "fused-moe-decode"]
    by: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        by.setdefault((r[0], r[1]), []).append(abs(float(r[8].rstrip("%"))) / 100)
    moe = decode_errors()[("moe", "fused-moe-decode")]
    assert moe.points == len(rows)
    assert moe.error == pytest.approx(max(statistics.median(v) for v in by.values()), abs=0.006)
    points = [int(r[2]) for r in _doc_section("validate_decode") if len(r) == 5 and r[2].isdigit()]
    assert public_regimes().max_points == max(points)


def test_window_chunk_and_dsa_decode_attention_is_named_not_covered_by_full_attention_errors() -> None:
    """The decode sweep measured full GQA and dense absorbed MLA: a windowed, chunked or DSA sparse decode attention
    is left out of the band and named (`bands.OWN_BAND_CLASSES`), not given the full-attention decode error."""
    for model, own in (
        ("tiny-gpt-oss", {"attention_window"}),
        ("tiny-llama4", {"attention_chunked"}),
        ("tiny-deepseek-v32", {"dsa_indexer", "attention_sparse"}),
    ):
        graph = build_model_graph(load_model(model))
        pred = cached_predictor(graph, baseline(), select_topology("h100x8-ib400", 1), Mesh(2), "bf16", None)
        b = decode_step_band(pred, 16, 2048)
        assert {u.klass for u in b.uncovered} >= own and not {p.klass for p in b.parts} & own, model
        assert all(u.share > 0 for u in b.uncovered if u.klass in own)
