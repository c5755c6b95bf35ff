"""`--cp-layers mla` (SGLang PR #38344's full-sequence CP) and the engines' CP records: audit, price, CLI."""

from __future__ import annotations

import json

import pytest

from tests.cli_helpers import run_cli
from tpplan.cost.predict import predict_plan
from tpplan.cost.pricing import Pricer
from tpplan.cost.topology import load_topology
from tpplan.engines.context_parallel import CP_PATHS, kv_cp_share
from tpplan.errors import TpplanError
from tpplan.layout.context_parallel import audit_cp, rank_positions
from tpplan.lower.schedule import predict_cp_calls
from tpplan.mesh import Mesh
from tpplan.models.config import load_model
from tpplan.models.graph import build_model_graph
from tpplan.plans.named import baseline


def _graph(model: str):
    return build_model_graph(load_model(model))


def test_only_mla_kinds_are_sharded_and_o_projs_collective_is_replaced() -> None:
    g = _graph("kimi-k3")
    a = audit_cp(g, Mesh(8, cp=8, cp_layers="mla"))
    assert a.legal and a.token_cp == 1 and a.attn_tp == 1
    assert {k: v.split for k, v in a.kinds.items()} == {"kda+dense": "none", "kda+moe": "none", "mla+moe": "zigzag"}
    mla = a.kinds["mla+moe"]
    assert [x.method for x in mla.exchanges] == ["output_all_gather"]  # A = 1: no attention-TP all-reduce
    assert mla.replaces == ("attn_out",) and mla.replicated == (("kv_b_proj", 8),)
    assert mla.exchanges[0].per_token == g.hidden
    two = audit_cp(g, Mesh(8, cp=2, cp_layers="mla")).kinds[
        "mla+moe"
    ]  # A = 4: o_proj's partial sums over 4 ranks first
    assert [(x.method, x.group) for x in two.exchanges] == [("attn_tp_all_reduce", "attn_tp"),
                                                            ("output_all_gather", "cp")]  # fmt: skip


@pytest.mark.parametrize(
    ("model", "tp", "cp", "why"),
    [("llama-3-70b", 8, 2, "has none"), ("qwen3-next-80b", 8, 4, "has none"), ("kimi-k3", 8, 3, "must divide")],
)
def test_mla_mode_is_refused_without_mla_layers_or_when_cp_does_not_divide_tp(model, tp, cp, why) -> None:
    a = audit_cp(_graph(model), Mesh(tp, cp=cp, cp_layers="mla"))
    assert not a.legal and any(why in r for r in a.reasons)
    with pytest.raises(TpplanError, match="unknown CP layer set"):
        audit_cp(_graph("tiny-llama"), Mesh(2, cp=2, cp_layers="odd"))


def test_the_cp_group_sits_inside_the_tp_group() -> None:
    assert Mesh(8, cp=8, cp_layers="mla").gpus == 8 and Mesh(8, cp=8).gpus == 64
    topo = load_topology("h200x8-ib400", nodes=1)
    with pytest.raises(TpplanError, match="inside the TP group"):
        Mesh(8, cp=3, cp_layers="mla").check(topo)


def test_predicted_calls_gather_the_attention_output_of_the_longest_zigzag_rank() -> None:
    g = _graph("tiny-kimi-k3")
    calls = predict_cp_calls(g, baseline(), Mesh(4, cp=4, cp_layers="mla"), 19, cp_rank=2)
    mla_layers = [i for i, k in enumerate(g.layer_kinds) if k == "mla+moe"]
    assert [c.layer for c in calls] == mla_layers and {c.value for c in calls} == {"attn_out"}
    rows = max(len(rank_positions(19, 4, r, "zigzag")) for r in range(4))
    assert calls[0].nbytes == 4 * rows * g.hidden * 4


def test_mla_mode_prices_the_gather_instead_of_the_all_reduce_and_replicates_the_kv_expansion() -> None:
    g = _graph("kimi-k3")
    topo = load_topology("h200x8-ib400", nodes=1)
    tp8 = predict_plan(g, baseline(), topo, mesh=Mesh(8), tokens=16384)
    cp8 = predict_plan(g, baseline(), topo, mesh=Mesh(8, cp=8, cp_layers="mla"), tokens=16384)
    k1 = next(k for k in tp8.kinds if k.kind == "mla+moe")
    k8 = next(k for k in cp8.kinds if k.kind == "mla+moe")
    labels1, labels8 = [c.label for c in k1.collectives], [c.label for c in k8.collectives]
    assert "AR attn_out[7168]" in labels1 and "AR attn_out[7168]" not in labels8
    gather = next(c for c in k8.collectives if c.region == "cp")
    assert gather.kind == "all_gather" and gather.nbytes == 8 * 2048 * 7168 * 2
    ar = next(c for c in k1.collectives if c.label == "AR attn_out[7168]")
    assert gather.seconds < ar.seconds  # an all-gather moves half an all-reduce's bytes
    kv_b = next(o for o in k8.ops if o.op == "kv_b_proj")
    extra = next(o for o in k8.ops if o.op == "kv_b_proj:cp_replicated")
    assert extra.seconds == pytest.approx(7 * kv_b.seconds)
    for kind in ("kda+dense", "kda+moe"):  # the full sequence, priced as TP8 to the op
        a = next(k for k in tp8.kinds if k.kind == kind)
        b = next(k for k in cp8.kinds if k.kind == kind)
        assert a.total_s == pytest.approx(b.total_s)
    assert cp8.memory.kv_cache == pytest.approx(tp8.memory.kv_cache)  # every rank caches the whole sequence
    pricer = Pricer(g, topo, Mesh(8, cp=8, cp_layers="mla"))  # the search's prices agree with predict_plan's
    plain = Pricer(g, topo, Mesh(8))
    res = pricer.baseline_audit.kinds["mla+moe"].result
    lg = g.kinds["mla+moe"]
    more = sum(pricer.weight_bytes(lg, d) - plain.weight_bytes(lg, d) for d in res.decisions)
    o_proj = next(d for d in res.decisions if d.op.name == "o_proj")
    assert pricer.weight_bytes(lg, o_proj) == pytest.approx(8 * plain.weight_bytes(lg, o_proj))  # all 96 heads
    assert more > 0 and cp8.memory.weights - tp8.memory.weights == pytest.approx(g.counts()["mla+moe"] * more)
    replaced = next(c for c in res.comms if c.value == "attn_out")
    assert pricer.collective_time("mla+moe", replaced, ((16384, 0),)).seconds == 0.0
    assert pricer.cp_exchange_time("mla+moe", ((16384, 0),)) == pytest.approx(gather.seconds)


def test_engines_keep_the_whole_sequences_kv_on_every_cp_rank() -> None:
    """Issue 33, item 3: CP is priced as the engines run it by default (the whole sequence's KV on every CP
    rank), whatever kernel source prices compute; tpplan's own 1/cp only with cp_kv="sharded"."""
    assert kv_cp_share(Mesh(2, cp=4)) == 1 and kv_cp_share(Mesh(2, cp=4, cp_kv="sharded")) == 4
    assert kv_cp_share(Mesh(4, cp=4, cp_layers="mla", cp_kv="sharded")) == 1  # no layer's tokens are split
    g = _graph("llama-3-70b")
    topo = load_topology("h200x8-ib400", nodes=1)
    default = predict_plan(g, baseline(), topo, mesh=Mesh(2, cp=4), tokens=8192)
    mine = predict_plan(g, baseline(), topo, mesh=Mesh(2, cp=4, cp_kv="sharded"), tokens=8192)
    tp2 = predict_plan(g, baseline(), topo, mesh=Mesh(2), tokens=8192)
    assert default.memory.kv_cache == pytest.approx(4 * mine.memory.kv_cache) == pytest.approx(tp2.memory.kv_cache)
    with pytest.raises(TpplanError, match="cp_kv=half"):
        predict_plan(g, baseline(), topo, mesh=Mesh(2, cp=4, cp_kv="half"), tokens=8192)
    modes = {p.tpplan_mode for p in CP_PATHS}
    assert modes == {"all", "mla", None}
    assert all(p.kv_source.read or p.kv_source.ref == "unread" for p in CP_PATHS)
    assert all(s.ref for p in CP_PATHS for s in p.sources)


def test_audit_and_explain_show_the_mla_mode(monkeypatch, capsys) -> None:
    code, out, _ = run_cli(monkeypatch, capsys, "audit", "--model", "tiny-kimi-k3", "--tp", "2", "--cp", "2",
                           "--cp-layers", "mla", "--plan", "baseline", "--json")  # fmt: skip
    assert code == 0
    cp = json.loads(out)["context_parallel"]
    assert cp["layers"] == "mla" and cp["attention_tp"] == 1 and cp["legal"]
    assert cp["kinds"]["mla+moe"]["replaces_plan_collectives_on"] == ["attn_out"]
    assert cp["kinds"]["kda+moe"]["exchanges"] == []
    code, out, _ = run_cli(monkeypatch, capsys, "explain", "--model", "tiny-kimi-k3", "--tp", "2", "--cp", "2",
                           "--cp-layers", "mla")  # fmt: skip
    assert code == 0 and "MLA layers only" in out and "all-gathers the attention output rows" in out
    code, _, err = run_cli(monkeypatch, capsys, "audit", "--model", "tiny-kimi-k3", "--tp", "2", "--cp", "2",
                           "--cp-layers", "odd")  # fmt: skip
    assert code == 2 and "--cp-layers odd" in err and "Traceback" not in err
    code, _, err = run_cli(monkeypatch, capsys, "verify", "--model", "tiny-kimi-k3", "--tp", "1", "--cp", "2",
                           "--cp-layers", "mla", "--plan", "baseline")  # fmt: skip
    assert code == 2 and "--tp 2 --cp 2" in err


def test_search_equals_brute_force_and_predict_plan_with_mla_only_cp() -> None:
    """The search prices `--cp-layers mla` through the same Pricer: the replaced collective at zero, the
    gather in `fixed`, the K/V expansion's extra passes on the op: still exact against brute force, and
    each score equals predict_plan's."""
    from tests.test_search import CASES, check_against_brute, close, graph_of
    from tpplan.search import PredictObjective, search

    model, n, opts = CASES[6]  # tiny-kimi-k3 at TP 2
    topo = load_topology("h200x8-ib400", nodes=1)
    obj = PredictObjective(Pricer(graph_of(model), topo, Mesh(n, cp=2, cp_layers="mla")), tokens=2048)
    check_against_brute(model, n, opts, obj)
    for c in search(graph_of(model), n, obj, top=2, per_family=True).candidates:
        pr = predict_plan(graph_of(model), c.plan, topo, mesh=Mesh(n, cp=2, cp_layers="mla"), tokens=2048)
        assert close(c.score, pr.forward_s), (c.plan.name, c.score, pr.forward_s)


def test_search_offers_the_mla_mode_inside_each_tp_group_where_legal(monkeypatch, capsys) -> None:
    from tpplan.search import search_report
    from tpplan.search.grid import MeshAsk, mla_deployments

    g = _graph("tiny-kimi-k3")
    got = mla_deployments(g, [Mesh(8), Mesh(4, pp=2), Mesh(1, pp=8), Mesh(4, replicas=2)], MeshAsk())
    assert [(m.tp, m.pp, m.cp, m.replicas) for m in got] == [
        (8, 1, 2, 1), (8, 1, 4, 1), (8, 1, 8, 1), (4, 2, 2, 1), (4, 2, 4, 1), (4, 1, 2, 2), (4, 1, 4, 2),
    ]  # fmt: skip
    assert mla_deployments(g, [Mesh(8), Mesh(4, pp=2)], MeshAsk(cp=8)) == [Mesh(8, cp=8)]
    with pytest.raises(TpplanError, match="has none"):
        mla_deployments(_graph("tiny-llama"), [Mesh(8)], MeshAsk())
    data = search_report("tiny-kimi-k3", "h200x8-ib400", nodes=1, tp=4, pp=1, cp=4, cp_layers="mla", top=2,
                         tokens=4096)  # fmt: skip
    assert data["search"]["deployments"] == ["TP4xCP4"]
    assert data["plans"] and all(p["cp"] == 4 for p in data["plans"])
    code, out, _ = run_cli(monkeypatch, capsys, "search", "--model", "tiny-kimi-k3", "--topology", "h200x8-ib400",
                           "--nodes", "1", "--tp", "4", "--pp", "1", "--cp", "4", "--cp-layers", "mla", "--top", "1",
                           "--json")  # fmt: skip
    assert code == 0 and json.loads(out)["cp_layers"] == "mla"
