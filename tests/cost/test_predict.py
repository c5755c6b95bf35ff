"""Prediction: the audit's decisions priced on a topology (compute, collectives, PP, memory, TTFT)."""

import time

import pytest

from tpplan.audit import audit, audit_plan
from tpplan.cost.collectives import collective_time
from tpplan.cost.predict import (
    STATE_BYTES,
    batch_time,
    predict_audit,
    predict_plan,
    stage_boundary_width,
    stage_layers,
)
from tpplan.cost.topology import load_topology
from tpplan.cost.workload import Workload, load_workload
from tpplan.errors import TpplanError
from tpplan.mesh import Mesh
from tpplan.models.config import load_model
from tpplan.models.graph import build_model_graph
from tpplan.plans.named import NAMED_PLANS, make_plan

TOPO = load_topology("h200x8-ib400")


@pytest.fixture(scope="module")
def k3():
    return build_model_graph(load_model("kimi-k3"))


def _kind(pred, kind):
    return next(k for k in pred.kinds if k.kind == kind)


def _op(kind_time, name):
    return next(o for o in kind_time.ops if o.op == name)


def test_redundant_qkv_a_is_counted(k3) -> None:
    base = predict_plan(k3, make_plan("baseline", k3, 32), TOPO, mesh=Mesh(32), tokens=8192)
    proto = predict_plan(k3, make_plan("latent-scattered", k3, 32), TOPO, mesh=Mesh(32), tokens=8192)
    qb, qp = _op(_kind(base, "mla+moe"), "qkv_a"), _op(_kind(proto, "mla+moe"), "qkv_a")
    assert qb.redundant and qb.shape == (8192, 7168, 2112)  # every rank runs the whole GEMM
    assert not qp.redundant and qp.shape == (256, 7168, 2112)  # token-sharded: 8192 / 32 rows
    assert qb.seconds > 4 * qp.seconds
    assert _kind(base, "mla+moe").redundant_s >= qb.seconds and base.redundant_s > proto.redundant_s
    assert not _op(_kind(base, "mla+moe"), "moe_sum").redundant  # partial sums: whole op, different data
    assert not _op(_kind(base, "mla+moe"), "q_b_proj").redundant  # column-parallel: 1/N of the work
    # The claim: on 2 H200s the saved GEMM outweighs the prototype's extra latent all-gather.
    box = load_topology("h200x2")
    b2 = _kind(predict_plan(k3, make_plan("baseline", k3, 2), box, mesh=Mesh(2), tokens=8192), "mla+moe")
    p2 = _kind(predict_plan(k3, make_plan("latent-scattered", k3, 2), box, mesh=Mesh(2), tokens=8192), "mla+moe")
    saved = _op(b2, "qkv_a").seconds - _op(p2, "qkv_a").seconds
    gather = next(c for c in p2.collectives if "qkv_latent" in c.label)
    assert gather.kind == "all_gather" and saved > gather.seconds > 0
    assert p2.total_s < b2.total_s


def test_memory_price_of_replication(k3) -> None:
    preds = {
        name: predict_plan(k3, make_plan(name, k3, 32), TOPO, mesh=Mesh(32), tokens=8192)
        for name in ("baseline", "gate-aware")
    }
    ga = audit_plan(k3, make_plan("gate-aware", k3, 32), 32)
    assert preds["gate-aware"].memory.replicated_extra == pytest.approx(ga.replicated_extra_bytes)
    assert preds["gate-aware"].memory.replicated_extra > 40 * 2**30
    assert preds["baseline"].memory.replicated_extra == 0
    # replication is the whole weight difference: each replicated weight goes from 1/N to full
    diff = preds["gate-aware"].memory.weights - preds["baseline"].memory.weights
    assert diff == pytest.approx(preds["gate-aware"].memory.replicated_extra)


def test_kv_cache_and_recurrent_state_by_hand() -> None:
    """tiny-kimi-k3 at TP2: MLA layers 3, 5, 6 cache kv_lora 16 + rope 8 per token on every rank;
    KDA layers 1, 2, 4 keep 4/2 heads of 16x16 fp32 state plus q/k/v conv tails (3 x 64/2 x 3)."""
    g = build_model_graph(load_model("tiny-kimi-k3"))
    w = Workload(input_len=100, output_len=1, concurrency=3, chunk_size=64)
    topo = load_topology("h200x2")
    m = predict_plan(g, make_plan("baseline", g, 2), topo, mesh=Mesh(2), workload=w, tokens=64).memory
    assert m.kv_cache == 3 * (16 + 8) * 2 * (3 * 101)
    per_seq = 2 * 16 * 16 * STATE_BYTES + 3 * 32 * 3 * 2
    assert m.recurrent_state == 3 * per_seq * 3
    assert m.total == m.weights + m.activations + m.kv_cache + m.recurrent_state


def test_gqa_kv_cache_sharded_by_kv_heads() -> None:
    g = build_model_graph(load_model("llama-3-70b"))  # 80 layers, 8 KV heads of 128
    w = Workload(input_len=1000, concurrency=1, chunk_size=1000)
    kv = {
        tp: predict_plan(g, make_plan("baseline", g, tp), TOPO, mesh=Mesh(tp), workload=w).memory.kv_cache
        for tp in (4, 8, 16)
    }
    assert kv[4] == 80 * 2 * (8 // 4) * 128 * 2 * 1001
    assert kv[8] == kv[4] / 2
    assert kv[16] == kv[8]  # TP beyond the KV heads replicates one head per rank


def test_ttft_schedule_uses_batch_time(k3) -> None:
    plan = make_plan("baseline", k3, 32)
    b0 = batch_time(k3, plan, TOPO, mesh=Mesh(32), n_tokens=8192, context=0)
    b1 = batch_time(k3, plan, TOPO, mesh=Mesh(32), n_tokens=8192, context=8192)
    assert b1 > b0 > 0  # the second chunk attends over the first
    means = {}
    for c in (8, 16):
        pred = predict_plan(k3, plan, TOPO, mesh=Mesh(32), workload=load_workload(f"seed-c{c}"))
        t = pred.ttft
        assert t is not None and len(t.batches) == 2 * c
        assert list(t.ttft_s) == sorted(t.ttft_s)  # FCFS: later requests wait longer
        assert t.ttft_s == pytest.approx([(i + 1) * (b0 + b1) for i in range(c)])
        assert t.max_s == pytest.approx(c * (b0 + b1))
        means[c] = t.mean_s
        assert pred.forward_s == pytest.approx(b0)
    assert means[16] > means[8]


def test_pp_stages_send_the_k3_bank(k3) -> None:
    assert [r.start for r in stage_layers(93, Mesh(1, 4))] == [0, 23, 46, 70]  # remainder before the last stage
    assert [len(r) for r in stage_layers(93, Mesh(1, 4))] == [23, 23, 24, 23]
    # the stream (its residual folded in), plus one H-wide AttnRes snapshot per block of 12 started so far
    # (SGLang's KimiK3LinearModel and vLLM's KimiLinearModel forward, cited in tpplan/engines)
    assert [stage_boundary_width(k3, s) for s in (23, 46, 70)] == [3 * 7168, 5 * 7168, 7 * 7168]
    ds = build_model_graph(load_model("deepseek-v3"))
    assert stage_boundary_width(ds, 30) == 2 * 7168  # no bank without attention residuals
    pred = predict_plan(k3, make_plan("baseline", k3, 8), TOPO, mesh=Mesh(8, pp=4), tokens=8192)
    expect = 0.0
    for s in (23, 46, 70):
        total = 8192 * stage_boundary_width(k3, s) * 2
        expect += collective_time("send_recv", total / 8, 2, TOPO, ranks_per_node=1).time_s  # 1/8 per rank
        expect += collective_time("all_gather", total, 8, TOPO).time_s  # receivers re-gather
    assert pred.stage_comm_s == pytest.approx(expect)
    assert pred.forward_s == pytest.approx(sum(pred.stage_s))
    # a token-sharded stream is re-gathered too: both engines' receivers all-gather what crosses
    sp = predict_plan(k3, make_plan("sp-moe", k3, 8), TOPO, mesh=Mesh(8, pp=4), tokens=8192)
    assert sp.stage_comm_s == pytest.approx(expect)
    # a stage holds a quarter of the layers at 4x the TP shard: weights per rank about the same
    flat = predict_plan(k3, make_plan("baseline", k3, 32), TOPO, mesh=Mesh(32), tokens=8192)
    assert 0.8 < pred.memory.weights / flat.memory.weights < 1.3


def test_pp_pipelines_chunks(k3) -> None:
    plan = make_plan("baseline", k3, 8)
    w = load_workload("seed-c8")
    pp4 = predict_plan(k3, plan, TOPO, mesh=Mesh(8, pp=4), workload=w)
    seq = predict_plan(k3, plan, TOPO, mesh=Mesh(32), workload=w)
    t = pp4.ttft
    assert t is not None
    # request 0 = chunk 0 enters, then chunk 1 one slowest-stage interval later and runs to the end
    lat1 = batch_time(k3, plan, TOPO, mesh=Mesh(8, pp=4), n_tokens=8192, context=8192)
    assert t.ttft_s[0] < lat1 + pp4.forward_s  # chunks overlap across stages
    assert t.ttft_s[0] > lat1
    assert t.ttft_s[-1] - t.ttft_s[0] < 0.5 * (seq.ttft.ttft_s[-1] - seq.ttft.ttft_s[0]) + lat1


def test_ep_vs_tp_memory_and_expert_time(k3) -> None:
    preds = {
        name: predict_plan(k3, make_plan(name, k3, 32), TOPO, mesh=Mesh(32), tokens=8192)
        for name in ("baseline", "ep4", "sp-moe")
    }
    base, ep, a2a = preds["baseline"], preds["ep4"], preds["sp-moe"]
    assert ep.memory.weights == base.memory.weights  # experts are 1/N per rank under TP and EP
    assert a2a.memory.weights - base.memory.weights == pytest.approx(a2a.memory.replicated_extra)
    assert a2a.memory.replicated_extra > 0  # SP-MoE replicates the shared experts
    e_tp = _op(_kind(base, "kda+moe"), "experts")
    e_ep = _op(_kind(ep, "kda+moe"), "experts")
    assert e_tp.shape[2] == 2 * 3072 // 32 and e_ep.shape[2] == 2 * 3072 // 8  # wider shards under EP4
    assert e_ep.seconds < e_tp.seconds
    labels = [c.label for c in _kind(a2a, "kda+moe").collectives]
    assert any("dispatch" in lb for lb in labels) and any("combine" in lb for lb in labels)
    mxfp4 = predict_plan(k3, make_plan("baseline", k3, 32), TOPO, mesh=Mesh(32), expert_dtype="mxfp4")
    bf16 = predict_plan(k3, make_plan("baseline", k3, 32), TOPO, mesh=Mesh(32), expert_dtype="bf16")
    assert mxfp4.memory.weights < 0.4 * bf16.memory.weights and mxfp4.fits and not bf16.fits
    assert base.memory.weights == mxfp4.memory.weights  # the preset's quantization_config: MXFP4 experts


def test_collective_algorithm_follows_the_group(k3) -> None:
    multi = _kind(predict_plan(k3, make_plan("baseline", k3, 32), TOPO, mesh=Mesh(32), tokens=8192), "kda+moe")
    ar = multi.collectives[0]
    assert ar.kind == "all_reduce" and ar.nbytes == 8192 * 7168 * 2
    assert ar.algorithm in ("tree", "hierarchical")
    assert ar.seconds == pytest.approx(collective_time("all_reduce", ar.nbytes, 32, TOPO).time_s)
    one = _kind(predict_plan(k3, make_plan("baseline", k3, 8), TOPO, mesh=Mesh(8), tokens=8192), "kda+moe")
    assert one.collectives[0].algorithm == "ring-curve"  # one node: the NVLS-off ring (derived curve)
    data = TOPO.model_dump()
    data["inter"]["nics_per_node"] = 1  # a slow network: the intra-node reduce-scatter first pays off
    slow = type(TOPO).model_validate(data)
    hier = _kind(predict_plan(k3, make_plan("baseline", k3, 32), slow, mesh=Mesh(32), tokens=8192), "kda+moe")
    assert hier.collectives[0].algorithm == "hierarchical"


def test_bad_sizes(k3) -> None:
    with pytest.raises(TpplanError, match="between 1 and the 93 layers"):
        stage_layers(93, Mesh(1, 94))
    with pytest.raises(TpplanError, match="n_tokens"):
        batch_time(k3, make_plan("baseline", k3, 8), TOPO, mesh=Mesh(8), n_tokens=0)
    with pytest.raises(TpplanError, match="needs 64 GPUs"):
        predict_plan(k3, make_plan("baseline", k3, 32), TOPO, mesh=Mesh(32, pp=2))
    with pytest.raises(TpplanError, match="whole nodes"):
        predict_plan(k3, make_plan("baseline", k3, 12), TOPO, mesh=Mesh(12))
    with pytest.raises(TpplanError, match="unknown weight dtype"):
        predict_plan(k3, make_plan("baseline", k3, 8), TOPO, mesh=Mesh(8), expert_dtype="int3")


def test_fast_enough_for_search(k3) -> None:
    a = audit(k3, 32, [*NAMED_PLANS, "sp-moe", "ep4"])
    t0 = time.perf_counter()
    preds = predict_audit(a, TOPO, workload=load_workload("seed-c16"))
    assert time.perf_counter() - t0 < 1.0
    assert all(p.ttft is not None for p in preds)
    js = preds[0].to_json()
    assert {"forward_s", "layer_kinds", "memory_bytes_per_rank", "ttft"} <= set(js)


@pytest.mark.parametrize("preset", ["tiny-kimi-k3", "tiny-deepseek-v3", "tiny-kimi-linear", "qwen3-next-80b"])
def test_every_family_and_plan_predicts(preset) -> None:
    g = build_model_graph(load_model(preset))
    w = Workload(input_len=300, concurrency=2, chunk_size=256)
    for name in [*NAMED_PLANS, "sp-moe", "ep2", "input-scattered+restore"]:
        plan = make_plan(name, g, 2)
        for pp in (1, 2):
            pred = predict_plan(g, plan, TOPO, mesh=Mesh(2, pp=pp), workload=w, tokens=256)
            assert pred.forward_s > 0 and pred.memory.total > 0 and pred.ttft is not None
            assert len(pred.stage_s) == pp and (pred.stage_comm_s > 0) == (pp > 1)
            assert all(o.seconds >= 0 for k in pred.kinds for o in k.ops)


def test_layout_copies_are_priced_as_ops(k3) -> None:
    """One `pack:<value>` per S(tok)->S(col) all-to-all (read + write of the rank's [T/N, W] rows),
    one per reduce-scatter whose T needs padding, `unpack:<value>` after a head all-gather; none
    under baseline. Memory-bound copies on the HBM roofline, not collective time."""
    from dataclasses import replace

    from tpplan.cost.predict import KERNEL_FLOOR_S, cached_predictor
    from tpplan.layout.propagate import CommEvent
    from tpplan.models.graph import Value
    from tpplan.placement import S_COL, S_TOK, Collective, R

    box = load_topology("h200x2")
    t, b = 8192, 2
    ga = cached_predictor(k3, make_plan("gate-aware", k3, 2), box, Mesh(2, pp=1), "bf16", None)
    n_pack = 0
    for res in ga.audit.layer_results:
        kt = ga.kind_time(res, ((t, 0),))
        lg = k3.kinds[res.kind]
        a2a = [c for c in res.comms if c.collective is Collective.ALL_TO_ALL and c.src is S_TOK and c.dst is S_COL]
        layout = [o for o in kt.ops if o.role == "layout"]
        assert a2a and sorted(o.op for o in layout) == sorted(f"pack:{c.value}" for c in a2a)
        for c in a2a:
            o = _op(kt, f"pack:{c.value}")
            nbytes = 2 * (t // 2) * lg.values[c.value].width * b  # read [T/2, W] + write [2, T/2, W/2]
            assert (o.category, o.flops_per_rank, o.bytes_per_rank, o.redundant) == ("elementwise", 0.0, nbytes, False)
            assert o.seconds == pytest.approx(max(nbytes / (box.gpu.hbm_TBps * 1e12), KERNEL_FLOOR_S))
        assert kt.compute_s == pytest.approx(sum(o.seconds for o in kt.ops))  # the copies count in the layer
        n_pack += len(a2a)
    assert n_pack >= 6  # KDA q, k, v, f, beta, g_out (and MLA's gate)
    # baseline moves nothing between layouts; sequence-parallel pads its reduce-scatters only when T % N
    for name, tokens, want in (("baseline", t, 0), ("sequence-parallel", t, 0), ("sequence-parallel", t - 1, 2)):
        p = cached_predictor(k3, make_plan(name, k3, 2), box, Mesh(2, pp=1), "bf16", None)
        for res in p.audit.layer_results:
            kt = p.kind_time(res, ((tokens, 0),))
            layout = [o for o in kt.ops if o.role == "layout"]
            assert len(layout) == want, (name, tokens, [o.op for o in layout])
            for o in layout:
                w = k3.kinds[res.kind].values[o.op.removeprefix("pack:")].width
                assert o.bytes_per_rank == (tokens + t) * w * b  # read [T, W], write [T_pad, W]
    # S(col) -> R all-gather (no named plan issues one): the gathered blocks interleaved, unless one head
    lg = k3.kinds["mla+moe"]
    w = lg.values["attn_gate"].width
    ag = CommEvent(Collective.ALL_GATHER, "attn_gate", w, S_COL, R, "g_proj", "o_proj", "attn_side", "", 1.0, 1.0)
    o = ga.layout_copy(lg, ag, t)
    assert o is not None and (o.op, o.role, o.bytes_per_rank) == ("unpack:attn_gate", "layout", 2 * t * w * b)
    one_head = replace(lg, values={**lg.values, "attn_gate": Value("attn_gate", 128, 1)})
    assert ga.layout_copy(one_head, replace(ag, width=128), t) is None  # rank 0's block is the whole value
