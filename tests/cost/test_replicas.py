"""Replicas: R copies of a deployment, the workload's requests split between them, each replica its
own chunked-prefill scheduler; validated once as a Mesh, priced by predict, offered by search."""

from __future__ import annotations

import functools
import json

import pytest

from tests.cli_helpers import run_cli
from tpplan.cost.topology import load_topology
from tpplan.cost.workload import Workload, load_workload, replica_workloads, simulate_routed, simulate_ttft
from tpplan.errors import TpplanError
from tpplan.mesh import Mesh


def unit(_batch) -> float:
    return 1.0


def test_two_replicas_halve_the_queue_by_hand():
    """C = 4 clients, N = 8 requests of one chunk each, a batch takes 1 s. One replica runs one
    request per batch: the first wave ends at 1, 2, 3, 4 s and the second wave, submitted at 1-4 s,
    at 5-8 s, so every second-wave TTFT is 4 s: mean (1+2+3+4+4*4)/8 = 3.25 s. Two replicas with
    C/2 = 2 clients each (round-robin deals alike prompts as the clients are dealt): first wave 1, 2 s, second
    3, 4 s (TTFT 2, 2): mean (1+2+2+2)/4 = 1.75 s."""
    wl = Workload(name="hand", input_len=1000, concurrency=4, chunk_size=1000, num_requests=8)
    one = simulate_ttft(wl, unit)
    assert one.ttft_s == (1, 2, 3, 4, 4, 4, 4, 4) and one.mean_s == 3.25
    two = simulate_routed(wl, lambda b: (unit(b),), Mesh(1, replicas=2), None)  # round-robin
    # request i on replica i % 2: replica 0 serves requests 0, 2, 4, 6, replica 1 requests 1, 3, 5, 7
    assert two.ttft_s == (1, 1, 2, 2, 2, 2, 2, 2) and two.mean_s == 1.75
    assert two.makespan_s == 4 and one.makespan_s == 8
    assert [(s.requests, s.concurrency, s.prefill_tokens, s.mean_s) for s in two.replicas] == [(4, 2, 4000, 1.75)] * 2
    assert two.prefill_tokens == one.prefill_tokens == 8000
    assert sorted({sg.request_id for b in two.batches for sg in b.segments}) == list(range(8))


def test_the_split_deals_clients_requests_and_prompt_lengths_round_robin():
    """5 clients, 11 requests with lengths cycled (a, b, c): replica 0 gets clients 0, 2, 4 and
    requests 0, 2, 4, ... (lengths a, c, b, a, ...); replica 1 clients 1, 3 and requests 1, 3, ..."""
    wl = Workload(name="mixed", input_lens=[300, 1200, 700], concurrency=5, num_requests=11, chunk_size=512)
    r0, r1 = replica_workloads(wl, Mesh(1, replicas=2))
    assert (r0.concurrency, r0.total_requests, r1.concurrency, r1.total_requests) == (3, 6, 2, 5)
    assert [r0.prompt_len(j) for j in range(6)] == [wl.prompt_len(i) for i in range(0, 11, 2)]
    assert [r1.prompt_len(j) for j in range(5)] == [wl.prompt_len(i) for i in range(1, 11, 2)]
    assert replica_workloads(wl, Mesh(1, replicas=1)) == (wl,)
    with pytest.raises(TpplanError, match="some replicas would get none"):
        replica_workloads(wl, Mesh(1, replicas=6))


def test_deployment_checks_replicas_once():
    topo = load_topology("h200x8-ib400").with_nodes(4)
    two = Mesh(16, replicas=2).check(topo)
    assert (two.replica_gpus, two.gpus, two.nodes(8)) == (16, 32, 4)
    assert Mesh(4, replicas=2).check(topo.with_nodes(1)).gpus == 8  # two replicas in one node
    with pytest.raises(TpplanError, match="needs 48 GPUs"):
        Mesh(16, replicas=3).check(topo)
    with pytest.raises(TpplanError, match="straddle nodes"):  # TP4 x PP3 = 12 GPUs: the second starts mid-node
        Mesh(4, pp=3, replicas=2).check(topo.with_nodes(3))
    with pytest.raises(TpplanError, match="at least 1"):
        Mesh(8, replicas=0).check(topo)


@functools.cache
def _k3():
    from tpplan.models.config import load_model
    from tpplan.models.graph import build_model_graph

    return build_model_graph(load_model("kimi-k3"))


@pytest.mark.parametrize(("workload", "one_s", "two_s"), [("prompt16k-c8", 7.042, 4.455),
                                                          ("prompt16k-c16", 13.302, 8.019)])  # fmt: skip
def test_two_tp16_replicas_beat_tp32_on_k3_4x8(workload, one_s, two_s):
    """What the model says of Kimi-K3 on 4 x 8 H200 (h200x8-ib400), Megatron TP (baseline) at 16K
    prompts: TP32 runs one 8192-token chunk in 0.775 s, TP16 in 0.875 s on half the GPUs, so under
    a closed loop of 8 or 16 clients two TP16 replicas, each with half of them, have the lower mean
    TTFT (each replica is exactly TP16 serving half the workload). Memory per rank is a replica's."""
    from tpplan.cost.predict import predict_plan
    from tpplan.plans.named import baseline

    graph, topo, wl = _k3(), load_topology("h200x8-ib400").with_nodes(4), load_workload(workload)
    tp32 = predict_plan(graph, baseline(), topo, mesh=Mesh(32), workload=wl)
    two = predict_plan(graph, baseline(), topo, mesh=Mesh(16, replicas=2), workload=wl)
    half = wl.with_overrides("half", concurrency=wl.concurrency // 2, num_requests=wl.total_requests // 2)
    alone = predict_plan(graph, baseline(), topo, mesh=Mesh(16), workload=half)
    assert two.ttft is not None and tp32.ttft is not None and alone.ttft is not None
    assert two.ttft.mean_s == pytest.approx(alone.ttft.mean_s) and two.memory.total == alone.memory.total
    assert (round(tp32.ttft.mean_s, 3), round(two.ttft.mean_s, 3)) == (one_s, two_s)
    assert two.ttft.mean_s < tp32.ttft.mean_s and two.forward_s > tp32.forward_s  # slower per batch, yet wins
    assert two.replicas == 2 and len(two.ttft.ttft_s) == wl.total_requests


def test_search_offers_replicas_and_shows_them(monkeypatch, capsys, tmp_path):
    """tiny-kimi-k3 on one 8-GPU node, 4 clients of 512-token prompts: `--tp 2 --replicas 2` searches
    two TP2 replicas, and the JSON names the deployment `2x TP2`, its replicas and each replica's
    volume (2 of the 4 requests each); `--replicas 4` ranks four-replica deployments in a table of at
    most 100 columns, with the note that says what a replica's figures are; more replicas than
    clients is one line and exit 2."""
    wl = tmp_path / "small.toml"
    wl.write_text('name = "small"\ninput_len = 512\nconcurrency = 4\nchunk_size = 256\n', encoding="utf-8")
    args = ["search", "--model", "tiny-kimi-k3", "-t", "h200x8-ib400", "--nodes", "1", "-w", str(wl)]
    code, out, err = run_cli(monkeypatch, capsys, *args, "--tp", "2", "--replicas", "2", "--top", "2", "--json", "-")
    assert code == 0, err
    data = json.loads(out)
    assert data["replicas"] == 2 and data["search"]["deployments"] == ["2x TP2"]
    best = data["plans"][0]
    assert best["deployment"] == "2x TP2" and best["replicas"] == 2
    vol = best["volume"]
    assert vol["prefill_tokens_per_replica"] == [2 * 512, 2 * 512]
    assert vol["comm_bytes_per_rank_total"] == pytest.approx(sum(vol["comm_bytes_per_rank_per_replica"]))
    assert vol["comm_bytes_per_rank_total"] == pytest.approx(4 * 512 * best["comm_bytes_per_token_per_rank"])
    code, out, err = run_cli(monkeypatch, capsys, *args, "--replicas", "4", "--top", "3", "--save", str(tmp_path / "s"))
    assert code == 0, err
    saved = json.loads((tmp_path / "s" / "plan-1.json").read_text(encoding="utf-8"))
    assert saved["deployment"]["replicas"] == 4  # the file is one replica's plan; a command using it says so
    tp = str(saved["deployment"]["tp"])
    code, _, err = run_cli(monkeypatch, capsys, "audit", "--model", "tiny-kimi-k3", "--tp", tp, "--plan",
                           str(tmp_path / "s" / "plan-1.json"))  # fmt: skip
    assert code == 0 and "4 replicas" in err and "check one replica" in " ".join(err.split())
    assert max(len(line) for line in out.splitlines()) <= 100
    assert "4x TP2" in out and "Replicas (4x)" in out  # the note that says what a replica's figures are
    code, out, err = run_cli(monkeypatch, capsys, *args, "--replicas", "8")
    assert code == 2 and "at most 4 replicas" in err and "Traceback" not in err


def test_replicas_all_offers_every_replica_count_that_divides_the_gpus():
    """`replicas="all"` with a workload and no --tp/--pp: R = 1's splits first (the reference is R =
    1's widest TP), then R = 2, 4, 8 on 4 x 8 GPUs, each with its replica's own splits, at most the
    concurrency (8); by default, without a workload, or with --tp, only R = 1; an explicit R with
    --tp is one deployment."""
    from tpplan.search.ranking import MeshAsk, deployment_grid, deployments

    graph, topo, wl = _k3(), load_topology("h200x8-ib400").with_nodes(4), load_workload("prompt16k-c8")
    grid = [(m.tp, m.pp, m.cp, m.replicas) for m in deployment_grid(graph, topo, MeshAsk(replicas="all"), wl)]
    assert {m.replicas for m in deployment_grid(graph, topo, MeshAsk(), wl)} == {1}  # asked for, not default
    assert grid[: len(deployments(graph, topo, MeshAsk()))] == [(*d, 1) for d in deployments(graph, topo, MeshAsk())]
    assert sorted({r for *_, r in grid}) == [1, 2, 4, 8]
    assert [(n, p, c) for n, p, c, r in grid if r == 2] == [
        (n, p, c) for n, p, c in deployments(graph, topo.with_nodes(2), MeshAsk())
    ]
    assert all(n * p * c * r == 32 for n, p, c, r in grid)
    assert {m.replicas for m in deployment_grid(graph, topo, MeshAsk(replicas="all"))} == {1}
    assert deployment_grid(graph, topo, MeshAsk(tp=16, replicas="all"), wl) == [Mesh(16)]
    assert deployment_grid(graph, topo, MeshAsk(tp=16, replicas=2), wl) == [Mesh(16, replicas=2)]
    with pytest.raises(TpplanError, match="does not divide"):
        deployment_grid(graph, topo, MeshAsk(replicas=3), wl)


def test_pipelined_replicas_are_each_a_pipeline_on_their_share():
    """With PP each replica runs the engine's pipelined schedule on its share: two TP2 x PP2 replicas
    of 6 clients have exactly the TTFT of one TP2 x PP2 with 3 clients (prompts alike), unlike one
    TP2 x PP2 with all 6, and the memory per rank is that of the share (half the KV cache)."""
    from tpplan.cost.predict import predict_plan
    from tpplan.models.config import load_model
    from tpplan.models.graph import build_model_graph
    from tpplan.plans.named import baseline

    graph = build_model_graph(load_model("tiny-kimi-k3"))
    topo = load_topology("h200x8-ib400").with_nodes(1)
    wl = Workload(name="six", input_len=2048, concurrency=6, chunk_size=512)
    share = wl.with_overrides("three", concurrency=3)
    two = predict_plan(graph, baseline(), topo, mesh=Mesh(2, pp=2, replicas=2), workload=wl)
    alone = predict_plan(graph, baseline(), topo, mesh=Mesh(2, pp=2), workload=share)
    every = predict_plan(graph, baseline(), topo, mesh=Mesh(2, pp=2), workload=wl)
    assert two.ttft is not None and alone.ttft is not None and every.ttft is not None
    assert two.ttft.mean_s == pytest.approx(alone.ttft.mean_s) and two.ttft.max_s == pytest.approx(alone.ttft.max_s)
    assert two.ttft.mean_s < every.ttft.mean_s
    assert two.memory == alone.memory and two.memory.kv_cache == pytest.approx(every.memory.kv_cache / 2)
