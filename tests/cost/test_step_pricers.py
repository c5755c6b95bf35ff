"""The two step pricers and the predictor that composes them (issue 30, "cost = pricers over steps"):
a kernel step priced by `KernelPricer`, a collective step by `CollectivePricer`, each built on its own from
typed arguments, give the predictor's prices; the predictor's caches are keyed on values, so a layer's
price never depends on which object holds its propagation; and the search's `Pricer` prices lowered
fragments with the same pricers, so a new pass reaches both."""

import copy
from dataclasses import replace

import pytest

from tpplan.cost.collective_pricer import CollectivePricer
from tpplan.cost.kernel_pricer import KernelPricer
from tpplan.cost.pipeline import pipeline_model
from tpplan.cost.predict import predict_plan
from tpplan.cost.predictor import Predictor, cached_predictor
from tpplan.cost.pricing import Pricer
from tpplan.cost.segments import batch_pairs
from tpplan.cost.topology import load_topology
from tpplan.lower import LayerProgram, Lowering, Pass, added
from tpplan.mesh import Mesh
from tpplan.models.config import load_model
from tpplan.models.graph import build_model_graph
from tpplan.plans.named import baseline, make_plan

SEGS = ((512, 0), (256, 128))


@pytest.fixture(scope="module")
def qwen():
    return build_model_graph(load_model("tiny-qwen3"))


@pytest.fixture(scope="module")
def topo():
    return load_topology("h200x8-ib400")


def test_the_step_pricers_alone_price_the_program_as_the_predictor_does(qwen, topo) -> None:
    plan = make_plan("sequence-parallel", qwen, 2)
    p = Predictor(qwen, plan, topo, Mesh(2), "bf16", None)
    kernels = KernelPricer(qwen, topo, Mesh(2), "bf16", None)
    comms = CollectivePricer(topo, "bf16", pipeline_model())
    res = p.audit.layer_results[0]
    layer, ctx = p.lowered(res, SEGS)
    t, pairs, cached = batch_pairs(ctx.local_segments)
    lg = qwen.kinds[res.kind]
    kt = p.kind_time(res, SEGS)
    by_op = {o.op: o for o in kt.ops}
    assert layer.kernels() and layer.collectives()
    for call in layer.kernels():
        assert kernels.price(lg, call, t, pairs, cached, ctx.local_segments) == by_op[call.op]
    priced = [comms.collective(res.kind, c) for c in layer.collectives() if c.priced]
    assert priced == kt.collectives and all(c.seconds > 0 for c in priced)


def test_a_layer_is_priced_by_its_propagation_s_value_not_its_identity(qwen, topo) -> None:
    p = Predictor(qwen, make_plan("baseline", qwen, 2), topo, Mesh(2), "bf16", None)
    res = p.audit.layer_results[0]
    kt = p.kind_time(res, SEGS)
    assert p.kind_time(copy.deepcopy(res), SEGS) is kt  # an equal copy: the same cached price
    bare = p.kind_time(replace(res, comms=[]), SEGS)  # a different propagation: lowered and priced on its own
    assert kt.collectives and not bare.collectives
    assert [o.op for o in bare.ops] == [o.op for o in kt.ops]


def test_cached_predictor_compares_graph_and_topology_by_value(qwen, topo) -> None:
    plan = make_plan("baseline", qwen, 2)
    p = cached_predictor(qwen, plan, topo, Mesh(2), "bf16", None)
    assert cached_predictor(copy.deepcopy(qwen), plan, topo.model_copy(deep=True), Mesh(2), "bf16", None) is p
    half_hbm = topo.gpu.model_copy(update={"hbm_TBps": topo.gpu.hbm_TBps / 2})
    slower = topo.model_copy(update={"gpu": half_hbm})  # the same name, another GPU
    q = cached_predictor(qwen, plan, slower, Mesh(2), "bf16", None)
    assert q is not p and q.topo is slower
    assert q.kernels.hbm == p.kernels.hbm / 2  # priced on the GPU asked for, not the cached one


def _o_proj_twice(ctx: Lowering, layer: LayerProgram) -> LayerProgram:
    """A toy rewrite: o_proj's kernel run a second time (as CP's extra passes are listed)."""
    rec = next((k for k in layer.kernels() if k.op == "o_proj" and k.repeat_of is None), None)
    if rec is None:
        return layer
    again = replace(rec, op="o_proj:again", repeat_of="o_proj", times=1, origin="toy")
    return replace(layer, steps=(*layer.steps, again))


def test_the_search_prices_a_decision_through_every_registered_pass() -> None:
    """The search's prices are the lowered fragment's: a pass registered later reaches `Pricer.op_time`
    and `predict_plan` alike, with no edit to either."""
    graph = build_model_graph(load_model("tiny-llama"))
    topo = load_topology("h200x2")
    pricer = Pricer(graph, topo, Mesh(2))
    res = pricer.baseline_audit.layer_results[0]
    lg, d = graph.kinds[res.kind], next(d for d in res.decisions if d.op.name == "o_proj")
    once = pricer.op_time(lg, d, SEGS)
    before = predict_plan(graph, baseline(), topo, mesh=Mesh(2), tokens=768)
    with added(Pass("toy_twice", 45, "o_proj run twice (test only)", _o_proj_twice)):
        twice = pricer.op_time(lg, d, SEGS)
        after = predict_plan(graph, baseline(), topo, mesh=Mesh(2), tokens=768)
    assert once.seconds > 0 and twice.seconds == pytest.approx(2 * once.seconds, rel=1e-12)
    (kind,) = after.kinds
    again = next(o for o in kind.ops if o.op == "o_proj:again")
    assert after.forward_s == pytest.approx(before.forward_s + kind.count * again.seconds, rel=1e-9)
