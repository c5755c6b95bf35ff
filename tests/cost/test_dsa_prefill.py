"""DSA's prefill attention priced in the form each engine runs it (issue 34; `cost.sparse_attention`,
`engines.sparse_mla`): the absorbed MQA 576/512 form over each query's selected keys, heads padded as the
engine's FlashMLA call pads them, W_UK / W_UV in place of kv_b_proj, dense per-head MHA for short steps."""

from __future__ import annotations

from functools import cache

import pytest

from tpplan.cost.prediction import OpTime
from tpplan.cost.predictor import Predictor
from tpplan.cost.sparse_attention import selected_keys
from tpplan.cost.topology import load_topology
from tpplan.engines import select
from tpplan.engines.sparse_mla import dense_prefill, heads_run
from tpplan.mesh import Mesh
from tpplan.models.config import load_model
from tpplan.models.graph import build_model_graph
from tpplan.plans.named import make_plan

SGL, VLLM = "sglang@0.5.23", "vllm@0.34.0"
TOPK = 2048  # DeepSeek-V3.2's index_topk
# DeepSeek-V3.2 at TP8: 128 heads -> 16 per rank; latent 512 + rope 64; per head q/k 192 (128 nope + 64 rope), v 128


@cache
def _predictor(engine: str | None, runtime: bool = False, model: str = "deepseek-v3.2", tp: int = 8) -> Predictor:
    graph = build_model_graph(load_model(model))
    mesh = Mesh(tp)
    impls = {"mla_dsa": "tpplan runtime"} if runtime else None
    return Predictor(graph, make_plan("baseline", graph, mesh.tp), load_topology("h200x8-ib400"), mesh, "bf16", None,
                     impls=impls, engine=engine)  # fmt: skip


def _op(
    engine: str | None, segs: tuple[tuple[int, int], ...], name: str, runtime: bool = False, **model: str | int
) -> OpTime:
    p = _predictor(engine, runtime, **model)
    ops = p.kind_time(p.audit.layer_results[-1], segs).ops
    return next(o for o in ops if o.op == name)


def test_selected_keys_by_hand() -> None:
    # 8192 new tokens: queries 0..2047 select 1..2048 keys, the other 6144 select 2048 each
    assert selected_keys(((8192, 0),), TOPK) == 2048 * 2049 // 2 + 6144 * 2048 == 14_681_088
    # 1024 new tokens after 2048 cached: every query selects 2048
    assert selected_keys(((1024, 2048),), TOPK) == 1024 * 2048
    assert selected_keys(((100, 0),), TOPK) == 100 * 101 // 2


@pytest.mark.parametrize("engine", [SGL, VLLM, None])
def test_8k_prompt_tp8_absorbed_flops(engine: str | None) -> None:
    """One DeepSeek-V3.2 layer at TP8, one 8K prompt: 2 x heads x (576 + 512) per selected (query, key) pair, the
    16 heads per rank computed as 64 (SGLang pads FlashMLA's q; vLLM's FA3 tile holds a query's heads in 64 rows);
    compute-bound, so 4x the unpadded work's time."""
    pairs = 14_681_088
    att = _op(engine, ((8192, 0),), "attention")
    assert att.flops_per_rank == pytest.approx(2 * 64 * (576 + 512) * pairs)
    assert att.source == "roofline"  # no GPU model carries a fitted dsa_attention set yet
    # the per-head form over every causal pair, which the planner priced before (and still prices where it runs)
    assert att.flops_per_rank != pytest.approx(2 * 16 * (192 + 128) * 8192 * 8193 / 2)


def test_kv_b_proj_runs_as_w_uk_and_w_uv() -> None:
    """In an absorbed step kv_b_proj does not run: the per-head W_UK and W_UV bmms do, with the same FLOPs."""
    op = _op(VLLM, ((8192, 0),), "kv_b_proj")
    m, k, n = op.shape or (0, 0, 0)
    assert (m, k, n) == (8192, 512, 16 * 256)
    assert op.flops_per_rank == pytest.approx(2.0 * m * k * n)
    assert op.note is not None and "W_UK" in op.note
    assert _op(VLLM, ((1024, 0),), "kv_b_proj").note is None  # a dense step runs kv_b_proj itself


@pytest.mark.parametrize("engine", [SGL, VLLM, None])
def test_short_prompt_runs_dense_mha(engine: str | None) -> None:
    """At most top-k (vLLM) / 2048 (SGLang) tokens in the step's longest sequence: dense per-head MHA over
    every causal pair, as before."""
    op = _op(engine, ((1024, 0),), "attention")
    assert op.flops_per_rank == pytest.approx(2 * 16 * (192 + 128) * 1024 * 1025 / 2)


def test_a_cached_prefix_makes_a_short_chunk_sparse() -> None:
    """1024 new tokens after 2048 cached: the sequence is 3072 long, so both engines run the sparse form."""
    op = _op(VLLM, ((1024, 2048),), "attention")
    assert op.flops_per_rank == pytest.approx(2 * 64 * (576 + 512) * 1024 * 2048)


def test_head_padding_rules() -> None:
    sgl, vllm = select(SGL).sparse_prefill, select(VLLM).sparse_prefill
    assert sgl is not None and vllm is not None
    for rule in (sgl, vllm):
        assert [heads_run(rule, h) for h in (4, 16, 64, 96, 128)] == [64, 64, 64, 128, 128]
    assert (
        dense_prefill(vllm, 2048, TOPK) and not dense_prefill(vllm, 2049, TOPK) and dense_prefill(vllm, 2049, 4096)
    )  # vLLM: its top-k
    assert dense_prefill(sgl, 2048, TOPK) and not dense_prefill(sgl, 2049, 4096)  # SGLang: a fixed 2048


def test_runtime_keeps_the_per_head_form() -> None:
    """A recorded run of tpplan's runtime (whose sparse attention is per head) is priced as before."""
    op = _op(None, ((8192, 0),), "attention", runtime=True)
    assert op.flops_per_rank == pytest.approx(2 * 16 * (192 + 128) * 8192 * 8193 / 2)
    assert _op(None, ((8192, 0),), "kv_b_proj", runtime=True).note is None


def test_glm_5_1_at_tp16() -> None:
    """GLM-5.1 (64 heads, q/k nope 192 + rope 64, v 256) at TP16: 4 heads per rank, padded to 64 by both engines;
    W_UK is 192 -> 512 and W_UV 512 -> 256 per head."""
    for engine in (SGL, VLLM):
        att = _op(engine, ((8192, 0),), "attention", model="glm-5.1", tp=16)
        assert att.flops_per_rank == pytest.approx(2 * 64 * (576 + 512) * 14_681_088)
    kv_b = _op(VLLM, ((8192, 0),), "kv_b_proj", model="glm-5.1", tp=16)
    assert kv_b.note is not None and "(8192x192x512)" in kv_b.note and "(8192x512x256)" in kv_b.note
    assert kv_b.flops_per_rank == pytest.approx(2.0 * 8192 * 512 * 4 * (192 + 256))
