"""A new rewrite is one lowering-pass module: a toy pass, registered here for one test, inserts a
collective after each layer's attention output projection (a "checksum" all-reduce of 8 columns per
token over the TP group). With no edit anywhere else, the cost model prices it, `tpplan audit`'s
prediction lists it, and the runtime's expected trace (`predict_schedule`) expects its calls."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from cli_helpers import run_cli

from tpplan.cost.predict import predict_plan
from tpplan.cost.topology import load_topology
from tpplan.layout.schedule import bytes_by_kind, ring_sent_bytes
from tpplan.lower import Collective, LayerProgram, Lowering, Pass, added
from tpplan.lower.schedule import predict_schedule
from tpplan.mesh import Mesh
from tpplan.models.config import load_model
from tpplan.models.graph import build_model_graph
from tpplan.plans.named import make_plan

WIDTH = 8
LABEL = f"AR toy_checksum[{WIDTH}]"


def _checksum(ctx: Lowering, layer: LayerProgram) -> LayerProgram:
    """The toy rewrite: an all-reduce of a [T, 8] checksum right after o_proj, on the TP group."""
    n, t = ctx.tp, ctx.tokens
    nbytes = t * WIDTH * ctx.elem_bytes
    sent = ring_sent_bytes("all_reduce", nbytes, n)
    step = Collective("all_reduce", "toy_checksum", LABEL, "attn_side", "tp", n, ctx.ranks_per_node, (t, WIDTH),
                      ctx.act, nbytes, sent, float(nbytes), origin="toy")  # fmt: skip
    return layer.with_after("o_proj", [step])


TOY = Pass("toy_checksum", 35, "a checksum all-reduce after o_proj (test only)", _checksum)


def test_the_cost_model_prices_the_toy_step() -> None:
    graph = build_model_graph(load_model("tiny-llama"))
    plan = make_plan("baseline", graph, 2)
    topo = load_topology("h200x2")
    before = predict_plan(graph, plan, topo, mesh=Mesh(2), tokens=256)
    with added(TOY):
        after = predict_plan(graph, plan, topo, mesh=Mesh(2), tokens=256)
    (kind,) = after.kinds
    toy = [c for c in kind.collectives if c.label == LABEL]
    assert len(toy) == 1 and toy[0].nbytes == 256 * WIDTH * 2 and toy[0].seconds > 0
    assert after.forward_s == pytest.approx(before.forward_s + kind.count * toy[0].seconds, rel=1e-9)
    assert not [c for k in before.kinds for c in k.collectives if c.label == LABEL]


def test_the_audits_prediction_lists_the_toy_step(monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    args = ("audit", "-m", "tiny-llama", "--tp", "2", "-t", "h200x2", "--plan", "baseline", "--json", "-")
    with added(TOY):
        code, out, _ = run_cli(monkeypatch, capsys, *args)
    assert code == 0
    (plan,) = json.loads(out)["plans"]
    colls = [c["label"] for k in plan["prediction"]["layer_kinds"].values() for c in k["collectives"]]
    assert LABEL in colls
    code, out, _ = run_cli(monkeypatch, capsys, *args)
    (plan,) = json.loads(out)["plans"]
    assert LABEL not in [c["label"] for k in plan["prediction"]["layer_kinds"].values() for c in k["collectives"]]


def test_the_runtimes_expected_trace_expects_the_toy_calls() -> None:
    graph = build_model_graph(load_model("tiny-llama"))
    plan = make_plan("sequence-parallel", graph, 2)
    before = [c for s in predict_schedule(graph, plan, 2, 10, chunk=5) for c in s.calls]
    with added(TOY):
        after = [c for s in predict_schedule(graph, plan, 2, 10, chunk=5) for c in s.calls]
    toy = [c for c in after if c.value == "toy_checksum"]
    assert len(toy) == 2 * graph.spec.num_layers and {c.shape for c in toy} == {(5, WIDTH)}
    assert [c for c in after if c.value != "toy_checksum"] == before
    n_ar, sent = bytes_by_kind(after)["all_reduce"]
    n0, sent0 = bytes_by_kind(before).get("all_reduce", (0, 0.0))
    assert n_ar - n0 == len(toy) and sent - sent0 == pytest.approx(len(toy) * 5 * WIDTH * 4 * (2 * 1 / 2))
    o_proj = next(i for i, s in enumerate(_layer0(graph, plan).steps) if getattr(s, "op", None) == "o_proj")
    with added(TOY):
        steps = _layer0(graph, plan).steps
    assert isinstance(steps[o_proj + 1], Collective) and steps[o_proj + 1].value == "toy_checksum"
    assert math.isclose(toy[0].sent_bytes, ring_sent_bytes("all_reduce", toy[0].bytes, 2))


def _layer0(graph, plan) -> LayerProgram:  # type: ignore[no-untyped-def]
    from tpplan.lower import Batch, lower

    return lower(graph, plan, Mesh(2), Batch(((5, 0),), "float32")).layers[0]


def _checksum_first(ctx: Lowering, layer: LayerProgram) -> LayerProgram:
    """The toy collective at the head of each layer, ahead of every planned one."""
    (step,) = [s for s in _checksum(ctx, layer).steps if isinstance(s, Collective) and s.value == "toy_checksum"]
    return replace(layer, steps=(step, *layer.steps))


@pytest.mark.parametrize("plan_name", ["sequence-parallel+asynctp", "sequence-parallel"])
def test_a_step_ahead_of_the_planned_ones_shifts_no_other_price(plan_name: str) -> None:
    """A pass that puts its step first changes the layer's price by that step alone: the async-TP pairs
    find their GEMMs and collectives by name, not by position."""
    graph = build_model_graph(load_model("tiny-llama"))
    plan = make_plan(plan_name, graph, 2)
    topo = load_topology("h200x2")
    before = predict_plan(graph, plan, topo, mesh=Mesh(2), tokens=512)
    with added(Pass("toy_first", 35, "a checksum all-reduce heading each layer (test only)", _checksum_first)):
        after = predict_plan(graph, plan, topo, mesh=Mesh(2), tokens=512)
    (kind,) = after.kinds
    toy = next(c for c in kind.collectives if c.label == LABEL)
    assert kind.collectives[0] is toy
    assert after.forward_s == pytest.approx(before.forward_s + kind.count * toy.seconds, rel=1e-9)
