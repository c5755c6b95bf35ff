"""The P/D prefill pool: a finished prompt's KV handed to the decode side before its first token, by hand
and on real prices; the engine does not block on it unless told to."""

from __future__ import annotations

import pytest

from tests.simulate.test_engine_loop import predictor
from tpplan.cost.collective_pricer import price_collective
from tpplan.simulate.engine import engine_loop, serve
from tpplan.simulate.loop import LoopConfig, simulate
from tpplan.simulate.pd import DISAGG_SOURCE, VLLM_HANDOFF_SOURCE, handoff, kv_bytes_per_rank, prefill_pool
from tpplan.simulate.requests import Request, Timed


def one_s_per_100(segs):  # type: ignore[no-untyped-def]
    return [sum(n for n, _ in segs) / 100]


TWO = Timed((Request(0, 0.0, 100), Request(1, 0.0, 100)))


@pytest.mark.parametrize(("blocks", "ttfts"), [(False, [1.5, 2.5]), (True, [1.5, 3.0])])
def test_one_p_d_hand_off_by_hand(blocks: bool, ttfts: list[float]) -> None:
    """Two 100-token prompts, one step each (1 s), a 0.5 s hand-off: the first token of the first arrives
    at 1.5 s; the second step runs 1-2 s and its token at 2.5 s, or, when the engine blocks its last stage
    on the hand-off, 1.5-2.5 s and 3.0 s."""
    cfg = LoopConfig(100, handoff_s=lambda r: 0.5, handoff_blocks=blocks)
    res = simulate(TWO, one_s_per_100, cfg)
    assert res.ttfts == pytest.approx(ttfts)
    assert [t.prefill_end_s for t in res.timelines] == pytest.approx([1.0, 2.0 if not blocks else 2.5])


def test_the_hand_off_is_the_prompt_s_kv_sent_between_nodes() -> None:
    p = predictor(2, 1)
    kv = kv_bytes_per_rank(p, 4000)
    assert kv == pytest.approx(2 * kv_bytes_per_rank(p, 2000)) and kv > 0  # full attention: linear in tokens
    seconds = handoff(p)(Request(0, 0.0, 4000))
    assert seconds == price_collective("send_recv", kv, 2, p.topo, ranks_per_node=1).time_s > 0
    loop = engine_loop(p.pipeline, p.deployment, 8192, 8, fixed_costs=False)
    cfg, cite = prefill_pool(loop, p)
    assert not cfg.handoff_blocks and cite == DISAGG_SOURCE.cite() and "event_loop_normal_disagg_prefill" in cite
    one = Timed((Request(0, 0.0, 4000),))
    base = serve(p, one, loop).mean_s
    assert serve(p, one, type(loop)(loop.pipeline, loop.rules, loop.costs, cfg)).mean_s == pytest.approx(base + seconds)


@pytest.mark.parametrize(("engine", "source"), [("sglang@0.5.23", DISAGG_SOURCE), ("vllm@0.34.0", VLLM_HANDOFF_SOURCE)])
def test_each_engine_s_prefill_side_was_read_and_does_not_block(engine, source) -> None:  # type: ignore[no-untyped-def]
    """vLLM's NixlConnector prefill server returns a finished prompt at once and only holds its blocks for the
    decode side to read (pull_scheduler.py request_finished): cited as read, not blocking, like SGLang's."""
    p = predictor(2, 1, engine=engine)
    cfg, cite = prefill_pool(engine_loop(p.pipeline, p.deployment, 8192, 8, fixed_costs=False), p)
    assert source.read and cite == source.cite() and "unread" not in cite
    assert not cfg.handoff_blocks and not cfg.decode and cfg.handoff_s is not None
