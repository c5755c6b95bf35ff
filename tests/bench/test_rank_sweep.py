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


def test_windowed_chunked_and_indexer_shapes_per_rank() -> None:
    """Windows (Gemma 3, gpt-oss with sinks) and chunks (Llama 4) split their heads over TP; DSA's indexer is
    replicated (every index head on every rank), so its heads do not follow TP."""
    from tpplan.bench.rank_sweep import MAX_INDEX_SCORES, all_cases

    s = S.rank_shapes(S.MASKED_MODELS)
    by = {(r["window"], r["chunk"]): sorted(x["heads"] for x in s["masked"] if (x["window"], x["chunk"]) ==
                                            (r["window"], r["chunk"])) for r in s["masked"]}  # fmt: skip
    assert by[(1024, 0)] == [1, 2, 4, 8] and by[(128, 0)] == [2, 4, 8, 16, 32, 64] and 1 in by[(0, 8192)]
    assert all(r["sinks"] == (r["window"] == 128) for r in s["masked"])
    assert {(r["heads"], r["topk"]) for r in s["indexer"]} == {(32, 2048), (64, 2048)}
    cases = all_cases()
    assert any(c["tokens"] == 32768 for c in cases["masked"]) and any(c["context"] for c in cases["masked"])
    assert max(c["heads"] * c["tokens"] * (c["tokens"] + c["context"]) for c in cases["indexer"]) <= MAX_INDEX_SCORES


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
    assert set(cases) == {"kda", "gdn", "experts", "attention", "norm", "short_conv", "elementwise", "attn_res", "gemm",
                          "masked", "indexer", "sparse"}  # fmt: skip
    assert {(c["heads"], c["topk"]) for c in cases["sparse"]} >= {(128, 2048), (64, 2048), (4, 2048)}  # DSV3.2 TP1-32
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
        {"family": "masked", "heads": 2, "d": 16, "window": 8, "chunk": 0, "sinks": True, "tokens": 32, "context": 16},
        {"family": "masked", "heads": 2, "d": 16, "window": 0, "chunk": 16, "sinks": False, "tokens": 32, "context": 0},
        {"family": "indexer", "heads": 2, "d": 64, "topk": 8, "tokens": 32, "context": 16},
        {"family": "sparse", "heads": 2, "topk": 8, "tokens": 32, "context": 16},
    ]
    pts = R.run_family(cases, deadline=float("inf"))
    assert len(pts) == len(cases) and all(p["seconds"] > 0 for p in pts)
    ep = pts[1]
    assert 0 < ep["rows"] < 32 * 2 and ep["ffn_s"] > 0 and ep["combine_s"] > 0
    assert pts[2]["rows"] == 64  # the rank holding every expert gets every routed row
    assert "window" in pts[7]["variant"] and "sinks" in pts[7]["variant"] and "chunk" in pts[8]["variant"]
    assert pts[10]["variant"] == "reference"  # no CUDA: neither FlashMLA nor the Triton kernel


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


def test_masked_and_indexer_forms_recover_their_constants() -> None:
    """A chunked call passes over each chunk's keys in turn (flash once per chunk), a window over its window;
    the masked and indexer forms fitted on the checkerboard half recover the constants they were made from."""
    from tpplan.bench.rank_fit import FAMILIES, chain_keys, fit_rank_sweep, inherited_errors, other_card_rows

    ch = {"family": "masked", "heads": 1, "d": 128, "window": 0, "chunk": 8192}
    assert chain_keys({**ch, "tokens": 32768, "context": 0}) == 32768
    assert chain_keys({**ch, "tokens": 4096, "context": 8192}) == 4096  # a new chunk: the cached one is not read
    assert chain_keys({**ch, "chunk": 0, "window": 128, "tokens": 4096, "context": 0}) == 128
    cm = {"a_s": 2e-5, "b_s": 1e-12, "tflops": 500.0, "sm_tflops": 5.0, "p1": 1.0}
    ci = {"a_s": 5e-4, "tflops": 20.0, "Gscores": 12.0}
    pts = [{**ch, "heads": h, "tokens": t, "context": 0} for h in (1, 2, 5, 10, 20, 40) for t in (1024, 4096, 16384)]
    pts += [{"family": "indexer", "heads": h, "d": 128, "topk": 2048, "tokens": t, "context": c}
            for h in (32, 64) for t in (1024, 2048, 4096, 8192) for c in (0, 8192)]  # fmt: skip
    for p in pts:
        p["seconds"] = FAMILIES[p["family"]][0](cm if p["family"] == "masked" else ci, p)
    res = fit_rank_sweep(pts)
    assert {"attention_chunked", "dsa_indexer"} <= set(res["constants"])
    held = [abs(r["error"]) for r in res["points"] if r["set"] == "held-out"]
    assert held and max(held) < 0.05
    # another card's sweep, every point priced by this fit: the same card agrees, a card 20% slower does not
    same = inherited_errors(other_card_rows(pts), res["constants"])
    slower = inherited_errors(other_card_rows([{**p, "seconds": 1.2 * p["seconds"]} for p in pts]), res["constants"])
    assert {r["model"] for r in same} == {"attention_chunked", "dsa_indexer"} and max(r["worst"] for r in same) < 0.05
    assert min(r["median"] for r in slower) > 0.1


@pytest.mark.slow
def test_docs_masked_tables_are_the_checked_in_fit() -> None:
    """docs/benchmarks.md's windowed / chunked / indexer tables are what `rank_fit` renders from the checked-in fit."""
    import json
    from pathlib import Path

    from tpplan.bench.rank_fit import markdown_tables, other_markdown, priced_today_markdown

    root = Path(__file__).resolve().parents[2]
    fit = json.loads((root / "docs/benchmarks/h100-2026-12-06c/rank-fit-masked.json").read_text())
    doc = (root / "docs/benchmarks.md").read_text()
    for tag, text in (("rank-fit-masked", markdown_tables(fit)),
                      ("rank-fit-masked-other", other_markdown(fit["other"]["table"])),
                      ("rank-priced-today", priced_today_markdown(fit["priced_today"]["points"]))):  # fmt: skip
        assert doc.split(f"<!-- {tag}:begin -->\n")[1].split(f"<!-- {tag}:end -->")[0] == text
    from tpplan.bench.run_table import layer_rows

    runs = root / "docs/benchmarks/h100-2026-12-06c/call5"
    models = ("deepseek-v3", "llama-3-70b", "mixtral-8x7b", "glm-4.5-air", "qwen3-next-80b", "kimi-k3")
    table = layer_rows([runs / f"{m}.json" for m in models])
    assert doc.split("<!-- run-table-80gb-2:begin -->\n")[1].split("<!-- run-table-80gb-2:end -->")[0] == table
    more = layer_rows([root / "docs/benchmarks/h100-2026-12-06c/call6" / f"{m}.json"
                       for m in ("llama-4-maverick-17b-128e", "minimax-m2.7")])  # fmt: skip
    assert doc.split("<!-- run-table-80gb-3:begin -->\n")[1].split("<!-- run-table-80gb-3:end -->")[0] == more


def test_docs_06d_run_tables_are_the_checked_in_runs() -> None:
    """docs/benchmarks.md's 2026-12-06d per-layer tables are what `run_table.layer_rows` renders from the
    recorded results (nothing typed)."""
    from pathlib import Path

    from tpplan.bench.run_table import layer_rows

    root = Path(__file__).resolve().parents[2]
    doc = (root / "docs/benchmarks.md").read_text()
    runs = root / "docs/benchmarks/h100-2026-12-06d"
    tables = {"run-table-80gb-4": [runs / "call2" / f"{m}.json" for m in ("kimi-linear-48b", "qwen3.5-397b-a17b")],
              "run-table-80gb-5": [runs / "call4" / f"{m}.json" for m in ("deepseek-v3.2", "glm-5.1", "gpt-oss-120b")]
              + [runs / "call5" / "gemma-3-4b-it.json"]}  # fmt: skip
    for tag, paths in tables.items():
        assert doc.split(f"<!-- {tag}:begin -->\n")[1].split(f"<!-- {tag}:end -->")[0] == layer_rows(paths)


@pytest.mark.slow
def test_docs_06d_sweep_tables_are_the_checked_in_fit() -> None:
    """The 06d sweep's fit, refitted from the recorded sweep, is the checked-in one, and docs/benchmarks.md's
    fit and priced-today tables are what `rank_fit` renders from it."""
    import json
    from pathlib import Path

    from tpplan.bench.rank_fit import bucket_table, fit_rank_sweep, markdown_tables, priced_today_markdown

    root = Path(__file__).resolve().parents[2]
    runs = root / "docs/benchmarks/h100-2026-12-06d"
    fit = json.loads((runs / "rank-fit-masked.json").read_text())
    again = fit_rank_sweep(json.loads((runs / "call4/rank-sweep.json").read_text())["points"])
    assert bucket_table(again["points"]) == fit["table"]
    doc = (root / "docs/benchmarks.md").read_text()
    for tag, text in (("rank-fit-masked-06d", markdown_tables(fit)),
                      ("rank-priced-today-06d", priced_today_markdown(fit["priced_today"]["points"]))):  # fmt: skip
        assert doc.split(f"<!-- {tag}:begin -->\n")[1].split(f"<!-- {tag}:end -->")[0] == text


def test_a_fitted_set_names_the_kernels_its_points_ran() -> None:
    """A set's `impl` is the variants its sweep points recorded (06d: fla's window, the fused indexer), not the
    default name of the kernel an older sweep ran; points without a record keep the default."""
    from tpplan.bench.rank_fit import FAMILIES, IMPLS, fit_rank_sweep

    ci = {"a_s": 5e-4, "tflops": 20.0, "Gscores": 12.0}
    pts = [{"family": "indexer", "heads": h, "d": 128, "topk": 2048, "tokens": t, "context": c}
           for h in (32, 64) for t in (1024, 2048, 4096, 8192) for c in (0, 8192)]  # fmt: skip
    for p in pts:
        p["seconds"] = FAMILIES["indexer"][0](ci, p)
    assert fit_rank_sweep(pts)["constants"]["dsa_indexer"]["impl"] == IMPLS["dsa_indexer"]
    ran = [{**p, "variant": "fused"} for p in pts]
    assert fit_rank_sweep(ran)["constants"]["dsa_indexer"]["impl"] == "fused"
