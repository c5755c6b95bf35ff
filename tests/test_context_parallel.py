"""Context parallelism: exchanges derived from the graph, the token splits, pricing, the CLI."""

from __future__ import annotations

import json
import math

import pytest

from tests.cli_helpers import run_cli
from tpplan.cost.predict import predict_plan
from tpplan.cost.topology import load_topology
from tpplan.layout.context_parallel import audit_cp, causal_imbalance, chunk_bounds, model_split, rank_positions
from tpplan.lower.batch import local_segments
from tpplan.lower.passes.cp import exchange_bytes
from tpplan.mesh import Mesh
from tpplan.models.config import load_model
from tpplan.models.graph import build_model_graph
from tpplan.plans.named import baseline


def _graph(model: str):
    return build_model_graph(load_model(model))


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_gqa_gathers_its_ranks_kv_heads_read_from_the_config(tp: int) -> None:
    spec = load_model("tiny-llama")
    attn = spec.layers[0].attn.gqa if hasattr(spec.layers[0].attn, "gqa") else spec.layers[0].attn
    kv_heads, head_dim = attn.kv_heads, attn.head_dim
    per_rank = max(1, kv_heads // tp)  # fewer KV heads than ranks: one each
    a = audit_cp(build_model_graph(spec), Mesh(tp, cp=2))
    (x,) = a.kinds["gqa+dense"].exchanges
    assert (x.method, x.collective, x.values) == ("kv_all_gather", "all_gather", ("k", "v"))
    assert x.per_token == 2 * per_rank * head_dim
    assert a.legal and model_split(a) == "zigzag"


def test_mla_gathers_the_latent_not_the_up_projected_kv() -> None:
    spec = load_model("tiny-deepseek-v3")
    mla = spec.layers[0].attn
    for tp in (1, 4):
        a = audit_cp(build_model_graph(spec), Mesh(tp, cp=4))
        for ck in a.kinds.values():
            (x,) = ck.exchanges
            assert x.method == "latent_all_gather"
            assert x.per_token == mla.kv_lora_rank + mla.rope_dim  # not divided by TP: every head reads it


def test_linear_attention_hands_the_state_on_serially_or_by_scan_with_the_conv_halo() -> None:
    g = _graph("tiny-kimi-k3")
    kda = next(op for op in g.kinds["kda+moe"].ops if op.attrs.get("impl") == "kda")
    h, d = int(kda.attrs["heads"]), int(kda.attrs["head_dim"])
    serial = audit_cp(g, Mesh(2, cp=4, cp_recurrence="serial")).kinds["kda+moe"]
    scan = audit_cp(g, Mesh(2, cp=4, cp_recurrence="scan")).kinds["kda+moe"]
    (s_state,) = [x for x in serial.exchanges if x.method == "state_serial"]
    (p_state,) = [x for x in scan.exchanges if x.method == "state_scan"]
    assert s_state.chain == 3 and s_state.per_seq == h / 2 * d * d and s_state.elem_bytes == 4
    assert p_state.chain == 0 and p_state.per_seq == h / 2 * (d * d + d * d)  # state + transition
    halos = [x for x in scan.exchanges if x.method == "conv_halo"]
    assert len(halos) == 3 and all(x.per_seq == 3 * 64 / 2 for x in halos)  # kernel 4: 3 rows of q, k, v / TP
    assert serial.split == "contiguous"
    # MLP/MoE run on own tokens: the audit names no CP exchange outside the token mixers
    assert all(x.op in {o.name for o in g.kinds["kda+moe"].ops if o.kind.name == "TOKEN_MIX"} for x in scan.exchanges)
    # a hybrid keeps one split for the stream: contiguous, with attention's causal imbalance
    assert model_split(audit_cp(g, Mesh(2, cp=4))) == "contiguous" and causal_imbalance(4, "contiguous") == 7 / 4


def test_gdn_state_and_halo_from_its_attrs() -> None:
    g = _graph("tiny-qwen3-next")
    op = next(o for o in g.kinds["gdn+moe"].ops if o.attrs.get("impl") == "gdn")
    a = op.attrs
    xs = audit_cp(g, Mesh(1, cp=2, cp_recurrence="serial")).kinds["gdn+moe"].exchanges
    state = next(x for x in xs if x.method == "state_serial")
    halo = next(x for x in xs if x.method == "conv_halo")
    assert state.per_seq == a["v_heads"] * a["k_head_dim"] * a["v_head_dim"]
    assert halo.per_seq == (a["kernel"] - 1) * (2 * a["k_heads"] * a["k_head_dim"] + a["v_heads"] * a["v_head_dim"])


def test_a_mixer_without_a_cp_method_is_illegal_with_its_reason() -> None:
    a = audit_cp(_graph("tiny-deepseek-v32"), Mesh(2, cp=2))
    assert not a.legal
    assert any("indexer" in r and "no context-parallel method" in r for r in a.reasons)
    assert audit_cp(_graph("tiny-deepseek-v32"), Mesh(2, cp=1)).legal  # CP 1 is plain TP


@pytest.mark.parametrize("cp", [2, 3, 4, 8])
@pytest.mark.parametrize("tokens", [16, 37, 64])
def test_zigzag_and_contiguous_splits_cover_every_position_once(cp: int, tokens: int) -> None:
    for split in ("zigzag", "contiguous"):
        held = [rank_positions(tokens, cp, r, split) for r in range(cp)]
        assert sorted(p for h in held for p in h) == list(range(tokens))
        assert max(map(len, held)) == math.ceil(tokens / cp) or split == "zigzag"
    # zigzag balances causal pairs (key <= query): within one pair per query of the mean
    pairs = [sum(p + 1 for p in rank_positions(tokens, cp, r, "zigzag")) for r in range(cp)]
    if tokens % (2 * cp) == 0:
        assert len(set(pairs)) == 1
    contiguous = [sum(p + 1 for p in rank_positions(tokens, cp, r, "contiguous")) for r in range(cp)]
    assert max(contiguous) > max(pairs) or cp == 1


def test_local_segments_are_the_slowest_ranks_attention_calls() -> None:
    segs = ((64, 0),)
    z = local_segments(segs, 4, "zigzag")
    assert z == ((8, 0), (8, 56))  # chunks 0 and 7 of 8
    pairs = sum(n * c + n * (n + 1) // 2 for n, c in z)
    assert pairs == 64 * 65 // 2 // 4  # balanced: 1/c of the causal pairs
    assert local_segments(segs, 4, "contiguous") == ((16, 48),)
    assert chunk_bounds(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]


def test_cp_prices_local_tokens_gathers_and_shards_the_kv() -> None:
    topo = load_topology("h200x8-ib400", nodes=1)
    g = _graph("llama-3-70b")
    one = predict_plan(g, baseline(), topo, mesh=Mesh(2), tokens=32768)
    two = predict_plan(g, baseline(), topo, mesh=Mesh(2, cp=4), tokens=32768)
    mine = predict_plan(g, baseline(), topo, mesh=Mesh(2, cp=4, cp_kv="sharded"), tokens=32768)
    assert two.cp == 4 and one.cp == 1
    assert two.forward_s < one.forward_s
    assert two.memory.kv_cache == pytest.approx(one.memory.kv_cache)  # as the engines keep it (default)
    assert mine.memory.kv_cache == pytest.approx(one.memory.kv_cache / 4)  # tpplan's own, asked for
    k1, k4 = one.kinds[0], two.kinds[0]
    cp_colls = [c for c in k4.collectives if c.region == "cp"]
    assert len(cp_colls) == 1 and not [c for c in k1.collectives if c.region == "cp"]
    x = audit_cp(g, Mesh(2, cp=4)).kinds[k4.kind].exchanges[0]
    assert cp_colls[0].nbytes == exchange_bytes(x, 4, ((32768, 0),), 2) == 4 * 8192 * x.per_token * 2
    gemm1 = next(o for o in k1.ops if o.op == "q_proj")
    gemm4 = next(o for o in k4.ops if o.op == "q_proj")
    assert gemm4.shape[0] == gemm1.shape[0] // 4  # every op on the rank's own rows


def test_serial_recurrence_waits_for_the_chain() -> None:
    topo = load_topology("h200x8-ib400", nodes=1)
    g = _graph("qwen3-next-80b")
    scan = predict_plan(g, baseline(), topo, mesh=Mesh(2, cp=4), tokens=65536)
    serial = predict_plan(g, baseline(), topo, mesh=Mesh(2, cp=4, cp_recurrence="serial"), tokens=65536)
    kind = next(k for k in serial.kinds if k.kind.startswith("gdn"))
    wait = next(o for o in kind.ops if o.op.endswith("cp_chain_wait"))
    rec = next(o for o in kind.ops if o.op == "gated_deltanet")
    assert wait.seconds == pytest.approx(3 * rec.seconds)
    assert serial.forward_s > scan.forward_s


def test_audit_cli_shows_and_bounds_cp(monkeypatch, capsys) -> None:
    code, out, _ = run_cli(monkeypatch, capsys, "audit", "--model", "tiny-kimi-k3", "--tp", "2", "--cp", "2",
                           "--plan", "baseline", "--json")  # fmt: skip
    assert code == 0
    data = json.loads(out)
    assert data["context_parallel"]["cp"] == 2 and data["context_parallel"]["legal"]
    assert data["context_parallel"]["kinds"]["mla+moe"]["units_per_token"] == 24
    code, out, _ = run_cli(monkeypatch, capsys, "audit", "--model", "tiny-llama", "--tp", "2", "--cp", "2")
    assert code == 0 and "Context parallel: CP2" in out and "AG(k+v 32/tok)" in out
    code, _, err = run_cli(monkeypatch, capsys, "audit", "--model", "tiny-llama", "--tp", "2", "--cp", "0")
    assert code == 2 and "--cp 0" in err and "Traceback" not in err
    code, _, err = run_cli(monkeypatch, capsys, "audit", "--model", "tiny-llama", "--tp", "2", "--cp", "2",
                           "--cp-recurrence", "ring")  # fmt: skip
    assert code == 2 and "--cp-recurrence ring" in err
    code, out, _ = run_cli(monkeypatch, capsys, "explain", "--model", "tiny-qwen3-next", "--tp", "2", "--cp", "4")
    assert code == 0 and "two-pass scan" in out and "all-gathers K and V" in out


@pytest.mark.parametrize("model", ["kimi-k3", "deepseek-v3", "qwen3-next-80b", "llama-3-70b"])
def test_the_issues_models_audit_and_price_at_cp_2_4_8(model: str) -> None:
    g = _graph(model)
    topo = load_topology("h200x8-ib400", nodes=8)
    plain = predict_plan(g, baseline(), topo, mesh=Mesh(8), tokens=16384)
    for cp in (2, 4, 8):
        a = audit_cp(g, Mesh(8, cp=cp))
        assert a.legal, a.reasons
        pr = predict_plan(g, baseline(), topo, mesh=Mesh(8, cp=cp, cp_kv="sharded"), tokens=16384)
        assert pr.legal and pr.memory.kv_cache == pytest.approx(plain.memory.kv_cache / cp)
        assert all(any(c.region == "cp" for c in k.collectives) == bool(a.kinds[k.kind].exchanges) for k in pr.kinds)


def test_search_lists_cp_deployments_over_the_memory_floor_without_searching_them() -> None:
    from tpplan.search import search_report

    data = search_report("tiny-llama", "h200x8-ib400", nodes=1, top=2, memory_cap_gib=1e-5, tokens=4096)
    floors = {e["deployment"] for e in data["excluded_over_cap"]["plans"] if e.get("why") == "floor"}
    assert floors == {"TP4xCP2", "TP2xCP4", "TP1xCP8"}
    assert not data["plans"]
    data = search_report("tiny-llama", "h200x8-ib400", nodes=1, top=3, tokens=65536, cp=2)
    assert data["search"]["deployments"] == ["TP4xCP2", "TP2xCP2xPP2"]  # PP4 > its layers
    assert all(p["cp"] == 2 for p in data["plans"])
