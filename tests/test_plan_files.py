"""Plans as files (`tpplan search --save DIR`, any `--plan *.json`) and the TP x PP deployment grid."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tpplan.audit import audit_plan
from tpplan.cost.topology import load_topology
from tpplan.errors import TpplanError
from tpplan.layout.propagate import propagate_model
from tpplan.models.config import load_model
from tpplan.models.graph import build_model_graph
from tpplan.plans.decisions import exact_decisions
from tpplan.plans.files import Deployment, load_plan_file, plan_file_data, save_plan_dir
from tpplan.plans.named import make_plan
from tpplan.search import MeshAsk, deployments, run_search

SEARCH = ("--model", "tiny-kimi-k3", "--topology", "h200x8-ib400", "--nodes", "1", "--tp", "2", "--top", "3")


def tpplan(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tpplan", *args], capture_output=True, text=True, cwd=cwd)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    d = tmp_path_factory.mktemp("plans") / "found"
    js = d.parent / "search.json"
    r = tpplan("search", *SEARCH, "--save", str(d), "--json", str(js))
    assert r.returncode == 0, r.stderr
    return d, json.loads(js.read_text())


def test_save_writes_one_file_per_ranked_plan(saved):
    d, data = saved
    index = json.loads((d / "index.json").read_text())
    assert [e["file"] for e in index["plans"]] == [f"plan-{i}.json" for i in range(1, len(data["plans"]) + 1)]
    for entry, p in zip(data["plans"], index["plans"], strict=True):
        f = json.loads((d / p["file"]).read_text())
        assert f["schema_version"] == 1 and f["name"] == entry["name"]
        ep, moe = f["decisions"]["ep_size"], f["decisions"]["moe"]
        assert f["deployment"] == {"tp": 2, "pp": 1, "cp": 1, "replicas": 1, "ep": ep, "moe": moe, "cp_layers": "all",
                                   "cp_recurrence": "scan", "cp_kv": "engines", "router": None}  # fmt: skip
        assert f["found_for"]["model"] == "tiny-kimi-k3" and f["found_for"]["topology"] == "h200x8-ib400"
        assert f["found_for"]["rank"] == entry["rank"]


def test_audit_and_explain_take_the_file_and_agree_with_the_search(saved, tmp_path):
    d, data = saved
    best = data["plans"][0]
    out = tmp_path / "audit.json"
    r = tpplan("audit", "--model", "tiny-kimi-k3", "--tp", "2", "--plan", str(d / "plan-1.json"), "--json")
    assert r.returncode == 0, r.stderr
    audit = json.loads(r.stdout)
    plans = {p["name"]: p for p in audit["plans"]}
    assert best["name"] in plans
    got = plans[best["name"]]
    assert got["legal"] is True
    assert got["comm_bytes_per_token_per_rank"] == pytest.approx(best["comm_bytes_per_token_per_rank"])
    r = tpplan("explain", "--model", "tiny-kimi-k3", "--tp", "2", "--plan", str(d / "plan-1.json"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].startswith(best["name"])
    del out


def test_file_plan_has_the_searched_decisions(saved):
    d, data = saved
    graph = build_model_graph(load_model("tiny-kimi-k3"))
    plan = make_plan(str(d / "plan-1.json"), graph, 2)
    assert plan.describe() == data["plans"][0]["decisions"]
    pa = audit_plan(graph, plan, 2)
    assert pa.legal and pa.comm_bytes_per_token == pytest.approx(data["plans"][0]["comm_bytes_per_token_per_rank"])


def test_round_trip_of_a_named_plan_with_every_decision_kind(tmp_path):
    graph = build_model_graph(load_model("tiny-kimi-k3"))
    for name in (
        "gate-aware", "input-scattered+restore", "sp-moe", "sglang-sp-moe", "latent-scattered", "sequence-parallel+ep2",
    ):  # fmt: skip
        plan = make_plan(name, graph, 2)
        pf = plan_file_data(plan, graph, {"rank": 1}, Deployment(tp=2))
        path = tmp_path / f"{name}.json"
        path.write_text(pf.model_dump_json())
        back = load_plan_file(str(path), graph, 2)
        # every decision survives (Plan equality compares them all), its patterns as the exact ops they match
        assert back == exact_decisions(plan, graph), name
        assert not any(c in q for q in back.gather | back.replicate | back.token_shard for c in "*?["), name
        same = [r.comms for r in propagate_model(graph, back, 2).results] == [
            r.comms for r in propagate_model(graph, plan, 2).results
        ]
        assert same, name  # and means the same collectives


def test_a_file_for_another_architecture_exits_2(saved, tmp_path):
    d, _ = saved
    r = tpplan("audit", "--model", "tiny-llama", "--tp", "2", "--plan", str(d / "plan-1.json"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "gqa+dense" in r.stderr and "tiny-kimi-k3" in r.stderr
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    r = tpplan("audit", "--model", "tiny-kimi-k3", "--tp", "2", "--plan", str(bad))
    assert r.returncode == 2 and "malformed JSON" in r.stderr
    r = tpplan("audit", "--model", "tiny-kimi-k3", "--tp", "2", "--plan", str(tmp_path / "missing.json"))
    assert r.returncode == 2 and "no such file" in r.stderr
    # a decision naming an op this model lacks
    f = json.loads((d / "plan-1.json").read_text())
    f["decisions"]["replicate"] = ["mla+moe/mla.no_such_proj"]
    (tmp_path / "odd.json").write_text(json.dumps(f))
    r = tpplan("audit", "--model", "tiny-kimi-k3", "--tp", "2", "--plan", str(tmp_path / "odd.json"))
    assert r.returncode == 2 and "mla+moe/mla.no_such_proj" in r.stderr


def test_a_file_is_reusable_on_the_same_architecture_with_a_note(saved):
    d, _ = saved
    r = tpplan("audit", "--model", "kimi-k3", "--tp", "32", "--plan", str(d / "plan-1.json"), "--json")
    assert r.returncode == 0, r.stderr
    said = " ".join(r.stderr.split())  # wrapped at 100 columns, in a pipe too
    assert "found for tiny-kimi-k3 at TP2;" in said and "kimi-k3 at TP32" in said
    assert said.count("note: plan file") == 1 and max(map(len, r.stderr.splitlines())) <= 100
    assert len(json.loads(r.stdout)["plans"]) == 2  # baseline and the file's plan


def test_save_never_touches_a_directory_it_did_not_write(tmp_path):
    foreign = tmp_path / "notes"
    foreign.mkdir()
    (foreign / "mine.txt").write_text("keep me")
    r = tpplan("search", *SEARCH, "--save", str(foreign))
    assert r.returncode == 2 and "Traceback" not in r.stderr and "did not write" in r.stderr
    assert [p.name for p in foreign.iterdir()] == ["mine.txt"] and (foreign / "mine.txt").read_text() == "keep me"
    afile = tmp_path / "a-file"
    afile.write_text("x")
    r = tpplan("search", *SEARCH, "--save", str(afile))
    assert r.returncode == 2 and afile.read_text() == "x"


def test_save_replaces_only_its_own_earlier_output(tmp_path):
    graph = build_model_graph(load_model("tiny-kimi-k3"))
    files = [
        plan_file_data(make_plan(n, graph, 2), graph, {}, Deployment(tp=2))
        for n in ("baseline", "sp-moe", "gate-aware")
    ]
    d = tmp_path / "out"
    save_plan_dir(d, files)
    listed = [".tpplan-output", "index.json", "plan-1.json", "plan-2.json", "plan-3.json"]
    assert sorted(p.name for p in d.iterdir()) == listed
    save_plan_dir(d, files[:1])  # ours: rewritten, the plans it no longer ranks removed
    assert sorted(p.name for p in d.iterdir()) == [".tpplan-output", "index.json", "plan-1.json"]
    (d / "added-by-user.txt").write_text("mine")
    with pytest.raises(TpplanError, match="did not write"):
        save_plan_dir(d, files)
    assert (d / "added-by-user.txt").read_text() == "mine" and not (d / "plan-2.json").exists()


@pytest.mark.slow
def test_verify_runs_the_saved_best_plan_on_cpu(saved):
    pytest.importorskip("torch")
    d, _ = saved
    best = str(d / "plan-1.json")
    r = tpplan("verify", "--model", "tiny-kimi-k3", "--tp", "2", "--plan", best, "--tokens", "32", "--chunk", "16")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "all passed: 1/1 plans" in r.stdout


def test_deployment_grid():
    k3 = build_model_graph(load_model("kimi-k3"))
    topo = load_topology("h200x8-ib400")  # 4 nodes x 8
    splits = [(32, 1, 1), (16, 2, 1), (8, 4, 1), (4, 8, 1), (2, 16, 1), (1, 32, 1)]
    assert deployments(k3, topo, MeshAsk()) == [*splits, (8, 1, 4), (4, 1, 8)]  # + TP x CP, TP in one node
    assert deployments(k3, topo, MeshAsk(pp=4)) == [(8, 4, 1)]
    assert deployments(k3, topo, MeshAsk(tp=8)) == [(8, 1, 1)]
    assert deployments(k3, topo, MeshAsk(cp=4)) == [(8, 1, 4), (4, 2, 4), (2, 4, 4), (1, 8, 4)]
    assert deployments(k3, topo, MeshAsk(tp=8, cp=2)) == [(8, 1, 2)]
    # 24 GPUs: TP12 would span one and a half nodes, so it is not a split (TP12 x CP2: TP over a node)
    three = [(24, 1, 1), (8, 3, 1), (6, 4, 1), (4, 6, 1), (3, 8, 1), (2, 12, 1), (1, 24, 1), (6, 1, 4), (3, 1, 8)]
    assert deployments(k3, topo.with_nodes(3), MeshAsk()) == three
    assert deployments(k3, None, MeshAsk(tp=4)) == [(4, 1, 1)]
    dsa = build_model_graph(load_model("deepseek-v3.2"))  # DSA's indexer has no CP method: no CP splits
    assert all(c == 1 for _, _, c in deployments(dsa, topo, MeshAsk()))
    with pytest.raises(TpplanError, match="no context-parallel method"):
        deployments(dsa, topo, MeshAsk(cp=2))
    with pytest.raises(TpplanError, match="only 32 GPUs"):
        deployments(k3, topo, MeshAsk(tp=16, pp=4))


def test_grid_ranks_every_deployment_by_predicted_time():
    """tiny-kimi-k3 on one 8-GPU node: every split is searched, and no deployment's best plan (searched
    alone with --tp/--pp) beats the grid's first."""
    from tpplan.search import search_report

    common = {"nodes": 1, "workload": "seed-c8", "top": 3}
    grid = search_report("tiny-kimi-k3", "h200x8-ib400", replicas="all", **common)
    # PP8 > its 6 layers; then TP x CP for CP 2, 4, 8; then 2, 4 and 8 replicas of the splits of 4, 2, 1 GPUs
    assert grid["search"]["deployments"] == [
        "TP8", "TP4xPP2", "TP2xPP4", "TP4xCP2", "TP2xCP4", "TP1xCP8",
        "2x TP4", "2x TP2xPP2", "2x TP1xPP4", "2x TP2xCP2", "2x TP1xCP4", "4x TP2", "4x TP1xPP2", "4x TP1xCP2",
        "8x TP1",
    ]  # fmt: skip
    best = grid["plans"][0]
    assert [p["score"] for p in grid["plans"]] == sorted(p["score"] for p in grid["plans"])
    skipped = {e["deployment"]: e["why"] for e in grid["search"]["skipped"]}
    assert "4 heads cannot be split evenly over 8 ranks" in skipped["TP8"]  # the model splits over 4 at most
    import re

    for label in set(grid["search"]["deployments"]) - set(skipped):
        r, tp, cp, pp = re.fullmatch(r"(?:(\d+)x )?TP(\d+)(?:xCP(\d+))?(?:xPP(\d+))?", label).groups()
        alone = search_report("tiny-kimi-k3", "h200x8-ib400", tp=int(tp), pp=int(pp or 1), cp=int(cp or 1),
                              replicas=int(r or 1), **common)  # fmt: skip
        assert alone["plans"][0]["score"] >= best["score"] - 1e-12, label
        assert alone["plans"][0]["ttft"]["mean_s"] == pytest.approx(alone["plans"][0]["score"])


def test_memory_cap_defaults_to_the_serving_share_of_the_gpu():
    """Llama-3-70B at TP1 does not fit one H200 (bf16 weights alone are ~131 GiB, plus KV and head):
    by default (90% of the GPU) nothing is ranked; with the cap lifted the same search ranks plans."""
    from tpplan.search.ranking import SERVING_SHARE

    capped = run_search("llama-3-70b", "h200x8-ib400", tp=1, nodes=1, workload="seed-c8", top=2).data
    gpu = load_topology("h200x8-ib400").gpu.memory_GiB * 2**30
    assert capped["memory_cap_bytes"] == pytest.approx(SERVING_SHARE * gpu)
    assert capped["baseline"]["memory_bytes_per_rank"]["total"] > gpu
    assert capped["plans"] == []
    free = run_search("llama-3-70b", "h200x8-ib400", tp=1, nodes=1, workload="seed-c8", top=2, memory_cap_gib=None)
    assert free.data["memory_cap_bytes"] is None and free.data["plans"]
    assert all(p["memory_bytes_per_rank"]["total"] > gpu for p in free.data["plans"])


def test_the_note_names_the_pipeline_stages_the_file_was_found_at(saved, tmp_path):
    d, _ = saved
    f = json.loads((d / "plan-1.json").read_text())
    f["deployment"]["pp"] = 2
    (tmp_path / "pp.json").write_text(json.dumps(f))
    r = tpplan("audit", "--model", "kimi-k3", "--tp", "32", "--plan", str(tmp_path / "pp.json"), "--json")
    assert r.returncode == 0, r.stderr
    assert "found for tiny-kimi-k3 at TP2 x PP2;" in " ".join(r.stderr.split())


# -- decisions checked against the model's real ops (issue 35) ---------------------------------


@pytest.fixture(scope="module")
def sp_file() -> dict:
    graph = build_model_graph(load_model("tiny-kimi-k3"))
    return json.loads(
        plan_file_data(make_plan("sequence-parallel", graph, 2), graph, {}, Deployment(tp=2)).model_dump_json()
    )


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("gather", ["*"], r"decisions\.gather\[0\]: '\*' is a pattern.*Fix: list the \d+ op\(s\) it matches"),
        ("gather", ["abc"], r"decisions\.gather\[0\]: 'abc' is not a qualified op name"),
        ("gather", [""], r"decisions\.gather\[0\]: '' is not a qualified op name"),
        ("a2a", ["P"], r"decisions\.a2a\[0\]: 'P' is not a qualified op name"),
        ("replicate", ["S(col)"], r"decisions\.replicate\[0\]: 'S\(col\)' is not a qualified op name"),
        ("replicate", ["mla"], r"is not a qualified op name"),
        ("gather", ["kda+dense/kda.q_prj"], r"has no op 'kda\.q_prj'.*did you mean kda\+dense/kda\.q_proj"),
        ("gather", ["gqa+dense/gqa.q_proj"], r"names layer kind 'gqa\+dense', which model tiny-kimi-k3 does not"),
        ("replicate", ["kda+dense/layer.attn_add"], r"is not an op with a weight.*Fix: drop it from"),
        ("fold", ["kda+dense/kda.q_proj"], r"decisions\.fold\[0\]: 'kda\+dense/kda\.q_proj' is not a residual add"),
        ("gather", ["kda+dense/layer.bank"], r"moves K3's attention-residual bank.*decisions\.bank"),
        ("a2a", ["kda+dense/layer.attn_in"], r"decisions\.a2a: 'kda\+dense/layer\.attn_in' is in both gather and a2a"),
        (
            "gather_for",
            [["kda+dense/kda.q_proj", "kda+dense/dense.down_proj"]],
            r"gather_for\[0\]: 'kda\+dense/dense\.down_proj' does not read the output of 'kda\+dense/kda\.q_proj'",
        ),
    ],
)
def test_a_decision_naming_no_real_op_is_refused(sp_file, tmp_path, field, value, says):
    """Each of these was silently ignored (or, `*`, called legal and computed wrong): now exit 2, one line."""
    graph = build_model_graph(load_model("tiny-kimi-k3"))
    data = json.loads(json.dumps(sp_file))
    data["decisions"][field] = value
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    with pytest.raises(TpplanError, match=says) as err:
        load_plan_file(str(path), graph, 2)
    assert str(err.value).startswith(f"--plan {path}: decisions.{field}")


def test_a_wildcard_gather_exits_2_on_the_command_line(sp_file, tmp_path):
    from cli_helpers import run_captured

    data = json.loads(json.dumps(sp_file))
    data["decisions"]["gather"] = ["*"]
    path = tmp_path / "star.json"
    path.write_text(json.dumps(data))
    code, out, err = run_captured("audit", "--model", "tiny-kimi-k3", "--tp", "2", "--plan", str(path))
    assert code == 2 and not out and len(err.strip().splitlines()) == 1, err
    assert "decisions.gather[0]" in err and "is a pattern" in err


def test_a_bank_on_a_model_without_one_and_a_huge_name_are_refused_briefly(tmp_path):
    graph = build_model_graph(load_model("tiny-llama"))
    data = json.loads(plan_file_data(make_plan("baseline", graph, 2), graph, {}, Deployment(tp=2)).model_dump_json())
    data["decisions"]["bank"] = "R"
    path = tmp_path / "bank.json"
    path.write_text(json.dumps(data))
    with pytest.raises(TpplanError, match=r"decisions\.bank: model tiny-llama has no attention-residual bank"):
        load_plan_file(str(path), graph, 2)
    data["decisions"].update(bank=None, gather=["x" * 1_500_000])
    path.write_text(json.dumps(data))
    with pytest.raises(TpplanError, match=r"1,500,002 characters") as err:
        load_plan_file(str(path), graph, 2)
    assert len(str(err.value)) < 600  # the bad value is quoted cut short, never whole


def test_the_file_deployment_converts_to_and_from_the_mesh_at_the_edge():
    """`Deployment.from_mesh` / `to_mesh`: the planner's Mesh in, the same Mesh out, the file's fields as before."""
    from tpplan.mesh import Mesh

    m = Mesh(
        8, pp=2, replicas=2, cp=4, cp_recurrence="serial", cp_layers="mla", cp_kv="sharded", router="dp:total_requests"
    )
    dep = Deployment.from_mesh(m)
    assert dep.to_mesh() == m
    assert dep.model_dump() == {"tp": 8, "pp": 2, "cp": 4, "replicas": 2, "ep": None, "moe": "tp", "cp_layers": "mla",
                                "cp_recurrence": "serial", "cp_kv": "sharded",
                                "router": "dp:total_requests"}  # fmt: skip
    assert dep.label() == "2x TP8xCP4xPP2 (cp-layers mla)"
    assert Deployment(tp=8, ep=2).to_mesh() == Mesh(8, ep=2)
