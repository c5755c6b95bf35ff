"""Redundant experts under EP (issue 32): physical = logical + redundant experts over the EP group, each rank
holding physical / EP of them (SGLang `ExpertLocationMetadata._init_common`, vLLM `determine_expert_counts`),
worked by hand on a tiny DeepSeek-V3 whose 6 routed experts do not divide over 4 ranks."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.cli_helpers import run_cli
from tpplan.engines import Launch
from tpplan.engines.recipes import recipes
from tpplan.engines.redundant_experts import SOURCES, with_redundant_experts
from tpplan.errors import TpplanError
from tpplan.layout.propagate import propagate_model
from tpplan.lower.shapes import expert_share
from tpplan.mesh import Mesh
from tpplan.models.config import load_model
from tpplan.models.graph import ModelGraph, build_model_graph
from tpplan.plans.named import make_plan

PRESET = Path(__file__).resolve().parents[2] / "tpplan" / "models" / "presets" / "tiny-deepseek-v3.json"


@pytest.fixture(scope="module")
def six_experts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny-deepseek-v3 with 6 routed experts (top-2): 6 do not divide over 4 ranks, 6 + 2 = 8 do."""
    cfg = json.loads(PRESET.read_text(encoding="utf-8"))
    cfg["n_routed_experts"] = 6
    cfg.pop("n_group", None), cfg.pop("topk_group", None)  # group-limited routing would need 6 % groups
    path = tmp_path_factory.mktemp("six") / "config.json"
    path.write_text(json.dumps(cfg), encoding="utf-8")
    return path


def _experts(graph: ModelGraph, plan_name: str, n: int) -> tuple[object, object]:
    """The last MoE layer's routed-experts decision under `plan_name` at TP `n`, and the plan."""
    plan = make_plan(plan_name, graph, n)
    res = next(r for r in reversed(propagate_model(graph, plan, n).results) if "moe" in r.kind)
    return next(d for d in res.decisions if d.op.name == "experts"), plan


def test_redundant_experts_make_an_ep_size_valid_and_take_their_memory(six_experts: Path) -> None:
    graph = build_model_graph(load_model(str(six_experts)))
    with pytest.raises(TpplanError, match=r"6 experts do not divide over 4 ranks.*\+redundant2"):
        _experts(graph, "dp-attention+a2a", 4)
    d, plan = _experts(graph, "dp-attention+a2a+redundant2", 4)
    numel = d.op.weight_numel  # every logical expert's gate/up/down, 6 of them
    assert numel % 6 == 0
    # 8 physical experts over 4 ranks: 2 whole experts a rank, a third of the logical set's weights (not a quarter)
    assert d.weight_elements_per_rank == 2 * numel // 6
    tokens, k = 40, d.op.int_attr("top_k")
    experts, inter, rows = expert_share(d, tokens, 4, plan)
    assert (experts, inter) == (2, d.op.int_attr("intermediate"))
    assert rows == pytest.approx(tokens * k / 4)  # the rank's routed rows, spread over its 2 physical experts


def test_ep_plans_count_the_physical_experts_over_their_ep_size(six_experts: Path) -> None:
    graph = build_model_graph(load_model(str(six_experts)))
    with pytest.raises(TpplanError, match="6 experts"):
        _experts(graph, "vllm-dp-ep", 4)
    d, plan = _experts(graph, "vllm-dp-ep+redundant6", 4)  # 12 physical experts, EP 4: 3 a rank
    assert d.weight_elements_per_rank == 3 * d.op.weight_numel // 6
    assert expert_share(d, 8, 4, plan)[0] == 3
    assert plan.describe()["redundant_experts"] == 6 and plan.name == "vllm-dp-ep+redundant6"


def test_no_redundant_experts_changes_nothing() -> None:
    graph = build_model_graph(load_model("tiny-deepseek-v3"))
    d, plan = _experts(graph, "dp-attention+a2a", 4)
    assert plan.redundant_experts == 0 and "redundant_experts" not in plan.describe()
    assert d.weight_elements_per_rank == math.ceil(d.op.weight_numel / 4)
    assert with_redundant_experts(plan, 0) is plan


def test_a_tp_moe_plan_or_a_second_count_is_refused_in_one_line() -> None:
    graph = build_model_graph(load_model("tiny-deepseek-v3"))
    with pytest.raises(TpplanError, match="splits the experts by TP"):
        make_plan("sequence-parallel+redundant4", graph, 4)
    with pytest.raises(TpplanError, match="already has 4 redundant experts"):
        make_plan("sp-moe+redundant4+redundant4", graph, 4)


def test_launch_lines_carry_each_engines_flags(six_experts: Path) -> None:
    graph = build_model_graph(load_model(str(six_experts)))
    by = {
        (name, r.engine): r
        for name in ("dp-attention+a2a+redundant2", "vllm-dp-ep+redundant2")
        for r in recipes(make_plan(name, graph, 4), Launch(graph.spec, Mesh(4), gpu="H100"))
    }
    sglang = by["dp-attention+a2a+redundant2", "SGLang"]
    assert sglang.realises == "yes" and {"--ep-num-redundant-experts 2", "--enable-eplb"} <= set(sglang.args)
    vllm = by["vllm-dp-ep+redundant2", "vLLM"]
    assert vllm.realises == "yes" and "--eplb-config '{\"num_redundant_experts\": 2}'" in vllm.args
    assert "--enable-eplb" in vllm.args
    assert all(s.read and s.ref.endswith("(PyPI wheel)") for s in SOURCES)


def test_the_audit_flag(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], six_experts: Path) -> None:
    args = ("audit", "--model", str(six_experts), "--tp", "4", "--json", "-")
    code, out, err = run_cli(
        monkeypatch, capsys, *args, "--plan", "dp-attention+a2a", "--ep-num-redundant-experts", "2"
    )
    assert code == 0, err
    plans = {p["name"]: p for p in json.loads(out)["plans"]}
    assert plans["dp-attention+a2a+redundant2"]["decisions"]["redundant_experts"] == 2
    code, out, err = run_cli(monkeypatch, capsys, *args, "--ep-num-redundant-experts", "2")
    assert code == 2 and not out and len(err.strip().splitlines()) == 1 and "--plan" in err
    code, _, err = run_cli(monkeypatch, capsys, *args, "--plan", "dp-attention+a2a", "--ep-num-redundant-experts", "-1")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--ep-num-redundant-experts" in err


def test_tpplans_runtime_refuses_redundant_copies_it_does_not_hold(six_experts: Path) -> None:
    pytest.importorskip("torch")
    from tpplan.runtime.shard import shard_model

    graph = build_model_graph(load_model(str(six_experts)))
    plan = make_plan("dp-attention+a2a+redundant2", graph, 4)
    with pytest.raises(TpplanError, match="does not hold redundant expert copies"):
        shard_model(graph, [], 4, 0, None, None, plan=plan)  # type: ignore[arg-type]  # refused before use
