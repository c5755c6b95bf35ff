"""SGLang's DeepEP low-latency all-to-all at decode (issue 32): which batches run it (`--deepep-mode auto`
resolves per batch), what it puts on the wire (one message per token and expert: FP8 + scales to dispatch,
bf16 to combine), and that a decode step's EP dispatch and combine are priced at those bytes."""

from __future__ import annotations

import math

import pytest

from tpplan.cost.collective_pricer import price_collective
from tpplan.cost.ep_low_latency import LL_SUFFIX, low_latency_steps, runs_low_latency
from tpplan.cost.pipeline import pipeline_model
from tpplan.cost.predictor import cached_predictor
from tpplan.cost.topology import select_topology
from tpplan.engines.deepep import (
    MAX_TOKENS,
    combine_message_bytes,
    dispatch_message_bytes,
    mode_at,
)
from tpplan.mesh import Mesh
from tpplan.models.config import load_model
from tpplan.models.graph import build_model_graph
from tpplan.models.opkinds import op_kind
from tpplan.plans.named import make_plan

TP = 2


def test_auto_runs_low_latency_only_for_batches_without_an_extend_request() -> None:
    assert mode_at("auto", extend=False) == "low_latency"
    assert mode_at("auto", extend=True) == "normal"
    assert mode_at("normal", extend=False) == "normal"
    assert mode_at("low_latency", extend=True) == "low_latency"
    decode, mixed = ((1, 900), (1, 40)), ((1, 900), (512, 0))
    assert runs_low_latency("sglang@0.5.23", decode)
    assert not runs_low_latency("sglang@0.5.23", mixed)  # a prefill chunk in the batch: normal kernels
    assert not runs_low_latency("vllm@0.34.0", decode)  # vLLM's recipe runs deepep_high_throughput


def test_messages_carry_fp8_rows_with_scales_out_and_bf16_rows_back() -> None:
    assert dispatch_message_bytes(7168) == 16 + 7168 + 4 * 56  # header, FP8 row, one fp32 scale per 128
    assert combine_message_bytes(7168) == 2 * 7168


@pytest.fixture(scope="module")
def pred():  # type: ignore[no-untyped-def]
    graph = build_model_graph(load_model("tiny-mixtral"))
    topo = select_topology("h100x8-ib400", 1, gpu="h100-datasheet")
    return cached_predictor(graph, make_plan("sp-moe", graph, TP), topo, Mesh(TP), "bf16", None)


def _a2a(kt):  # type: ignore[no-untyped-def]
    return {c.label.split(":")[1].split("[")[0]: c for c in kt.collectives if c.kind == "all_to_all"}


def test_a_decode_steps_dispatch_and_combine_are_priced_at_the_low_latency_bytes(pred) -> None:  # type: ignore[no-untyped-def]
    """8 decode requests over TP2: each rank sends its 4 tokens x top-2 messages; priced as an all-to-all of
    that send buffer on the EP group by the topology's collective pricing."""
    res = next(r for r in pred.audit.layer_results if any(op_kind(d.op.kind).routed_experts for d in r.decisions))
    segs = ((1, 300),) * 8
    kt = pred.kind_time(res, segs)
    got = _a2a(kt)
    hidden, k = pred.graph.hidden, 2
    for name, per in (("dispatch", dispatch_message_bytes(hidden)), ("combine", combine_message_bytes(hidden))):
        c = got[name]
        assert c.label.endswith(LL_SUFFIX)
        assert c.nbytes == math.ceil(8 / TP) * k * per
        assert c.seconds == pytest.approx(price_collective("all_to_all", c.nbytes, TP, pred.topo).time_s)
    prefill = _a2a(pred.kind_time(res, ((64, 0),)))  # a prefill batch: the lowered (normal-mode) volume
    assert not any(c.label.endswith(LL_SUFFIX) for c in prefill.values())


def test_other_engines_and_oversized_batches_keep_the_lowered_all_to_all(pred) -> None:  # type: ignore[no-untyped-def]
    res = next(r for r in pred.audit.layer_results if any(op_kind(d.op.kind).routed_experts for d in r.decisions))
    layer, _ = pred.lowered(res, ((1, 300),) * 8)
    steps = [c for c in layer.collectives() if c.priced]
    lg = pred.graph.kinds[res.kind]
    assert low_latency_steps(steps, lg, 8, "vllm@0.34.0", ((1, 300),) * 8) == steps
    big = TP * (MAX_TOKENS + 1)  # each rank over SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK
    assert low_latency_steps(steps, lg, big, "sglang@0.5.23", ((1, 300),) * big) == steps
    vllm = cached_predictor(pred.graph, pred.plan, pred.topo, Mesh(TP), "bf16", None,
                            pipeline=pipeline_model("vllm@0.34.0"))  # fmt: skip
    assert not any(c.label.endswith(LL_SUFFIX) for c in _a2a(vllm.kind_time(res, ((1, 300),) * 8)).values())
