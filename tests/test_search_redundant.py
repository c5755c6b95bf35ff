"""`search --ep-num-redundant-experts r` (issue 32): the search's EP and all-to-all plans hold r redundant experts
(`Plan.redundant_experts`), an EP size that divides experts + r but not the experts becomes searchable, and the
search prices each plan's physical experts per rank exactly as `predict_plan` does."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tpplan.audit import audit_plan
from tpplan.cost.predict import predict_plan
from tpplan.cost.pricing import Pricer
from tpplan.cost.topology import load_topology
from tpplan.mesh import Mesh
from tpplan.models.config import load_model
from tpplan.models.graph import build_model_graph
from tpplan.search import PredictObjective, SpaceOptions, global_choices, search

PRESETS = Path(__file__).resolve().parents[1] / "tpplan" / "models" / "presets"


def six_expert_graph(tmp_path: Path):
    """tiny-qwen3-moe with 6 routed experts: they do not divide over 4 ranks, 6 + 2 do."""
    cfg = json.loads((PRESETS / "tiny-qwen3-moe.json").read_text())
    cfg["num_experts"] = 6
    path = tmp_path / "six-experts.json"
    path.write_text(json.dumps(cfg))
    return build_model_graph(load_model(str(path)))


def close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


def test_redundant_experts_make_an_ep_size_searchable(tmp_path):
    graph = six_expert_graph(tmp_path)
    without = {(g.moe, g.ep_size) for g in global_choices(graph, 4)}
    with_two = global_choices(graph, 4, redundant_experts=2)
    assert ("a2a", None) not in without and ("ep", 4) not in without
    assert {("a2a", None), ("ep", 4)} <= {(g.moe, g.ep_size) for g in with_two}
    assert all(g.redundant_experts == (0 if g.moe == "tp" else 2) for g in with_two)


@pytest.mark.parametrize(("model", "n", "r"), [("six", 4, 2), ("tiny-kimi-k3", 2, 4)])
def test_search_with_redundant_experts_equals_predict_plan(tmp_path, model, n, r):
    """Every plan the search returns with redundant experts scores predict_plan's forward time of that plan,
    and its memory is what predict counts beside activations: physical experts per rank, priced alike."""
    graph = six_expert_graph(tmp_path) if model == "six" else build_model_graph(load_model(model))
    topo = load_topology("h200x8-ib400").with_nodes(1)
    obj = PredictObjective(Pricer(graph, topo, Mesh(n)), tokens=4096)
    res = search(graph, n, obj, top=8, per_family=True, options=SpaceOptions(redundant_experts=r))
    moe = [c for c in res.candidates if c.plan.moe != "tp"]
    assert moe and all(c.plan.redundant_experts == r for c in moe)
    assert {c.plan.moe for c in moe} == {"a2a", "ep"}
    for c in res.candidates:
        assert audit_plan(graph, c.plan, n).legal
        pr = predict_plan(graph, c.plan, topo, mesh=Mesh(n), tokens=4096)
        assert close(c.score, pr.forward_s), (c.plan.name, c.score, pr.forward_s)
        assert close(c.memory, pr.memory.total - pr.memory.activations), (c.plan.name, c.memory, pr.memory)


def test_redundant_copies_cost_weight_and_time(tmp_path):
    """The same all-to-all plan with 4 more physical experts holds more expert weight per rank (a test that the
    copies are priced, not dropped): 12 experts over 2 ranks against 8."""
    graph = build_model_graph(load_model("tiny-kimi-k3"))
    topo = load_topology("h200x8-ib400").with_nodes(1)
    obj = PredictObjective(Pricer(graph, topo, Mesh(2)), tokens=4096)

    def best_a2a(r: int):
        res = search(graph, 2, obj, top=8, per_family=True, options=SpaceOptions(redundant_experts=r))
        return min((c for c in res.candidates if c.plan.moe == "a2a"), key=lambda c: c.score)

    plain, copies = best_a2a(0), best_a2a(4)
    assert copies.memory > plain.memory


def test_plan_file_keeps_redundant_experts(tmp_path):
    """`search --save` writes the copies into the plan file and `--plan FILE` reads them back; a file without
    copies has no such field (files read as before)."""
    from tpplan.plans.files import Deployment, load_plan_file, plan_file_data
    from tpplan.plans.named import make_plan

    graph = build_model_graph(load_model("tiny-kimi-k3"))
    for name, r in (("sp-moe+redundant4", 4), ("sp-moe", 0)):
        text = plan_file_data(make_plan(name, graph, 2), graph, {}, Deployment(tp=2)).model_dump_json()
        assert ("redundant_experts" in text) == bool(r)
        path = tmp_path / f"{r}.json"
        path.write_text(text)
        assert load_plan_file(str(path), graph, 2).redundant_experts == r


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tpplan", "search", *args], capture_output=True, text=True)


@pytest.mark.slow
def test_cli_search_with_redundant_experts(tmp_path):
    common = ("--model", "tiny-kimi-k3", "--topology", "h200x8-ib400-datasheet", "--nodes", "1", "--tp", "2")
    r = run(*common, "--ep-num-redundant-experts", "4", "--json", "-")
    assert r.returncode == 0, r.stderr
    plans = json.loads(r.stdout)["plans"]
    assert any("redundant4" in p["name"] for p in plans)


def test_cli_redundant_experts_bad_input_one_line():
    r = run("--model", "tiny-llama", "--tp", "2", "--objective", "volume", "--ep-num-redundant-experts", "2")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "--ep-num-redundant-experts 2" in r.stderr and "no routed experts" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
