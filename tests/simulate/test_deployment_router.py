"""One request router per deployment (`tpplan.engines.routing`): chosen once from the engine release's records,
started by the launch lines and run by the serving loop, and audit's TTFT over replicas taken through it."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from tests.cli_helpers import run_cli
from tpplan.cost.pipeline import pipeline_model
from tpplan.engines import ENGINES, Launch, select_pair
from tpplan.engines.recipes import recipes
from tpplan.engines.routing import replica_router, replica_routers
from tpplan.errors import TpplanError
from tpplan.mesh import Mesh
from tpplan.models.config import load_model
from tpplan.plans.named import baseline
from tpplan.simulate.engine import engine_loop
from tpplan.simulate.loop import LoopConfig
from tpplan.simulate.replicas import simulate
from tpplan.simulate.requests import Request, Timed


def steps_of(segs):
    return [sum(n for n, _ in segs) / 100]


def test_the_releases_routers_are_read_and_the_defaults_are_the_engines():
    assert replica_router("sglang@0.5.23").name == "dp:round_robin"
    assert replica_router("vllm@0.34.0").name == "dp:least_loaded"
    assert replica_router("sglang@main@7665ff96") is None  # none read: the loop assumes round-robin
    for key in ("sglang@0.5.23", "vllm@0.34.0"):
        assert all(f.source.read for r in replica_routers(key) for f in r.rule.facts)
    sgl = ENGINES["sglang@0.5.23"].scheduling
    assert sgl is not None and [r.name for r in sgl.replica_routers][:2] == ["dp:round_robin", "dp:total_requests"]


def test_a_router_the_release_lacks_is_refused_naming_its_routers():
    with pytest.raises(TpplanError) as e:
        replica_router("vllm@0.34.0", "sglang-router:cache_aware")
    assert e.value.where == "router=sglang-router:cache_aware" and "dp:least_loaded" in e.value.fix


def test_three_routers_three_ttfts_by_hand():
    """Two replicas, 1 s per 100 tokens: 400 and 100 tokens at t = 0, 100 at 1.5 s and 1.6 s.
    Round-robin: the third goes behind the 400-token prompt (replica 0 busy to 4 s): 4, 1, 3.5, 1.
    SGLang's total_requests (fewest in flight, ties to the lowest): the third to the idle replica 1 (1 s), the
    fourth at loads [1, 1] to replica 0, behind the long prompt: 4, 1, 1, 3.4.
    vLLM's least-loaded (ties from a rotating start, here replica 1): 4, 1, 1, 1.9."""
    reqs = Timed((Request(0, 0.0, 400, 1), Request(1, 0.0, 100, 1), Request(2, 1.5, 100, 1), Request(3, 1.6, 100, 1)))
    two = Mesh(1, replicas=2)
    got = {}
    for key, name in (("sglang@0.5.23", None), ("sglang@0.5.23", "dp:total_requests"), ("vllm@0.34.0", None)):
        r = replica_router(key, name)
        assert r is not None
        cfg = LoopConfig(100, router=r.rule.prefill, router_rule=r.rule)
        got[r.name] = [t.ttft_s for t in simulate(reqs, steps_of, cfg, two).timelines]
    assert got["dp:round_robin"] == pytest.approx([4.0, 1.0, 3.5, 1.0])
    assert got["dp:total_requests"] == pytest.approx([4.0, 1.0, 1.0, 3.4])
    assert got["dp:least_loaded"] == pytest.approx([4.0, 1.0, 1.0, 1.9])


@pytest.mark.parametrize("key", ["sglang@0.5.23", "vllm@0.34.0"])
def test_the_launch_line_starts_the_router_the_loop_runs(key):
    """For every router of each release: the loop's policy and rule are the router's, and the launch line starts
    it (its flags at R = 2 in one server) or puts the R servers behind it (its command)."""
    spec = load_model("tiny-llama")
    pair = select_pair([key])
    for r in replica_routers(key):
        mesh = Mesh(2, replicas=2, router=r.name)
        loop = engine_loop(pipeline_model(key), mesh, 1024, 8)
        assert (loop.router, loop.config.router, loop.config.router_rule) == (r, r.rule.prefill, r.rule)
        rec = next(
            x for x in recipes(baseline(), Launch(spec, mesh, gpu="NVIDIA H100"), engines=pair) if x.version == key
        )
        assert rec.router == r
        cmd, line = rec.command(), rec.line()
        if r.flags:
            assert all(f in cmd and f in line for f in r.launch_flags(2)) and "2 replicas in one server" in cmd
        else:
            assert r.behind in cmd and "2 servers, each" in line and r.what in line


def test_the_other_engines_line_says_the_router_is_not_its():
    spec = load_model("tiny-llama")
    mesh = Mesh(2, replicas=2, router="sglang-router:cache_aware")
    vll = next(x for x in recipes(baseline(), Launch(spec, mesh, gpu="NVIDIA H100")) if x.engine == "vLLM")
    assert vll.realises == "no" and "router=sglang-router:cache_aware" in vll.summary


def test_a_pd_pool_line_names_the_pd_router():
    spec = load_model("tiny-llama")
    from tpplan.engines.routing import pd_pool_router

    rec = recipes(baseline(), Launch(spec, Mesh(2), gpu="NVIDIA H100"))[0]
    line = replace(rec, replicas=3, router=pd_pool_router(rec.version)).line()
    assert line.startswith("SGLang 0.5.23: 3 servers, each on GPUs of its own, behind its P/D router (cache_aware")


WORKLOAD = {"name": "mixed", "input_lens": [3000, 500, 500, 500, 3000, 500], "concurrency": 3, "num_requests": 12,
            "chunk_size": 1024}  # fmt: skip


def _audit(monkeypatch, capsys, tmp_path, *extra):
    wl = tmp_path / "mixed.json"
    wl.write_text(json.dumps(WORKLOAD))
    code, out, err = run_cli(monkeypatch, capsys, "audit", "--model", "tiny-llama", "--topology", "h100x8-ib400",
                             "--tp", "2", "--replicas", "2", "-w", str(wl), "--plan", "baseline", "--json", "-",
                             *extra)  # fmt: skip
    assert code == 0, err
    return json.loads(out)["plans"][0]


@pytest.mark.parametrize("router", [None, "dp:total_requests", "sglang-router:cache_aware"])
def test_audits_ttft_is_the_loops_through_the_same_router(monkeypatch, capsys, tmp_path, router):
    """A closed loop of mixed prompts (3 clients on 2 replicas), where dealing client c to replica c mod R is
    not what a router does: the prediction's TTFT is the idealised loop's (no fixed costs) behind the same router,
    request by request."""
    got = _audit(monkeypatch, capsys, tmp_path, *(("--router", router) if router else ()))
    assert got["prediction"]["ttft"]["mean_s"] == pytest.approx(got["serving"]["idealised_mean_s"], rel=1e-12)
    assert got["serving"]["settings"]["router"]["name"] == (router or "dp:round_robin")


def test_the_routers_change_audits_ttft(monkeypatch, capsys, tmp_path):
    rr = _audit(monkeypatch, capsys, tmp_path)["prediction"]["ttft"]["mean_s"]
    tr = _audit(monkeypatch, capsys, tmp_path, "--router", "dp:total_requests")["prediction"]["ttft"]["mean_s"]
    assert rr != pytest.approx(tr, rel=1e-6)


def test_a_bad_router_is_one_line_exit_2(monkeypatch, capsys):
    code, out, err = run_cli(monkeypatch, capsys, "audit", "--model", "tiny-llama", "--topology", "h100x8-ib400",
                             "--tp", "2", "--replicas", "2", "--router", "dp:least_loaded")  # fmt: skip
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "--router dp:least_loaded" in lines[0] and "dp:round_robin" in lines[0]


def test_vllms_replicas_of_an_moe_model_are_separate_servers_not_data_parallel_size():
    """vLLM's --data-parallel-size shards an MoE model's experts over DP x TP: R copies of tiny-mixtral are R
    servers behind an external router that deals least-loaded, as priced; a dense model's stay one server."""
    moe, dense = (
        next(x for x in recipes(baseline(), Launch(load_model(m), Mesh(2, replicas=2), gpu="NVIDIA H100"))
             if x.engine == "vLLM")
        for m in ("tiny-mixtral", "tiny-llama")
    )  # fmt: skip
    assert "--data-parallel-size" not in moe.command().splitlines()[-1] and "DPEngineCoreProc" in moe.line()
    assert moe.command().startswith("# 2 servers") and "external router" in moe.command()
    assert "least-loaded" in moe.command()
    assert "--data-parallel-size 2" in dense.command() and dense.command().startswith("# 2 replicas in one server")


def _search(monkeypatch, capsys, tmp_path, *extra):
    wl = tmp_path / "mixed.json"
    wl.write_text(json.dumps(WORKLOAD))
    return run_cli(monkeypatch, capsys, "search", "--model", "tiny-llama", "--topology", "h100x8-ib400", "--tp", "2",
                   "--replicas", "2", "-w", str(wl), "--top", "1", "--json", "-", *extra)  # fmt: skip


def test_search_ranks_through_the_router_asked_for(monkeypatch, capsys, tmp_path):
    """The search's TTFT is the serving loop's over the grid's meshes, each behind `--router`."""
    code, out, err = _search(monkeypatch, capsys, tmp_path)
    assert code == 0, err
    rr = json.loads(out)["plans"][0]["ttft"]["mean_s"]
    code, out, err = _search(monkeypatch, capsys, tmp_path, "--router", "dp:total_requests")
    assert code == 0, err
    assert json.loads(out)["plans"][0]["ttft"]["mean_s"] != pytest.approx(rr, rel=1e-6)
    code, out, err = _search(monkeypatch, capsys, tmp_path, "--router", "nope")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "--router nope" in err


def test_sglangs_replicas_across_nodes_are_separate_servers_behind_the_router_that_deals_alike():
    """Two TP8 replicas over two nodes: SGLang's --dp-size would put each DP rank's TP group over both nodes (from
    GPU dp_rank x 8), so the lines start 2 servers behind sglang-router --policy round_robin, which deals as the
    priced DP controller does; on one node --dp-size starts them."""
    spec = load_model("tiny-llama")
    one_node, two_nodes = (
        recipes(baseline(), Launch(spec, Mesh(8, replicas=2), gpu="NVIDIA H100", nodes=n))[0] for n in (1, 2)
    )
    assert "--dp-size 2" in one_node.command() and "launch_dp_schedulers" not in one_node.line()
    cmd = two_nodes.command()
    assert "--dp-size" not in cmd.splitlines()[-1] and "launch_dp_schedulers" in cmd and "# 2 servers" in cmd
    assert "sglang_router.launch_router --worker-urls" in cmd and "--policy round_robin" in cmd
    priced, started = replica_router("sglang@0.5.23"), replica_router("sglang@0.5.23", "sglang-router:round_robin")
    assert priced is not None and priced.alike == started and priced.rule.prefill == started.rule.prefill


def test_a_dp_router_without_an_external_twin_says_one_is_needed():
    spec = load_model("tiny-llama")
    mesh = Mesh(8, replicas=2, router="dp:total_requests")
    cmd = recipes(baseline(), Launch(spec, mesh, gpu="NVIDIA H100", nodes=2))[0].command()
    assert "--dp-size" not in cmd.splitlines()[-1] and "needs an external router" in cmd and "fewest requests" in cmd


def test_dp_attention_copies_are_separate_servers_behind_the_router_that_deals_alike():
    """DP attention's --dp-size is the plan's own: its 2 copies are 2 servers behind sglang-router round-robin."""
    from tpplan.models.graph import build_model_graph
    from tpplan.plans.named import make_plan

    graph = build_model_graph(load_model("tiny-deepseek-v3"))
    mesh = Mesh(2, replicas=2)
    cmd = recipes(make_plan("dp-attention", graph, 2), Launch(graph.spec, mesh))[0].command()
    assert cmd.startswith("# 2 servers") and "--policy round_robin" in cmd and "--dp-size is the plan's own" in cmd
    assert cmd.splitlines()[-1].count("--dp-size") == 1


@pytest.mark.parametrize("command", ["audit", "search"])
def test_a_router_with_one_replica_is_one_line_exit_2(monkeypatch, capsys, command):
    code, out, err = run_cli(monkeypatch, capsys, command, "--model", "tiny-llama", "--topology", "h100x8-ib400",
                             "--tp", "2", "--router", "dp:total_requests")  # fmt: skip
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "--router dp:total_requests" in lines[0] and "--replicas 2" in lines[0]


def test_the_memos_flags_column_names_the_router():
    spec = load_model("tiny-llama")
    sgl = recipes(baseline(), Launch(spec, Mesh(2, replicas=2, router="sglang-router:cache_aware"), gpu="NVIDIA H100"))
    text = sgl[0].flags_text()
    assert text.startswith("`--tp-size 2") and "--policy cache_aware" in text
    assert "--dp-size 2`" in recipes(baseline(), Launch(spec, Mesh(2, replicas=2), gpu="NVIDIA H100"))[0].flags_text()


def test_a_saved_plan_carries_its_router_into_audit(monkeypatch, capsys, tmp_path):
    """`search --save` writes the router into the file's deployment; audit given the file runs behind it."""
    code, _, err = _search(monkeypatch, capsys, tmp_path, "--router", "dp:total_requests", "--save",
                           str(tmp_path / "found"))  # fmt: skip
    assert code == 0, err
    f = tmp_path / "found" / "plan-1.json"
    assert json.loads(f.read_text())["deployment"]["router"] == "dp:total_requests"
    code, out, err = run_cli(monkeypatch, capsys, "audit", "--model", "tiny-llama", "--topology", "h100x8-ib400",
                             "-w", str(tmp_path / "mixed.json"), "--plan", str(f), "--json", "-")  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["plans"][0]["serving"]["settings"]["router"]["name"] == "dp:total_requests"


def test_a_release_without_a_router_read_says_one_is_needed():
    spec = load_model("tiny-llama")
    pair = select_pair(["sglang@main@7665ff96"])
    rec = recipes(baseline(), Launch(spec, Mesh(2, replicas=2), gpu="NVIDIA H100"), engines=pair)[0]
    assert rec.router is None and "needs a request router in front of them" in rec.command()


def test_the_cost_model_docs_table_lists_every_router_and_its_default():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "cost-model.md").read_text()
    rows = [line for line in doc.splitlines() if line.startswith(("| SGLang 0.5.23 | `", "| vLLM 0.34.0"))]
    named = [row.split("`")[1] for row in rows]
    assert named == [r.name for key in ("sglang@0.5.23", "vllm@0.34.0") for r in replica_routers(key)]
    assert [row.split("`")[1] for row in rows if "(default)" in row] == ["dp:round_robin", "dp:least_loaded"]
