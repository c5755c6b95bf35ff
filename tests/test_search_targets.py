"""The search under latency targets (tpplan.search.targets, tpplan.search.under_targets, `tpplan search
--ttft-target/--tpot-target`): targets read as written or refused in one line, goodput counted request
by request, the Pareto front, deployments that meet the targets and the closest one when none does."""

from __future__ import annotations

import itertools
import json
import math
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.cli_helpers import run_cli
from tpplan.errors import TpplanError
from tpplan.mesh import Mesh
from tpplan.models.config import load_config_dict
from tpplan.search.fronts import pareto_max
from tpplan.search.targets import Target, Targets, goodput, parse_duration, parse_target, seconds_text
from tpplan.simulate.requests import Request
from tpplan.simulate.results import Timeline


def _timeline(rid: int, arrival: float, ttft: float, tpot: float, out: int) -> Timeline:
    first = arrival + ttft
    return Timeline(Request(rid, arrival, 100, out), 0, arrival, arrival, arrival, first, first,
                    first + tpot * (out - 1))  # fmt: skip


# -- targets as written ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds", "stat"),
    [("2s", 2.0, "p90"), ("50ms", 0.05, "p90"), ("p99:1.5s", 1.5, "p99"), ("mean:800us", 8e-4, "mean"),
     ("P50: 40 ms", 0.04, "p50")],
)  # fmt: skip
def test_a_target_reads_its_duration_and_statistic(text: str, seconds: float, stat: str) -> None:
    t = parse_target(text, "ttft", "p90")
    assert t.stat == stat and t.seconds == pytest.approx(seconds) and t.metric == "ttft"


@pytest.mark.parametrize("text", ["2", "2x", "fast", "0s", "-1s", "p95:2s", "p90:", ":2s", "1e400s"])
def test_a_malformed_target_names_the_field(text: str) -> None:
    with pytest.raises(TpplanError) as e:
        parse_target(text, "tpot", "p90")
    assert e.value.where.startswith("tpot_target=") and e.value.fix


def test_statistics_of_a_target() -> None:
    values = [float(v) for v in range(1, 11)]  # 1..10
    assert Target("ttft", 1, "mean").value(values) == 5.5
    assert Target("ttft", 1, "p50").value(values) == 5.5
    assert Target("ttft", 1, "p90").value(values) == pytest.approx(9.1)  # linear between order statistics
    assert math.isnan(Target("tpot", 1, "p99").value([math.nan]))
    with pytest.raises(TpplanError):
        Targets()
    assert parse_duration("1.25s", "x") == 1.25 and seconds_text(0.05) == "50 ms" and seconds_text(2) == "2 s"


# -- goodput: request by request ------------------------------------------------------------------------------


def test_goodput_counts_requests_meeting_both_targets_by_brute_force() -> None:
    rng = random.Random(7)
    for _ in range(50):
        lines = [_timeline(i, rng.uniform(0, 5), rng.uniform(0.1, 3), rng.uniform(0.01, 0.1), rng.choice([1, 2, 40]))
                 for i in range(rng.randint(1, 30))]  # fmt: skip
        ttft, tpot, gpus = rng.uniform(0.5, 2.5), rng.uniform(0.02, 0.09), rng.choice([1, 8])
        targets = Targets(Target("ttft", ttft, "p90"), Target("tpot", tpot, "p90"))
        brute = 0
        for t in lines:  # first token and last token as the timeline records them
            own_ttft = t.first_token_s - t.arrival_s
            n = t.request.output_tokens
            own_tpot = (t.done_s - t.first_token_s) / (n - 1) if n > 1 else 0.0
            brute += own_ttft <= ttft and own_tpot <= tpot
        span = max(t.done_s for t in lines)
        good, per_gpu = goodput(lines, targets, gpus)
        assert good == brute and per_gpu == pytest.approx(brute / span / gpus)


def test_goodput_on_a_served_tiny_model_matches_a_count_of_its_requests() -> None:
    from tpplan.cost.predictor import cached_predictor
    from tpplan.cost.topology import select_topology
    from tpplan.models.config import load_model
    from tpplan.models.graph import build_model_graph
    from tpplan.plans.named import baseline
    from tpplan.simulate.engine import engine_loop, serve
    from tpplan.simulate.requests import Shape, closed_loop

    graph = build_model_graph(load_model("tiny-llama"))
    topo = select_topology("h200x8-ib400", 1)
    p = cached_predictor(graph, baseline(), topo, Mesh(2, pp=1), "bf16", None)
    loop = engine_loop(p.pipeline, p.deployment, 1024, 8, decode=True)
    res = serve(p, closed_loop(4, [Shape(512, 16), Shape(300, 5)], 12), loop)
    rows = [t.to_json() for t in res.timelines]
    ttfts = sorted(float(r["ttft_s"]) for r in rows)  # type: ignore[arg-type]
    tpots = sorted(float(r["tpot_s"]) for r in rows)  # type: ignore[arg-type]
    targets = Targets(Target("ttft", ttfts[6], "mean"), Target("tpot", tpots[8], "mean"))  # some of each miss
    brute = sum(1 for r in rows if r["ttft_s"] <= ttfts[6] and r["tpot_s"] <= tpots[8])  # type: ignore[operator]
    good, per_gpu = goodput(res.timelines, targets, 2)
    assert 0 < good == brute < len(rows)
    assert per_gpu == pytest.approx(brute / max(float(r["latency_s"]) + float(r["arrival_s"]) for r in rows) / 2)  # type: ignore[arg-type]


# -- the Pareto front -----------------------------------------------------------------------------------------


def _dominated(p: tuple[float, float], q: tuple[float, float]) -> bool:
    return q[0] >= p[0] and q[1] >= p[1] and q != p


def test_the_front_of_hand_made_points() -> None:
    pts = [(10, 1), (8, 3), (8, 2), (5, 5), (5, 5), (4, 4), (1, 9), (1, 8), (0, 9)]
    assert pareto_max(pts, lambda x: x) == [(10, 1), (8, 3), (5, 5), (5, 5), (1, 9)]
    assert pareto_max([(1.0, math.nan), (0.5, 0.5)], lambda x: x) == [(0.5, 0.5)]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6)), max_size=25))
def test_the_front_holds_every_undominated_point_and_no_other(pts: list[tuple[int, int]]) -> None:
    front = pareto_max(pts, lambda x: (float(x[0]), float(x[1])))
    brute = [p for p in pts if not any(_dominated(p, q) for q in pts)]
    assert sorted(front) == sorted(brute)
    assert not any(_dominated(p, q) for p, q in itertools.product(front, pts))


# -- the command ----------------------------------------------------------------------------------------------

SEARCH = ("search", "-m", "tiny-llama", "--tp", "2", "-t", "h200x8-ib400", "--top", "1", "--no-pd")


@pytest.fixture(scope="module")
def chat(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("wl") / "chat.toml"
    path.write_text('name = "chat"\ninput_len = 512\noutput_len = 32\nconcurrency = 4\nchunk_size = 1024\n')
    return str(path)


def _under(monkeypatch, capsys, *args: str) -> dict:  # type: ignore[no-untyped-def]
    code, out, err = run_cli(monkeypatch, capsys, *SEARCH, *args, "--json", "-")
    assert code == 0, err
    return json.loads(out)["serving_search"]


def test_targets_met_rank_by_goodput_with_what_binds(monkeypatch, capsys, chat: str) -> None:  # type: ignore[no-untyped-def]
    s = _under(monkeypatch, capsys, "-w", chat, "--ttft-target", "1s", "--tpot-target", "p90:1ms")
    d = s["deployments"][0]
    best, loads = d["best"], d["loads"]
    assert d["meets_targets"] and s["meets"] == ["TP2"] and s["closest"] is None
    assert best["achieved_s"]["tpot"] <= 1e-3 and best["achieved_s"]["ttft"] <= 1.0 and best["meets_targets"]
    assert best["goodput_per_gpu"] == max(p["goodput_per_gpu"] for p in loads if p["meets_targets"])
    up = [p for p in loads if p["clients"] == 2 * best["clients"]]  # the load above it was tried and missed
    assert up and not up[0]["meets_targets"] and d["binds"] == "decode"
    assert f"at {up[0]['clients']} clients its p90 TPOT is {seconds_text(up[0]['achieved_s']['tpot'])}" in d["why"]
    assert s["verdict"].startswith("TP2 (") and f"{best['goodput_per_gpu']:.3g} requests/s per GPU" in s["verdict"]
    front = {(p["clients"], p["output_tok_s_per_gpu"]) for p in s["pareto_front"]}
    assert (best["clients"], best["output_tok_s_per_gpu"]) in front or any(
        _dominated((best["output_tok_s_per_gpu"], best["output_tok_s_per_user"]),
                   (p["output_tok_s_per_gpu"], p["output_tok_s_per_user"])) for p in s["pareto_front"]
    )  # fmt: skip


def test_nothing_meets_names_the_closest_and_by_how_much(monkeypatch, capsys, chat: str) -> None:  # type: ignore[no-untyped-def]
    s = _under(monkeypatch, capsys, "-w", chat, "--ttft-target", "p99:1ms", "--tpot-target", "mean:100us")
    near = s["closest"]
    assert s["meets"] == [] and near is not None and not near["meets_targets"]
    assert near["pruned_by_bound"] and len(near["loads"]) == 1  # one client alone already misses: no more loads
    miss = near["closest"]["misses_s"]
    for metric, target in (("ttft", 1e-3), ("tpot", 1e-4)):
        got = near["closest"]["achieved_s"][metric]
        assert miss[metric] == pytest.approx(got - target) and miss[metric] > 0
        assert f"{seconds_text(got)}, {seconds_text(got - target)} (+{(got - target) / target:,.0%})" in s["verdict"]
    assert s["verdict"].startswith("Nothing meets p99 TTFT <= 1 ms and mean TPOT <= 100 us; closest is TP2")


def test_nothing_meets_is_an_answer_in_the_table(monkeypatch, capsys, chat: str) -> None:  # type: ignore[no-untyped-def]
    code, out, err = run_cli(monkeypatch, capsys, *SEARCH, "-w", chat, "--ttft-target", "1us")
    assert code == 0, err
    assert "Nothing meets p90 TTFT <= 1 us; closest is TP2" in " ".join(out.split())
    assert "TP2 (misses)" in out and "Pareto front" in out
    assert max(len(line) for line in out.splitlines() if "│" in line) <= 100


def test_a_rate_serves_each_deployment_at_it(monkeypatch, capsys, chat: str) -> None:  # type: ignore[no-untyped-def]
    s = _under(monkeypatch, capsys, "-w", chat, "--tpot-target", "5ms", "--arrival-rate", "50", "--requests", "20")
    d = s["deployments"][0]
    assert s["mode"] == "rate" and s["rate_per_s"] == 50 and d["loads"][0]["rate_per_s"] == 50
    assert d["loads"][0]["requests"] == 20 and d["meets_targets"]


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (("--ttft-target", "2x"), "--ttft-target 2x: not a duration with a unit"),
        (("--tpot-target", "p95:50ms"), "--tpot-target p95: unknown statistic"),
        (("--ttft-target", "0ms"), "--ttft-target 0ms: must be a positive duration"),
        (("--ttft-target", "2s", "--target-stat", "p42"), "--target-stat p42: unknown statistic"),
        (("--ttft-target", "2s", "--gpus", "12"), "--gpus 12: is not whole nodes of 8 GPUs"),
        (("--gpus", "8"), "--gpus 8: a GPU budget is for the search under targets"),
        (("--ttft-target", "2s", "--trace", "t.jsonl"), "--trace: the search under targets serves"),
    ],
)
def test_bad_target_input_is_one_line_and_exit_2(monkeypatch, capsys, chat: str, extra, says) -> None:  # type: ignore[no-untyped-def]
    code, _, err = run_cli(monkeypatch, capsys, *SEARCH, "-w", chat, *extra)
    assert code == 2 and says in " ".join(err.split()) and "Traceback" not in err and err.count("\n") == 1, err


def test_targets_need_a_workload_with_output_tokens(monkeypatch, capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    code, _, err = run_cli(monkeypatch, capsys, *SEARCH, "--tpot-target", "50ms")
    assert code == 2 and "--ttft-target/--tpot-target: the requests' prompts and outputs come from a workload" in err
    code, _, err = run_cli(monkeypatch, capsys, *SEARCH, "-w", "prompt16k-c8", "--tpot-target", "50ms")
    assert code == 2 and "one output token: no TPOT to target" in err and err.count("\n") == 1


@pytest.mark.slow
def test_pd_deployments_rank_beside_the_aggregated_with_what_binds(monkeypatch, capsys, chat: str) -> None:  # type: ignore[no-untyped-def]
    """With P/D (the default), pools of the meshes found, at the ratio the bound chose, rank beside the
    aggregated deployment; what binds is the P/D bound's side, said with its figures."""
    args = [a for a in SEARCH if a != "--no-pd"]
    code, out, err = run_cli(monkeypatch, capsys, *args, "-w", chat, "--ttft-target", "1s", "--tpot-target", "0.65ms",
                             "--json", "-")  # fmt: skip
    assert code == 0, err
    s = json.loads(out)["serving_search"]
    pd = [d for d in s["deployments"] if d["kind"] == "disaggregated"]
    assert pd and all(d["deployment"].startswith("P/D ") and d["decode_plan"] for d in pd)
    for d in pd:
        n_p, n_d = (int(x) for x in d["ratio"].split(":"))
        run = d["disaggregated"]
        assert run["ratio"] == d["ratio"] and run["gpus"] == 2 * n_p + 2 * n_d <= 8
        assert d["binds"] == {"prefill": "prefill", "decode": "decode", "transfer": "KV transfer"}[run["binding"]]
        assert d["why"].startswith(run["binding_text"])
        p = d["best"] or d["closest"]
        assert p["kind"] == "disaggregated" and p["gpus"] == run["gpus"]
    ranked = [d["best"]["goodput_per_gpu"] for d in s["deployments"] if d["meets_targets"]]
    assert ranked == sorted(ranked, reverse=True) and len(ranked) >= 1


def test_the_load_search_finds_the_largest_load_meeting_the_targets_and_serves_the_next() -> None:
    """`largest_met` against every threshold, ladder length and first probe: the answer is the last load
    that meets the targets (figures growing with the load), the load above it was served, and a ladder of
    n loads costs at most about 2 log2(n) runs."""
    from tpplan.search.serving_points import largest_met, load_ladder

    assert load_ladder(138) == [1, 2, 4, 8, 16, 32, 64, 128, 138] and load_ladder(64) == [1, 2, 4, 8, 16, 32, 64]
    for n in range(1, 14):
        for last in range(n):
            for first in range(n + 2):
                probed: list[int] = []

                def met(i: int, last: int = last, probed: list[int] = probed) -> bool:
                    probed.append(i)
                    return i <= last

                assert largest_met(n, met, first) == last
                assert last + 1 == n or last + 1 in probed
                assert len(set(probed)) <= 2 * n.bit_length() + 1


def test_what_binds_says_it_with_the_figures_it_was_given() -> None:
    """The KV pool, the running cap, prefill or decode: each sentence made from the loads and the pool."""
    from tpplan.search.serving_points import Load, ServingPoint
    from tpplan.search.under_targets import what_binds

    targets = Targets(Target("ttft", 2.0, "p90"), Target("tpot", 0.05, "p90"))

    def point(clients: int, ttft: float, tpot: float) -> ServingPoint:
        got = {"ttft": ttft, "tpot": tpot}
        return ServingPoint("TP8", "baseline", "aggregated", 8, Load(clients=clients), 2 * clients, got, 0, 0.0, 0.0,
                            0.0, {}, {}, targets.met(got), targets.worst_ratio(got))  # type: ignore[arg-type]  # fmt: skip

    alone, at_batch = point(1, 0.1, 0.02), point(37, 1.9, 0.049)
    binds, why = what_binds(targets, [alone, at_batch], at_batch, 37, (2048, 180_000), 4_608)
    assert binds == "KV capacity" and "37 requests of 4,608 tokens" in why and "170,496 of its 180,000" in why
    assert what_binds(targets, [alone, at_batch], at_batch, 37, (37, 10**9), 4_608)[0] == "running-request cap"
    slow_decode = point(64, 1.5, 0.0712)
    assert what_binds(targets, [alone, at_batch, slow_decode], at_batch, 128, (2048, 10**9), 4_608) == (
        "decode",
        "at 64 clients its p90 TPOT is 71.2 ms, over the 50 ms target",
    )
    slow_prefill = point(64, 3.0, 0.06)  # both over: TTFT by 50%, TPOT by 20%
    assert what_binds(targets, [alone, slow_prefill], None, 128, (2048, 10**9), 4_608)[0] == "prefill"


def test_requests_past_the_context_are_refused_before_any_work(monkeypatch, capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    config, _ = load_config_dict("tiny-llama")
    assert "max_position_embeddings" not in config  # states none: a default, not a limit (next test)
    (tmp_path / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 2048}))
    long = tmp_path / "long.toml"
    long.write_text('name = "long"\ninput_len = 2000\noutput_len = 100\nconcurrency = 2\nchunk_size = 1024\n')
    search = [str(tmp_path) if a == "tiny-llama" else a for a in SEARCH]
    code, _, err = run_cli(monkeypatch, capsys, *search, "-w", str(long), "--tpot-target", "50ms")
    assert code == 2 and "a request of 2,100 tokens (prompt and output) is past the model's context of 2,048" in err
    assert err.count("\n") == 1


def test_a_context_the_config_does_not_state_refuses_nothing(monkeypatch, capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """tiny-llama's file states no max_position_embeddings (transformers' default of 2,048 fills it for RoPE):
    the same long requests are served, as the Kimi-K3 preset's 4,608-token requests are in its example."""
    long = tmp_path / "long.toml"
    long.write_text('name = "long"\ninput_len = 2000\noutput_len = 100\nconcurrency = 2\nchunk_size = 1024\n')
    code, _, err = run_cli(monkeypatch, capsys, *SEARCH, "-w", str(long), "--tpot-target", "50ms", "--json", "-")
    assert code == 0, err


def test_audit_refuses_requests_past_the_stated_context_as_search_does(monkeypatch, capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """`tpplan audit --workload` applies the same check as search and report under targets
    (`under_targets.check_context`): one line, exit 2, no JSON written; a request inside the context is priced."""
    config, _ = load_config_dict("tiny-llama")
    (tmp_path / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 2048}))
    audit = ["audit", "-m", str(tmp_path), "--tp", "2", "-t", "h200x8-ib400", "--nodes", "1"]
    long, fits = tmp_path / "long.toml", tmp_path / "fits.toml"
    long.write_text('name = "long"\ninput_len = 2000\noutput_len = 100\nconcurrency = 2\nchunk_size = 1024\n')
    fits.write_text('name = "fits"\ninput_len = 1948\noutput_len = 100\nconcurrency = 2\nchunk_size = 1024\n')
    out = tmp_path / "audit.json"
    code, _, err = run_cli(monkeypatch, capsys, *audit, "-w", str(long), "--json", str(out))
    assert code == 2 and "a request of 2,100 tokens (prompt and output) is past the model's context of 2,048" in err
    assert err.count("\n") == 1 and not out.exists()
    code, _, err = run_cli(monkeypatch, capsys, *audit, "-w", str(fits), "--json", str(out))
    assert code == 0 and out.exists(), err  # 2,048 tokens: exactly the context


# -- which engine releases launch each deployment -------------------------------------------------------------


@pytest.fixture(scope="module")
def long_prompts(tmp_path_factory: pytest.TempPathFactory) -> str:
    """16K-token prompts: on tiny-llama the CP deployments serve the most goodput under a 2 s TTFT target."""
    path = tmp_path_factory.mktemp("wl") / "long.toml"
    path.write_text('name = "long"\ninput_len = 16384\noutput_len = 8\nconcurrency = 4\nchunk_size = 16384\n')
    return str(path)


CP_WINS = ("search", "-m", "tiny-llama", "-t", "h200x8-ib400", "--no-pd", "--ttft-target", "2s")


def test_a_winning_deployment_no_engine_launches_is_marked_and_the_best_launched_one_named(  # type: ignore[no-untyped-def]
    monkeypatch, capsys, long_prompts: str
) -> None:
    """Neither release runs CP for a Llama model (SGLang's forward never splits its prefill tokens, vLLM's PCP is
    MLA only): the CP deployment that wins needs code, and the verdict names the best one an engine launches."""
    code, out, err = run_cli(monkeypatch, capsys, *CP_WINS, "-w", long_prompts, "--json", "-")
    assert code == 0, err
    s = json.loads(out)["serving_search"]
    first = s["deployments"][0]
    assert "CP" in first["deployment"] and first["meets_targets"] and first["launched_by"] == []
    assert "SGLang 0.5.23: " in first["needs_code"] and "vLLM 0.34.0: MLA models only" in first["needs_code"]
    for d in s["deployments"]:  # CP needs code here, every other mesh is launched by both releases
        cp = "CP" in d["deployment"]
        assert (d["needs_code"] is not None) == cp and (d["launched_by"] == []) == cp
    alt = next(d for d in s["deployments"] if d["launched_by"] and d["meets_targets"])
    b = alt["best"]
    assert "no engine release launches it (needs code)" in s["verdict"]
    assert (
        f"the best an engine launches is {alt['deployment']} ({alt['plan']}, SGLang 0.5.23 or vLLM 0.34.0): "
        f"{b['goodput_per_gpu']:.3g} requests/s per GPU at {b['clients']} clients per replica"
    ) in s["verdict"]
    code, out, err = run_cli(monkeypatch, capsys, *CP_WINS, "-w", long_prompts)
    assert code == 0, err
    rows = [line for line in out.splitlines() if "│" in line]
    assert any(f"│ {first['deployment']}* " in r for r in rows) and any(f"│ {alt['deployment']} " in r for r in rows)
    assert max(len(r) for r in rows) <= 100
    assert "* No engine release launches it (needs code): SGLang 0.5.23:" in " ".join(out.split())


def test_a_closest_deployment_no_engine_launches_says_so(monkeypatch, capsys, long_prompts: str) -> None:  # type: ignore[no-untyped-def]
    code, out, err = run_cli(monkeypatch, capsys, *CP_WINS[:-1], "1us", "-w", long_prompts, "--json", "-")
    assert code == 0, err
    s = json.loads(out)["serving_search"]
    first, alt = s["deployments"][0], next(d for d in s["deployments"] if d["launched_by"])
    assert s["meets"] == [] and first["needs_code"]
    assert s["verdict"].startswith(f"Nothing meets p90 TTFT <= 1 us; closest is {first['deployment']} (")
    said = "binds; no engine release launches it (needs code); the closest an engine launches is "
    assert s["verdict"].endswith(f"{said}{alt['deployment']} ({alt['plan']})")


def test_a_winning_deployment_an_engine_launches_has_no_mark(monkeypatch, capsys, chat: str) -> None:  # type: ignore[no-untyped-def]
    s = _under(monkeypatch, capsys, "-w", chat, "--ttft-target", "1s", "--engine", "vllm@0.33.0")
    d = s["deployments"][0]
    assert d["launched_by"] == ["SGLang 0.5.23", "vLLM 0.33.0"] and d["needs_code"] is None
    assert "needs code" not in s["verdict"]
    code, out, err = run_cli(monkeypatch, capsys, *SEARCH, "-w", chat, "--ttft-target", "1s")
    assert code == 0, err
    assert "TP2*" not in out and "No engine release launches" not in out and "│ TP2 " in out


@pytest.mark.slow
def test_the_memo_says_its_choice_needs_code_and_names_the_launched_one(  # type: ignore[no-untyped-def]
    monkeypatch, capsys, long_prompts: str, tmp_path: Path
) -> None:
    """The memo's chosen deployments follow the search's marks: the winning CP deployment's launch lines are
    all "needs code" and the best one an engine launches follows it, with launch lines."""
    args = ("-m", "tiny-llama", "-t", "h200x8-ib400", "--tp", "2", "-w", long_prompts, "--ttft-target", "2s", "--no-pd")
    code, _, err = run_cli(monkeypatch, capsys, "report", *args, "-o", str(tmp_path / "m"))
    assert code == 0, err
    md = (tmp_path / "m" / "report.md").read_text().split("## Serving")[1].split("\n## ")[0]
    bullets = [line for line in md.splitlines() if line.startswith("- `")]
    assert len(bullets) == 2 and "CP" in bullets[0] and "CP" not in bullets[1]
    assert "No engine release launches it: needs code" in bullets[0] and "needs code" not in bullets[1]
    first, second = (b.split("`")[1] for b in bullets)
    assert f"no engine release launches it (needs code); the best an engine launches is {second} (" in md
    lines_first = md.split(f"Launch lines for `{first}`")[1].split("Launch lines for")[0]
    assert lines_first.count(": needs code (") == 2 and "```bash" not in lines_first
    assert md.split(f"Launch lines for `{second}`")[1].count("```bash") == 2
