"""The decode sweep (issue 32): flash-decoding equals plain attention over the cache for any split, its
cases span batch 1-512 and KV 1K-128K within the memory cap, and every family's runner times tiny cases
on the CPU."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tpplan.bench import decode_sweep as D  # noqa: E402


def _reference(q, k, v, scale):
    """Softmax over every cached key, query head h reading KV head h // (h / hk), in fp64."""
    rep = q.shape[1] // k.shape[2]
    kk, vv = k.double().repeat_interleave(rep, dim=2), v.double().repeat_interleave(rep, dim=2)
    w = torch.softmax(torch.einsum("bhd,blhd->bhl", q.double(), kk) * scale, dim=-1)
    return torch.einsum("bhl,blhd->bhd", w, vv)


@pytest.mark.parametrize(("heads", "kv_heads", "dv"), [(8, 2, 16), (4, 4, 16), (6, 1, 12)])
def test_flash_decoding_is_attention_over_the_cache_for_every_split(heads: int, kv_heads: int, dv: int) -> None:
    g = torch.Generator().manual_seed(heads * 10 + kv_heads)
    b, n, d = 3, 64, 16
    q, k = torch.randn(b, heads, d, generator=g), torch.randn(b, n, kv_heads, d, generator=g)
    v = torch.randn(b, n, kv_heads, dv, generator=g)
    ref = _reference(q, k, v, 0.3)
    for splits in (1, 2, 4, 8):
        got = D.decode_attention(q, k, v, 0.3, splits).double()
        assert float((got - ref).norm() / ref.norm()) < 1e-5


def test_splits_fill_the_sms_and_divide_the_keys() -> None:
    assert D.splits_for(rows=1, keys=131072, sms=132) == 256
    assert D.splits_for(rows=512 * 8, keys=131072, sms=132) == 1
    assert D.splits_for(rows=2, keys=1024, sms=132) == 4  # at least SPLIT_KEYS keys per split
    assert D.splits_for(rows=1, keys=1001, sms=132) == 1  # an odd length is not split into equal parts
    assert 131072 % D.splits_for(rows=3, keys=131072, sms=132) == 0


def test_cases_span_the_issue_ranges_within_the_cap() -> None:
    cases = D.decode_cases()
    assert set(cases) == {"decode_gqa", "decode_mla", "gemm_small", "experts_small"}
    for fam in ("decode_gqa", "decode_mla"):
        assert {c["batch"] for c in cases[fam]} == set(D.BATCHES)
        assert {c["kv"] for c in cases[fam]} == set(D.KV_LENS)
        assert max(D.kv_bytes(c) for c in cases[fam]) <= D.MAX_KV_BYTES
    assert any(c["batch"] == 1 and c["kv"] == 131072 and c["heads"] == 8 for c in cases["decode_gqa"])
    assert {c["m"] for c in cases["gemm_small"]} == set(D.SMALL_M)
    assert {c["split"] for c in cases["experts_small"]} <= set(D.EXPERT_SPLITS)
    assert {c["tokens"] for c in cases["experts_small"]} == set(D.EXPERT_TOKENS)


def test_every_decode_runner_times_tiny_cases_on_cpu() -> None:
    from tpplan.bench.rank_sweep import run_family
    from tpplan.bench.rank_timing import DEVICE

    DEVICE[0] = "cpu"
    try:
        cases = [
            {"family": "decode_gqa", "heads": 4, "kv_heads": 2, "d": 16, "batch": 2, "kv": 512},
            {"family": "decode_mla", "heads": 4, "batch": 2, "kv": 512},
            {"family": "gemm_small", "m": 2, "k": 32, "n": 16},
            {
                "family": "experts_small",
                "experts": 8,
                "local": 8,
                "top_k": 2,
                "width": 16,
                "inter": 8,
                "split": "tp8",
                "tokens": 4,
            },
        ]
        pts = run_family(cases, float("inf"), D.DECODE_RUNNERS)
    finally:
        DEVICE[0] = "cuda"
    assert len(pts) == 4 and all(p["seconds"] > 0 for p in pts)
    assert pts[0]["splits"] == 2 and pts[3]["rows"] == 8 and pts[2]["copies"] == 2  # GEMMs cycle weight copies
    assert pts[1]["variant"] == D.FLASH_DECODING  # no CUDA: not FlashMLA


def test_a_repeat_that_comes_back_without_a_time_keeps_the_first(monkeypatch) -> None:
    """Random routing can leave an expert-parallel rank no rows in one repeat (no b2b time): the
    re-measurement of a non-monotone case takes the medians it has (the H100 call's KeyError)."""
    from tpplan.bench import rank_sweep as R

    times = [2.0, 1.0, None, 3.0, 1.0, 1.0]  # None: a repeat with no rows here
    calls = iter({"seconds": 0.0, "skipped": "x"} if t is None else {"seconds": t, "b2b_s": t} for t in times)
    runners = {"gemm_small": lambda c: next(calls)}
    cases = [{"family": "gemm_small", "m": m, "k": 8, "n": 8} for m in (1, 2)]
    pts = R.run_family(cases, float("inf"), runners)
    assert pts[0]["remeasured"] == [2.0, 0.0, 3.0] and pts[0]["seconds"] == 2.0 and pts[0]["b2b_s"] == 2.0
    assert pts[1]["remeasured"] == [1.0, 1.0, 1.0]


@pytest.mark.slow
def test_docs_tables_are_the_checked_in_runs_and_fit() -> None:
    """docs/benchmarks.md's per-layer table and decode-fit tables are rendered from the checked-in files."""
    import json
    from pathlib import Path

    from tpplan.bench.decode_fit import markdown
    from tpplan.bench.run_table import layer_rows

    root = Path(__file__).resolve().parents[2]
    d = root / "docs/benchmarks/h100-2026-12-06b"
    doc = (root / "docs/benchmarks.md").read_text()

    def block(tag: str) -> str:
        return doc.split(f"<!-- {tag}:begin -->\n")[1].split(f"<!-- {tag}:end -->")[0]

    runs = [d / c / f"{m}.json" for c in ("call2", "call3")
            for m in ("gpt-oss-120b", "glm-5.1", "gemma-3-4b-it", "llama-4-scout-17b-16e")]  # fmt: skip
    assert block("run-table") == layer_rows(runs)
    fit = json.loads((d / "decode-fit.json").read_text())
    assert block("decode-fit") == markdown(fit)
    other = markdown({"totals": fit["other"]["totals"], "buckets": []}).split("\n\n")[0] + "\n"
    assert block("decode-fit-other") == other
    from tpplan.bench.decode_fit import gemm_formula_table, merged

    assert block("decode-gemm-before") == gemm_formula_table(merged([str(d / "call6/decode-sweep-gemm.json")]))
