"""The draft's pass in aggregated serving's prefill and mixed steps (issue 32 leftover): both engines run the
draft over a prompt's tokens in the step that prefills them (engines/speculative.AGG_PREFILL_SOURCES). Worked by
hand on tiny-deepseek-v3 (3 MLA layers, one MTP layer) at TP 2, k = 3: a draft pass is the target's last layer
over the segments and the eh_proj over their tokens (2H -> H), plus, where the engine samples, the shared
lm_head over one token per request (H -> V / 2) and the logits' all-gather over TP 2 (V bf16 per request).
Also SGLang's P/D hand-off, which carries each request's draft hidden state beside its KV."""

from __future__ import annotations

import json

import pytest

from tests.cli_helpers import run_cli
from tests.simulate.test_pd_speculative import MTP, _predictor
from tests.simulate.test_speculative import AUDIT
from tpplan.cost.collective_pricer import price_collective
from tpplan.cost.draft import draft_memory
from tpplan.cost.predictor import cached_predictor
from tpplan.cost.topology import select_topology
from tpplan.mesh import Mesh
from tpplan.models.config import load_model
from tpplan.models.graph import build_model_graph
from tpplan.plans.named import baseline
from tpplan.simulate.disagg import DisaggDeployment, PoolSpec, handoff_seconds
from tpplan.simulate.loop import LoopConfig, simulate
from tpplan.simulate.pd import handoff_bytes_per_rank, kv_bytes_per_rank
from tpplan.simulate.prices import CachedPrices, predictor_prices, stage_prices
from tpplan.simulate.requests import Shape, closed_loop


@pytest.fixture(scope="module", params=["sglang@0.5.23", "vllm@0.34.0"])
def p(request):  # type: ignore[no-untyped-def]
    out = _predictor(request.param)
    assert out.pipeline.engine == request.param  # the loop's engine, whose draft rules apply
    return out


def _sglang(p) -> bool:  # type: ignore[no-untyped-def]
    return bool(p.pipeline.engine.startswith("sglang"))


def draft_by_hand(p, segs, sample: bool) -> float:  # type: ignore[no-untyped-def]
    """One MTP pass over `segs`: the last layer and the eh_proj; `sample`: the lm_head and all-gather too."""
    h, v = p.graph.spec.hidden, p.graph.spec.vocab
    out = p.kind_time(p.audit.layer_results[-1], segs).total_s + p.kernels.gemm_seconds(
        sum(n for n, _ in segs), 2 * h, h
    )
    if sample:
        r = len(segs)
        gather = price_collective("all_gather", r * v * 2, 2, p.topo, ranks_per_node=2, sources=p.comms.sources)
        assert gather.time_s > 0
        out += p.kernels.gemm_seconds(r, h, v // 2) + gather.time_s
    return out


def extra(p, prefill, batch: int = 0, context: int = 0, samples: bool = True) -> float:  # type: ignore[no-untyped-def]
    """The last stage's seconds under --spec over the same step without the draft (decode requests verifying
    k + 1 tokens alike), the other stages unchanged."""
    spec = predictor_prices(p, MTP).price_step(prefill, batch, batch * context, samples)
    plain = CachedPrices(stage_prices(p), MTP.verify_tokens).price_step(prefill, batch, batch * context)
    assert list(spec[:-1]) == list(plain[:-1])
    return spec[-1] - plain[-1]


def test_a_prefill_step_whose_requests_will_decode(p) -> None:  # type: ignore[no-untyped-def]
    """Prompts of 300 (after 100 cached) and 200 tokens, both final chunks: SGLang's draft extend for prefill is
    one sampling pass over the 500 tokens; vLLM's propose is that pass and k - 1 = 2 one-token passes over the two
    requests at their new contexts 400 and 200 (each sampling)."""
    segs = ((300, 100), (200, 0))
    want = draft_by_hand(p, segs, True)
    if not _sglang(p):
        want += 2 * draft_by_hand(p, ((1, 400), (1, 200)), True)
    assert extra(p, segs) == pytest.approx(want)


def test_a_step_whose_drafts_go_unused(p) -> None:  # type: ignore[no-untyped-def]
    """A non-final chunk (or a prompt with one output token): vLLM proposes nothing (K = 0) and its draft prefill
    only fills the draft's KV; SGLang's draft extend samples after every chunk."""
    segs = ((256, 0),)
    assert extra(p, segs, samples=False) == pytest.approx(draft_by_hand(p, segs, _sglang(p)))


def test_vllm_mixed_step_drafts_over_the_whole_step() -> None:
    """vLLM: a chunk of 300 (after 100) beside two decoding requests at context 64 verifying k + 1 = 4 tokens:
    one draft prefill over the 308 tokens sampling 3 rows, then 2 one-token passes over the 3 requests (at 400,
    64, 64). Without the chunk the decode step's draft is the same chain over the 2 requests alone."""
    p = _predictor("vllm@0.34.0")
    dec = ((4, 64), (4, 64))
    want = draft_by_hand(p, ((300, 100), *dec), True) + 2 * draft_by_hand(p, ((1, 400), (1, 64), (1, 64)), True)
    assert extra(p, ((300, 100),), 2, 64) == pytest.approx(want)
    alone = draft_by_hand(p, dec, True) + 2 * draft_by_hand(p, ((1, 64), (1, 64)), True)
    assert extra(p, (), 2, 64) == pytest.approx(alone)


@pytest.mark.parametrize("prompt", [300, 1000])
def test_ttft_with_spec_is_above_ttft_without_by_the_drafts_passes(p, prompt: int) -> None:  # type: ignore[no-untyped-def]
    """One request alone, chunk budget 512 (1000 tokens: chunks 512 and 488): TTFT under --spec is TTFT without
    plus the draft on each prefill step, by hand: SGLang samples after every chunk; vLLM's earlier chunk only
    fills the draft's KV, its final chunk proposes k tokens."""
    chunks = [(512, 0), (prompt - 512, 512)] if prompt > 512 else [(prompt, 0)]
    want = 0.0
    for i, (n, c) in enumerate(chunks):
        final = i == len(chunks) - 1
        want += draft_by_hand(p, ((n, c),), _sglang(p) or final)
        if final and not _sglang(p):
            want += 2 * draft_by_hand(p, ((1, prompt),), True)
    arrivals = closed_loop(1, [Shape(prompt, 8)], 1)
    plain = simulate(arrivals, predictor_prices(p), LoopConfig(512, decode=True, mixed=not _sglang(p)))
    spec = simulate(arrivals, predictor_prices(p, MTP),
                    LoopConfig(512, decode=True, mixed=not _sglang(p), verify_tokens=4, accepted=2.5))  # fmt: skip
    got = spec.timelines[0].first_token_s - plain.timelines[0].first_token_s
    assert want > 0 and got == pytest.approx(want)


def test_one_output_token_in_vllm_proposes_nothing() -> None:
    """vLLM: a prompt with one output token finishes at its prefill step, so that step proposes no drafts
    (Scheduler._drafts_unused): its draft only fills the draft's KV."""
    p = _predictor("vllm@0.34.0")
    arrivals = closed_loop(1, [Shape(300, 1)], 1)
    plain = simulate(arrivals, predictor_prices(p), LoopConfig(512, decode=True))
    spec = simulate(arrivals, predictor_prices(p, MTP), LoopConfig(512, decode=True, verify_tokens=4, accepted=2.5))
    got = spec.timelines[0].first_token_s - plain.timelines[0].first_token_s
    assert got == pytest.approx(draft_by_hand(p, ((300, 0),), False))


def test_audit_serving_ttft_carries_the_draft(monkeypatch, capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`tpplan audit --spec` (its loop runs SGLang, the default engine): one request of 128 prompt tokens; its
    TTFT in the serving block, the decode block's and the idealised one exceed those without --spec by one
    sampling MTP pass over the 128 tokens."""
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,128,9\n")
    runs = []
    for extra in ((), ("--spec", "mtp:3:2.5")):
        code, out, err = run_cli(monkeypatch, capsys, *AUDIT, "--trace", str(trace), *extra)
        assert code == 0, err
        runs.append(json.loads(out)["plans"][0]["serving"])
    graph = build_model_graph(load_model("tiny-deepseek-v3"))  # the audit's predictor (no --engine)
    audit_p = cached_predictor(graph, baseline(), select_topology("h200x8-ib400", 1), Mesh(2), "bf16", None)
    assert audit_p.pipeline.engine == "sglang@0.5.23"
    want = draft_by_hand(audit_p, ((128, 0),), True)
    plain, spec = runs
    assert spec["ttft"]["mean_s"] - plain["ttft"]["mean_s"] == pytest.approx(want)
    assert spec["idealised_mean_s"] - plain["idealised_mean_s"] == pytest.approx(want)
    assert spec["decode"]["ttft_s"]["mean"] - plain["decode"]["ttft_s"]["mean"] == pytest.approx(want)


def test_the_pd_hand_off_carries_sglangs_draft_hidden_state(p) -> None:  # type: ignore[no-untyped-def]
    """P/D: SGLang's prefill server sends each request's draft hidden state in its metadata beside the KV
    (spec_hidden_size = tiny-deepseek-v3's hidden 64, in bf16: 128 bytes); vLLM's proposes nothing and sends
    none. A 448-token prompt's hand-off is one send of the KV per rank (4 MLA cells a token with the MTP
    layer) plus that state."""
    draft = draft_memory(p, MTP)
    assert draft is not None and draft.hidden == p.graph.spec.hidden == 64
    state = 64 * 2 if _sglang(p) else 0
    kv = kv_bytes_per_rank(p, 448, draft)
    assert kv == pytest.approx(4 * p.kv_per_token(p.graph.spec.layers[-1].attn) * 448)
    assert handoff_bytes_per_rank(p, 448, draft) - kv == state
    assert handoff_bytes_per_rank(p, 448) == kv_bytes_per_rank(p, 448)  # no draft: the KV alone
    dep = DisaggDeployment(PoolSpec(p), PoolSpec(p, speculative=MTP))
    send = price_collective("send_recv", kv + state, 2, p.topo, ranks_per_node=2 if dep.one_node() else 1).time_s
    assert handoff_seconds(dep, 448) == pytest.approx(send)
