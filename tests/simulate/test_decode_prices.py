"""A decode step priced by the cost model's own pricers, worked by hand at known shapes (issue 32).

A decode step of B requests is the segments (1, KV length) per request: its GEMMs run at M = B, MLA's
attention runs absorbed over the cached latent (both engines, `MLA_DECODE_ABSORBED`), GQA's over each
request's cached K and V; the step's time grows with the KV length exactly as its attention's does."""

from __future__ import annotations

import functools

import pytest

from tpplan.cost.predictor import Predictor, cached_predictor
from tpplan.cost.topology import load_topology
from tpplan.engines.scheduling import MLA_DECODE_ABSORBED
from tpplan.mesh import Mesh
from tpplan.models.config import load_model
from tpplan.models.graph import build_model_graph
from tpplan.plans.named import make_plan


@functools.cache
def predictor(model: str, tp: int = 2) -> Predictor:
    graph = build_model_graph(load_model(model))
    return cached_predictor(
        graph, make_plan("baseline", graph, tp), load_topology("h200x8-ib400"), Mesh(tp, pp=1), "bf16", None
    )


def ops(p: Predictor, segs: tuple[tuple[int, int], ...], kind: int = -1) -> dict[str, float]:
    res = p.audit.layer_results[kind]
    return {o.op: o.seconds for o in p.kind_time(res, segs).ops}


def test_mla_decode_attention_is_absorbed_mqa_over_the_latent() -> None:
    p = predictor("tiny-deepseek-v3")
    res = p.audit.layer_results[-1]
    lg = p.graph.kinds[res.kind]
    op = next(d.op for d in res.decisions if d.op.name == "attention")
    lora, rope, heads = lg.values["kv_latent"].width, lg.values["k_rope"].width, op.int_attr("heads") // 2
    batch, ctx = 64, 65536
    keys = batch * (ctx + 1)
    flops = 2.0 * heads * (lora + rope + lora) * keys
    nbytes = (keys * (lora + rope) + batch * heads * (2 * lora + rope)) * p.b
    gpu = p.topo.gpu
    by_hand = max(flops / (p.kernels.peak * gpu.attn_efficiency), nbytes / p.kernels.hbm)
    got = ops(p, ((1, ctx),) * batch)
    assert got["attention"] == pytest.approx(by_hand)
    assert by_hand > 10e-6 and nbytes / p.kernels.hbm > flops / (
        p.kernels.peak * gpu.attn_efficiency
    )  # memory-bound, past the floor
    expanded = (
        ctx * batch * (lg.values["kv"].width // 2 + rope // 2) * p.b / p.kernels.hbm
    )  # what a prefill pricer reads
    assert got["attention"] < expanded
    assert all(f.source.read and f.source.ref for f in MLA_DECODE_ABSORBED)


def test_decode_gemms_run_at_m_equal_the_batch() -> None:
    p = predictor("tiny-llama")
    res = p.audit.layer_results[0]
    batch = 24
    kt = p.kind_time(res, ((1, 300),) * batch)
    gemms = [o for o in kt.ops if o.category == "gemm"]
    assert gemms and all(o.shape is not None and o.shape[0] == batch for o in gemms)
    for o in gemms:
        assert o.shape is not None
        assert o.modelled_s == pytest.approx(p.kernels.shapes.formula_gemm(*o.shape, p.kernels.gemm_dtype))


def test_a_mixed_step_prices_mla_decode_and_prefill_tokens_apart() -> None:
    p = predictor("tiny-deepseek-v3")
    dec, pre = ((1, 4096),) * 16, ((512, 1000),)
    assert ops(p, dec + pre)["attention"] == pytest.approx(ops(p, dec)["attention"] + ops(p, pre)["attention"])


@pytest.mark.parametrize("model", ["tiny-deepseek-v3", "tiny-llama"])
def test_step_time_grows_with_kv_length_as_the_priced_attention_does(model: str) -> None:
    p = predictor(model)
    short, long = ((1, 16384),) * 64, ((1, 65536),) * 64
    step = sum(p.stage_times(long)[0]) - sum(p.stage_times(short)[0])
    attn = sum(
        p.counts[r.kind] * (p.kind_time(r, long).total_s - p.kind_time(r, short).total_s)
        for r in {id(r): r for r in p.audit.layer_results}.values()
    )
    assert step > 0 and step == pytest.approx(attn)
    grew = {k for k, v in ops(p, long).items() if v != ops(p, short)[k]}
    assert grew == {"attention"}  # nothing else of a layer reads the KV
