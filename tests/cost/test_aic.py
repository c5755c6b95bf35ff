"""The issue-25 checks against AIConfigurator's measured database (skipped without the package).

Each check compares the source's answer (the package's own op query) with the raw measured rows the
package binds, so a wrong mapping of tokens, TP/EP, dtype or message size fails here. The database
loads once per session (tables of one engine: 5-15 s on a 2-core machine)."""

from __future__ import annotations

import statistics

import numpy as np
import pytest

pytest.importorskip("aiconfigurator_core")

from tpplan.cost.kernel_source import AttentionShape, CollectiveShape, GemmShape, KernelSource, MoeShape
from tpplan.cost.sources.aic import FAR, AicSource, aic_databases, engine_source
from tpplan.errors import TpplanError

DSV3 = {"hidden": 7168, "intermediate": 2048, "experts": 256, "top_k": 8}
DSV3_KEY = (7168, 2048, 256, 8)
ENGINES = ("sglang", "vllm", "trtllm")
MIB = 2**20


@pytest.fixture(scope="session")
def h200() -> dict[str, AicSource]:
    return {e: AicSource("h200_sxm", e) for e in ENGINES}


def _name(key: object) -> str:
    return getattr(key, "name", str(key))


def _by_name(view: object, name: str) -> object:
    return next(view[k] for k in view if _name(k) == name)  # type: ignore[attr-defined,index]


def test_the_database_lists_the_gpus_of_the_issue() -> None:
    held = aic_databases()
    for system in ("h100_sxm", "h200_sxm", "b200_sxm", "b300_sxm", "gb200", "gb300", "rtx_pro_6000_server"):
        assert set(held[system]) >= set(ENGINES)


def test_bad_system_engine_or_version_is_one_line_naming_the_choices() -> None:
    with pytest.raises(TpplanError, match=r"has tables .*h200_sxm"):
        AicSource("h999", "sglang")
    with pytest.raises(TpplanError, match="use one of"):
        AicSource("h200_sxm", "sglang", "0.0.1")
    with pytest.raises(TpplanError, match="engine="):
        engine_source("h200_sxm", "tensorrt@1")
    assert engine_source("h200", "vllm@0.24.0").name == "aic:h200_sxm/vllm@0.24.0"


@pytest.mark.slow
def test_deepseek_v3_experts_at_tp8_match_the_rows_aic_measured(h200: dict[str, AicSource]) -> None:
    """Exact rows: the source must return them (within 15%, the issue's bar) at 1K-16K tokens."""
    for engine, src in h200.items():
        assert isinstance(src, KernelSource)
        rows = _by_name(src.table("moe"), "fp8_block")["balanced"][8][256][7168][2048]  # type: ignore[index]
        for tp, ep in ((8, 1), (1, 8)):
            measured = rows[tp][ep]
            checked = 0
            for tokens in (t for t in measured if 1024 <= t <= 16384):
                p = src.moe(MoeShape(tokens, tp=tp, ep=ep, dtype="fp8_block", **DSV3))
                assert p is not None and not p.extrapolated
                assert p.seconds * 1e3 == pytest.approx(measured[tokens]["latency"], rel=0.15), (engine, tp, tokens)
                checked += 1
            assert checked >= 4


def test_tp_and_ep_experts_rank_as_each_engine_measured(h200: dict[str, AicSource]) -> None:
    """The issue: at 8K tokens TRT-LLM runs DeepSeek-V3's fp8 experts 3.9x faster at EP8 than TP8;
    SGLang and vLLM run TP8 2.5-2.7x faster than EP8. Measured in AIC 0.12.0: 3.88x, 2.73x, 2.51x."""
    ratio = {}
    for engine, src in h200.items():
        tp = src.moe(MoeShape(8192, tp=8, ep=1, dtype="fp8_block", **DSV3))
        ep = src.moe(MoeShape(8192, tp=1, ep=8, dtype="fp8_block", **DSV3))
        assert tp is not None and ep is not None
        ratio[engine] = tp.seconds / ep.seconds
    assert ratio["trtllm"] == pytest.approx(3.9, rel=0.05)
    assert 1 / ratio["sglang"] == pytest.approx(2.7, rel=0.05)
    assert 1 / ratio["vllm"] == pytest.approx(2.5, rel=0.05)


def test_fitted_experts_out_of_sample_on_deepseek_v3(h200: dict[str, AicSource]) -> None:
    """Fit each engine's fp8_block TP and EP classes WITHOUT DeepSeek-V3's configuration, then predict
    its TP8/EP8 rows at 1K-16K tokens from the work each row measured (AIC's collector routing):
    out-of-sample median within 15% on every engine, and TP vs EP at 8K ranked as the rows rank them.
    (Before the routing was replayed the medians were 0.38 SGLang, 0.40 vLLM, and vLLM ranked wrong.)"""
    from tools.aic_fit import held_out_fit, moe_rows

    for engine, src in h200.items():
        rows = moe_rows(src, quants=("fp8_block",))
        errs, pred, measured = [], {}, {}
        for mode, (tp, ep) in (("tp", (8, 1)), ("ep", (1, 8))):
            kept = rows[f"fp8_block/{mode}"][1]
            coef = held_out_fit(kept, DSV3_KEY)
            for _, x, ms, (tokens, r_tp, r_ep) in (r for r in kept if r[0] == DSV3_KEY):
                if (r_tp, r_ep) == (tp, ep) and 1024 <= tokens <= 16384:
                    p = float(np.array(x) @ coef)
                    errs.append(abs(p - ms) / ms)
                    if tokens == 8192:
                        pred[mode], measured[mode] = p, ms
        assert len(errs) >= 16
        assert statistics.median(errs) < 0.15, (engine, statistics.median(errs))
        assert (pred["tp"] < pred["ep"]) == (measured["tp"] < measured["ep"]), engine


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_the_ep8_slowdown_is_aics_routing_of_deepseek_v3(h200: dict[str, AicSource], engine: str) -> None:
    """SGLang and vLLM measure DeepSeek-V3's fp8 experts 2.5-2.7x slower at EP8 than TP8 (8K tokens);
    the same widths with 384 experts (Kimi-K2's MoE, one expert group) are not slower at EP8. The
    difference is the routing AIC's collector produced: DeepSeek-V3's grouped top-k over its tied
    logits sends 5 of each token's 8 pairs to EP8's rank 0, and the EP rows scale as that load does
    (EP2 as slow as EP1, 4-5x less work than EP1 only at EP128-256)."""
    from tools.aic_fit import collector_routing

    src = h200[engine]

    def ms(experts: int, tp: int, ep: int) -> float:
        p = src.moe(MoeShape(8192, tp=tp, ep=ep, dtype="fp8_block", **{**DSV3, "experts": experts}))
        assert p is not None
        return p.seconds

    assert ms(256, 1, 8) / ms(256, 8, 1) > 2.4
    assert ms(384, 1, 8) / ms(384, 8, 1) < 1.0
    for ep in (2, 8, 64, 256):
        rows = sum(n * r for n, r in collector_routing(engine, DSV3_KEY, 8192, ep))
        assert ms(256, 1, ep) / ms(256, 1, 1) == pytest.approx(rows / (8192 * 8), abs=0.12), ep


@pytest.mark.parametrize("dtype", ["fp8", "fp8_block", "bf16"])
def test_gemm_answers_are_the_measured_rows(h200: dict[str, AicSource], dtype: str) -> None:
    src = h200["sglang"]
    rows = _by_name(src.table("gemm"), {"bf16": "bfloat16"}.get(dtype, dtype))
    for m, n, k in ((4096, 2048, 7168), (8192, 7168, 2048), (16384, 4096, 4096)):
        measured = rows[m][n][k]["latency"]  # type: ignore[index]
        p = src.gemm(GemmShape(m, k, n, dtype))  # type: ignore[arg-type]
        assert p is not None and not p.extrapolated
        assert p.seconds * 1e3 == pytest.approx(measured, rel=0.02)


def test_gemm_far_outside_the_grid_gets_no_answer(h200: dict[str, AicSource]) -> None:
    src = h200["sglang"]
    ms = sorted(src.table("gemm")[next(iter(src.table("gemm")))])
    beyond = src.gemm(GemmShape(int(ms[-1] * 2), 4096, 4096, "bf16"))
    assert beyond is not None and beyond.extrapolated
    assert src.gemm(GemmShape(int(ms[-1] * FAR * 2), 4096, 4096, "bf16")) is None
    assert src.gemm(GemmShape(1024, 4096, 4096, "mxfp4")) is None  # no such GEMM table on H200


@pytest.mark.parametrize("engine", ENGINES)
def test_attention_kernel_matches_the_rows_at_1k_to_16k(h200: dict[str, AicSource], engine: str) -> None:
    """GQA 8 q / 1 kv heads, d128 (Llama-3-70B at TP8): the kernel alone, AIC's RoPE/KV-write extras
    removed, equals the measured row."""
    src = h200[engine]
    view = _by_name(_by_name(src.table("context_attention"), "bfloat16"), "bfloat16")
    rows = view[1][128][0][8]  # type: ignore[index]
    kernel = {}
    for tokens in (1024, 2048, 4096, 8192, 16384):
        p = src.attention(AttentionShape(tokens, 0, 8, 1, 128, 128))
        assert p is not None and not p.extrapolated
        assert p.seconds * 1e3 == pytest.approx(rows[tokens][1]["latency"], rel=0.01)
        kernel[tokens] = p.seconds
    extras = AicSource("h200_sxm", engine, attention_extras=True).attention(AttentionShape(1024, 0, 8, 1, 128, 128))
    assert extras is not None and extras.seconds - kernel[1024] == pytest.approx(13.2e-6, rel=0.05)  # RoPE + KV write


def test_mla_prefill_matches_the_rows_and_differs_by_engine(h200: dict[str, AicSource]) -> None:
    times = {}
    for engine in ("sglang", "trtllm"):
        src = h200[engine]
        rows = _by_name(_by_name(src.table("context_mla"), "bfloat16"), "bfloat16")[16]  # type: ignore[index]
        p = src.attention(AttentionShape(16384, 0, 16, 16, 192, 128, "mla"))
        assert p is not None and p.seconds * 1e3 == pytest.approx(rows[16384][1]["latency"], rel=0.01)
        times[engine] = p.seconds
    assert times["sglang"] / times["trtllm"] > 2.5  # the issue's "up to 3.3x (MLA prefill)"
    assert h200["sglang"].attention(AttentionShape(1024, 0, 16, 16, 128, 128, "mla")) is None  # not DeepSeek dims


def test_single_node_collectives_are_the_nccl_rows(h200: dict[str, AicSource]) -> None:
    src = AicSource("h200_sxm", "sglang", all_reduce="nccl")
    view = _by_name(src.table("nccl"), "half")
    for kind, op in (
        ("all_reduce", "all_reduce"),
        ("all_gather", "all_gather"),
        ("reduce_scatter", "reduce_scatter"),
        ("all_to_all", "alltoall"),
    ):
        for n in (2, 4, 8):
            for size in (MIB, 16 * MIB, 512 * MIB):
                p = src.collective(CollectiveShape(kind, size, n, n))  # type: ignore[arg-type]
                assert p is not None and not p.extrapolated
                assert p.seconds * 1e3 == pytest.approx(view[op][n][size // 2]["latency"], rel=0.01)  # type: ignore[index]
    assert src.collective(CollectiveShape("all_reduce", 64 * MIB, 16, 8)) is None  # multi-node: not in AIC
    assert src.collective(CollectiveShape("send_recv", 64 * MIB, 2, 2)) is None
    engine_ar = h200["sglang"].collective(CollectiveShape("all_reduce", MIB, 8, 8))
    assert engine_ar is not None and "custom-allreduce" in engine_ar.source


def test_the_rtx_pro_6000_server_has_nccl_rows() -> None:
    src = AicSource("rtx_pro_6000_server", "sglang", all_reduce="nccl")
    ar8 = src.collective(CollectiveShape("all_reduce", 64 * MIB, 8, 8))
    ar2 = src.collective(CollectiveShape("all_reduce", 64 * MIB, 2, 2))
    assert ar8 is not None and ar2 is not None and ar8.seconds > ar2.seconds
