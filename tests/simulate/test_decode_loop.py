"""The serving loop's decode, on cases worked by hand (prices a linear function of the step's shape)."""

from __future__ import annotations

import math

import pytest

from tpplan.errors import TpplanError
from tpplan.simulate.loop import LoopConfig, simulate
from tpplan.simulate.requests import ClosedLoop, Request, Timed


def price(segs: tuple[tuple[int, int], ...]) -> list[float]:
    """1 s per step, 0.01 s per new token, 0.001 s per context token."""
    return [1.0 + 0.01 * sum(n for n, _ in segs) + 0.001 * sum(c for _, c in segs)]


def test_one_request_is_its_ttft_then_o_minus_1_decode_steps() -> None:
    p, o = 100, 5
    cfg = LoopConfig(64, decode=True, step_overhead_s=0.5, request_in_s=0.25, request_out_s=0.125)
    res = simulate(Timed((Request(0, 0.0, p, o),)), price, cfg)
    t = res.timelines[0]
    prefill = (1.5 + 0.64) + (1.5 + 0.36 + 0.064)  # chunks of 64 and 36, the second reads 64 of context
    assert t.ttft_s == pytest.approx(0.25 + prefill + 0.125)
    decode = [1.5 + 0.01 + 0.001 * (p + k) for k in range(o - 1)]  # token k+2 reads p + k positions
    assert t.latency_s == pytest.approx(t.ttft_s + sum(decode))
    assert t.tpot_s == pytest.approx(sum(decode) / (o - 1))
    assert res.itl == pytest.approx(tuple(decode))
    assert [s.decode_tokens for s in res.steps] == [0, 0, 1, 1, 1, 1]


def test_one_output_token_ends_at_the_first_token() -> None:
    res = simulate(Timed((Request(0, 0.0, 10, 1),)), price, LoopConfig(64, decode=True))
    assert res.timelines[0].done_s == res.timelines[0].first_token_s
    assert math.isnan(res.timelines[0].tpot_s)
    assert res.decode_summary(1) is None


def test_tpot_grows_with_the_context_the_prices_read() -> None:
    short = simulate(Timed((Request(0, 0.0, 100, 50),)), price, LoopConfig(4096, decode=True))
    long = simulate(Timed((Request(0, 0.0, 4000, 50),)), price, LoopConfig(4096, decode=True))
    gap = long.timelines[0].tpot_s - short.timelines[0].tpot_s
    assert gap == pytest.approx(0.001 * 3900)


def two_requests(mixed: bool) -> tuple[float, float]:
    """Request 0 decodes 6 tokens; request 1 (prompt 300) arrives while it does, steps of 100 tokens.
    (request 1's TTFT, request 0's largest gap between tokens)"""
    reqs = (Request(0, 0.0, 10, 6), Request(1, 1.5, 300, 2))
    res = simulate(Timed(reqs), price, LoopConfig(100, decode=True, mixed=mixed))
    return res.timelines[1].ttft_s, max(res.itl[:5])


def test_sglang_runs_prefill_first_and_vllm_mixes_decode_in() -> None:
    ttft_sgl, gap_sgl = two_requests(mixed=False)
    ttft_vllm, gap_vllm = two_requests(mixed=True)
    # SGLang: the prompt's three prefill steps run back to back, request 0 waits for all of them, then
    # decodes beside request 1 (contexts 11 and 300).
    prefill = 3 * 1.0 + 0.01 * 300 + 0.001 * (100 + 200)
    assert gap_sgl == pytest.approx(prefill + 1.0 + 0.01 * 2 + 0.001 * (11 + 300))
    # vLLM: each step carries request 0's decode token and 99 prompt tokens, so the prompt takes 4 steps.
    assert ttft_vllm > ttft_sgl and gap_vllm < gap_sgl


def test_max_running_holds_the_third_request_until_one_finishes() -> None:
    reqs = tuple(Request(i, 0.0, 10, 4) for i in range(3))
    res = simulate(Timed(reqs), price, LoopConfig(100, decode=True, max_running=2))
    assert res.timelines[2].first_step_s == pytest.approx(max(res.timelines[0].done_s, res.timelines[1].done_s))
    assert max(s.decode_tokens for s in res.steps) == 2


def test_the_kv_pool_holds_the_second_request_and_refuses_one_that_never_fits() -> None:
    reqs = (Request(0, 0.0, 10, 4), Request(1, 0.0, 10, 4))
    res = simulate(Timed(reqs), price, LoopConfig(100, decode=True, kv_tokens=20))
    assert res.timelines[1].first_step_s == pytest.approx(res.timelines[0].done_s)
    with pytest.raises(TpplanError, match=r"request 0.*14 tokens of KV .*, more than the pool's 13 tokens"):
        simulate(Timed(reqs), price, LoopConfig(100, decode=True, kv_tokens=13))


def test_a_closed_loop_client_sends_its_next_request_when_the_last_one_finished() -> None:
    reqs = tuple(Request(i, 0.0, 10, 3) for i in range(2))
    res = simulate(ClosedLoop(1, reqs), price, LoopConfig(100, decode=True, request_out_s=0.5))
    assert res.timelines[1].arrival_s == pytest.approx(res.timelines[0].done_s)


def test_decode_summary_counts_tokens_per_gpu_and_per_user() -> None:
    reqs = tuple(Request(i, 0.0, 10, 5) for i in range(4))
    res = simulate(Timed(reqs), price, LoopConfig(100, decode=True))
    d = res.decode_summary(gpus=2)
    assert d is not None
    end = max(t.done_s for t in res.timelines)
    assert d["output_tokens"] == 20
    assert d["output_tok_s_per_gpu"] == pytest.approx(20 / end / 2)
    assert d["mean_decode_batch"] == 4
    assert d["output_tok_s_per_user"] == pytest.approx(1 / res.timelines[0].tpot_s)


def test_cached_prices_price_a_decode_step_at_its_mean_context_exactly_when_linear() -> None:
    from tpplan.simulate.prices import CachedPrices

    cached = CachedPrices(price)
    for segs in [((1, 5), (1, 9)), ((1, 1000), (1, 3001), (1, 77)), ((300, 10), (1, 70000), (1, 65000))]:
        assert cached(segs) == pytest.approx(price(segs))
    nonlinear = CachedPrices(lambda segs: [max(c for _, c in segs) ** 0.5])  # priced at the mean context
    assert nonlinear(((1, 100), (1, 300))) == pytest.approx([200**0.5], rel=1e-3)


def test_audit_json_carries_decode_per_request(monkeypatch, capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    from tests.cli_helpers import run_cli

    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(f'{{"arrival_s": {i * 0.01}, "prompt_tokens": 256, "output_tokens": 20}}\n'
                             for i in range(6)))  # fmt: skip
    args = ("audit", "-m", "tiny-llama", "--tp", "2", "-t", "h200x8-ib400", "--plan", "baseline", "--json", "-")
    code, out, err = run_cli(monkeypatch, capsys, *args, "--trace", str(trace))
    assert code == 0, err
    d = json.loads(out)["plans"][0]["serving"]["decode"]
    assert d["output_tokens"] == 120 and len(d["requests"]) == 6
    assert all(r["latency_s"] == pytest.approx(r["ttft_s"] + 19 * r["tpot_s"]) for r in d["requests"])
    assert d["tpot_s"]["p50"] <= d["tpot_s"]["p90"] <= d["tpot_s"]["p99"]
    assert "scheduler.py" in d["settings"]["rule"] and d["settings"]["mixed_steps"] is False
    assert d["admitted"] and d["settings"]["kv_capacity"].startswith("SGLang 0.5.23")
    assert d["settings"]["max_running"] >= 1 and d["settings"]["kv_tokens"] >= 20 * 6


def test_audit_text_prints_the_decode_table(monkeypatch, capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from tests.cli_helpers import run_cli

    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,128,8\n0.01,256,4\n")
    args = ("audit", "-m", "tiny-llama", "--tp", "2", "-t", "h200x8-ib400", "--plan", "baseline")
    code, out, err = run_cli(monkeypatch, capsys, *args, "--trace", str(trace))
    assert code == 0, err
    assert "With decode: TTFT, TPOT and ITL" in out and "TPOT p99" in out and "Decode leaves out" in out
