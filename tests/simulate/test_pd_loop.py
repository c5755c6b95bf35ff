"""The P/D loop by hand: prefill and decode instances in one co-simulation, the KV handed over as each
engine hands it (SGLang: decode reserves first, the prefill pushes; vLLM: prefill first, decode pulls and
computes the first token), the links one transfer at a time, the decode pool's KV pool and cap."""

from __future__ import annotations

import pytest

from tpplan.errors import TpplanError
from tpplan.simulate.disagg_loop import SGLANG_RULE, VLLM_RULE, PoolLoop, handoff_rule, simulate_disaggregated
from tpplan.simulate.loop import LoopConfig
from tpplan.simulate.requests import ClosedLoop, Request, Timed


def one_s_per_100(segs):  # type: ignore[no-untyped-def]
    return [sum(n for n, _ in segs) / 100]


def ten_ms_step(segs):  # type: ignore[no-untyped-def]
    return [0.01]


PRE = PoolLoop(one_s_per_100, LoopConfig(100), 1)
DEC = PoolLoop(ten_ms_step, LoopConfig(100, decode=True), 1)
TWO = Timed((Request(0, 0.0, 100, 5), Request(1, 0.0, 100, 5)))


def test_sglang_two_requests_by_hand() -> None:
    """Prefill 1 s each (one after the other), KV 0.5 s: first tokens at 1.5 and 2.5 s, then 4 decode
    steps of 10 ms each (the prefill gave the first token)."""
    run = simulate_disaggregated(TWO, PRE, DEC, lambda r: 0.5, SGLANG_RULE)
    lines = run.result.timelines
    assert [t.first_token_s for t in lines] == pytest.approx([1.5, 2.5])
    assert [t.done_s for t in lines] == pytest.approx([1.54, 2.54])
    assert run.result.itl == pytest.approx([0.01] * 8)
    assert run.handoff_mean_s == 0.5 and run.link_wait_mean_s == 0.0


def test_vllm_decode_computes_the_first_token() -> None:
    """vLLM: the decode server reads the KV (0.5 s) and its first step gives the first token: one step
    later than SGLang's, and 5 decode steps for 5 tokens, 4 gaps each."""
    run = simulate_disaggregated(TWO, PRE, DEC, lambda r: 0.5, VLLM_RULE)
    lines = run.result.timelines
    assert [t.first_token_s for t in lines] == pytest.approx([1.51, 2.51])
    assert [t.done_s for t in lines] == pytest.approx([1.55, 2.55])
    assert len(run.result.itl) == 8


def test_one_link_carries_one_transfer_at_a_time() -> None:
    """Both prompts in one 2 s step: their KV leaves together, the second waits 0.5 s for the link."""
    pre = PoolLoop(one_s_per_100, LoopConfig(200), 1)
    run = simulate_disaggregated(TWO, pre, DEC, lambda r: 0.5, SGLANG_RULE)
    assert [t.first_token_s for t in run.result.timelines] == pytest.approx([2.5, 3.0])
    assert run.link_wait_mean_s == pytest.approx(0.25)
    two_links = PoolLoop(one_s_per_100, LoopConfig(100), 2)  # two prefill instances, a link each
    run = simulate_disaggregated(TWO, two_links, DEC, lambda r: 0.5, SGLANG_RULE)
    assert [t.first_token_s for t in run.result.timelines] == pytest.approx([1.5, 1.5])


def test_sglang_prefill_waits_for_the_decode_side_to_reserve_the_kv() -> None:
    """A decode pool of 105 tokens holds one 100 + 5 request: the second's prefill starts only when the
    first has finished decoding (1.54 s); under vLLM the prefill runs at once."""
    dec = PoolLoop(ten_ms_step, LoopConfig(100, decode=True, kv_tokens=105), 1)
    sgl = simulate_disaggregated(TWO, PRE, dec, lambda r: 0.5, SGLANG_RULE)
    assert [t.first_step_s for t in sgl.result.timelines] == pytest.approx([0.0, 1.54])
    assert sgl.decode_admit_wait_mean_s == pytest.approx(1.54 / 2)
    vll = simulate_disaggregated(TWO, PRE, dec, lambda r: 0.5, VLLM_RULE)
    assert [t.first_step_s for t in vll.result.timelines] == pytest.approx([0.0, 1.0])
    # the second reaches the decode server at 2.0 s, after the first left it (1.55 s): read 0.5 s, one step
    assert vll.result.timelines[1].first_token_s == pytest.approx(2.51) and vll.decode_admit_wait_mean_s == 0


def test_a_closed_loop_client_sends_when_its_last_token_is_out() -> None:
    one_client = ClosedLoop(1, TWO.requests)
    run = simulate_disaggregated(one_client, PRE, DEC, lambda r: 0.5, SGLANG_RULE)
    assert run.result.timelines[1].arrival_s == pytest.approx(1.54)
    assert run.result.timelines[1].first_token_s == pytest.approx(1.54 + 1.5)


def test_decode_instances_share_the_requests_round_robin() -> None:
    four = Timed(tuple(Request(i, 0.0, 100, 3) for i in range(4)))
    run = simulate_disaggregated(four, PoolLoop(one_s_per_100, LoopConfig(100), 4), PoolLoop(ten_ms_step,
                                 LoopConfig(100, decode=True), 2), lambda r: 0.0, SGLANG_RULE)  # fmt: skip
    assert [t.replica for t in run.result.timelines] == [0, 1, 0, 1]
    assert [t.done_s for t in run.result.timelines] == pytest.approx([1.02] * 4)  # two per decode step


def test_bad_pools_are_refused_with_the_field_named() -> None:
    with pytest.raises(TpplanError, match="decode pool"):
        simulate_disaggregated(TWO, PRE, PRE, lambda r: 0.5)
    with pytest.raises(TpplanError, match="instances=0:1"):
        simulate_disaggregated(TWO, PoolLoop(one_s_per_100, LoopConfig(100), 0), DEC, lambda r: 0.5)
    small = PoolLoop(ten_ms_step, LoopConfig(100, decode=True, kv_tokens=50), 1)
    with pytest.raises(TpplanError, match="request 0"):
        simulate_disaggregated(TWO, PRE, small, lambda r: 0.5)


def test_the_rule_names_the_version_it_was_read_from() -> None:
    assert handoff_rule("sglang@0.5.23") == (SGLANG_RULE, None)
    rule, note = handoff_rule("vllm@0.33.0")
    assert rule is VLLM_RULE and note is not None and "0.34.0" in note
    assert all("0.5.23" in s.cite() for s in SGLANG_RULE.sources)


@pytest.mark.parametrize(("handoff", "first", "tail"), [(0.8, 2.4, 0.4), (3.0, 4.0, 2.0)])
def test_sglang_sends_each_chunk_s_kv_after_its_step(handoff: float, first: float, tail: float) -> None:
    """A 200-token prompt in two 1 s chunks, its KV `handoff` s in all: half leaves after the first chunk
    (at 1 s), half after the second (2 s), one after the other on the link; vLLM reads it all at the end."""
    one = Timed((Request(0, 0.0, 200, 2),))
    run = simulate_disaggregated(one, PRE, DEC, lambda r: handoff, SGLANG_RULE)
    assert run.result.timelines[0].first_token_s == pytest.approx(first)
    assert run.handoff_tail_mean_s == pytest.approx(tail)
    vll = simulate_disaggregated(one, PRE, DEC, lambda r: handoff, VLLM_RULE)
    assert vll.handoff_tail_mean_s == pytest.approx(handoff)  # read whole after the last chunk
    assert vll.result.timelines[0].first_token_s == pytest.approx(2.0 + handoff + 0.01)
