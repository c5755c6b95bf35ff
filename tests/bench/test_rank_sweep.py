"""The per-rank sweep (issue 34): its shapes come from the model presets per TP/EP, its runners time the
serving-path kernels (tiny cases on the CPU; fla's recurrences need CUDA), and it re-measures what is not
monotone."""

from __future__ import annotations

import pytest

from tpplan.bench import rank_shapes as S


def test_k3_heads_per_rank_follow_tp() -> None:
    shapes = S.model_rank_shapes("kimi-k3")
    assert sorted({r["heads"] for r in shapes["kda"]}) == [3, 6, 12, 24, 48, 96]
    assert {(r["heads"], r["dqk"], r["dv"]) for r in shapes["attention"]} >= {(3, 192, 128), (96, 192, 128)}
    splits = {r["split"]: r for r in shapes["experts"]}
    assert splits["tp32"]["inter"] == 3072 // 32 and splits["tp32"]["local"] == 896
    assert splits["ep32"]["local"] == 896 // 32 and splits["ep32"]["inter"] == 3072
    assert "tp1" not in splits  # 896 whole experts do not fit MAX_EXPERT_BYTES


def test_rank_shapes_dedupe_across_models() -> None:
    s = S.rank_shapes(("deepseek-v3", "kimi-linear-48b"), tps=(8,), eps=())
    (row,) = [r for r in s["attention"] if r["heads"] == 16]  # DS-V3 128/8 and Kimi-Linear 32/2 would differ
    assert row["models"] == ["deepseek-v3"]
    assert S.heads_bucket(3) == "3-4" and S.heads_bucket(96) == "33+" and S.tokens_bucket(32768) == "32K"


def test_non_monotone_flags_a_falling_time() -> None:
    from tpplan.bench.rank_sweep import non_monotone

    pts = [
        {"family": "norm", "width": 7168, "tokens": t, "seconds": s} for t, s in ((1024, 1.0), (2048, 0.5), (4096, 2.0))
    ]
    assert non_monotone(pts) == [0, 1]
    pts[1]["seconds"] = 1.2
    assert non_monotone(pts) == []


def test_cases_cover_every_family_and_cap_attention() -> None:
    from tpplan.bench.rank_sweep import MAX_ATTN_FLOPS, all_cases
    from tpplan.cost.kernel_models import attention_flops

    cases = all_cases()
    assert set(cases) == {"kda", "gdn", "experts", "attention", "norm", "short_conv", "elementwise", "attn_res", "gemm"}
    flops = [attention_flops(c["heads"], c["tokens"], c["context"], c["dqk"], max(c["dqk"], c["dv"]))
             for c in cases["attention"]]  # fmt: skip
    assert max(flops) <= MAX_ATTN_FLOPS
    assert any(c["heads"] == 1 and c["tokens"] == 32768 for c in cases["kda"])


def test_runners_time_tiny_cases_on_cpu() -> None:
    pytest.importorskip("torch")
    from tpplan.bench import rank_sweep as R
    from tpplan.bench.rank_timing import DEVICE

    DEVICE[0] = "cpu"
    cases = [
        {"family": "attention", "heads": 2, "dqk": 16, "dv": 8, "tokens": 32, "context": 16},
        {
            "family": "experts",
            "experts": 8,
            "local": 4,
            "top_k": 2,
            "width": 16,
            "inter": 8,
            "split": "ep2",
            "tokens": 32,
        },
        {
            "family": "experts",
            "experts": 8,
            "local": 8,
            "top_k": 2,
            "width": 16,
            "inter": 8,
            "split": "tp1",
            "tokens": 32,
        },
        {"family": "norm", "width": 16, "tokens": 32},
        {"family": "short_conv", "channels": 16, "tokens": 32},
        {"family": "elementwise", "op": "silu_mul", "width": 16, "tokens": 32},
        {"family": "gemm", "m": 32, "k": 16, "n": 8},
    ]
    pts = R.run_family(cases, deadline=float("inf"))
    assert len(pts) == len(cases) and all(p["seconds"] > 0 for p in pts)
    ep = pts[1]
    assert 0 < ep["rows"] < 32 * 2 and ep["ffn_s"] > 0 and ep["combine_s"] > 0
    assert pts[2]["rows"] == 64  # the rank holding every expert gets every routed row


def test_checkerboard_holds_out_part_of_every_bucket_and_the_fit_recovers_constants() -> None:
    from tpplan.bench.rank_fit import bucket_table, checkerboard, fit_rank_sweep
    from tpplan.cost import kernel_models as M

    c = {"c0_s": 6e-5, "c1_s": 2e-8, "b_s": 4e-9, "p": 1.1}
    heads, tokens = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 96), (1024, 2048, 4096, 8192, 16384, 32768)
    pts = [{"family": "kda", "heads": h, "d": 128, "tokens": t, "seconds": M.recurrence_s(c, h, t)}
           for h in heads for t in tokens]  # fmt: skip
    fit = checkerboard(pts)
    assert 0 < sum(fit) < len(fit)
    res = fit_rank_sweep(pts)
    table = bucket_table(res["points"])
    assert {r["bucket"] for r in table} == {"h 1-2", "h 3-4", "h 5-8", "h 9-16", "h 17-32", "h 33+"}
    assert max(r["worst"] for r in table) < 0.02


@pytest.mark.slow
def test_docs_tables_are_the_checked_in_fit() -> None:
    """docs/benchmarks.md's per-rank tables are what `rank_fit` renders from the checked-in fit."""
    import json
    from pathlib import Path

    from tpplan.bench.rank_fit import inherited_markdown, markdown_tables

    root = Path(__file__).resolve().parents[2]
    fit = json.loads((root / "docs/benchmarks/h100-2026-12-06/rank-fit.json").read_text())
    doc = (root / "docs/benchmarks.md").read_text()
    for tag, text in (("rank-fit", markdown_tables(fit)), ("rank-inherit", inherited_markdown(fit))):
        assert doc.split(f"<!-- {tag}:begin -->\n")[1].split(f"<!-- {tag}:end -->")[0] == text
