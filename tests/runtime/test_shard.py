"""Weight shards by head, for the fused layouts (no process group needed)."""

from __future__ import annotations

import torch
from safetensors.torch import save_file

from tpplan.layout.schedule import layer_results
from tpplan.models.config import load_model
from tpplan.models.graph import build_model_graph
from tpplan.plans.named import make_plan
from tpplan.runtime.executor import numerics_for
from tpplan.runtime.shard import FULL, DictSource, SafetensorsSource, expert_ownership, head_range, shard_model
from tpplan.runtime.weights import random_weights


def _shards(model: str, plan: str, n: int, source_of=DictSource):
    graph = build_model_graph(load_model(model))
    nu = numerics_for(graph)
    w = random_weights(graph, nu, seed=4)
    res = layer_results(graph, make_plan(plan, graph, n), n)
    return graph, w, [shard_model(graph, res, n, r, source_of(w), nu) for r in range(n)]


def test_head_ranges() -> None:
    assert [head_range(8, 4, r) for r in range(4)] == [(0, 2), (2, 4), (4, 6), (6, 8)]
    assert [head_range(2, 4, r) for r in range(4)] == [(0, 1), (0, 1), (1, 2), (1, 2)]  # shared KV heads
    assert expert_ownership(8, "a2a", 4, 3, None) == (range(6, 8), 0, 1)
    assert expert_ownership(8, "ep", 4, 3, 2) == (range(4, 8), 1, 2)
    assert expert_ownership(8, "tp", 4, 3, None) == (range(8), 3, 4)


def test_gdn_fused_conv_keeps_q_k_v_ranges_of_own_heads() -> None:
    graph, w, shards = _shards("tiny-qwen3-next", "baseline", 2)
    layer = graph.layer_kinds.index("gdn+moe")
    conv = w[f"model.layers.{layer}.linear_attn.conv1d.weight"]  # [2*4*8 + 8*8, 1, 4]
    key_dim = 4 * 8
    for r, sh in enumerate(shards):
        got = sh.ops[(layer, "gated_deltanet")]["conv"]
        q = conv[r * 16 : (r + 1) * 16]
        k = conv[key_dim + r * 16 : key_dim + (r + 1) * 16]
        v = conv[2 * key_dim + r * 32 : 2 * key_dim + (r + 1) * 32]
        assert torch.equal(got, torch.cat([q, k, v]))
        a_log = sh.ops[(layer, "gated_deltanet")]["A_log"]
        assert torch.equal(a_log, w[f"model.layers.{layer}.linear_attn.A_log"][r * 4 : (r + 1) * 4])


def test_gated_q_proj_rows_keep_query_and_gate_of_own_heads() -> None:
    graph, w, shards = _shards("tiny-qwen3-next", "baseline", 4)
    layer = graph.layer_kinds.index("gqa+moe")
    q = w[f"model.layers.{layer}.self_attn.q_proj.weight"]  # per head [query 16 | gate 16]
    for r, sh in enumerate(shards):
        assert torch.equal(sh.ops[(layer, "q_proj")]["weight"], q[r * 32 : (r + 1) * 32])
        k = sh.ops[(layer, "k_proj")]["weight"]  # 2 KV heads over 4 ranks: head r // 2
        assert torch.equal(k, w[f"model.layers.{layer}.self_attn.k_proj.weight"][(r // 2) * 16 : (r // 2 + 1) * 16])


def test_mla_fused_latent_whole_and_k3_gate_by_head_or_replicated() -> None:
    graph, w, shards = _shards("tiny-kimi-k3", "gate-aware", 2)
    layer = graph.layer_kinds.index("mla+moe")
    pre = f"model.layers.{layer}.self_attn."
    fused = torch.cat([w[pre + "q_a_proj.weight"], w[pre + "kv_a_proj_with_mqa.weight"]])
    for r, sh in enumerate(shards):
        assert torch.equal(sh.ops[(layer, "qkv_a")]["weight"], fused)
        assert torch.equal(sh.ops[(layer, "g_proj")]["weight"], w[pre + "g_proj.weight"])  # replicated (gate-aware)
        assert torch.equal(sh.ops[(layer, "q_b_proj")]["weight"], w[pre + "q_b_proj.weight"][r * 48 : (r + 1) * 48])
        assert torch.equal(sh.ops[(layer, "o_proj")]["weight"], w[pre + "o_proj.weight"][:, r * 32 : (r + 1) * 32])
    _, _, base = _shards("tiny-kimi-k3", "baseline", 2)
    assert base[1].ops[(layer, "g_proj")]["weight"].shape == (32, 64)
    assert base[1].numel() < shards[1].numel()  # replication has a memory price


def test_safetensors_source_reads_the_same_slices(tmp_path) -> None:
    graph = build_model_graph(load_model("tiny-kimi-linear"))
    nu = numerics_for(graph)
    w = random_weights(graph, nu, seed=4)
    save_file({k: v.contiguous() for k, v in w.items()}, str(tmp_path / "model.safetensors"))
    res = layer_results(graph, make_plan("sp-moe", graph, 2), 2)
    src = SafetensorsSource(tmp_path, graph, nu)
    assert src.get("model.norm.weight", FULL).shape == (64,)
    for r in range(2):
        a = shard_model(graph, res, 2, r, DictSource(w), nu)
        b = shard_model(graph, res, 2, r, src, nu)
        assert a.ops.keys() == b.ops.keys()
        for key, tensors in a.ops.items():
            for name, t in tensors.items():
                assert torch.equal(t, b.ops[key][name]), (key, name)
        assert torch.equal(a.embed, b.embed) and a.vocab_lo == 64 * r
