"""Speculative decoding / MTP in the serving loop (issue 32): a decode step verifies k + 1 tokens per request
plus the draft's cost, a request gains the mean accepted tokens per step, so TPOT = step time / accepted.
Worked by hand on a loop with linear prices; the draft's price checked against the target's own layers; the
per-step decode path against the per-request one; the CLI's flags, JSON and bad input."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.cli_helpers import run_cli
from tests.simulate.test_decode_json_docs import DOCS, SPECULATIVE, _block, _documented
from tpplan.cost.collective_pricer import price_collective
from tpplan.cost.draft import draft_memory
from tpplan.cost.kv_capacity import kv_capacity
from tpplan.cost.predictor import cached_predictor
from tpplan.cost.topology import select_topology
from tpplan.engines.speculative import Speculative, launch_flags, running_cap
from tpplan.errors import TpplanError
from tpplan.mesh import Mesh
from tpplan.models.config import load_model
from tpplan.models.graph import build_model_graph
from tpplan.plans.named import baseline
from tpplan.simulate import loop
from tpplan.simulate.loop import LoopConfig, simulate
from tpplan.simulate.prices import CachedPrices, draft_price, even_decode, predictor_prices
from tpplan.simulate.requests import Shape, closed_loop, poisson


class Recorder:
    """1 s per step plus 10 ms per token computed; remembers every step's segments."""

    def __init__(self) -> None:
        self.steps: list[tuple[tuple[int, int], ...]] = []

    def __call__(self, segs):  # type: ignore[no-untyped-def]
        self.steps.append(tuple(segs))
        return [1.0 + 0.01 * sum(n for n, _ in segs)]


def test_one_request_by_hand() -> None:
    """Prompt 10, 11 output tokens, k = 3, 2.5 accepted per step: the prefill step gives the first token
    (1 + 0.10 s), the other 10 take ceil(10 / 2.5) = 4 steps of 4 verified tokens (1 + 0.04 s each) at
    contexts 10, 12.5, 15, 17.5 (rounded half to even); TPOT = 4 x 1.04 / 10."""
    prices = Recorder()
    cfg = LoopConfig(4096, decode=True, verify_tokens=4, accepted=2.5)
    res = simulate(closed_loop(1, [Shape(10, 11)], 1), prices, cfg)
    assert prices.steps == [((10, 0),), ((4, 10),), ((4, 12),), ((4, 15),), ((4, 18),)]
    (t,) = res.timelines
    assert t.first_token_s == pytest.approx(1.1)
    assert t.done_s == pytest.approx(1.1 + 4 * 1.04)
    assert t.tpot_s == pytest.approx(4 * 1.04 / 10)
    assert len(res.itl) == 4 and res.itl[0] == pytest.approx(1.04)


def test_without_speculation_the_same_request_takes_ten_steps() -> None:
    prices = Recorder()
    res = simulate(closed_loop(1, [Shape(10, 11)], 1), prices, LoopConfig(4096, decode=True))
    assert [s[0] for s in prices.steps[1:]] == [(1, 10 + i) for i in range(10)]
    assert res.timelines[0].tpot_s == pytest.approx(1.01)


def test_mixed_steps_take_the_verify_width_from_the_budget() -> None:
    """vLLM's scheduler takes 1 + k tokens per running request from the step's budget: with a budget of 20,
    four decoding requests verify 4 tokens each (k = 3) and leave 4 tokens for the long prompt's chunk,
    where one token each would leave 16."""
    shapes = [Shape(4, 50)] * 4 + [Shape(100, 2)]
    spec, plain = Recorder(), Recorder()
    simulate(closed_loop(5, shapes, 5), spec, LoopConfig(20, decode=True, mixed=True, verify_tokens=4, accepted=2.0))
    simulate(closed_loop(5, shapes, 5), plain, LoopConfig(20, decode=True, mixed=True))
    assert spec.steps[0] == plain.steps[0] == ((4, 0),) * 5
    assert spec.steps[1] == ((4, 4),) + ((4, 4),) * 4
    assert plain.steps[1] == ((16, 4),) + ((1, 4),) * 4


def test_cached_prices_verify_width_and_draft_on_the_last_stage() -> None:
    seen: list[tuple[tuple[int, int], ...]] = []

    def stages(segs):  # type: ignore[no-untyped-def]
        seen.append(tuple(segs))
        return [0.5, 1.0 + 0.001 * sum(n for n, _ in segs)]

    prices = CachedPrices(stages, verify=4, draft=lambda pre, dec, samples: 0.25 * len(dec))
    got = prices.price_step((), 3, 3 * 64)
    assert even_decode(3, 3 * 64, 4) == ((4, 64),) * 3 == seen[0]  # the grid's points 64 and 65; mean 64
    assert list(got) == pytest.approx([0.5, 1.0 + 0.012 + 0.75])


def unread(k: int, accepted: float, draft_layers: int = 1) -> Speculative:
    """An EAGLE draft named by a hub name tpplan does not read: timed as `draft_layers` of the target's last
    layer with the target's lm_head, its memory not priced (tiny-llama has no MTP layers)."""
    return Speculative(k, accepted, method="eagle", draft_layers=draft_layers, draft_model="org/unread-draft")


@pytest.fixture(scope="module")
def llama():  # type: ignore[no-untyped-def]
    graph = build_model_graph(load_model("tiny-llama"))
    topo = select_topology("h100x8-ib400", 1, gpu="h100-datasheet")
    return cached_predictor(graph, baseline(), topo, Mesh(2), "bf16", None)


def test_the_draft_is_the_targets_layer_per_pass(llama) -> None:  # type: ignore[no-untyped-def]
    """tiny-llama's layers are all alike: a one-token draft pass (k = 1: only the pass over the verify width,
    2 tokens a request) costs the target's step at that batch over its layer count, without the final
    reduction, plus the pass's eh_proj (2b rows, 2H -> H on every rank), the shared lm_head (b rows,
    H -> V / TP) and the logits' all-gather over TP 2 (b x V in bf16); k = 3 with two draft layers adds two
    one-token passes."""
    p = llama
    layers = p.graph.spec.num_layers
    h, v = p.graph.spec.hidden, p.graph.spec.vocab
    b, c = 8, 1000

    def per_layer(width: int) -> float:
        segs = ((width, c),) * b
        stage_s, _, final = p.stage_times(segs)
        return (sum(stage_s) - final) / layers

    gather = price_collective("all_gather", b * v * 2, 2, p.topo, ranks_per_node=2, sources=p.comms.sources).time_s
    assert gather > 0

    def extras(width: int) -> float:
        return p.kernels.gemm_seconds(b * width, 2 * h, h) + p.kernels.gemm_seconds(b, h, v // 2) + gather

    one = unread(1, 1.5)
    assert draft_price(p, one)(b, c) == pytest.approx(per_layer(2) + extras(2))
    three = unread(3, 2.5, draft_layers=2)
    want = 2 * per_layer(4) + extras(4) + 2 * (2 * per_layer(1) + extras(1))
    assert draft_price(p, three)(b, c) == pytest.approx(want)


EAGLE3 = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "vocab_size": 128, "draft_vocab_size": 32,
          "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 1, "num_attention_heads": 4,
          "num_key_value_heads": 2, "rms_norm_eps": 1e-05, "tie_word_embeddings": False}  # fmt: skip
"""An EAGLE-3 draft of tiny-llama's shape: one decoder layer like the target's, a 32-token draft vocabulary."""


def test_an_eagle3_draft_is_priced_from_its_config(llama, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """DRAFT a checkpoint folder holding the config: at TP 2 its one layer holds q 64x64, k and v 64x32 (2 KV
    heads of 16), o 64x64 and the MLP 3 x 64x96, halved, and its two norms 2 x 64 whole: 15,488 weights; the fc
    reads three target hidden states (3 x 64 -> 64, every rank whole); its own lm_head holds the 32-token draft
    vocabulary over TP 2. vLLM caches the draft layer as its own GQA layer, 2 x 1 head x 16 x 2 bytes = 64 bytes
    a token, beside the target's 2 x 64. A pass is its layer (the target's per-layer time: the same shape),
    the fc over the pass's tokens, the head over one token per request and the draft logits' all-gather."""
    (tmp_path / "config.json").write_text(json.dumps(EAGLE3))
    spec = Speculative(3, 2.4, method="eagle", draft_model=str(tmp_path))
    draft = draft_memory(llama, spec)
    assert draft is not None and draft.layers == 1
    assert draft.layer_bytes == (64 * 64 // 2 * 2 + 64 * 32 // 2 * 2 + 3 * 64 * 96 // 2 + 2 * 64) * 2 == 30_976
    assert (draft.glue_bytes, draft.head_bytes) == (3 * 64 * 64 * 2, 32 * 64 / 2 * 2)
    plain, with_draft = kv_capacity(llama, "vllm@0.34.0"), kv_capacity(llama, "vllm@0.34.0", draft=draft)
    assert (plain.bytes_per_token, with_draft.bytes_per_token) == (128, 192)
    assert with_draft.weights == plain.weights + draft.weights
    b, c, p = 8, 1000, llama

    def per_layer(width: int) -> float:
        stage_s, _, final = p.stage_times(((width, c),) * b)
        return (sum(stage_s) - final) / p.graph.spec.num_layers

    gather = price_collective("all_gather", b * 32 * 2, 2, p.topo, ranks_per_node=2, sources=p.comms.sources).time_s

    def one_pass(width: int) -> float:
        return per_layer(width) + p.kernels.gemm_seconds(b * width, 3 * 64, 64) + p.kernels.gemm_seconds(b, 64, 16)

    want = one_pass(4) + 2 * one_pass(1) + 3 * gather
    assert draft_price(p, spec)(b, c) == pytest.approx(want)


def test_the_eagle_conditions_say_whether_the_drafts_config_was_read(monkeypatch, capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "config.json").write_text(json.dumps(EAGLE3))
    said = []
    for draft in (str(tmp_path), "org/eagle3-draft"):
        code, out, err = _decode(monkeypatch, capsys, tmp_path, "-m", "tiny-llama", "--spec", f"eagle:3:2.4:{draft}")
        assert code == 0, err
        dec = json.loads(out)["plans"][0]["serving"]["decode"]
        said.append(" ".join(dec["conditions"]))
        assert (dec["settings"]["speculative"]["draft"] is None) == (draft == "org/eagle3-draft")
    assert "priced from its config" in said[0] and "is not read" not in said[0]
    assert "is not read" in said[1] and "priced from its config" not in said[1]


@pytest.fixture(scope="module")
def tiny_mtp():  # type: ignore[no-untyped-def]
    """tiny-deepseek-v3 (hidden 64, vocab 128, 3 MLA layers, the last MoE; one nextn layer) at TP 1 on H100."""
    graph = build_model_graph(load_model("tiny-deepseek-v3"))
    topo = select_topology("h100x8-ib400", 1, gpu="h100-datasheet")
    return cached_predictor(graph, baseline(), topo, Mesh(1), "bf16", None)


def test_the_mtp_drafts_weights_by_hand(tiny_mtp) -> None:  # type: ignore[no-untyped-def]
    """One nextn layer at TP 1 in bf16, counted by hand from the config: MLA q_a 64x24 + kv_a 64x(16+8),
    q_b 24x4x(16+8), kv_b 16x4x(16+16), o 4x16x64 and the q_a/kv_a norms 24 + 16; the layer's two norms 2x64;
    MoE router 8x64, 8 experts x 3 x 64x32, one shared expert 3 x 64x32: 67,496 weights; the eh_proj 2x64x64
    and three norms 3x64: 8,384. The embedding and lm_head are the target's."""
    attn = 64 * 24 + 64 * 24 + 24 * 4 * 24 + 16 * 4 * 32 + 4 * 16 * 64 + 24 + 16
    moe = 8 * 64 + 8 * 3 * 64 * 32 + 3 * 64 * 32
    assert attn + 2 * 64 + moe == 67_496
    draft = draft_memory(tiny_mtp, Speculative(3, 2.4))
    assert draft is not None and draft.layers == 1
    assert draft.layer_bytes == 67_496 * 2
    assert draft.glue_bytes == (2 * 64 * 64 + 3 * 64) * 2 == 8_384 * 2
    assert draft.weights == 151_760
    assert draft_memory(tiny_mtp, None) is None
    assert draft_memory(tiny_mtp, Speculative(3, 2.4, method="eagle", draft_model="org/d")) is None  # not read


@pytest.mark.parametrize("engine", ["sglang@0.5.23", "vllm@0.34.0"])
def test_kv_capacity_with_and_without_the_draft(tiny_mtp, engine) -> None:  # type: ignore[no-untyped-def]
    """The draft's weights come out of the pool and its nextn layer caches every token as an MLA layer does
    ((kv_lora_rank 16 + rope 8) x 2 bytes = 48 per layer): the cell grows from 3 x 48 to 4 x 48 bytes, so
    the pool holds 3/4 of the tokens less the draft's weights' share, and a long request's admitted batch
    shrinks with it."""
    draft = draft_memory(tiny_mtp, Speculative(3, 2.4))
    assert draft is not None
    plain = kv_capacity(tiny_mtp, engine, 10**6)
    spec = kv_capacity(tiny_mtp, engine, 10**6, draft=draft)
    assert (plain.bytes_per_token, spec.bytes_per_token) == (144, 192)
    assert spec.weights == plain.weights + 151_760
    if engine.startswith("sglang"):  # pool = pre x mem_fraction_static - weights: the draft's come out
        assert spec.pool_bytes == pytest.approx(plain.pool_bytes - 151_760)
        assert spec.tokens == int(spec.pool_bytes // 192)
    else:  # vLLM: KV bytes after the profiled weights, in blocks of 16 tokens
        assert spec.pool_bytes == pytest.approx(plain.pool_bytes - 151_760)
        assert spec.tokens == int(spec.pool_bytes // (16 * 192)) * 16
    assert spec.tokens < plain.tokens * 3 / 4 + 16
    assert plain.bound == spec.bound == "KV pool"
    assert spec.batch is not None and plain.batch is not None and spec.batch < plain.batch


def test_a_speculative_step_costs_more_but_tpot_falls_with_acceptance(llama) -> None:  # type: ignore[no-untyped-def]
    """The same 8 requests decoding 65 tokens: a k = 3 step costs more than a plain one (4 tokens verified
    and the draft), and TPOT is the step time over the accepted tokens, so it falls as acceptance grows."""
    arrivals = closed_loop(8, [Shape(512, 65)], 8)

    def run(spec: Speculative | None) -> float:
        cfg = LoopConfig(8192, decode=True, verify_tokens=spec.verify_tokens if spec else 1,
                         accepted=spec.accepted if spec else 1.0)  # fmt: skip
        res = simulate(arrivals, predictor_prices(llama, spec), cfg)
        s = res.decode_summary(2)
        assert s is not None
        return float(s["tpot_s"]["mean"])  # type: ignore[index]

    plain = run(None)
    low, high = run(unread(3, 1.0)), run(unread(3, 3.2))
    assert low > plain  # every step pays verify + draft and gains one token
    assert high < low
    step_plain = predictor_prices(llama).price_step((), 8, 8 * 600)[0]
    step_spec = predictor_prices(llama, unread(3, 3.2)).price_step((), 8, 8 * 600)[0]
    assert step_spec > step_plain
    assert high == pytest.approx(step_spec / 3.2, rel=0.05)  # steps at contexts 512..577: about alike


def _tpot(p, spec: Speculative | None) -> float:  # type: ignore[no-untyped-def]
    """Mean TPOT of 8 requests decoding 64 tokens after a 256-token prompt, together on one replica."""
    cfg = LoopConfig(8192, decode=True, verify_tokens=spec.verify_tokens if spec else 1,
                     accepted=spec.accepted if spec else 1.0)  # fmt: skip
    s = simulate(closed_loop(8, [Shape(256, 65)], 8), predictor_prices(p, spec), cfg).decode_summary(1)
    assert s is not None
    return float(s["tpot_s"]["mean"])  # type: ignore[index]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(k=st.integers(1, 3), share=st.floats(0.0, 1.0))
def test_tpot_falls_only_where_acceptance_pays_for_the_draft(tiny_mtp, k, share) -> None:  # type: ignore[no-untyped-def]
    """A speculative step costs r plain steps (the k + 1 verify and the draft's passes) and gains A tokens:
    TPOT falls below the plain TPOT exactly where A > r (8% either side of the break-even left out: a
    request's last step is rounded up), and it is the plain TPOT x r x ceil(64 / A) / 64. The draft's passes
    raise r above the verify pass's alone, so acceptance must pay for them too."""
    accepted = 1.0 + share * k  # 1 to k + 1
    spec = Speculative(k, accepted)
    plain_step = predictor_prices(tiny_mtp).price_step((), 8, 8 * 288)[0]
    r = predictor_prices(tiny_mtp, spec).price_step((), 8, 8 * 288)[0] / plain_step
    verify_only = CachedPrices(predictor_prices(tiny_mtp), spec.verify_tokens).price_step((), 8, 8 * 288)[0]
    assert r > verify_only / plain_step > 1.0
    assume(abs(accepted - r) > 0.08 * r)
    plain, fast = _tpot(tiny_mtp, None), _tpot(tiny_mtp, spec)
    assert (fast < plain) == (accepted > r)
    steps = LoopConfig(8192, decode=True, accepted=accepted).steps_out(65) - 1  # ceil(64 / A), 1e-9 slack
    assert steps == math.ceil(64 / accepted - 1e-9)
    assert fast == pytest.approx(plain * r * steps / 64, rel=0.03)


@pytest.mark.parametrize("mixed", [True, False])
def test_per_step_decode_equals_per_request_under_speculation(monkeypatch, llama, mixed) -> None:  # type: ignore[no-untyped-def]
    spec = unread(2, 2.3)
    arrivals = poisson(40.0, [Shape(300, 40), Shape(900, 17), Shape(100, 2)], 120, seed=5)
    cfg = LoopConfig(2048, decode=True, mixed=mixed, max_running=24, verify_tokens=3, accepted=2.3)
    fast = simulate(arrivals, predictor_prices(llama, spec), cfg)
    monkeypatch.setattr(loop._Replica, "FAST_DECODE", False)
    slow = simulate(arrivals, predictor_prices(llama, spec), cfg)
    assert fast.timelines == slow.timelines
    assert fast.steps == slow.steps
    assert fast.itl == pytest.approx(slow.itl)


def test_flags_and_caps_as_the_engines_read_them() -> None:
    spec = Speculative(3, 2.4)
    sglang = ("--speculative-algorithm NEXTN", "--speculative-num-steps 3", "--speculative-eagle-topk 1",
              "--speculative-num-draft-tokens 4")  # fmt: skip
    assert launch_flags("sglang@0.5.23", spec) == sglang
    assert launch_flags("vllm@0.34.0", spec) == (
        """--speculative-config '{"method":"mtp","num_speculative_tokens":3}'""",
    )
    eagle = Speculative(5, 3.0, method="eagle", draft_model="org/eagle3-draft")
    assert launch_flags("sglang@0.5.23", eagle)[-1] == "--speculative-draft-model-path org/eagle3-draft"
    assert '"model":"org/eagle3-draft"' in launch_flags("vllm@0.34.0", eagle)[0]
    assert launch_flags("sglang@0.5.23", spec, 200)[-1] == "--max-running-requests 200"  # not SGLang's 48
    assert running_cap("sglang@0.5.23", None) == 48 and running_cap("sglang@0.5.23", 200) == 200
    assert running_cap("vllm@0.34.0", None) is None


@pytest.mark.parametrize(
    ("args", "where"),
    [((3, 4.5), "spec_accepted=4.5"), ((0, 1.0), "spec_draft_tokens=0"), ((2, 0.5), "spec_accepted=0.5")],
)
def test_bad_inputs_name_the_field(args, where) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(TpplanError) as e:
        Speculative(*args)
    assert where in str(e.value)


AUDIT = ("audit", "-m", "tiny-deepseek-v3", "--tp", "2", "-t", "h200x8-ib400", "--plan", "baseline", "--json", "-")


def _decode(monkeypatch, capsys, tmp_path, *extra: str):  # type: ignore[no-untyped-def]
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,128,33\n0.001,256,21\n")
    code, out, err = run_cli(monkeypatch, capsys, *AUDIT, "--trace", str(trace), *extra)
    return code, out, err


def test_audit_json_carries_the_inputs_and_the_flags(monkeypatch, capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    code, out, err = _decode(monkeypatch, capsys, tmp_path, "--spec", "mtp:3:2.5")
    assert code == 0, err
    d = json.loads(out)["plans"][0]["serving"]["decode"]
    s = d["settings"]["speculative"]
    assert (s["draft_tokens"], s["verify_tokens"], s["accepted_per_step"]) == (3, 4, 2.5)
    assert "--speculative-num-draft-tokens 4" in s["flags"] and len(s["sources"]) == 8
    assert s["draft"]["layers"] == 1 and s["draft"]["weights_bytes_per_rank"] > 0  # its nextn layer at TP 2
    assert f"--max-running-requests {d['settings']['max_running']}" in s["flags"]  # the cap the loop served with
    # 32 + 20 decode tokens at 2.5 a step: 13 and 8 steps
    assert d["decode_steps"] == 13
    assert not any("not modelled: one token per step" in c for c in d["conditions"])
    doc = (DOCS / "audit-json.md").read_text(encoding="utf-8")
    documented = _documented(_block(doc, '"decode": {'))
    emitted = set(d) | set(d["settings"]) | set(s) | set(s["draft"])
    assert emitted - {"requests"} <= documented, emitted - documented
    assert emitted >= SPECULATIVE


def test_a_pd_decode_pool_holds_the_draft(monkeypatch, capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """--pd with --spec: the decode pool's KV pool loses the draft's share (the cell 3 -> 4 MLA layers and the
    draft's weights), and its JSON carries the draft's memory."""
    pools = []
    for extra in ((), ("--spec", "mtp:3:2.5")):
        code, out, err = _decode(monkeypatch, capsys, tmp_path, "--pd", "tp2:tp2", *extra)
        assert code == 0, err
        pools.append(json.loads(out)["plans"][0]["serving"]["disaggregated"])
    plain, spec = pools
    assert "speculative" not in plain and spec["speculative"]["draft"]["layers"] == 1
    assert spec["decode"]["kv_tokens"] < plain["decode"]["kv_tokens"] * 3 / 4


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (("--spec", "mtp:3"), "--spec mtp:3: is not METHOD:K:A[:DRAFT]"),
        (("--spec", "mtp:3:7"), "--spec mtp:3:7: A must be 1 to draft tokens + 1 = 4"),
        (("--spec", "medusa:3:2"), "--spec medusa:3:2: METHOD is not mtp or eagle"),
        (("--spec", "eagle:3:2"), "end it with :CHECKPOINT"),
        (("--spec", "mtp:3:2", "-m", "tiny-llama"), "--spec mtp: model tiny-llama has no MTP layers"),
    ],
)
def test_bad_spec_options_are_one_line_exit_2(monkeypatch, capsys, tmp_path, extra, says) -> None:  # type: ignore[no-untyped-def]
    code, _, err = _decode(monkeypatch, capsys, tmp_path, *extra)
    assert code == 2
    assert says in err and "Traceback" not in err


def test_search_serving_blocks_carry_it_too(monkeypatch, capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    wl = tmp_path / "chat.toml"
    wl.write_text('name = "chat"\ninput_len = 256\noutput_len = 64\nconcurrency = 4\nchunk_size = 1024\n')
    args = ("search", "-m", "tiny-deepseek-v3", "-t", "h200x8-ib400", "--tp", "2", "-w", str(wl), "--top", "1",
            "--json", "-")  # fmt: skip
    code, out, err = run_cli(monkeypatch, capsys, *args, "--spec", "mtp:3:2.4")
    assert code == 0, err
    dec = json.loads(out)["plans"][0]["serving"]["decode"]
    assert dec["settings"]["speculative"]["accepted_per_step"] == 2.4
    code, out, err = run_cli(monkeypatch, capsys, *args)
    plain = json.loads(out)["plans"][0]["serving"]["decode"]
    assert "speculative" not in plain["settings"] and dec["decode_steps"] < plain["decode_steps"]
