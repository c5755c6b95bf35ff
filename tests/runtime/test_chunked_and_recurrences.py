"""Chunked prefill equals one-shot for every tiny preset; chunked delta rule equals the naive loop."""

from __future__ import annotations

import pytest
import torch

from tpplan.models.config import list_presets, load_model
from tpplan.models.graph import build_model_graph
from tpplan.runtime import kernels as K
from tpplan.runtime.executor import numerics_for, run_reference
from tpplan.runtime.weights import random_weights

TINY = [p for p in list_presets() if p.startswith("tiny-")]


@pytest.mark.parametrize("preset", TINY)
def test_chunked_prefill_equals_one_shot(preset: str) -> None:
    graph = build_model_graph(load_model(preset))
    nu = numerics_for(graph)
    w = random_weights(graph, nu, seed=1)
    ids = torch.randint(0, graph.spec.vocab, (13,), generator=torch.Generator().manual_seed(2))
    full = run_reference(graph, w, ids)
    assert torch.isfinite(full).all() and full.abs().max() > 1e-3
    scale = full.abs().max().item()  # ~0.7 for most presets; ~74 for Gemma's sqrt(hidden)-scaled, tied embedding
    for chunk in (5, 1):
        diff = (run_reference(graph, w, ids, chunk=chunk) - full).abs().max().item()
        assert diff / scale < 1e-5, f"{preset} chunk={chunk}: {diff:.2e} of {scale:.2f}"  # fp32 reordering: ~2e-7


@pytest.mark.parametrize("per_channel", [True, False], ids=["kda-decay", "gdn-decay"])
@pytest.mark.parametrize("chunk", [1, 4, 7, 64])
def test_chunked_delta_rule_equals_naive(per_channel: bool, chunk: int) -> None:
    g = torch.Generator().manual_seed(0)
    t, h, dk, dv = 23, 3, 8, 5
    q = K.l2norm(torch.randn(t, h, dk, generator=g)) * dk**-0.5
    k = K.l2norm(torch.randn(t, h, dk, generator=g))
    v = torch.randn(t, h, dv, generator=g)
    decay = -torch.rand(t, h, dk if per_channel else 1, generator=g).squeeze(-1) * 4
    beta = torch.rand(t, h, generator=g)
    s0 = torch.randn(h, dk, dv, generator=g)
    o_ref, s_ref = K.naive_gated_delta_rule(q, k, v, decay, beta, s0)
    o, s = K.chunk_gated_delta_rule(q, k, v, decay, beta, s0, chunk_size=chunk)
    assert (o - o_ref).abs().max() < 1e-5 and (s - s_ref).abs().max() < 1e-5
    # Carrying the state across two calls equals one call.
    o1, s1 = K.chunk_gated_delta_rule(q[:9], k[:9], v[:9], decay[:9], beta[:9], s0, chunk_size=chunk)
    o2, s2 = K.chunk_gated_delta_rule(q[9:], k[9:], v[9:], decay[9:], beta[9:], s1, chunk_size=chunk)
    assert (torch.cat([o1, o2]) - o_ref).abs().max() < 1e-5 and (s2 - s_ref).abs().max() < 1e-5
