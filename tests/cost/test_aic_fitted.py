"""The AIC kernel sources without the package: the module imports without it and says how to get it,
and the fitted models (shipped as JSON) price MoE and attention on their own."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tools.aic_fit import DEEPSEEK_V3, collector_loads, collector_routing
from tpplan.cost.kernel_source import AttentionShape, GemmShape, KernelSource, MoeShape
from tpplan.cost.sources.aic_fitted import (
    AicFittedSource,
    attention_features,
    balanced_loads,
    load_fits,
    moe_features,
    moe_mode,
    routing_groups,
)
from tpplan.errors import TpplanError

DSV3 = {"hidden": 7168, "intermediate": 2048, "experts": 256, "top_k": 8}


def test_the_aic_source_imports_without_the_package_and_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['aiconfigurator_core'] = None\n"
        "from tpplan.cost.sources import aic\n"
        "assert not aic.aic_available()\n"
        "try:\n"
        "    aic.AicSource('h200_sxm', 'sglang')\n"
        "except aic.TpplanError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert 'pip install "tpplan[aic]"' in out and out.count("\n") == 1


def test_importing_the_sources_does_not_import_aiconfigurator() -> None:
    code = (
        "import sys\n"
        "import tpplan.cost.sources.aic, tpplan.cost.sources.aic_fitted\n"
        "print(sorted(m for m in sys.modules if m.startswith(('aiconfigurator', 'torch'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_moe_features_count_only_the_experts_that_get_tokens() -> None:
    one = dict(zip(("call", "active", "weights", "flops"), moe_features(_shape(1, tp=1, ep=8)), strict=False))
    assert one["active"] == 1.0 and one["weights"] == 3 * 7168 * 2048  # 8 routed pairs over 8 ranks
    many = moe_features(_shape(8192, tp=8, ep=1))
    assert many[1] == 256 and many[3] == pytest.approx(6 * 8192 * 8 * 7168 * 256)
    modes = [moe_mode(_shape(1, tp=tp, ep=ep)) for tp, ep in ((8, 1), (1, 8), (2, 4))]
    assert modes == ["tp", "ep", "tp_ep"]


def test_balanced_loads_are_what_aics_plain_routing_gives() -> None:
    """AIC's balanced logits under plain top-k (TRT-LLM's collector) spread DeepSeek-V3's pairs evenly:
    the replayed loads and the closed form agree, so a fit on the rows prices balanced shapes."""
    for tokens, ep in ((8192, 8), (8192, 1), (64, 8), (4096, 32)):
        replayed = collector_loads(tokens, 256, 8, ep, None)
        assert replayed == balanced_loads(_shape(tokens, tp=1, ep=ep)), (tokens, ep)
        x = moe_features(_shape(tokens, tp=1, ep=ep))
        assert moe_features(_shape(tokens, tp=1, ep=ep), loads=replayed) == pytest.approx(x)


def test_grouped_topk_sends_five_of_eight_deepseek_pairs_to_rank0_at_ep8() -> None:
    """SGLang's and vLLM's collectors route AIC's logits through DeepSeek-V3's grouped top-k; every
    group ties, experts 0-3 take 4 of each token's 8 picks, and rank 0 of EP8 gets 5 pairs per token
    (40,960 rows at 8K tokens) where balanced routing gives it 1 (8,192)."""
    groups = routing_groups()
    assert groups[DEEPSEEK_V3] == (8, 4) and len(groups) == 1
    grouped = collector_routing("vllm", DEEPSEEK_V3, 8192, 8, groups)
    assert sum(n * r for n, r in grouped) == 5 * 8192 and max(r for _, r in grouped) == 8192
    plain = collector_routing("trtllm", DEEPSEEK_V3, 8192, 8, groups)
    assert plain == ((32, 256.0),)
    kimi_k2 = (7168, 2048, 384, 8)  # one expert group: AIC's logits stay balanced on every engine
    assert collector_routing("sglang", kimi_k2, 8192, 8, groups) == collector_routing(
        "trtllm", kimi_k2, 8192, 8, groups
    )


def _shape(tokens: int, *, tp: int, ep: int) -> MoeShape:
    """The AIC query of DeepSeek-V3's routed experts at `tokens` tokens, split TP `tp` x EP `ep`."""
    return MoeShape(tokens, 7168, 2048, 256, 8, tp, ep)


def test_attention_features_count_causal_and_windowed_pairs() -> None:
    causal = attention_features(AttentionShape(4, 0, 1, 1, 1, 1))
    assert causal[1] == 2.0 * (1 + 2 + 3 + 4) * 2  # q.k and p.v over 10 pairs, d = 1 + 1
    windowed = attention_features(AttentionShape(4, 0, 1, 1, 1, 1, window=2))
    assert windowed[1] == 2.0 * (1 + 2 + 2 + 2) * 2
    prefixed = attention_features(AttentionShape(2, 3, 1, 1, 1, 1))
    assert prefixed[1] == 2.0 * (4 + 5) * 2


def test_the_fit_file_says_what_it_is_and_holds_h200() -> None:
    fits = load_fits()
    assert fits["aic_version"] == "0.12.0" and fits["moe_distribution"] == "balanced"
    assert fits["moe_routing"]["grouped_topk_engines"] == ["sglang", "vllm"]
    assert any(k.startswith("h200_sxm/sglang@") for k in fits["fits"])
    for entry in fits["fits"].values():
        for cls in (*entry["moe"].values(), *entry["attention"].values()):
            assert cls["rows"] >= 20 and cls["in_sample"]["median"] is not None
            assert all(c >= 0 for c in cls["coef"])
        assert all(cls["kernel"] for cls in entry["moe"].values())


# AIC 0.12.0's rows, h200_sxm, DeepSeek-V3 fp8_block at 8192 tokens (ms): TP8, EP8 (test_aic.py checks them).
DSV3_ROWS_8K = {"sglang": (1.8813, 5.1409), "vllm": (2.3712, 5.9593), "trtllm": (4.9800, 1.2844)}


def _fitted_ms(engine: str, tp: int, ep: int, loads: object) -> float:
    src = AicFittedSource("h200_sxm", engine)
    shape = MoeShape(8192, *DEEPSEEK_V3, tp, ep)
    fitted = src.moe_classes[f"fp8_block/{moe_mode(shape)}"]
    return fitted.seconds(moe_features(shape, loads=loads)) * 1e3  # type: ignore[arg-type]


@pytest.mark.parametrize("engine", ["sglang", "vllm", "trtllm"])
def test_fitted_experts_rank_tp_and_ep_as_each_engine_measured(engine: str) -> None:
    """DeepSeek-V3 fp8 experts at 8K tokens on H200, fed the routing AIC's collector gave each row
    (in-sample: these rows are in the fit): the fit reproduces each engine's TP8 and EP8 rows within
    15% and so ranks them as measured (SGLang/vLLM TP8 faster, TRT-LLM EP8 faster)."""
    groups = routing_groups()
    tp = _fitted_ms(engine, 8, 1, collector_routing(engine, DEEPSEEK_V3, 8192, 1, groups))
    ep = _fitted_ms(engine, 1, 8, collector_routing(engine, DEEPSEEK_V3, 8192, 8, groups))
    row_tp, row_ep = DSV3_ROWS_8K[engine]
    assert tp == pytest.approx(row_tp, rel=0.15) and ep == pytest.approx(row_ep, rel=0.15)
    assert (tp < ep) == (row_tp < row_ep)


@pytest.mark.parametrize(("engine", "low", "high"), [("sglang", 0.9, 1.1), ("vllm", 0.4, 0.7), ("trtllm", 0.2, 0.35)])
def test_priced_shapes_assume_balanced_routing_where_ep8_reads_an_eighth_of_the_experts(
    engine: str, low: float, high: float
) -> None:
    """What the fitted source prices (balanced routing, `balanced_loads`) for DeepSeek-V3 at 8K tokens:
    EP8 over TP8 about even on SGLang's Triton MoE (1.01 in this fit), EP8 faster on vLLM (0.55) and
    TRT-LLM (0.26) -- not the 2.5-2.7x slowdown of SGLang's and vLLM's rows, which is AIC's routing."""
    src = AicFittedSource("h200_sxm", engine)
    assert isinstance(src, KernelSource)
    tp = src.moe(MoeShape(8192, tp=8, ep=1, dtype="fp8_block", **DSV3))
    ep = src.moe(MoeShape(8192, tp=1, ep=8, dtype="fp8_block", **DSV3))
    assert tp is not None and ep is not None and tp.extrapolated and ep.extrapolated
    assert low < ep.seconds / tp.seconds < high
    assert tp.source.startswith(f"aic-fit:h200_sxm/{engine}@")
    assert tp.seconds * 1e3 == pytest.approx(_fitted_ms(engine, 8, 1, None))


def test_the_shipped_fits_price_without_aiconfigurator() -> None:
    code = (
        "import sys; sys.modules['aiconfigurator_core'] = None\n"
        "from tpplan.cost.kernel_source import MoeShape\n"
        "from tpplan.cost.sources.aic_fitted import AicFittedSource\n"
        "p = AicFittedSource('h200_sxm', 'vllm').moe(MoeShape(8192, 3584, 3072, 896, 16, 8, 1, 'fp8_block'))\n"
        "print(p.source, p.seconds > 0, p.extrapolated)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.startswith("aic-fit:h200_sxm/vllm@") and out.strip().endswith("True True")


def test_the_fitted_source_prices_latent_widths_and_refuses_what_it_cannot() -> None:
    src = AicFittedSource("h200", "sglang")
    latent = src.moe(MoeShape(8192, 3072, 1536, 384, 8, tp=8, ep=1, dtype="bf16"))
    assert latent is not None and latent.seconds > 0
    assert src.moe(MoeShape(10**9, tp=8, ep=1, dtype="bf16", **DSV3)) is None  # far beyond the rows
    assert src.gemm(GemmShape(1024, 1024, 1024)) is None
    attn = src.attention(AttentionShape(8192, 0, 10, 2, 128, 128))
    assert attn is not None and attn.extrapolated
    with pytest.raises(TpplanError, match=r"aic-fitted\.json holds no fit"):
        AicFittedSource("h200_sxm", "nosuchengine")
