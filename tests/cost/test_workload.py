import pytest

from tpplan.cost.workload import (
    Workload,
    list_workloads,
    load_workload,
    schedule,
    simulate_pipeline,
    simulate_ttft,
)
from tpplan.errors import TpplanError


def test_presets() -> None:
    assert {"prompt16k-c8", "prompt16k-c16"} <= set(list_workloads())
    w = load_workload("seed-c16")
    assert (w.input_len, w.output_len, w.concurrency, w.chunk_size) == (16384, 1, 16, 8192)
    assert w.total_requests == 16


@pytest.mark.parametrize("c", [8, 16])
def test_seed_protocol_exact_ttft(c: int) -> None:
    w = load_workload(f"seed-c{c}")
    t = 0.25
    batches = schedule(w)
    assert len(batches) == 2 * c and all(b.n_tokens == 8192 for b in batches)
    for i, b in enumerate(batches):  # request i fills batches 2i and 2i+1, one chunk each
        assert [(s.request_id, s.start_pos, s.n_tokens) for s in b.segments] == [(i // 2, 8192 * (i % 2), 8192)]
    r = simulate_ttft(w, lambda _b: t)
    assert r.ttft_s == pytest.approx([(2 * i + 2) * t for i in range(c)])
    assert r.mean_s == pytest.approx((c + 1) * t)
    assert r.p50_s == pytest.approx((c + 1) * t)  # median of 2t..2ct (even count)
    assert r.max_s == pytest.approx(2 * c * t)
    assert r.throughput_tok_s == pytest.approx(8192 / t)


def test_uneven_lengths_split_and_continue_first() -> None:
    w = Workload(input_lens=[5000, 3000, 12000, 100], concurrency=4, chunk_size=8192)
    batches = schedule(w)
    segs = [[(s.request_id, s.start_pos, s.n_tokens) for s in b.segments] for b in batches]
    assert segs == [
        [(0, 0, 5000), (1, 0, 3000), (2, 0, 192)],
        [(2, 192, 8192)],  # the split request continues first and fills the budget
        [(2, 8384, 3616), (3, 0, 100)],
    ]
    assert all(b.n_tokens <= 8192 for b in batches)
    r = simulate_ttft(w, lambda b: b.n_tokens * 1e-4)  # time proportional to tokens
    last = 2 * 0.8192 + 0.3716
    assert r.ttft_s == pytest.approx([0.8192, 0.8192, last, last])


def test_closed_loop_resubmits_at_first_token() -> None:
    w = Workload(input_len=8192, concurrency=2, chunk_size=8192, num_requests=5)
    r = simulate_ttft(w, lambda _b: 1.0)
    # one request per batch; the client whose request finished submits the next immediately
    assert r.arrival_s == pytest.approx([0, 0, 1, 2, 3])
    assert r.ttft_s == pytest.approx([1, 2, 2, 2, 2])
    assert r.makespan_s == pytest.approx(5)


def test_idle_gap_when_nothing_waits() -> None:
    # batch_time 0 means arrivals pile at t=0 anyway; simulated time never runs backwards
    w = Workload(input_len=100, concurrency=1, chunk_size=64, num_requests=3)
    r = simulate_ttft(w, lambda _b: 0.5)
    assert r.ttft_s == pytest.approx([1.0, 1.0, 1.0])
    starts = [b.start_s for b in r.batches]
    assert starts == sorted(starts)


def test_bad_workload_files(tmp_path) -> None:
    p = tmp_path / "w.toml"
    p.write_text("input_len = 16384\nconcurrency = 0\nchunk_size = 8192\n")
    with pytest.raises(TpplanError) as exc:
        load_workload(str(p))
    assert "w.toml" in str(exc.value) and "concurrency" in str(exc.value)
    p.write_text('input_len = "long"\nconcurrency = 1\nchunk_size = 8192\n')
    with pytest.raises(TpplanError, match="input_len"):
        load_workload(str(p))
    with pytest.raises(TpplanError, match="no such preset"):
        load_workload("seed-c7")
    p.write_text("input_lens = []\nconcurrency = 1\nchunk_size = 8\n")
    with pytest.raises(TpplanError, match="input_lens must be a non-empty list"):
        load_workload(str(p))
    p.write_text("concurrency = 1\nchunk_size = 8\n")
    with pytest.raises(TpplanError, match="give input_len"):
        load_workload(str(p))


def test_a_second_stage_pipelines_batches_and_delays_resubmission() -> None:
    # two stages (1.0 s, 0.5 s): batches enter every 1.0 s and each leaves 0.5 s after stage 0
    w = Workload(input_len=8192, concurrency=2, chunk_size=8192, num_requests=3)
    r = simulate_pipeline(w, lambda _b: (1.0, 0.5), in_flight=2)
    assert r.ttft_s == pytest.approx([1.5, 2.5, 2.0])  # request 2 arrives when request 0 is out (1.5)
    assert r.arrival_s == pytest.approx([0, 0, 1.5])
    assert [b.start_s for b in r.batches] == pytest.approx([0, 1, 2])
    assert r.makespan_s == pytest.approx(3.5)
    one = Workload(input_len=8192, concurrency=1, chunk_size=8192, num_requests=2)
    r1 = simulate_pipeline(one, lambda _b: (1.0, 0.5), in_flight=2)
    assert r1.ttft_s == pytest.approx([1.5, 1.5]) and r1.batches[1].start_s == pytest.approx(1.5)  # idle gap
