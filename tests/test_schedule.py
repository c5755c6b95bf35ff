"""The predicted collectives of a batch (torch-free): shapes, padding, fallback, MoE all-to-all rows,
and agreement with the audit's per-token volume."""

from __future__ import annotations

import pytest

from tpplan.audit import audit_plan
from tpplan.layout.schedule import chunk_sizes, padded_rows
from tpplan.lower.schedule import predict_schedule
from tpplan.models.config import list_presets, load_model
from tpplan.models.graph import build_model_graph
from tpplan.plans.named import EXTRA_PLANS, NAMED_PLANS, make_plan

TINY = [p for p in list_presets() if p.startswith("tiny-")]


@pytest.mark.parametrize("model", [*TINY, "kimi-k3"])
def test_ring_volume_follows_from_the_calls_and_equals_the_audit(model: str) -> None:
    graph = build_model_graph(load_model(model))
    for n in (2, 4, 8, 32) if model == "kimi-k3" else (2, 4):
        ep = ("ep2", "sequence-parallel+ep2") if graph.has_routed_experts else ()  # refused on a dense model
        for name in (*NAMED_PLANS, *EXTRA_PLANS, *ep):
            plan = make_plan(name, graph, n)
            if plan.moe == "a2a":
                continue  # data-dependent (routing); checked against the reference's routing at run time
            pa = audit_plan(graph, plan, n, "bf16")
            if not pa.legal:
                continue
            tokens = 3 * n
            calls = [c for s in predict_schedule(graph, plan, n, tokens, dtype="bf16") for c in s.calls]
            sent = sum(c.sent_bytes for c in calls)
            assert sent == pytest.approx(pa.comm_bytes_per_token * tokens, rel=1e-12), (model, name, n)
            assert len(calls) == sum(len(r.comms) for r in pa.layer_results) + (pa.final_elements_per_token > 0)


def test_padding_shapes_and_fallback() -> None:
    graph = build_model_graph(load_model("tiny-deepseek-v3"))
    plan = make_plan("input-scattered", graph, 4)
    assert padded_rows(5, 4) == (8, 2) and chunk_sizes(11, 5) == [5, 5, 1]
    first, last = predict_schedule(graph, plan, 4, 6, chunk=5, dtype="fp32")
    rs = next(c for c in first.calls if c.kind == "reduce_scatter")
    assert rs.shape == (8, graph.hidden) and rs.bytes == 8 * graph.hidden * 4 and rs.sent_bytes == 0.75 * rs.bytes
    ag = next(c for c in first.calls if c.value == "qkv_latent")
    assert ag.kind == "all_gather" and ag.shape == (8, 24 + 16 + 8)
    assert not first.fallback and last.fallback and last.plan == "baseline"
    assert {c.kind for c in last.calls} == {"all_reduce"} and all(c.shape[0] == 1 for c in last.calls)
    base = predict_schedule(graph, make_plan("baseline", graph, 4), 4, 1)
    assert not base[0].fallback
    assert predict_schedule(graph, plan, 1, 7)[0].calls == []  # one rank: nothing moves
    ep = predict_schedule(graph, make_plan("gate-aware+ep2", graph, 4), 4, 6, chunk=5)
    assert ep[1].fallback and ep[1].plan == "ep2"  # the experts stay where they are
    a2a = predict_schedule(graph, make_plan("sp-moe", graph, 4), 4, 6, chunk=5)
    assert not a2a[1].fallback and a2a[1].calls[0].shape == (4, graph.hidden)  # padded: 1 real token


def test_moe_all_to_all_rows_from_routing() -> None:
    graph = build_model_graph(load_model("tiny-qwen3-moe"))  # 8 experts, top-2
    plan = make_plan("sp-moe", graph, 2)
    tokens = 4  # rank 0: tokens 0-1, rank 1: tokens 2-3; experts 0-3 on rank 0, 4-7 on rank 1
    routes = {(0, layer): [[0, 1], [0, 5], [6, 7], [2, 7]] for layer in range(graph.spec.num_layers)}
    (s,) = predict_schedule(graph, plan, 2, tokens, rank=0, routes=routes)
    layer0 = [c for c in s.calls if c.layer == 0 and ":" in c.value]
    counts, dispatch, combine = layer0  # the routing weights ride inside the dispatch
    assert counts.shape == (2,) and counts.dtype == "int64" and counts.sent_bytes == 8
    # token 0 -> rank 0; token 1 -> ranks 0 and 1; each row W activations + 4 fp32 weights (fp32: 4 columns)
    assert dispatch.shape == (3, graph.hidden + 4) and dispatch.dtype == "float32"
    assert dispatch.bytes == 3 * (graph.hidden + 4) * 4 and dispatch.sent_bytes == 1 * (graph.hidden + 4) * 4
    assert combine.shape == (3, graph.hidden)  # own tokens 0, 1 and rank 1's token 3 (expert 2)
    assert combine.sent_bytes == 1 * graph.hidden * 4
    (b,) = predict_schedule(graph, plan, 2, tokens, rank=0, routes=routes, dtype="bf16")
    _, dispatch16, combine16 = [c for c in b.calls if c.layer == 0 and ":" in c.value]
    assert dispatch16.shape == (3, graph.hidden + 8) and dispatch16.dtype == "bfloat16"  # 2 columns per weight
    assert dispatch16.bytes == 3 * graph.hidden * 2 + 3 * 4 * 4 and combine16.shape == (3, graph.hidden)
