"""PP TTFT as the engines schedule it (tpplan/cost/pipeline.py, cost/workload.py simulate_pipeline):
the flow shop against hand-computed cases, the engine selection, and the boundary send it implies."""

from dataclasses import replace

import pytest

from tpplan.cost.pipeline import DEFAULT_PP_ENGINE, pipeline_model
from tpplan.cost.predict import cached_predictor, predict_plan
from tpplan.cost.topology import load_topology
from tpplan.cost.workload import Workload, simulate_pipeline, simulate_ttft
from tpplan.engines import ENGINES
from tpplan.errors import TpplanError
from tpplan.lower.stages import stage_boundary_width
from tpplan.mesh import Mesh
from tpplan.models.config import load_model
from tpplan.models.graph import build_model_graph
from tpplan.plans.named import make_plan


def equal_stages(p: int, s: float = 1.0):
    return lambda _b: (s,) * p


def test_one_chunk_gets_no_overlap() -> None:
    # one request, one chunk, P equal stages: it crosses every stage alone
    w = Workload(input_len=8, concurrency=1, chunk_size=8)
    for p in (1, 2, 4):
        assert simulate_pipeline(w, equal_stages(p), in_flight=p).ttft_s == pytest.approx([p * 1.0])


def test_c_chunks_over_p_stages_take_c_plus_p_minus_1_stage_times() -> None:
    for c, p in ((2, 4), (3, 3), (5, 2)):
        w = Workload(input_len=8 * c, concurrency=1, chunk_size=8)
        r = simulate_pipeline(w, equal_stages(p), in_flight=p)
        assert r.ttft_s == pytest.approx([c + p - 1.0])
        assert [b.start_s for b in r.batches] == pytest.approx(list(range(c)))  # one stage time apart


def test_unequal_stages_are_paced_by_the_slowest() -> None:
    # stages of 1 s and 3 s, 3 chunks: 1 + 3 (first chunk) + 2 x 3 (the slow stage, once per later chunk)
    w = Workload(input_len=24, concurrency=1, chunk_size=8)
    assert simulate_pipeline(w, lambda _b: (1.0, 3.0), in_flight=2).ttft_s == pytest.approx([10.0])


def test_a_short_last_chunk_cannot_overtake_the_chunk_before_it() -> None:
    # chunks of 8, 8 and 2 tokens, 0.1 s per token per stage, 2 stages: the 2-token chunk leaves stage 0
    # at 1.8 s but waits for stage 1 until 2.4 s (it would be out at 2.0 s if it could pass chunk 2)
    w = Workload(input_len=18, concurrency=1, chunk_size=8)
    r = simulate_pipeline(w, lambda b: (0.1 * b.n_tokens,) * 2, in_flight=2)
    assert [b.end_s for b in r.batches] == pytest.approx([1.6, 2.4, 2.6])
    assert r.ttft_s == pytest.approx([2.6])


def test_concurrency_fills_the_pipeline_across_requests() -> None:
    # four one-chunk requests at once over four 1 s stages: out at 4, 5, 6, 7 s; without PP (one 4 s stage)
    # they queue: 4, 8, 12, 16 s
    w = Workload(input_len=8, concurrency=4, chunk_size=8)
    assert simulate_pipeline(w, equal_stages(4), in_flight=4).ttft_s == pytest.approx([4, 5, 6, 7])
    assert simulate_ttft(w, lambda _b: 4.0).ttft_s == pytest.approx([4, 8, 12, 16])
    # a batch holds chunk_size tokens of several requests, as the engines' schedulers batch them
    two = Workload(input_len=4, concurrency=4, chunk_size=8)
    r = simulate_pipeline(two, equal_stages(4), in_flight=4)
    assert [len(b.segments) for b in r.batches] == [2, 2] and r.ttft_s == pytest.approx([4, 4, 5, 5])


def test_micro_batches_in_flight_gate_the_next_one() -> None:
    w = Workload(input_len=8, concurrency=2, chunk_size=8)
    assert simulate_pipeline(w, equal_stages(2), in_flight=2).ttft_s == pytest.approx([2, 3])
    assert simulate_pipeline(w, equal_stages(2), in_flight=1).ttft_s == pytest.approx([2, 4])  # waits for b0
    with pytest.raises(TpplanError, match="in_flight"):
        simulate_pipeline(w, equal_stages(2), in_flight=0)


def test_chunks_that_do_not_overlap_wait_for_their_previous_chunk() -> None:
    one = Workload(input_len=24, concurrency=1, chunk_size=8)
    assert simulate_pipeline(one, equal_stages(2), in_flight=2, chunks_overlap=False).ttft_s == pytest.approx([6])
    assert simulate_pipeline(one, equal_stages(2), in_flight=2).ttft_s == pytest.approx([4])
    # two requests of two chunks: the other request fills the gap (r1's first chunk enters at 1 s)
    two = Workload(input_len=16, concurrency=2, chunk_size=8)
    r = simulate_pipeline(two, equal_stages(2), in_flight=2, chunks_overlap=False)
    assert [b.segments[0].request_id for b in r.batches] == [0, 1, 0, 1]
    assert r.ttft_s == pytest.approx([4, 5])
    assert simulate_pipeline(two, equal_stages(2), in_flight=2).ttft_s == pytest.approx([3, 5])


def test_engine_selection() -> None:
    assert pipeline_model().engine == DEFAULT_PP_ENGINE == "sglang@0.5.23"
    v = pipeline_model("vllm")
    assert v.engine == "vllm@0.34.0" and v.schedule is ENGINES["vllm@0.34.0"].pipeline
    said = v.assumption(Mesh(8, pp=4))
    assert "vLLM 0.34.0" in said and "at most 5 micro-batches in flight (pp_size 4 + 1)" in said
    with pytest.raises(TpplanError, match="engine=trtllm@1"):
        pipeline_model("trtllm@1")
    # the sentence follows the fields the simulation reads
    deeper = replace(pipeline_model(), schedule=replace(pipeline_model().schedule, extra_in_flight=1))
    assert deeper.in_flight(Mesh(8, pp=4)) == 5
    assert "at most 5 micro-batches in flight (pp_size 4 + 1)" in deeper.assumption(Mesh(8, pp=4))
    serial = replace(v, schedule=replace(v.schedule, chunks_overlap=False))
    assert "waits until its previous chunk has left the last stage" in serial.assumption(Mesh(8, pp=4))


@pytest.fixture(scope="module")
def k3():
    return build_model_graph(load_model("kimi-k3"))


TOPO = load_topology("h200x8-ib400", nodes=4)


def test_k3_pp_ttft_is_the_flow_shop_of_its_stage_times(k3) -> None:
    # one 16K prompt in two 8K chunks over TP8 x PP4: by hand from the two chunks' stage times
    plan = make_plan("baseline", k3, 8)
    w = Workload(input_len=16384, concurrency=1, chunk_size=8192)
    pred = predict_plan(k3, plan, TOPO, mesh=Mesh(8, pp=4), workload=w)
    p = cached_predictor(k3, plan, TOPO, Mesh(8, pp=4), "bf16", None)
    a = [s + x for s, x in zip(*p.stage_times(((8192, 0),))[:2], strict=True)]
    b = [s + x for s, x in zip(*p.stage_times(((8192, 8192),))[:2], strict=True)]
    ta = tb = 0.0
    for sa, sb in zip(a, b, strict=True):
        ta += sa
        tb = max(tb, ta) + sb
    assert pred.ttft is not None and pred.ttft.ttft_s == pytest.approx([tb])
    assert sum(a) < tb < sum(a) + sum(b)  # the two chunks overlap, and the second is not free
    # one chunk: no overlap, the forward through every stage
    w1 = Workload(input_len=8192, concurrency=1, chunk_size=8192)
    one = predict_plan(k3, plan, TOPO, mesh=Mesh(8, pp=4), workload=w1, tokens=8192)
    assert one.ttft is not None and one.ttft.ttft_s == pytest.approx([one.forward_s])


def test_k3_engines_agree_where_their_schedules_agree(k3) -> None:
    # SGLang 0.5.23 keeps pp_size micro-batches in flight and vLLM 0.33.0 pp_size + 1; both pipeline a prompt's
    # chunks and gather the boundary over TP: at C=1 (two chunks, fewer than either limit) the same TTFT; a
    # schedule whose chunks do not overlap is slower at C=1
    plan = make_plan("baseline", k3, 8)
    w = Workload(input_len=16384, concurrency=1, chunk_size=8192)
    sgl = predict_plan(k3, plan, TOPO, mesh=Mesh(8, pp=4), workload=w, pipeline=pipeline_model("sglang@0.5.23"))
    vll = predict_plan(k3, plan, TOPO, mesh=Mesh(8, pp=4), workload=w, pipeline=pipeline_model("vllm@0.33.0"))
    assert sgl.ttft is not None and vll.ttft is not None
    assert sgl.ttft.ttft_s == pytest.approx(vll.ttft.ttft_s)
    m = pipeline_model()
    serial = replace(m, schedule=replace(m.schedule, chunks_overlap=False))
    slow = predict_plan(k3, plan, TOPO, mesh=Mesh(8, pp=4), workload=w, pipeline=serial)
    assert slow.ttft is not None and slow.ttft.mean_s > 1.3 * sgl.ttft.mean_s


def test_the_boundary_is_gathered_as_the_engines_do(k3) -> None:
    # both engines send 1/N per TP rank and all-gather on the next stage, a token-sharded stream (sp-moe)
    # included; a schedule that keeps shards across the boundary would skip that all-gather
    sp = make_plan("sp-moe", k3, 8)
    gathered = predict_plan(k3, sp, TOPO, mesh=Mesh(8, pp=4), tokens=8192)
    m = pipeline_model()
    shards = replace(m, schedule=replace(m.schedule, boundary_gathers=False))
    kept = predict_plan(k3, sp, TOPO, mesh=Mesh(8, pp=4), tokens=8192, pipeline=shards)
    assert kept.stage_comm_s < gathered.stage_comm_s
    base = make_plan("baseline", k3, 8)  # a replicated stream is gathered either way
    assert predict_plan(k3, base, TOPO, mesh=Mesh(8, pp=4), tokens=8192, pipeline=shards).stage_comm_s == pytest.approx(
        predict_plan(k3, base, TOPO, mesh=Mesh(8, pp=4), tokens=8192).stage_comm_s
    )
    # K3 sends the stream with its residual folded in plus the bank (both engines' forward), not 2H + bank
    assert stage_boundary_width(k3, 23) == 3 * 7168


def test_each_engines_schedule_fields_say_what_its_prose_says() -> None:
    for ev in ENGINES.values():
        p = ev.pipeline
        assert p.chunks_overlap == p.chunks_of_one_request.startswith("they pipeline"), ev.key
        assert p.boundary_gathers == ("all-gathers it" in p.boundary), ev.key
        # the launch lines' defaults: SGLang pp_size (pp_async_batch_depth 0); vLLM pp_size + 1 (async scheduling)
        assert p.extra_in_flight == (0 if ev.engine == "SGLang" else 1), ev.key
        assert ("pp_size + 1" in p.in_flight or "pipeline_parallel_size + 1" in p.in_flight) == (p.extra_in_flight == 1)
        assert "1/N slice" in p.boundary, ev.key
        # K3's snapshot bank crosses the boundary too: its own clause, printed only for K3 (boundary_models)
        assert "ceil(end_layer / block)" in p.boundary_for("kimi_k3"), ev.key
        assert "ceil(end_layer / block)" not in p.boundary_for("llama"), ev.key


def test_pp_ttft_crosses_over_with_concurrency(k3) -> None:
    # as the public K3 reports describe (the issue: SGLang PP8 x TP1 against TP8 on GB300): one-chunk prompts get
    # no overlap, so PP loses alone and wins once concurrent requests fill the pipeline
    def ttft(tp: int, pp: int, c: int) -> float:
        wl = Workload(input_len=8192, concurrency=c, chunk_size=8192)
        pr = predict_plan(
            k3, make_plan("baseline", k3, tp), TOPO, mesh=Mesh(tp, pp=pp), workload=wl, expert_dtype="mxfp4"
        )
        assert pr.ttft is not None
        return pr.ttft.mean_s

    assert ttft(4, 8, 1) > ttft(32, 1, 1)
    assert ttft(4, 8, 16) < ttft(32, 1, 16)
