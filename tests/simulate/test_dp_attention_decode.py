"""MLA decode attention under DP attention (issue 32, P/D decode pools): each rank decodes its own requests with
every head, reading only their cached latent, not every request's at a 1/N share of the heads."""

from __future__ import annotations

import pytest

from tpplan.cost.predictor import cached_predictor
from tpplan.cost.topology import load_topology
from tpplan.mesh import Mesh
from tpplan.models.config import load_model
from tpplan.models.graph import build_model_graph
from tpplan.plans.named import make_plan


def test_a_dp_attention_rank_reads_its_own_requests_latent_with_every_head() -> None:
    graph = build_model_graph(load_model("tiny-deepseek-v3"))
    tp, batch, ctx = 2, 64, 65536
    p = cached_predictor(graph, make_plan("dp-attention", graph, tp), load_topology("h200x8-ib400"), Mesh(tp),
                         "bf16", None)  # fmt: skip
    res = p.audit.layer_results[-1]
    lg = graph.kinds[res.kind]
    op = next(d.op for d in res.decisions if d.op.name == "attention")
    lora, rope, heads = lg.values["kv_latent"].width, lg.values["k_rope"].width, op.int_attr("heads")
    mine = batch // tp  # the rank's requests, all heads
    keys = mine * (ctx + 1)
    flops = 2.0 * heads * (lora + rope + lora) * keys
    nbytes = (keys * (lora + rope) + mine * heads * (2 * lora + rope)) * p.b
    by_hand = max(flops / (p.kernels.peak * p.topo.gpu.attn_efficiency), nbytes / p.kernels.hbm)
    got = {o.op: o for o in p.kind_time(res, ((1, ctx),) * batch).ops}["attention"]
    assert got.seconds == pytest.approx(by_hand)
    assert got.bytes_per_rank == pytest.approx(nbytes)  # 1/tp of the batch's latent, where a head split reads all of it
