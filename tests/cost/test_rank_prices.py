"""Issue 34's price changes: the routing a serving engine's fused MoE pays shrinks with the rows a rank
computes, a GPU model can inherit a measured die's kernel models scaled to it, and attention at few heads
per rank is bounded by the last query block's chain."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpplan.cost import kernel_models as M
from tpplan.cost.topology import load_gpu
from tpplan.errors import TpplanError
from tpplan.mesh import Mesh


def test_fused_routing_is_the_combine_of_the_rank_rows() -> None:
    km = M.KernelModels({"experts": {"combine_TBps": 1.5, "route_TBps": 1.0}}, charge_host=False)
    whole = km.routing(131072, 8192, 3584, 4.8e12, fused=True)
    assert whole == pytest.approx((131072 * 2 + 8192 * 2) * 3584 / 1.5e12)
    assert km.routing(131072 // 32, 8192 // 32, 3584, 4.8e12, fused=True) == pytest.approx(whole / 32)
    assert km.routing(131072, 8192, 3584, 4.8e12) > 4 * whole  # tpplan's own runtime: gather and un-permute too


def test_k3_tp32_experts_op_is_priced_as_the_fused_moe() -> None:
    """The 4.3 ms routing term of K3's TP32 experts op (issue 34) is gone: the op is now under 2.5 ms."""
    from tpplan.cost.predict import predict_plan
    from tpplan.cost.topology import load_topology
    from tpplan.layout.plan import baseline
    from tpplan.models.config import load_model
    from tpplan.models.graph import build_model_graph

    g = build_model_graph(load_model("kimi-k3"))
    topo = load_topology("h200x8-ib400", 4)
    times = {}
    for tp in (8, 32):
        pred = predict_plan(g, baseline(), topo, mesh=Mesh(tp), tokens=8192)
        times[tp] = next(o.seconds for k in pred.kinds if k.kind == "kda+moe" for o in k.ops if o.op == "experts")
    assert times[32] < 2.5e-3 and times[32] < times[8]


def test_gpu_model_inherits_a_measured_die_scaled(tmp_path: Path) -> None:
    f = tmp_path / "h100-like.toml"
    f.write_text('name = "H100 variant"\nbf16_tflops = 989.0\nfp8_tflops = 1979.0\nhbm_TBps = 2.4\n'
                 'memory_GiB = 79.6\nkernel_models_from = "h200-measured"\n')  # fmt: skip
    src, got = load_gpu("h200-measured"), load_gpu(str(f))
    assert got.kernel_models["norm"]["TBps"] == pytest.approx(src.kernel_models["norm"]["TBps"] * 2.4 / 4.8)
    assert got.kernel_models["kda"]["b_s"] == pytest.approx(src.kernel_models["kda"]["b_s"] * 4.8 / 2.4)
    assert got.kernel_models["kda"]["c0_s"] == src.kernel_models["kda"]["c0_s"]  # fixed costs stay
    assert "scaled" in got.provenance["moe"]
    f.write_text(f.read_text().replace("h200-measured", "h100-datasheet"))
    with pytest.raises(TpplanError, match="no kernel models"):
        load_gpu(str(f))


def test_attention_chain_bounds_few_heads() -> None:
    c = {"a_s": 0.0, "b_s": 0.0, "tflops": 650.0, "sm_tflops": 6.6, "p": 1.6}
    flat = {k: v for k, v in c.items() if k not in ("sm_tflops", "p")}
    one = M.attention_flops(1, 8192, 0, 192, 192)
    assert M.attention_s(c, 1, 8192, 192, 192, one) > 3 * M.attention_s(flat, 1, 8192, 192, 192, one)
    many = M.attention_flops(128, 8192, 0, 192, 192)
    assert M.attention_s(c, 128, 8192, 192, 192, many) == pytest.approx(
        M.attention_s(flat, 128, 8192, 192, 192, many), rel=0.05)  # fmt: skip


def test_a_window_bounds_the_few_heads_chain_by_its_keys() -> None:
    """Under a sliding window a query block passes over the window's keys, not every key: at 2 heads of 64
    and 32K tokens the window's price is its pairs' work, not a full causal pass (06d sweep: 0.03 ms
    measured, 0.18 ms priced before); a window as long as the keys changes nothing."""
    from tpplan.lower.batch import masked_pairs

    c = {"a_s": 0.0, "b_s": 0.0, "tflops": 650.0, "sm_tflops": 6.6, "p": 1.6}
    flat = {k: v for k, v in c.items() if k not in ("sm_tflops", "p")}
    pairs, _ = masked_pairs(((32768, 0),), 128)
    f = 2.0 * 2 * pairs * (64 + 64)
    causal_chain = M.attention_s(c, 2, 32768, 64, 64, f)
    windowed = M.attention_s(c, 2, 32768, 64, 64, f, window=128)
    assert windowed < causal_chain / 5 and windowed == pytest.approx(M.attention_s(flat, 2, 32768, 64, 64, f), rel=0.1)
    assert M.attention_s(c, 2, 4096, 64, 64, f, window=8192) == M.attention_s(c, 2, 4096, 64, 64, f)


def test_h100_clusters_hold_the_measured_h100() -> None:
    from tpplan.cost.topology import load_cluster

    assert load_cluster("h100x8-ib400").gpu == "h100-measured"
    assert load_gpu("h100-measured").kernel_models["kda"]["min_heads"] == 1.0
