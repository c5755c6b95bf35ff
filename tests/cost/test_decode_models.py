"""Decode attention priced by the measured decode models where the GPU has them (issue 32): a GQA or MLA
decode step's attention is the fitted form over the cache it reads, worked by hand; the fit recovers its
constants and holds out part of every batch and KV bucket."""

from __future__ import annotations

import functools

import pytest

from tpplan.bench import decode_fit as DF
from tpplan.cost.compute import DECODE_MODEL, ROOFLINE
from tpplan.cost.kernel_models import decode_s
from tpplan.cost.predictor import Predictor, cached_predictor
from tpplan.cost.topology import load_topology
from tpplan.mesh import Mesh
from tpplan.models.config import load_model
from tpplan.models.graph import build_model_graph
from tpplan.plans.named import make_plan


@functools.cache
def predictor(model: str, topology: str = "h100x8-ib400", tp: int = 2) -> Predictor:
    graph = build_model_graph(load_model(model))
    return cached_predictor(graph, make_plan("baseline", graph, tp), load_topology(topology), Mesh(tp, pp=1), "bf16",
                            None)  # fmt: skip


def attention(p: Predictor, segs: tuple[tuple[int, int], ...], kind: int = -1):
    res = p.audit.layer_results[kind]
    return next(o for o in p.kind_time(res, segs).ops if o.op == "attention")


def test_gqa_decode_attention_is_the_decode_model_over_the_kv_read() -> None:
    p = predictor("tiny-llama")
    res = p.audit.layer_results[0]
    op = next(d.op for d in res.decisions if d.op.name == "attention")
    heads, kv = op.int_attr("heads") // 2, max(1, op.int_attr("kv_heads") // 2)
    d = p.graph.kinds[res.kind].values[op.inputs[0]].width // op.int_attr("heads")
    c = p.topo.gpu.kernel_models["decode_gqa"]
    batch = 32
    times = []
    for ctx in (1024, 8192, 65536):
        keys = batch * (ctx + 1)
        got = attention(p, ((1, ctx),) * batch, 0)
        assert got.seconds == pytest.approx(decode_s(c, keys * kv * 2 * d * p.b, 2.0 * heads * 2 * d * keys))
        assert got.source == DECODE_MODEL
        times.append(got.seconds)
    assert times[2] - times[1] == pytest.approx((times[1] - times[0]) * (65536 - 8192) / (8192 - 1024), rel=1e-6)


def test_mla_decode_attention_is_the_decode_model_over_the_latent() -> None:
    p = predictor("tiny-deepseek-v3")
    res = p.audit.layer_results[-1]
    lg = p.graph.kinds[res.kind]
    op = next(d.op for d in res.decisions if d.op.name == "attention")
    lora, rope, heads = lg.values["kv_latent"].width, lg.values["k_rope"].width, op.int_attr("heads") // 2
    batch, ctx = 16, 4096
    keys = batch * (ctx + 1)
    c = p.topo.gpu.kernel_models["decode_mla"]
    want = decode_s(c, keys * (lora + rope) * p.b, 2.0 * heads * (lora + rope + lora) * keys)
    assert attention(p, ((1, ctx),) * batch).seconds == pytest.approx(want)


def test_a_gpu_without_decode_models_keeps_the_roofline() -> None:
    """The H200 presets have no decode sets (no H200 decode sweep yet): MLA's decode stays on the roofline."""
    p = predictor("tiny-deepseek-v3", "h200x8-ib400")
    assert "decode_mla" not in (p.topo.gpu.kernel_models or {})
    assert attention(p, ((1, 4096),) * 8).source == ROOFLINE


def _sweep(consts: dict[str, float]) -> list[dict]:
    pts = []
    for h, kv, d in ((64, 8, 128), (8, 1, 128), (16, 2, 256)):
        for b in DF.BATCHES:
            for n in DF.KV_LENS:
                p = {"family": "decode_gqa", "heads": h, "kv_heads": kv, "d": d, "batch": b, "kv": n}
                p["seconds"] = decode_s(consts, *DF.features(p))
                pts.append(p)
    return pts


def test_the_fit_recovers_its_constants_and_holds_out_every_bucket() -> None:
    consts = {"a_s": 3e-5, "TBps": 2.7, "tflops": 0.0}
    res = DF.fit_decode(_sweep(consts))
    got = res["constants"]["decode_gqa"]
    assert got["a_s"] == pytest.approx(3e-5, rel=1e-3) and got["TBps"] == pytest.approx(2.7, rel=1e-3)
    table = DF.error_table(res["points"])
    assert {(r["row"], r["col"]) for r in table} == {
        (f"B {DF.batch_bucket(b)}", DF.kv_bucket(n)) for b in DF.BATCHES for n in DF.KV_LENS
    }
    assert max(r["worst"] for r in table) < 1e-3
    other = DF.judge(res["constants"], _sweep({"a_s": 3e-5, "TBps": 2.0}))  # a slower card: errors show
    assert min(abs(p["error"]) for p in other if p["kv"] == 131072 and p["batch"] == 512) > 0.2


def test_decode_gemms_are_the_small_gemm_model_and_prefill_keeps_its_table() -> None:
    p = predictor("tiny-llama")
    res = p.audit.layer_results[0]
    c = p.topo.gpu.kernel_models["gemm_small"]
    for batch, small in ((24, True), (2048, False)):
        kt = p.kind_time(res, ((1, 300),) * batch if batch <= 512 else ((batch, 0),))
        gemms = [o for o in kt.ops if o.category == "gemm" and o.shape]
        assert gemms
        for o in gemms:
            m, k, n = o.shape
            by_hand = decode_s(c, 2.0 * (m * k + k * n + m * n), 2.0 * m * k * n)
            assert (o.source == DECODE_MODEL) is small
            assert (o.seconds == pytest.approx(by_hand)) is small


def test_dsa_decode_reads_only_the_top_k_keys_the_indexer_kept() -> None:
    """GLM-5 / DeepSeek-V3.2: each decode token attends to its top-k keys, so past top-k keys of context the
    attention's price stops growing (the indexer, priced apart, still scores every key)."""
    p = predictor("tiny-deepseek-v32")
    res = p.audit.layer_results[-1]
    op = next(d.op for d in res.decisions if d.op.name == "attention")
    topk = p.graph.kinds[res.kind].values[op.inputs[3]].width
    short, at, past = (attention(p, ((1, c),) * 4).seconds for c in (topk // 2, topk, 4 * topk))
    assert short < at == pytest.approx(past)
    far, near = attention(p, ((1, 4 * topk),) * 4), attention(p, ((1, topk - 1),) * 4)
    assert far.flops_per_rank == pytest.approx(near.flops_per_rank)
